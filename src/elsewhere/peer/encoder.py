"""The pickling of a peer job's tasks for their TASK frames.

A :class:`TaskEncoder` turns the tasks of a batch into the info and buffers of
a TASK: the pickled ``(fn, args, kwargs)`` entries, and, once per connection,
the *function part* they use (the job's function, or the function of tasks
added one by one) and the *job part* (the job data and the job's ``files=``),
each pickled once and named by its digest. The user's own modules travel by
value with the function. The controller
(:class:`~.controller.Controller`) encodes in its loop's thread; an Executor
prepares a task in its own thread (:meth:`TaskEncoder.prepare`), so the state
here is under one lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import threading
import types
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .attached import pack_files

if TYPE_CHECKING:
    from ..folder.payload import PayloadReader

_NO_KWARGS: dict[str, Any] = {}

__all__ = ["TaskEncoder"]

_MAX_OOB = 1000
_FN_PARTS = 256  # the function parts kept pickled (see TaskEncoder._fn_part)
_FN_PART_BYTES = 64 << 20
MAX_SENT_PARTS = 64
"""Function parts a worker keeps for one connection (an Executor whose tasks are each a
new closure or partial sends one per task): the controller says which to drop."""


class TaskEncoder:
    """Pickles the tasks of one job for TASK frames (thread-safe; see the module doc).

    ``payload``: the job's payload (the tasks not handed in memory, the job's function
    and job data); ``job_info``, ``diary`` and ``time_s`` go in every TASK's info.
    """

    def __init__(self, payload: PayloadReader, job_info: dict[str, Any], diary: str,
                 time_s: float, files: Path | None = None) -> None:  # fmt: skip
        self.payload = payload
        self.files_dir = files  # the job's files= folder: it goes in the job part
        self._job_part: tuple[str, list[Any]] | bool | None = False  # made when first needed
        self._combined: dict[str, tuple[str, list[Any]]] = {}  # digest -> (fn, job data) part
        self.job_info = job_info
        self.diary = diary
        self.time_s = time_s
        self.lock = threading.Lock()  # the function parts and cloudpickle's registry
        self.common: tuple[str, list[Any]] | None = None
        self.fn_parts: dict[int, tuple[Any, tuple[str, list[Any]], Any]] = {}  # id -> (weak ref, part, fn)
        self.fn_part_bytes = 0
        self._job_data: Any = None
        self._job_fn: Any = None
        self._by_value: list[Any] = []

    def prepare(self, entry: tuple[Any, tuple[Any, ...], dict[str, Any]]) -> Any:
        """Pickle a task ``(fn, args, kwargs)`` in the calling thread: its function part
        once per function (cached), its inputs now (see :meth:`.controller.Controller.prepare`)."""
        from ..folder import serial

        fn, args, kwargs = entry
        with self.lock:
            digest, fn_parts = self._fn_part(fn)
            items = [(None, args, kwargs)]
            data, oob = serial.dumps(items)
            if len(oob) > _MAX_OOB:
                data, oob = serial.dumps_inband(items), []
        return digest, fn_parts, data, oob, fn

    def encode(self, indices: list[int], attempts: list[int], prepared: Any,
               in_memory: Mapping[int, Any], sent_fns: dict[str, None],
               job_part: bool = True) -> tuple[dict[str, Any], list[Any]]:  # fmt: skip
        """The TASK of a batch: pickled entries, plus, once per connection, the function
        part they use (the job's function; or the function of tasks added one by one, when
        a batch shares it: an Executor's tasks then pickle only their inputs) and the job
        part (the job data and ``files=``, once for every function: ``jpart``, ``njpart``).
        A worker that does not understand a job part (``job_part`` false) gets function
        parts that carry the job data themselves, as before there were job parts.

        ``indices`` and ``attempts``: the batch's tasks; ``prepared``: what :meth:`prepare`
        made of its one task, if it has one task and that was prepared; ``in_memory``: the
        tasks handed in memory (the others are read from the payload); ``sent_fns``: the
        function parts the worker has, oldest first (updated: past :data:`MAX_SENT_PARTS`
        the oldest are dropped, and the TASK's ``forget`` tells the worker to drop them too)."""
        if prepared is not None:  # pickled by the caller of put
            digest, fn_parts, data, oob, fn = prepared
        else:
            with self.lock:
                digest, fn_parts, data, oob, fn = self._pickle_batch(indices, in_memory)
        buffers: list[Any] = [data, *oob]
        info: dict[str, Any] = {
            "job": self.job_info, "diary": self.diary, "items": [[i, a] for i, a in zip(indices, attempts)],
            "ntask": len(buffers), "nfn": 0, "fn": digest, "time_s": self.time_s,
        }  # fmt: skip
        if not job_part:
            with self.lock:
                digest, fn_parts = self._combined_part(digest, fn)
            info["fn"] = digest
        if digest not in sent_fns:
            buffers += fn_parts
            info["nfn"] = len(fn_parts)
        sent_fns.pop(digest, None)
        sent_fns[digest] = None  # used now: the last to be dropped
        jp = self.job_part() if job_part else None
        if jp is not None:
            info["jpart"], info["njpart"] = jp[0], 0
            if jp[0] not in sent_fns:
                buffers += jp[1]
                info["njpart"] = len(jp[1])
            sent_fns.pop(jp[0], None)
            sent_fns[jp[0]] = None  # used now: the last to be dropped
        if len(sent_fns) > MAX_SENT_PARTS:  # the worker keeps what it is not told to drop
            forget = list(sent_fns)[: len(sent_fns) - MAX_SENT_PARTS]
            for old in forget:
                del sent_fns[old]
            info["forget"] = forget
        return info, buffers

    def job_part(self) -> tuple[str, list[Any]] | None:
        """(digest, buffers) of the job data and ``files=``; None when there are neither."""
        with self.lock:
            if self._job_part is False:
                self._common()
                files = pack_files(self.files_dir) if self.files_dir is not None else None
                if self._job_data is None and files is None:
                    self._job_part = None
                else:
                    from ..folder import serial

                    packed = None if files is None else (files[0], pickle.PickleBuffer(files[1]))
                    self._job_part = _digested("j", *serial.dumps((self._job_data, packed)))
            return self._job_part if isinstance(self._job_part, tuple) else None

    def _combined_part(self, digest: str, fn: Any) -> tuple[str, list[Any]]:
        """The function part ``digest`` of ``fn`` with the job data in it (for a worker
        without job parts)."""
        cached = self._combined.get(digest)
        if cached is None:
            from ..folder import serial

            cached = self._combined[digest] = _digested("c", *serial.dumps((fn, self._job_data)))
            if len(self._combined) > 256:
                self._combined.pop(next(iter(self._combined)))
        return cached

    def _pickle_batch(self, indices: list[int],
                      in_memory: Mapping[int, Any]) -> tuple[str, list[Any], bytes, list[Any], Any]:
        """The function part, the pickled entries of a batch's tasks, and the function."""
        from ..folder import serial

        entries = self._entries(indices, in_memory)
        own = {id(e[0]) for e in entries}
        if len(own) == 1 and entries[0][0] is not None:  # one function of their own: a part
            part_fn = entries[0][0]
            digest, fn_parts = self._fn_part(part_fn)
            entries = [(None, args, kwargs) for _, args, kwargs in entries]
        else:
            digest, fn_parts = self._common()
            part_fn = self._job_fn
            for fn, _, _ in entries:
                if fn is not None:
                    self._register_by_value(fn)
        data, oob = serial.dumps(entries)
        if len(oob) > _MAX_OOB:
            data, oob = serial.dumps_inband(entries), []
        return digest, fn_parts, data, oob, part_fn

    def _entries(self, indices: list[int], in_memory: Mapping[int, Any]) -> list[Any]:
        """The entries of tasks ``indices``: a run of consecutive tasks of the job's own
        function is sliced from its payload chunk at once, not read task by task."""
        if in_memory or len(indices) < 2:
            return [self._entry(i, in_memory) for i in indices]
        out: list[Any] = []
        k, n = 0, len(indices)
        while k < n:
            i = indices[k]
            run = self._read(self.payload.args_run, i)
            m = 0 if run is None else min(n - k, run[0] + len(run[1]) - i)
            if m > 1 and indices[k : k + m] != list(range(i, i + m)):  # the consecutive part
                j = 1
                while indices[k + j] == i + j:
                    j += 1
                m = j
            if m < 2:
                out.append(self._entry(i, in_memory))
                k += 1
                continue
            first, part, single = run
            args = part[i - first : i - first + m]
            out += [(None, (a,), _NO_KWARGS) for a in args] if single else [(None, a, _NO_KWARGS) for a in args]
            k += m
        return out

    def _entry(self, index: int, in_memory: Mapping[int, Any]) -> Any:
        entry = in_memory.get(index)
        return entry if entry is not None else self._read(self.payload.task, index)

    def _read(self, read: Callable[..., Any], *args: Any) -> Any:
        """``read(*args)`` from the payload, which names the user's modules: if one cannot
        be imported here, once more with the job's folders on ``sys.path``."""
        try:
            return read(*args)
        except ImportError:
            from ..folder.lifecycle import import_from_job  # (not at every task: it costs as much)

            if not import_from_job(self.job_info):
                raise
            return read(*args)

    def _common(self) -> tuple[str, list[Any]]:
        """The function part of the job's own function."""
        if self.common is None:
            fn, job_data = self._read(self.payload.common)
            self._job_data, self._job_fn = job_data, fn
            self.common = self._pickle_part(fn)
        return self.common

    def _fn_part(self, fn: Any) -> tuple[str, list[Any]]:
        """The function part of a task's own function, pickled once while the function lives.

        Held weakly: a partial, bound method or closure the caller drops is freed with what
        it holds, and its part with it; a function that cannot be referenced weakly (a
        built-in: it lives as long as its module anyway) is held as it is. At most
        :data:`_FN_PARTS` parts and :data:`_FN_PART_BYTES` bytes of them are kept."""
        key = id(fn)
        cached = self.fn_parts.get(key)
        if cached is not None and (cached[0]() if cached[0] is not None else cached[2]) is fn:
            return cached[1]
        self._common()
        part = self._pickle_part(fn)
        parts = self.fn_parts
        entry: tuple[Any, tuple[str, list[Any]], Any] | None
        try:
            entry = (weakref.ref(fn, lambda _ref: self._forget_part(key)), part, None)
        except TypeError:
            entry = (None, part, fn) if isinstance(fn, types.BuiltinFunctionType) else None
        if entry is not None:
            parts[key] = entry
            self.fn_part_bytes += sum(len(b) for b in part[1])
            while parts and (len(parts) > _FN_PARTS or self.fn_part_bytes > _FN_PART_BYTES):
                self._forget_part(next(iter(parts)))
        return part

    def _forget_part(self, key: int) -> None:
        old = self.fn_parts.pop(key, None)
        if old is not None:
            self.fn_part_bytes -= sum(len(b) for b in old[1][1])

    def _pickle_part(self, fn: Any) -> tuple[str, list[Any]]:
        from ..folder import serial

        if fn is not None:
            self._register_by_value(fn)
        return _digested("f", *serial.dumps((fn, None)))

    def _register_by_value(self, fn: Any) -> None:
        """Send the user's own modules' code with the task (the worker may not have it)."""
        import sys

        import cloudpickle

        from ..folder import serial

        name = getattr(fn, "__module__", None)
        if not isinstance(name, str) or name not in sys.modules:
            return
        module = sys.modules[name]
        if module in self._by_value or not serial.needs_by_value(name, shared_fs=False):
            return
        try:
            cloudpickle.register_pickle_by_value(module)
            self._by_value.append(module)
        except ValueError:
            pass  # already registered (by the user)

    def close(self) -> None:
        """Forget the modules registered to be pickled by value; close the payload."""
        import cloudpickle

        with self.lock:  # a put's prepare may pickle in another thread meanwhile
            for module in self._by_value:
                with contextlib.suppress(ValueError):
                    cloudpickle.unregister_pickle_by_value(module)
            self._by_value.clear()
            self.payload.close()


def _digested(kind: str, data: bytes, oob: list[Any]) -> tuple[str, list[Any]]:
    """(digest, buffers) of a pickled part; the digest's first letter says its kind."""
    h = hashlib.sha256(data)
    for v in oob:
        h.update(v)
    return kind + h.hexdigest()[:31], [data, *oob]
