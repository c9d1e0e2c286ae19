"""Per-task seeds for ``random`` and NumPy's global generator.

Every task runs as if ``random`` and NumPy's legacy global generator had been
seeded from the job seed and the task index just before it started (NumPy
through ``SeedSequence(job_seed, spawn_key=(index,))``), at as little cost as
possible for floods of tasks that take microseconds:

- ``random`` is seeded before each task (its C seeding, ~4 us), but only once
  it is loaded: a worker does not import it, and a job whose code never
  imports it pays nothing. When a task imports it, it is seeded right after
  it has loaded.
- NumPy's generator costs ~18 us to seed, so it is seeded on first use: the
  module functions of ``numpy.random`` (``np.random.rand``, ...) are stubs that
  apply the running task's seed on the first draw (or ``get_state``, or
  ``seed``), put the real functions back for the rest of the task and call
  through; after a task that used them the stubs go back in. A stub bound to
  a name (``rand = np.random.rand``) stays valid: it checks for a pending
  seed on each call (~0.1 us more per call). Observable state is that of
  eager seeding.

::

    seeder.begin(job_seed, index)     # before the task
    value = fn(*args)
    if seeder.fired:                  # after it
        seeder.rearm()

While ``nothing_loaded`` (neither ``random`` nor NumPy is loaded), a loop over
tiny tasks may instead set ``job_seed`` once and ``_live`` to a sequence whose
first item is the running task's index, which it keeps up to date (the map of
the running task, or the count of values of a loop in C: no store of its own per
task); a module a task imports is then seeded from there. A loop in Python looks
at ``nothing_loaded`` before each task; a loop in C sets ``stop_loop``, which the
seeder calls once a task has loaded one (it ends the loop after that task): the
next ones are seeded with ``begin`` (``flood.py``).

``random`` is not stubbed: tasks bind ``random.random`` to a local name for
speed in hot loops, and a stub there would slow every draw. Kept free of heavy
imports: the worker imports it at start-up.
"""

from __future__ import annotations

import _random
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_NO_SEED = -1

SEEDED_MODULES = ("random", "numpy.random")
"""The modules a worker seeds before every task once they are loaded (a worker started as a
fork of a client that has loaded one would seed it for every task: hosts/forkstart.py)."""


#: ``random.seed(n)`` for an int n: the C seeding it ends in, without its Python wrapper
#: (``_random`` is built in: importing it does not load the ``random`` module)
_c_seed = _random.Random.seed


class TaskSeeder:
    """Seeds ``random`` and ``numpy.random`` for the running task, lazily."""

    def __init__(self) -> None:
        self.fired = False
        self.armed = True
        self._pending = _NO_SEED  # task index whose seed is not applied yet
        self.job_seed = 0
        self._index = _NO_SEED  # the task running now
        self._live: Any = None  # or, while a loop of tiny tasks runs, its [0] (see the module)
        self.stop_loop: Any = None  # ... and, for a loop in C, what ends it after the running task
        self._rinst: Any = None  # random's global generator, once random is loaded
        self._np_module: Any = None
        self._np_stubs: dict[str, Any] = {}
        self._np_real: dict[str, Any] = {}
        self.nothing_loaded = True  # neither random nor numpy.random is loaded: nothing to seed yet
        # A module loaded already is taken care of now; one a task imports later,
        # right after it has loaded (no import here: ``random`` costs a worker
        # that never uses it a few milliseconds, NumPy far more).
        watch = []
        for name, install in zip(SEEDED_MODULES, (self._install_random, self._install_numpy)):
            module = sys.modules.get(name)
            if module is not None:
                install(module)
            else:
                watch.append(name)
        if watch:
            self._hook(watch)

    # -- per task ---------------------------------------------------------------
    def begin(self, job_seed: int, index: int) -> None:
        """The task ``index`` of a job seeded ``job_seed`` starts now."""
        self.job_seed = job_seed
        self._pending = self._index = index
        r = self._rinst
        if r is not None:
            _c_seed(r, job_seed + index)
            r.gauss_next = None

    def rearm(self) -> None:
        """After a task that drew numbers (or for a seeded job): stubs back in."""
        self.fired = False
        self.armed = True
        self._pending = _NO_SEED
        self._put(self._np_stubs)

    def disarm(self) -> None:
        """For a job without seeds: the real functions back in, nothing seeded."""
        self.fired = False
        self.armed = False
        self._pending = self._index = _NO_SEED
        self._put(self._np_real)

    def _put(self, np_fns: dict[str, Any]) -> None:
        if self._np_module is not None:
            self._np_module.__dict__.update(np_fns)

    def seed_now(self) -> None:
        """Apply the pending seed (the first use of a generator in this task)."""
        index = self._pending
        if index == _NO_SEED:
            return
        self._pending = _NO_SEED
        self.fired = True
        if self._np_module is not None:
            self._seed_numpy(index)
            self._np_module.__dict__.update(self._np_real)

    def _seed_numpy(self, index: int) -> None:
        ss = self._np_module.SeedSequence(self.job_seed, spawn_key=(index,))
        self._np_real["seed"](ss.generate_state(4))

    def _running(self) -> int:
        live = self._live
        if live is None:
            return self._index
        index = int(live[0])
        return index if index >= 0 else _NO_SEED

    # -- installing the stubs -----------------------------------------------------
    def _install_random(self, random: Any) -> None:
        inst = getattr(random, "_inst", None)
        if inst is None:
            return
        self._rinst = inst
        self.nothing_loaded = False
        if self.stop_loop is not None:
            self.stop_loop()  # the tasks after this one are seeded one by one
        index = self._running()
        if self.armed and index != _NO_SEED:
            # imported by the running task: seeded for it, as if it had been loaded before
            _c_seed(inst, self.job_seed + index)
            inst.gauss_next = None

    def _install_numpy(self, np_random: Any) -> None:
        mtrand = getattr(np_random, "mtrand", None)
        legacy = getattr(mtrand, "_rand", None)
        if legacy is None or not hasattr(np_random, "SeedSequence"):
            return
        # The methods of the legacy global RandomState, and mtrand's functions
        # that use it (seed, sample, ranf, get/set_bit_generator).
        functions = set(getattr(mtrand, "__all__", ()))
        for name in dir(np_random):
            real = np_random.__dict__.get(name)
            if name.startswith("_") or not callable(real) or isinstance(real, type):
                continue
            if getattr(real, "__self__", None) is legacy or (name in functions and getattr(mtrand, name, None) is real):
                self._np_real[name] = real
                self._np_stubs[name] = _stub(self, real)
        if "seed" not in self._np_real:
            return
        self._np_module = np_random
        self.nothing_loaded = False
        if self.stop_loop is not None:
            self.stop_loop()  # the tasks after this one are seeded one by one
        if self.armed:  # NumPy fires its stubs itself, so it cannot have fired before they exist
            np_random.__dict__.update(self._np_stubs)
            index = self._running()
            if index != _NO_SEED:
                self._pending = index  # loaded by the running task: its seed is due

    def _hook(self, names: list[str]) -> None:
        # If a task imports one of ``names``, put the stubs in right after it has
        # loaded, so a task that imports numpy inside its body is as
        # reproducible as one that got numpy with its inputs.
        installs = {"random": self._install_random, "numpy.random": self._install_numpy}
        waiting = set(names)
        # Names this finder is looking for now: the finder of another seeder in the process
        # (a test's) asks the finders after it, this one included, and this one the others.
        busy: set[str] = set()

        class Finder:  # a meta path finder (no importlib.abc: importing it costs ~30 ms)
            def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
                if name not in waiting or name in busy:
                    return None
                busy.add(name)
                try:
                    for finder in sys.meta_path:
                        if finder is self:
                            continue
                        spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
                        if spec is not None and spec.loader is not None:
                            loader = spec.loader
                            exec_module = loader.exec_module

                            def exec_and_install(module: Any, _exec: Any = exec_module,
                                                 _install: Any = installs[name]) -> None:
                                _exec(module)
                                _install(module)

                            loader.exec_module = exec_and_install
                            waiting.discard(name)
                            if not waiting:
                                try:
                                    sys.meta_path.remove(self)
                                except ValueError:
                                    pass
                            return spec
                    return None
                finally:
                    busy.discard(name)

        sys.meta_path.insert(0, Finder())


def _stub(seeder: TaskSeeder, real: Any) -> Any:
    def stub(*args: Any, **kwargs: Any) -> Any:
        if seeder._pending != _NO_SEED:
            seeder.seed_now()
        return real(*args, **kwargs)

    for attr in ("__name__", "__qualname__", "__doc__"):
        try:
            setattr(stub, attr, getattr(real, attr))
        except (AttributeError, TypeError):
            pass
    stub.__wrapped__ = real  # type: ignore[attr-defined]
    return stub
