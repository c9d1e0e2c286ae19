"""How many array elements a batch job gets (backends/packing.py), on made-up queue states."""

from __future__ import annotations

import pytest

from elsewhere.backends.packing import ELEMENT_START_S, LONG_TASK, Packing, plan_elements
from elsewhere.schedulers.capacity import FreeCpus


def plan(n, idle=None, usable=None, **kw):
    cpus = FreeCpus(idle, usable) if usable is not None else None
    return plan_elements(n, cpus=cpus, **kw)


def test_more_tasks_than_usable_slots_are_packed_into_that_many_claiming_elements():
    p = plan(1000, idle=8, usable=8)
    assert (p.elements, p.claims) == (8, True)
    assert "8 usable slots" in p.why


def test_fewer_tasks_than_slots_get_one_element_each_given_their_task():
    p = plan(4, idle=8, usable=8)
    assert (p.elements, p.per_element, p.claims) == (4, 1, False)
    assert plan(8, idle=8, usable=8).per_element == 1


def test_a_busy_queue_still_gets_as_many_elements_as_it_has_cpus_in_service():
    # none idle now: the elements wait for CPUs that free up, and claim what is left then
    assert plan(1000, idle=0, usable=8).elements == 8
    # CPUs down or drained do not count (sinfo's "other")
    assert plan(1000, idle=2, usable=4).elements == 4
    # a large queue: one element per task, as many as the tasks
    p = plan(300, idle=40, usable=10_000)
    assert (p.elements, p.per_element) == (300, 1)


def test_cores_per_task_max_running_and_max_elements_bound_the_elements():
    assert plan(100, idle=8, usable=8, cores_per_task=4).elements == 2
    assert plan(100, idle=8, usable=64, cores_per_task=3).elements == 21
    assert plan(100, idle=1, usable=2, cores_per_task=4).elements == 1  # never none
    p = plan(100, idle=8, usable=8, max_running=3)
    assert (p.elements, p.claims) == (3, True) and "max_running" in p.why
    p = plan(5000, idle=9000, usable=9000, max_elements=1000)
    assert (p.elements, p.claims) == (1000, True)


def test_an_unknown_queue_bounds_the_elements_by_the_tasks_and_max_elements():
    p = plan(500)
    assert (p.elements, p.per_element) == (500, 1)  # as many as before, one task each
    p = plan(1500, max_elements=1000)
    assert (p.elements, p.claims) == (1000, True)


def test_tasks_per_element_wins():
    p = plan(1000, idle=8, usable=8, tasks_per_element=1)
    assert (p.elements, p.per_element, p.claims) == (1000, 1, False)
    p = plan(10, idle=8, usable=8, tasks_per_element=3)
    assert (p.elements, p.per_element) == (4, 3)


def test_measured_long_tasks_get_one_element_each_whatever_the_queue():
    long_s = LONG_TASK * ELEMENT_START_S
    p = plan(1000, idle=8, usable=8, mean_s=long_s)
    assert (p.elements, p.per_element, p.claims) == (1000, 1, False)
    assert "one element per task" in p.why
    p = plan(1500, idle=8, usable=8, mean_s=long_s, max_elements=1000)
    assert (p.elements, p.per_element) == (750, 2)  # the array stays within max_elements
    # a measured start-up sets what "long" means
    assert plan(100, idle=8, usable=8, mean_s=5.0, start_s=0.4).per_element == 1
    assert plan(100, idle=8, usable=8, mean_s=5.0, start_s=1.0).claims


def test_measured_short_tasks_get_no_more_elements_than_can_start_now_or_their_work_needs():
    # 1000 x 10 ms = 10 s of work on 8 idle of 100 usable slots: the 8 that start now
    p = plan(1000, idle=8, usable=100, mean_s=0.01)
    assert (p.elements, p.claims) == (8, True) and "idle" in p.why
    # 100 x 1 ms = 0.1 s of work: less than one element's start, so one element
    p = plan(100, idle=8, usable=8, mean_s=0.001)
    assert (p.elements, p.claims) == (1, True)
    # 20 x 0.2 s = 4 s of work, one element's start is 1 s: 4 elements
    assert plan(20, idle=8, usable=8, mean_s=0.2).elements == 4


def test_elements_that_cannot_claim_are_given_even_shares():
    p = plan(1000, idle=8, usable=8, can_claim=False)
    assert (p.elements, p.per_element, p.claims) == (8, 125, False)
    p = plan(10, idle=4, usable=4, can_claim=False)
    assert (p.elements, p.per_element) == (4, 3)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="at least one task"):
        plan(0, idle=8, usable=8)
    with pytest.raises(ValueError, match="elements"):
        Packing(0, 1, "x")
    with pytest.raises(ValueError, match="idle=9 is more than usable=8"):
        FreeCpus(9, 8)
    with pytest.raises(ValueError, match="non-negative"):
        FreeCpus(-1, 8)
