"""journal.Outcomes: a task -> outcome mapping that keeps range records whole."""

import pytest

from elsewhere.folder.journal import Outcomes
from elsewhere.folder.records import Kind, Record


def rec(task, count=1, attempt=0):
    return Record(int(Kind.OK), 0, attempt, task, 0, count)


def as_dict(o):
    return {t: o[t] for t in o}


def test_it_reads_like_the_dict_it_replaces():
    o, d = Outcomes(), {}
    a, b, c = ("w1", rec(0, 100)), ("w2", rec(100, 50)), ("w1", rec(150))
    assert o.add_range(0, 100, a) and o.add_range(100, 50, b)
    o[150] = c
    d.update(dict.fromkeys(range(100), a))
    d.update(dict.fromkeys(range(100, 150), b))
    d[150] = c
    assert len(o) == len(d) == 151
    assert as_dict(o) == d and sorted(o) == sorted(d)
    assert all(o.get(t) == d.get(t) and (t in o) == (t in d) for t in range(-2, 160))
    assert o.get(151, "none") == "none" and "x" not in o
    with pytest.raises(KeyError):
        o[151]


def test_a_range_over_known_outcomes_is_refused():
    o = Outcomes()
    assert o.add_range(10, 10, ("w", rec(10, 10)))
    assert not o.add_range(15, 10, ("w", rec(15, 10)))  # overlaps a range
    assert not o.add_range(5, 6, ("w", rec(5, 6)))      # its last task is taken
    o[30] = ("w", rec(30))
    assert not o.add_range(25, 10, ("w", rec(25, 10)))  # over a single outcome
    assert o.add_range(20, 10, ("w", rec(20, 10)))      # right between them
    assert len(o) == 21


def test_a_later_attempt_overrides_one_task_of_a_range():
    o = Outcomes()
    first = ("w1", rec(0, 10))
    o.add_range(0, 10, first)
    retry = ("w2", rec(4, attempt=1))
    o[4] = retry
    assert len(o) == 10 and o[4] == retry and o[3] == first and o[5] == first
    assert o.run_end(0) == 0 and o.run_end(5) == 10  # a slice may not cross task 4
    assert o.run_end(4) == 4 and o.run_end(10) == 10


def test_forgetting_a_task_of_a_range_keeps_the_others():
    o = Outcomes()
    entry = ("w1", rec(0, 10))
    o.add_range(0, 10, entry)
    del o[3]
    assert len(o) == 9 and 3 not in o and all(o[t] == entry for t in range(10) if t != 3)
    assert sorted(o) == [t for t in range(10) if t != 3]
    with pytest.raises(KeyError):
        del o[3]
