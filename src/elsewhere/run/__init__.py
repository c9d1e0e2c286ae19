"""Running tasks: the task runner and the worker every backend starts.

``worker`` is ``python -m elsewhere.worker``; ``jobrun`` claims and runs a job's tasks;
``context`` is ``ew.task()``; ``seeding`` and ``threads`` set up each task. Imports ``folder``
and ``util``.
"""
