"""The job folder: everything a job is, on disk (docs/job-folder.md).

Its files and their one writer each: ``store`` (job.json, cluster.json, the two-slot queue
file), ``records`` and ``journal`` (task outcomes), ``payload`` and ``serial`` (the function and
its inputs), ``snapshot`` (task states read from the folder), ``lifecycle`` (making and removing
a folder), ``registry`` (every job by name) and ``housekeeping``. Imports only ``util``.
"""

from ..util.system import require_fcntl

require_fcntl()  # its files are locked with fcntl: on a system without it, say so here, once
