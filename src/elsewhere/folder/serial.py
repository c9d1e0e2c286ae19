"""Serialisation of functions, inputs and results.

cloudpickle (protocol 5) for functions and closures; large contiguous buffers
(NumPy arrays) go out of band so they are written straight from the caller's
memory and read straight into the worker's, never pickled into a big bytes
object; the pickle stream itself is compressed with zstandard.

When something cannot be serialised, :func:`find_offender` walks the object
(arguments, closure cells, referenced globals, container items, attributes)
to name the part that fails, so the error says *which* object is to blame.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: Buffers at least this large travel out of band; smaller ones stay in the pickle.
OOB_MIN_BYTES = 64 * 1024


def dumps(obj: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle ``obj``; large buffers are returned out of band.

    The standard pickler first: it is faster, and what it writes needs no
    cloudpickle to read (a worker then never imports it). Wherever something
    must travel by value (a function or class of ``__main__``, of a module
    that is not importable, of a module sent by value, a lambda, a closure),
    cloudpickle pickles the whole object instead.
    """
    buffers: list[memoryview] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < OOB_MIN_BYTES:
            return True  # a true value keeps the buffer in band
        buffers.append(view)
        return False

    import io

    out = io.BytesIO()
    try:
        _ByReference(out, protocol=5, buffer_callback=keep).dump(obj)
        return out.getvalue(), buffers
    except Exception:
        buffers.clear()
    out = io.BytesIO()
    _cloud_pickler()(out, protocol=5, buffer_callback=keep).dump(obj)
    return out.getvalue(), buffers


def dumps_inband(obj: Any) -> bytes:
    """Pickle ``obj`` with cloudpickle, every buffer in the stream (one bytes object)."""
    import io

    out = io.BytesIO()
    _cloud_pickler()(out, protocol=5).dump(obj)
    return out.getvalue()


class _ModuleFunction:
    """``module.name``, looked up at each call in the process that loaded the pickle
    (see :func:`_shared_generator`): what a task that calls ``np.random.rand(...)`` in
    its body gets, with the worker's per-task seeding."""

    __slots__ = ("_module", "module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name
        self._module: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        mod = self._module
        if mod is None:
            import importlib

            mod = self._module = importlib.import_module(self.module)
        return getattr(mod, self.name)(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return _ModuleFunction, (self.module, self.name)

    def __repr__(self) -> str:
        return f"{self.module}.{self.name}"


_GENERATOR_MODULES = ("numpy.random", "random")
_FUNCTION_TYPES = frozenset({types.BuiltinMethodType, types.MethodType, types.FunctionType})


def _shared_generator(obj: Any) -> Any:
    """A function of ``random`` or ``numpy.random`` that draws from the module's shared
    generator (``np.random.rand``, ``random.random``: methods of a hidden generator
    object) is pickled by its name, looked up at each call, so that a task draws from the
    worker's generator, seeded for that task, as it would calling it in its body, not
    from a copy of the caller's generator in the state it was in when the job was made
    (which would give every task the same numbers). Returns the reduction, or None."""
    if type(obj) not in _FUNCTION_TYPES:
        return None
    name = getattr(obj, "__name__", None)
    if not isinstance(name, str):
        return None
    for module in _GENERATOR_MODULES:
        mod = sys.modules.get(module)
        if mod is not None and mod.__dict__.get(name) is obj:
            return _ModuleFunction, (module, name)
    return None


_cloud_pickler_class: Any = None


def _cloud_pickler() -> Any:
    """cloudpickle's pickler, with the shared generators' functions pickled by name."""
    global _cloud_pickler_class
    if _cloud_pickler_class is None:
        import cloudpickle

        class CloudPickler(cloudpickle.Pickler):
            def reducer_override(self, obj: Any) -> Any:
                reduced = _shared_generator(obj)
                return reduced if reduced is not None else super().reducer_override(obj)

        _cloud_pickler_class = CloudPickler
    return _cloud_pickler_class


class _ByValue(Exception):
    """Something in the object must travel by value: use cloudpickle."""


_by_value_modules: set[str] = set()  # modules sent by value (by_value_for), while they are


class _ByReference(pickle.Pickler):
    """The standard pickler, refusing what it would wrongly pickle by reference."""

    def reducer_override(self, obj: Any) -> Any:
        # Not called for None, bools, ints, floats, str, bytes, list, tuple, dict, set.
        reduced = _shared_generator(obj)
        if reduced is not None:
            return reduced
        if isinstance(obj, type) or (callable(obj) and hasattr(obj, "__code__")):
            import sys

            name = getattr(obj, "__module__", None)
            mod = sys.modules.get(name) if isinstance(name, str) else None
            if (mod is None or name in ("__main__", "__mp_main__") or name in _by_value_modules
                    or _registered_by_value(mod)):
                raise _ByValue(name)
        return NotImplemented


def _registered_by_value(module: Any) -> bool:
    """Whether the user registered ``module`` (or a package of it) with cloudpickle by value."""
    import sys

    cp = sys.modules.get("cloudpickle.cloudpickle")
    if cp is None:
        return False  # nothing can be registered before cloudpickle is imported
    check = getattr(cp, "_is_registered_pickle_by_value", None)
    return bool(check(module)) if check is not None else True


def dumps_plain(obj: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle a result: the fast standard pickler, cloudpickle as the fallback."""
    buffers: list[memoryview] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < OOB_MIN_BYTES:
            return True
        buffers.append(view)
        return False

    try:
        return pickle.dumps(obj, protocol=5, buffer_callback=keep), buffers
    except Exception:
        buffers.clear()
        return dumps(obj)


_SYSTEM_PATHS: tuple[str, ...] = ()


def installed_prefixes() -> tuple[str, ...]:
    """Where installed modules live: the interpreter's and the environment's prefixes
    (standard library, site-packages), and the user's site-packages."""
    global _SYSTEM_PATHS
    if not _SYSTEM_PATHS:
        import site
        import sys

        found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
        user_site = getattr(site, "USER_SITE", None)
        if user_site:
            found.add(user_site)
        _SYSTEM_PATHS = tuple(os.path.join(p, "") for p in found if p)
    return _SYSTEM_PATHS


def needs_by_value(module_name: str, *, shared_fs: bool = True) -> bool:
    """Whether functions of ``module_name`` must travel by value.

    Installed modules (standard library, site-packages) travel by reference.
    The user's own modules travel by reference only when the worker can
    import them (shared file system and findable on ``sys.path``), else by
    value: their code goes with the job.
    """
    import importlib.util
    import sys

    if module_name in ("__main__", "__mp_main__"):
        return False  # cloudpickle already sends these by value
    if module_name == "elsewhere" or module_name.startswith("elsewhere."):
        return False  # every worker runs this package (a checkout may lie outside site-packages)
    mod = sys.modules.get(module_name)
    path = getattr(mod, "__file__", None)
    if mod is None or not path:
        return False
    if path.startswith(installed_prefixes()):
        return False
    if not shared_fs:
        return True
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return True
    return spec is None or spec.origin != path


class by_value_for:
    """Within the block, pickle the given functions' own modules by value where needed."""

    def __init__(self, objs: list[Any], *, shared_fs: bool = True) -> None:
        self.modules: list[Any] = []
        import sys

        seen = set()
        for obj in objs:
            name = getattr(obj, "__module__", None)
            if not isinstance(name, str) or name in seen:
                continue
            seen.add(name)
            if needs_by_value(name, shared_fs=shared_fs):
                self.modules.append(sys.modules[name])

    def __enter__(self) -> by_value_for:
        if not self.modules:
            return self
        import cloudpickle

        with _by_value_lock:  # the registry is global: counted, so threads may nest blocks
            for m in self.modules:
                name = m.__name__
                if name not in _by_value_counts:
                    try:
                        cloudpickle.register_pickle_by_value(m)
                        ours = True
                    except ValueError:
                        ours = False  # registered by the user: theirs to keep
                    _by_value_counts[name] = [0, ours]
                _by_value_counts[name][0] += 1
                _by_value_modules.add(name)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.modules:
            return
        import cloudpickle

        with _by_value_lock:
            for m in self.modules:
                entry = _by_value_counts[m.__name__]
                entry[0] -= 1
                if entry[0] == 0:
                    del _by_value_counts[m.__name__]
                    _by_value_modules.discard(m.__name__)
                    if entry[1]:
                        cloudpickle.unregister_pickle_by_value(m)


_by_value_lock = threading.Lock()
_by_value_counts: dict[str, list[Any]] = {}  # module name -> [blocks open, registered by us]


def loads(data: bytes | memoryview, buffers: list[Any] | None = None) -> Any:
    """Unpickle what :func:`dumps` or :func:`dumps_plain` produced."""
    return pickle.loads(data, buffers=buffers or ())


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_compressors = threading.local()


def compress(data: bytes, level: int = 3) -> bytes:
    """zstd-compress ``data`` (one frame with its content size)."""
    import zstandard

    cache = getattr(_compressors, "by_level", None)
    if cache is None:
        cache = _compressors.by_level = {}
    c = cache.get(level)
    if c is None:
        c = cache[level] = zstandard.ZstdCompressor(level=level)
    return c.compress(data)


def decompress(data: bytes | memoryview) -> bytes | memoryview:
    """Undo :func:`compress`; data that is not a zstd frame (a pickle stored as is) is returned as is."""
    if bytes(data[:4]) != _ZSTD_MAGIC:
        return data
    import zstandard

    return zstandard.ZstdDecompressor().decompress(data)


def describe(obj: Any) -> str:
    """A short description of an object for an error message."""
    tname = type(obj).__qualname__
    mod = type(obj).__module__
    if mod not in ("builtins", None):
        tname = f"{mod}.{tname}"
    try:
        text = repr(obj)
    except Exception:
        text = f"<{tname}>"
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} (type {tname})"


def _fails(obj: Any) -> BaseException | None:
    import cloudpickle

    try:
        cloudpickle.dumps(obj, protocol=5, buffer_callback=lambda b: False)
    except BaseException as exc:
        return exc
    return None


def _children(obj: Any) -> list[tuple[str, Any]]:
    """Parts of ``obj`` that a pickler would visit, with a path label each."""
    out: list[tuple[str, Any]] = []
    if isinstance(obj, dict):
        out += [(f"[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        out += [(f"[{i}]", v) for i, v in enumerate(obj)]
    elif callable(obj) and hasattr(obj, "__code__"):
        code = obj.__code__
        cells = obj.__closure__ or ()
        for name, cell in zip(code.co_freevars, cells):
            try:
                out.append((f" (closure variable {name!r})", cell.cell_contents))
            except ValueError:
                pass
        glb = getattr(obj, "__globals__", {})
        for name in code.co_names:
            if name in glb:
                out.append((f" (global {name!r})", glb[name]))
        if getattr(obj, "__defaults__", None):
            out += [(f" (default {i})", v) for i, v in enumerate(obj.__defaults__)]
    elif isinstance(getattr(obj, "__self__", None), object) and hasattr(obj, "__func__"):
        out.append((".__self__", obj.__self__))
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        out += [(f".{k}", v) for k, v in vars(obj).items()]
    return out


def find_offender(obj: Any, label: str, depth: int = 6) -> tuple[str, Any, BaseException] | None:
    """The innermost part of ``obj`` that cannot be pickled, or None if all can.

    Returns (path label, the object, the error it raised).
    """
    exc = _fails(obj)
    if exc is None:
        return None
    if depth > 0:
        for sub_label, child in _children(obj):
            found = find_offender(child, label + sub_label, depth - 1)
            if found is not None:
                return found
    return label, obj, exc


def check_serialisable(fn: Callable[..., Any] | None, tasks: list[tuple[Any, tuple, dict]],
                       job_data: Any = None) -> None:
    """Raise SerializationError naming the first part that cannot be serialised.

    ``tasks`` are ``(fn or None, args, kwargs)`` entries; ``fn`` is the common function.
    """
    from ..util.errors import SerializationError

    candidates: list[tuple[str, Any]] = []
    if fn is not None:
        candidates.append((f"the function {getattr(fn, '__qualname__', fn)!r}", fn))
    if job_data is not None:
        candidates.append(("job_data", job_data))
    for i, (task_fn, args, kwargs) in enumerate(tasks):
        if task_fn is not None:
            candidates.append((f"the function {getattr(task_fn, '__qualname__', task_fn)!r} of task {i}", task_fn))
        for j, a in enumerate(args):
            candidates.append((f"argument {j} of task {i}", a))
        for k, v in kwargs.items():
            candidates.append((f"argument {k!r} of task {i}", v))
    for label, obj in candidates:
        found = find_offender(obj, label)
        if found is not None:
            where, bad, exc = found
            raise SerializationError(
                f"cannot serialise {where}: {describe(bad)}: {type(exc).__name__}: {exc}"
            ) from exc
