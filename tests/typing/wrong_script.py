"""A user's script with mistakes that a type checker must find (never run).

Each line that must be reported ends with ``# expect: MYPY-CODE | PYRIGHT-RULE``; the test
asserts that mypy --strict reports exactly those errors, and pyright errors on exactly those
lines, that rule among them (on a wrong line it also says what it cannot know, e.g.
reportUnknownMemberType). Were the cluster options, ``ew.map`` or the Executor typed ``Any``, these
mistakes would pass unseen and the test would fail.
"""

from __future__ import annotations

import elsewhere as ew


def square(x: int) -> int:
    return x * x


def wrong_options() -> None:
    ew.slurm(partition="debug", gpus="2")  # expect: arg-type | reportArgumentType
    ew.local(4, memory="4G")  # expect: call-arg | reportCallIssue
    ew.peers("lab", encrypt="yes")  # expect: arg-type | reportArgumentType
    ew.ssh(["server1"], host_timeout_s="1m")  # expect: arg-type | reportArgumentType
    ew.map(square, [1, 2], retries="2")  # expect: call-overload | reportCallIssue
    ew.map(square, [1, 2], errors="ignore")  # expect: call-overload | reportCallIssue
    ew.submit(square, [1, 2], retry=2)  # expect: call-arg | reportCallIssue
    ew.Executor(max_workers=2, seed="7")  # expect: arg-type | reportArgumentType


def wrong_results() -> None:
    first: str = ew.map(square, [1, 2])[0]  # expect: assignment | reportAssignmentType
    job = ew.submit(square, [1, 2])
    value: int = job.results()[0]  # expect: assignment | reportAssignmentType
    print(first, value)
    print(job.tasks[0].result + 1)  # expect: operator | reportOperatorIssue
    with ew.Executor() as ex:
        ex.submit(square, "three")  # expect: arg-type | reportArgumentType
        future = ex.submit(square, 3)
        text = future.result().upper()  # expect: attr-defined | reportAttributeAccessIssue
        for n in ex.map(square, [1, 2]):
            text += n.upper()  # expect: attr-defined | reportAttributeAccessIssue


def misspelt() -> None:
    ew.mapp(square, [1, 2])  # expect: attr-defined | reportAttributeAccessIssue
