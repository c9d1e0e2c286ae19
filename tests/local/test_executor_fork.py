"""A child forked while an executor runs (multiprocessing's fork, a user's os.fork) exits.

The child inherits the executor's exit hook and its streams, but not the threads that serve
them: the hook must leave them to the parent, or the child's exit waits for ever on threads
it does not have (it did: the hook ran in every process that inherited it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CHILD_EXITS = """
import multiprocessing, os, sys
import elsewhere as ew

def hello():
    print("hello from the child", flush=True)

ex = ew.Executor(on=ew.local(cores=1))
assert ex.submit(pow, 2, 5).result(timeout=60) == 32
pending = ex.submit(pow, 3, 3)
# multiprocessing's fork: the child runs the threading exit hooks before it ends
child = multiprocessing.get_context("fork").Process(target=hello)
child.start()
child.join(60)
print("mp child", child.exitcode, flush=True)
with ex:
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # inside the with block: the child's exit shuts the executor down
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status), flush=True)
    assert pending.result(timeout=60) == 27
print("parent done", flush=True)
"""


def test_a_forked_child_exits_while_its_parent_executor_runs(ew_home):
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD_EXITS)], capture_output=True, text=True,
                       timeout=100, env=os.environ.copy())  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:4] == [
        "hello from the child",
        "mp child 0",
        "child 0",
        "parent done",
    ], p.stdout + p.stderr
