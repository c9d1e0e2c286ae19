"""Running tasks: the one task runner, and the worker every backend starts.

``runner`` runs tasks in any process that runs them (a worker, an MPI rank, a peer task
process): a job's surroundings entered once, each task with its ``ew.task()`` (``context``),
its seed (``seeding``) and its thread limits (``threads``), an exception as its error record
(``errors``). ``worker`` is ``python -m elsewhere.worker``; ``jobrun`` is one worker inside one
job, which claims its tasks (``claims``) and writes their outcomes (``results``). Imports
``folder`` and ``util``.
"""
