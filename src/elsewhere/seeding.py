"""Per-task seeds for ``random`` and NumPy's global generator, applied on first use.

Every task runs as if ``random`` and NumPy's legacy global generator had been
seeded from the job seed and the task index just before it started (NumPy
through ``SeedSequence(job_seed, spawn_key=(index,))``). Seeding eagerly costs
more than a tiny task (4 us for ``random``, 18 us for NumPy), so the worker
seeds on first use instead: the module-level functions of ``random`` and
``numpy.random`` (``random.random``, ``np.random.rand``, ...) are replaced by
stubs that apply the running task's seed, put the real functions back for the
rest of the task (full speed), and call through. After a task that used them,
the stubs go back in for the next task. A task that never draws a random
number costs one attribute store::

    seeder.begin(job_seed, index)     # before the task
    value = fn(*args)
    if seeder.fired:                  # after it
        seeder.rearm()

Observable state is the same as with eager seeding: the first draw (or
``getstate()``, or ``seed()``) of a task sees the task's seed. A function
bound before the stubs went in (``from random import random`` in a module
imported before the worker started) bypasses them; the stubs themselves stay
valid when bound (``from random import random`` in a task's module): they
check for a pending seed on every call.

Kept free of heavy imports: the worker imports it at start-up.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_NO_SEED = -1


class TaskSeeder:
    """Seeds ``random`` and ``numpy.random`` for the running task, lazily."""

    def __init__(self) -> None:
        self.fired = False
        self.armed = True
        self._pending = _NO_SEED  # task index whose seed is not applied yet
        self._fired_index = 0
        self.job_seed = 0
        self._random_module: Any = None
        self._random_stubs: dict[str, Any] = {}
        self._random_real: dict[str, Any] = {}
        self._np_module: Any = None
        self._np_stubs: dict[str, Any] = {}
        self._np_real: dict[str, Any] = {}
        # A module loaded already gets its stubs now; one a task imports later,
        # right after it has loaded (no import here: ``random`` costs a worker
        # that never uses it a few milliseconds, NumPy far more).
        watch = []
        for name, install in (("random", self._install_random), ("numpy.random", self._install_numpy)):
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
        self._pending = index

    def rearm(self) -> None:
        """After a task that drew numbers (or for a seeded job): stubs back in."""
        self.fired = False
        self.armed = True
        self._pending = _NO_SEED
        self._put(self._random_stubs, self._np_stubs)

    def disarm(self) -> None:
        """For a job without seeds: the real functions back in, nothing seeded."""
        self.fired = False
        self.armed = False
        self._pending = _NO_SEED
        self._put(self._random_real, self._np_real)

    def _put(self, random_fns: dict[str, Any], np_fns: dict[str, Any]) -> None:
        if self._random_module is not None:
            self._random_module.__dict__.update(random_fns)
        if self._np_module is not None:
            self._np_module.__dict__.update(np_fns)

    def seed_now(self) -> None:
        """Apply the pending seed (the first use of a generator in this task)."""
        index = self._pending
        if index == _NO_SEED:
            return
        self._pending = _NO_SEED
        self._fired_index = index
        self.fired = True
        if self._random_module is not None:
            self._seed_random(index)
            self._random_module.__dict__.update(self._random_real)
        if self._np_module is not None:
            self._seed_numpy(index)
            self._np_module.__dict__.update(self._np_real)

    def _seed_random(self, index: int) -> None:
        import _random

        inst = self._random_module._inst
        _random.Random.seed(inst, self.job_seed + index)  # what random.seed(n) ends in
        inst.gauss_next = None

    def _seed_numpy(self, index: int) -> None:
        ss = self._np_module.SeedSequence(self.job_seed, spawn_key=(index,))
        self._np_real["seed"](ss.generate_state(4))

    # -- installing the stubs -----------------------------------------------------
    def _install_random(self, random: Any) -> None:
        inst = getattr(random, "_inst", None)
        if inst is None:
            return
        for name in dir(random):
            real = random.__dict__.get(name)
            if getattr(real, "__self__", None) is inst and not name.startswith("_"):
                self._random_real[name] = real
                self._random_stubs[name] = _stub(self, real)
        self._random_module = random
        self._arrive(random, self._random_stubs, self._seed_random)

    def _arrive(self, module: Any, stubs: dict[str, Any], seed: Any) -> None:
        if not self.armed:
            return
        if self.fired:
            # Loaded in the middle of a task that already drew from the other
            # generator: seed it now for this task, as eager seeding would have.
            seed(self._fired_index)
        else:
            module.__dict__.update(stubs)

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
        self._arrive(np_random, self._np_stubs, self._seed_numpy)

    def _hook(self, names: list[str]) -> None:
        # If a task imports one of ``names``, put the stubs in right after it has
        # loaded, so a task that imports numpy inside its body is as
        # reproducible as one that got numpy with its inputs.
        installs = {"random": self._install_random, "numpy.random": self._install_numpy}
        waiting = set(names)

        class Finder:  # a meta path finder (no importlib.abc: importing it costs ~30 ms)
            def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
                if name not in waiting:
                    return None
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
