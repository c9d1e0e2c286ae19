"""serial.dumps: the standard pickler where a reference is enough, cloudpickle where not."""

import os
import pickle
import subprocess
import sys
import types

import cloudpickle
import numpy as np

from elsewhere.folder import serial


def module_level(x):
    return x + 1


class Point:
    def __init__(self, x):
        self.x = x


def by_cloudpickle(data: bytes) -> bool:
    return b"cloudpickle" in data


def roundtrip(obj):
    data, bufs = serial.dumps(obj)
    return data, serial.loads(data, bufs)


def test_importable_functions_and_plain_data_use_the_standard_pickler():
    for obj in (module_level, os.path.join, (1, "a", 2.5), {"k": [Point(3)]}):
        data, _ = roundtrip(obj)
        assert not by_cloudpickle(data), obj
    assert roundtrip(module_level)[1] is module_level
    assert roundtrip({"k": [Point(3)]})[1]["k"][0].x == 3


def test_large_arrays_stay_out_of_band():
    a = np.arange(100_000, dtype=np.float64)
    data, bufs = serial.dumps([a, 1])
    assert not by_cloudpickle(data) and len(bufs) == 1 and len(data) < 1000
    assert np.array_equal(serial.loads(data, bufs)[0], a)


def test_lambdas_and_closures_travel_by_value():
    k = 10
    for fn in (lambda x: x * 2, (lambda: (lambda x: x + k))()):
        data, back = roundtrip(fn)
        assert by_cloudpickle(data)
        assert back(1) == fn(1)


def test_the_shared_generators_functions_travel_by_name_not_with_a_copy_of_the_generator():
    import random

    # np.random.rand is a method of NumPy's hidden global RandomState: pickled as Python
    # does, the generator goes with it, its state copied, and every task draws the same.
    for fn, module, args in ((np.random.rand, np.random, (3,)), (np.random.normal, np.random, ()),
                             (random.random, random, ()), (random.uniform, random, (0, 1))):
        for obj in (fn, [fn, lambda: 0]):  # the standard pickler, and cloudpickle's
            data, back = roundtrip(obj)
            got = back if obj is fn else back[0]
            assert b"RandomState" not in data and b"_randomstate" not in data
            module.seed(11)
            drawn = got(*args)
            module.seed(11)  # it drew from the module's generator, as fn itself does
            assert np.array_equal(drawn, fn(*args)), fn
        got = pickle.loads(serial.dumps_inband([fn, lambda: 0]))[0]
        assert pickle.loads(pickle.dumps(got)).name == fn.__name__
    # a generator of one's own is data: it travels with its state
    rng = np.random.RandomState(3)
    assert roundtrip(rng.rand)[1]() == np.random.RandomState(3).rand()


def test_functions_of_a_module_sent_by_value_travel_by_value():
    bv = serial.by_value_for([])
    bv.modules = [sys.modules[__name__]]  # as if the worker could not import this module
    with bv:
        data, _ = serial.dumps([module_level, Point(1)])
    assert by_cloudpickle(data)
    assert not by_cloudpickle(serial.dumps(module_level)[0])  # and by reference again after


def test_a_module_the_user_registered_with_cloudpickle_travels_by_value():
    mod = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(mod)
    try:
        assert by_cloudpickle(serial.dumps(module_level)[0])
    finally:
        cloudpickle.unregister_pickle_by_value(mod)


def test_functions_of_a_module_gone_from_sys_modules_travel_by_value():
    mod = types.ModuleType("made_at_runtime_ew")
    exec("def g(x):\n    return x * 3\n", mod.__dict__)
    data, back = roundtrip(mod.g)
    assert by_cloudpickle(data) and back(2) == 6


def test_this_package_never_travels_by_value():
    # every worker runs it, even when it is a checkout outside site-packages (a registered
    # module stays registered for the whole process: its classes would all go by value)
    assert not serial.needs_by_value("elsewhere.folder.serial", shared_fs=False)
    assert not serial.needs_by_value("elsewhere", shared_fs=False)
    assert serial.needs_by_value(__name__, shared_fs=False)


def test_functions_of_a_script_travel_by_value():
    # __main__ of another process: the standard pickler would write a reference to
    # a name this process does not have.
    script = ("import sys\nfrom elsewhere.folder import serial\n"
              "class C:\n    pass\n"
              "def f(x):\n    return x + 41\n"
              "data, _ = serial.dumps([f, C()])\nsys.stdout.buffer.write(data)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, check=True)
    assert by_cloudpickle(out.stdout)
    f, c = serial.loads(out.stdout)
    assert f(1) == 42 and type(c).__name__ == "C"


def test_by_value_blocks_nest_across_threads():
    # Two submissions from two threads send the same module by value: neither may
    # unregister it while the other still pickles (cloudpickle's registry is global).
    import threading

    mod = sys.modules[__name__]
    errors = []
    inside = threading.Barrier(2, timeout=30)

    def submit():
        try:
            bv = serial.by_value_for([])
            bv.modules = [mod]
            with bv:
                inside.wait()
                for _ in range(50):
                    assert by_cloudpickle(serial.dumps(module_level)[0])
                inside.wait()  # both still inside: neither has left yet
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not by_cloudpickle(serial.dumps(module_level)[0])  # unregistered after the last one
    assert not cloudpickle.cloudpickle._is_registered_pickle_by_value(mod)
