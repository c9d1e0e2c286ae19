"""Task functions of the benchmarks, in a module of their own.

Workers import them by reference (``_tasks.noop``). The module is small on
purpose: a worker that imports a task's module compiles it when no cached
bytecode is there (``PYTHONDONTWRITEBYTECODE``), and the benchmarks measure
elsewhere, not the compiling of a long benchmark script.
"""

import time


def noop(x):
    return x


def spin_cpu(secs):
    """Loop until this thread has used ``secs`` of CPU time (the vCPU speed drifts)."""
    tt = time.thread_time
    end = tt() + secs
    x = 0
    while tt() < end:
        for i in range(10000):
            x += i
    return x


def arr_sum(a):
    return float(a.sum())
