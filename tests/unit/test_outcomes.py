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


def test_a_task_set_behaves_as_a_set_of_its_tasks():
    import random

    from elsewhere.folder.taskmap import TaskSet

    rng = random.Random(7)
    for _ in range(50):
        ts, ref = TaskSet(), set()
        for _ in range(400):
            t = rng.randrange(80)
            op = rng.random()
            if op < 0.4:
                ts.add(t)
                ref.add(t)
            elif op < 0.5:  # a run at once
                end = t + rng.randrange(0, 9)
                ts.add_run(t, end)
                ref.update(range(t, end))
            elif op < 0.6:  # any tasks, runs of them among them
                more = [rng.choice((t + k, rng.randrange(80))) for k in range(rng.randrange(6))]
                ts.update(more)
                ref.update(more)
            else:
                ts.discard(t)
                ref.discard(t)
            a = rng.randrange(80)
            b = a + rng.randrange(1, 12)
            assert ts.overlaps(a, b) == any(a <= x < b for x in ref)
        assert len(ts) == len(ref) and set(ts) == ref and all((t in ts) == (t in ref) for t in range(-1, 90))
        runs = ts.runs()  # as few runs as can be: none touch
        assert all(runs[i][1] < runs[i + 1][0] for i in range(len(runs) - 1)), runs
    many = TaskSet()
    for t in range(100_000):
        many.add(t)
    assert len(many) == 100_000 and many.runs() == [(0, 100_000)]


def test_a_task_set_differs_from_another_as_sets_do_and_copies_apart():
    import random

    from elsewhere.folder.taskmap import TaskSet

    rng = random.Random(11)
    for _ in range(2000):
        n = rng.randrange(1, 70)
        a = {t for t in range(n) if rng.random() < 0.6}
        b = {t for t in range(n) if rng.random() < rng.random()}
        assert TaskSet(a).difference(TaskSet(b)) == sorted(a - b), (a, b)
    ts = TaskSet(range(10))
    copy = ts.copy()
    copy.add(50)
    copy.discard(3)
    assert set(ts) == set(range(10)) and set(copy) == (set(range(10)) - {3}) | {50}
    # what a peer job's snapshot asks: a million ended, all but a few written
    ended, written = TaskSet(), TaskSet()
    for t in range(1_000_000):
        ended.add(t)
        if t % 250_000 != 7:
            written.add(t)
    assert ended.difference(written) == [7, 250_007, 500_007, 750_007]


def test_retired_outcomes_count_but_hold_no_record():
    from elsewhere.folder.journal import JournalReader
    from elsewhere.folder.taskmap import RETIRED

    o = Outcomes()
    for t in range(10):
        o[t] = ("w", rec(t))
    o.retire(range(0, 8))
    assert len(o) == 10 and all(t in o for t in range(10))
    assert sorted(o) == [8, 9]  # iterating leaves retired tasks out (they have no body)
    assert o.get(3) is RETIRED and o._retired.runs() == [(0, 8)] and len(o._single) == 2
    assert not o.add_range(5, 10, ("w", rec(5, 10)))  # over retired tasks: refused
    # a late duplicate of a retired task (a retry's record) does not count again
    reader = JournalReader.__new__(JournalReader)
    reader.final, reader.track = o, None
    reader.kind_counts = dict.fromkeys((int(k) for k in Kind), 0)
    reader.damaged_tasks = set()
    assert reader._add(3, ("w2", rec(3, attempt=5)), o.get(3)) == 0
    del o[3]  # forgetting one (a rerun) still works
    assert 3 not in o and len(o) == 9


def test_absent_gives_the_tasks_without_an_outcome_in_their_order():
    o = Outcomes()
    o.add_range(10, 20, ("w", rec(10, 20)))  # 10..29
    o.add_range(50, 5, ("w", rec(50, 5)))  # 50..54
    for t in (3, 40, 41):
        o[t] = ("w", rec(t))
    o.retire([40])
    asked = [99, 41, 0, 29, 30, 40, 3, 54, 55, 9, 10, -1]
    assert o.absent(asked) == [t for t in asked if t not in o] == [99, 0, 30, 55, 9, -1]
    assert o.absent({}) == [] and Outcomes().absent(range(3)) == [0, 1, 2]


def test_absent_cuts_many_tasks_by_the_runs_of_outcomes_as_one_by_one():
    import random

    o = Outcomes()
    for k in range(40):
        o.add_range(k * 100, 60 + k, ("w", rec(k * 100, 60 + k)))
    for t in (70, 71, 1999, 5000, 5001):
        o[t] = ("w", rec(t))
    o.retire([70, 5000])
    asked = [*range(-5, 4500), 10**9]
    random.Random(7).shuffle(asked)
    assert o.absent(asked) == [t for t in asked if t not in o]
    assert o.absent(dict.fromkeys(asked)) == [t for t in asked if t not in o]  # a dict's keys too
    assert o.absent(list(range(100, 160))) == []


def test_a_task_set_s_gaps_are_the_runs_it_does_not_hold():
    import random

    from elsewhere.folder.taskmap import TaskSet

    rng = random.Random(3)
    for _ in range(500):
        ts = TaskSet(rng.sample(range(60), rng.randint(0, 40)))
        first = rng.randint(-5, 65)
        end = rng.randint(first, 70)
        gaps = ts.gaps(first, end)
        assert [i for a, b in gaps for i in range(a, b)] == [i for i in range(first, end) if i not in ts]
        assert all(a < b for a, b in gaps) and all(x[1] < y[0] for x, y in zip(gaps, gaps[1:]))
    assert TaskSet().gaps(0, 10_000) == [(0, 10_000)]  # a new job: one run


def test_run_end_stops_at_every_task_a_later_outcome_overtook_whatever_came_before():
    # run_end against its definition, through every way the outcomes change: ranges, single
    # records (beside ranges and inside them), forgotten tasks and retired ones
    import random

    rng = random.Random(11)
    for _ in range(40):
        o = Outcomes()
        for _ in range(60):
            t = rng.randrange(120)
            op = rng.random()
            if op < 0.35:
                o.add_range(t, rng.randrange(1, 20), ("w", rec(t, 5)))
            elif op < 0.75:
                o[t] = ("w", rec(t, attempt=1))
            elif op < 0.9:
                if t in o:
                    del o[t]
            else:
                o.retire([t])
            for u in range(125):
                i = o._range_index(u)
                if i < 0:
                    want = u
                else:
                    end = o._ranges[i][1]
                    want = u if any(u <= s < end for s in o._single) else end
                assert o.run_end(u) == want, (u, o._ranges, sorted(o._single))
