"""Calls for the Executor's contract (test_executor.py): importable by every worker."""

from __future__ import annotations

import os
import sys
import time

# The process's environment holds what the initializer did: it is one per process whatever
# way this module travels (a module sent by value has its globals once per function sent).


def init(tag: str) -> None:
    """An initializer: counts its runs with ``tag`` in this process."""
    key = f"EW_TEST_INITS_{tag}"
    os.environ[key] = str(int(os.environ.get(key, "0")) + 1)


def seen_init(tag: str) -> tuple[int, int]:
    """(pid, how often the initializer ran with ``tag`` in this process)."""
    return os.getpid(), int(os.environ.get(f"EW_TEST_INITS_{tag}", "0"))


def span(seconds: float) -> tuple[float, float]:
    t0 = time.time()
    time.sleep(seconds)
    return t0, time.time()


class MyError(Exception):
    """An exception whose __init__ takes two arguments and passes one message up."""

    def __init__(self, code: int, where: str) -> None:
        super().__init__(f"code {code} at {where}")
        self.code = code
        self.where = where


def raise_(kind: str) -> None:
    if kind == "runtime":
        raise RuntimeError(123)
    if kind == "notfound":
        raise FileNotFoundError(2, "No such file or directory", "/nowhere/x.txt")
    if kind == "key":
        raise KeyError("k")
    if kind == "mine":
        raise MyError(7, "the pump")
    raise ValueError(kind)


def _fail_on_load() -> None:
    raise ImportError("this value cannot be loaded here")


def _exit_on_load() -> None:
    raise SystemExit(3)


class LoadsBadly:
    """A value that pickles on the worker and cannot be unpickled by the caller."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __reduce__(self):
        return (_exit_on_load if self.how == "exit" else _fail_on_load, ())


def loads_badly(how: str) -> LoadsBadly:
    return LoadsBadly(how)


class ExitsWhenPickled:
    def __reduce__(self):
        sys.exit(4)


def exits_when_pickled(_: object = None) -> ExitsWhenPickled:
    return ExitsWhenPickled()


def megabyte(i: int) -> bytes:
    return bytes([i % 256]) * (1 << 20)


def touch_later(path: str, seconds: float) -> str:
    time.sleep(seconds)
    with open(path, "w") as f:
        f.write("done")
    return path


def pid_then_sleep(path: str, seconds: float) -> None:
    """Write this process's pid to ``path`` (whole, by a rename), then sleep."""
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)
    time.sleep(seconds)


def _die() -> None:
    os._exit(9)


class DiesWhenLoaded:
    """An argument whose unpickling kills the process that loads it (the worker)."""

    def __reduce__(self):
        return (_die, ())


class DiesWhenPickled:
    def __reduce__(self):
        os._exit(9)


def identity(x: object) -> object:
    return x


def dies_when_pickled(_: object = None) -> DiesWhenPickled:
    return DiesWhenPickled()


class Marker:
    """An argument that leaves a file behind when the process that loaded it frees it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __del__(self) -> None:
        with open(self.path, "w") as f:
            f.write("freed")


def size_of(marker: Marker) -> int:
    return len(marker.path)
