"""Per-task seeds applied on first use (elsewhere.run.seeding) give what eager seeding gives."""

import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from elsewhere.run.seeding import TaskSeeder


def eager_random(job_seed, index):
    return random.Random(job_seed + index)


def eager_numpy(job_seed, index):
    return np.random.RandomState(np.random.SeedSequence(job_seed, spawn_key=(index,)).generate_state(4))


@pytest.fixture
def seeder():
    s = TaskSeeder()
    yield s
    s.disarm()


def run(seeder, job_seed, index, fn):
    if seeder.fired:
        seeder.rearm()
    seeder.begin(job_seed, index)
    return fn()


def test_each_task_draws_from_its_own_seed(seeder):
    for index in (0, 1, 5, 0):
        r = run(seeder, 42, index, lambda: (random.random(), random.randint(0, 10**9), np.random.rand(),
                                            np.random.randint(0, 10**9)))
        er, en = eager_random(42, index), eager_numpy(42, index)
        assert r == (er.random(), er.randint(0, 10**9), en.rand(), en.randint(0, 10**9))


def test_numpy_first_then_random(seeder):
    got = run(seeder, 7, 3, lambda: (np.random.normal(), random.gauss(0, 1)))
    assert got == (eager_numpy(7, 3).normal(), eager_random(7, 3).gauss(0, 1))


def test_gauss_cache_does_not_leak_between_tasks(seeder):
    # random.gauss keeps a second value; each task must start without it.
    a = run(seeder, 1, 0, lambda: random.gauss(0, 1))
    b = run(seeder, 1, 0, lambda: random.gauss(0, 1))
    assert a == b == eager_random(1, 0).gauss(0, 1)


def test_state_and_explicit_seed(seeder):
    state = run(seeder, 9, 2, random.getstate)
    assert state == eager_random(9, 2).getstate()
    # a task that seeds itself gets what it asked for
    assert run(seeder, 9, 2, lambda: (random.seed(123), random.random())[1]) == random.Random(123).random()
    assert run(seeder, 9, 2, lambda: np.random.get_state()[1][:4].tolist()) == \
        eager_numpy(9, 2).get_state()[1][:4].tolist()


def test_a_bound_stub_stays_seeded(seeder):
    from random import random as bound  # bound while the stubs are in: a stub

    a = run(seeder, 5, 4, bound)
    b = run(seeder, 5, 4, bound)
    assert a == b == eager_random(5, 4).random()


def test_tasks_that_draw_nothing_leave_the_numpy_stubs_in(seeder):
    stub = np.random.rand
    assert getattr(stub, "__wrapped__", None) is not None
    run(seeder, 1, 0, lambda: None)
    assert np.random.rand is stub and not seeder.fired
    run(seeder, 1, 1, np.random.rand)
    assert seeder.fired and np.random.rand is not stub  # the real one, for the rest of the task
    run(seeder, 1, 2, lambda: None)
    assert np.random.rand is stub


def test_random_is_never_stubbed_so_a_bound_draw_runs_at_full_speed(seeder):
    # tasks bind random.random to a local name for their hot loops: it must be the C method
    rand = run(seeder, 4, 9, lambda: random.random)
    assert not hasattr(rand, "__wrapped__") and type(rand).__name__ == "builtin_function_or_method"
    assert rand() == eager_random(4, 9).random()


def test_disarm_puts_the_real_functions_back(seeder):
    seeder.disarm()
    assert not hasattr(np.random.rand, "__wrapped__")
    random.seed(3)
    assert random.random() == random.Random(3).random()
    seeder.begin(1, 0)  # (the worker does not call begin for a job without seeds)
    seeder.disarm()
    random.seed(3)
    assert random.random() == random.Random(3).random()
    seeder.rearm()
    assert hasattr(np.random.rand, "__wrapped__")


@pytest.mark.parametrize("order", ["random-first", "numpy-first"])
def test_numpy_imported_inside_a_task(order):
    # NumPy not loaded when the worker starts; the task imports it.
    script = textwrap.dedent(f"""
        import random, sys
        from elsewhere.run.seeding import TaskSeeder
        assert "numpy" not in sys.modules
        s = TaskSeeder()
        s.begin(11, 6)
        if {order!r} == "random-first":
            r = random.random()
            import numpy as np
            v = np.random.rand()
        else:
            import numpy as np
            v = np.random.rand()
            r = random.random()
        ss = np.random.SeedSequence(11, spawn_key=(6,))
        assert v == np.random.RandomState(ss.generate_state(4)).rand(), v
        assert r == random.Random(17).random(), r
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_random_imported_inside_a_task():
    # Neither random nor NumPy loaded when the seeder is made (a worker that
    # never draws numbers does not pay for importing them); the task imports both.
    script = textwrap.dedent("""
        import sys
        from elsewhere.run.seeding import TaskSeeder
        assert "random" not in sys.modules and "numpy" not in sys.modules
        s = TaskSeeder()
        assert "random" not in sys.modules
        s.begin(3, 4)
        import random
        r = random.random()
        import numpy as np
        v = np.random.rand()
        s.rearm()
        s.begin(3, 5)
        v2, r2 = np.random.rand(), random.random()
        rs = lambda i: np.random.RandomState(np.random.SeedSequence(3, spawn_key=(i,)).generate_state(4))
        assert (r, v) == (random.Random(7).random(), rs(4).rand()), (r, v)
        assert (r2, v2) == (random.Random(8).random(), rs(5).rand()), (r2, v2)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_two_seeders_in_one_process_both_see_a_module_loaded_later():
    # A process with more than one seeder (a test's runners, one after another): each waits
    # for numpy.random with a finder of its own, and the finders ask each other, not forever.
    script = textwrap.dedent("""
        import sys
        from elsewhere.run.seeding import TaskSeeder
        assert "numpy" not in sys.modules
        old = TaskSeeder()
        old.disarm()
        s = TaskSeeder()
        s.begin(5, 2)
        import numpy as np
        v = np.random.rand()
        assert v == np.random.RandomState(np.random.SeedSequence(5, spawn_key=(2,)).generate_state(4)).rand(), v
        assert old._np_module is np.random and s._np_module is np.random
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
