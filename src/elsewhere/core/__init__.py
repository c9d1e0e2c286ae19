"""The core services between the user's API and the backends: submitting a job and
controlling it (cancel, cancel one task, retry, poll). Imports every layer below it."""
