"""What a type checker infers for the results of the public API (never run).

Each ``reveal_type`` line ends with ``# reveal: TYPE``, the type both mypy and pyright must
infer (module prefixes left out: ``TaskError`` for ``elsewhere.util.errors.TaskError``).
"""

# ruff: noqa: F821  (reveal_type needs no import: the type checkers know it)
from __future__ import annotations

import concurrent.futures as cf

import elsewhere as ew


def square(x: int) -> int:
    return x * x


def name(x: int) -> str:
    return str(x)


def reveal(ex: ew.Executor) -> None:
    reveal_type(ew.map(square, [1, 2, 3]))  # reveal: list[int]
    reveal_type(ew.map(name, [1, 2], on=ew.local(2), retries=1))  # reveal: list[str]
    reveal_type(ew.map(square, [1, 2], errors="return"))  # reveal: list[int | TaskError]
    job = ew.submit(square, [1, 2, 3])
    reveal_type(job)  # reveal: Job[int]
    reveal_type(job.wait())  # reveal: Job[int]
    reveal_type(job.results())  # reveal: list[int | TaskError]
    reveal_type(job.results(partial=True))  # reveal: list[int | TaskError | None]
    reveal_type(job.tasks[0])  # reveal: Task[int]
    reveal_type(job.tasks[0].result)  # reveal: int | TaskError
    reveal_type(ew.submit_communicating(name, (1,), ranks=2))  # reveal: Job[str]
    reveal_type(ex.submit(square, 2))  # reveal: Future[int]
    reveal_type(ex.map(name, [1, 2]))  # reveal: Iterator[str]
    reveal_type(ex.submit(name, 2).result())  # reveal: str
    reveal_type(cf.as_completed([ex.submit(square, 1)]))  # reveal: Iterator[Future[int]]
    reveal_type(ew.local())  # reveal: Cluster
    reveal_type(ew.task().cores)  # reveal: int
