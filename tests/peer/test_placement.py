"""How many tasks a controller asks a worker to take at once."""

from __future__ import annotations

import math

from elsewhere.peer.announce import Announcement, PeerState
from elsewhere.peer.peertable import PeerInfo
from elsewhere.peer.placement import BATCH_BYTES, ControllerSettings, Worker, batch_size


def _worker(time_s: float = math.inf) -> Worker:
    ann = Announcement(peer_id="ab" * 16, group="lab", address="10.0.0.5", port=7001, user="u", host="h",
                       state=PeerState.IDLE, slots=2, slots_free=2, mem_bytes=8 << 30, time_s=time_s,
                       task=None, timestamp=0.0, counter=1)  # fmt: skip
    return Worker(ann.peer_id, PeerInfo(ann, ("10.0.0.5", 17700), 0.0, 0.0))


def test_one_task_until_one_was_measured_then_a_batch_of_the_target_time() -> None:
    s = ControllerSettings(batch_target_s=0.02)
    w = _worker()
    assert batch_size(s, w, total_slots=2, pending=10_000, mean_s=0.0, n_measured=0) == 1
    assert batch_size(s, w, total_slots=2, pending=10_000, mean_s=0.001, n_measured=5) == 20
    # at most half a fair share of what is left
    assert batch_size(s, w, total_slots=2, pending=40, mean_s=0.001, n_measured=5) == 10


def test_the_end_of_a_job_of_tiny_tasks_goes_in_batches_of_the_least_time_not_one_by_one() -> None:
    s = ControllerSettings(batch_target_s=0.1, batch_min_s=0.002)
    w = _worker()
    # 10 us tasks: a batch holds at least 2 ms of them, however few are left to share
    assert batch_size(s, w, total_slots=2, pending=40, mean_s=1e-5, n_measured=5) == 200
    assert batch_size(s, w, total_slots=2, pending=10_000, mean_s=1e-5, n_measured=5) == 2500
    # tasks of a second: half a fair share still, down to one (the least time is no task)
    assert batch_size(s, w, total_slots=2, pending=40, mean_s=1.0, n_measured=5) == 1
    assert batch_size(s, w, total_slots=2, pending=40, mean_s=1e-5, n_measured=0) == 1  # not measured yet
    # a job of 10 000 tiny tasks on 2 slots: how many batches it takes, each of what is left

    def batches(settings: ControllerSettings) -> int:
        pending, n = 10_000, 0
        while pending:
            pending -= min(pending, batch_size(settings, w, total_slots=2, pending=pending, mean_s=1e-5, n_measured=5))
            n += 1
        return n

    assert batches(s) == 13 and batches(ControllerSettings(batch_target_s=0.1, batch_min_s=0.0)) == 30


def test_batches_bring_back_at_most_a_gigabyte_of_results() -> None:
    s = ControllerSettings(batch_target_s=0.02)
    w = _worker()
    # quick tasks with 300 MB results: three to a batch, not twenty (a RESULT is one frame)
    assert batch_size(s, w, 2, 10_000, 0.001, 5, bytes_per_task=300e6) == BATCH_BYTES // int(300e6) == 3
    # a result larger than that alone: one task at a time
    assert batch_size(s, w, 2, 10_000, 0.001, 5, bytes_per_task=2e9) == 1
    assert batch_size(s, w, 2, 10_000, 0.001, 5, bytes_per_task=100.0) == 20  # tiny results: no limit


def test_a_job_context_is_who_sent_it_and_where_its_imports_come_from() -> None:
    from elsewhere.peer.runs import job_context

    job = {"id": "a", "name": "fit", "cwd": "/home/u/project", "sys_path": ["/home/u/project", "/opt/lib"],
           "env": {"A": "1", "B": "2"}, "seed": 3}  # fmt: skip
    same = job_context("u", "h", job)
    # another job (id, name, seed) of the same folder, paths and environment: the same context
    assert job_context("u", "h", {**job, "id": "b", "name": "fit2", "seed": 4,
                                  "env": {"B": "2", "A": "1"}}) == same  # fmt: skip
    # anything that changes what an import loads, or who asks, is another
    assert job_context("v", "h", job) != same
    assert job_context("u", "g", job) != same
    assert job_context("u", "h", {**job, "cwd": "/home/u/other"}) != same
    assert job_context("u", "h", {**job, "sys_path": ["/opt/lib", "/home/u/project"]}) != same
    assert job_context("u", "h", {**job, "env": {"A": "1"}}) != same


def test_a_task_longer_than_a_batch_goes_alone_whatever_else_the_size_would_weigh() -> None:
    s = ControllerSettings(batch_target_s=0.1, batch_min_s=0.002)
    w = _worker(time_s=50.0)
    for pending in (1, 3, 10_000, 10**7):
        for least in (True, False):
            assert batch_size(s, w, total_slots=1, pending=pending, mean_s=0.4, n_measured=3, least=least) == 1
    # a task of exactly the batch's time: one too, by the general rule
    assert batch_size(s, w, total_slots=1, pending=10_000, mean_s=0.1, n_measured=3) == 1


def test_an_ask_a_controller_makes_is_the_ask_the_wire_reads() -> None:
    from elsewhere.peer.messages import Ask

    made = Ask.made("ctl-7", 1 << 20, 2.5, 2)
    assert made == Ask("ctl-7", mem_bytes=1 << 20, time_s=2.5, cores=2)
    assert made.to_header() == Ask("ctl-7", mem_bytes=1 << 20, time_s=2.5, cores=2).to_header()
    assert isinstance(Ask.made("ctl-8", 0, 0, 1).time_s, float)


def test_the_task_result_and_ack_an_end_makes_are_those_the_wire_reads() -> None:
    # made without their checks (the receiver checks what it reads): each must equal the
    # checked message and read back the same from its header
    import msgpack

    from elsewhere.peer.messages import Ack, Ask, Result, Task, parse_header

    info = {"items": [[3, 0]], "fn": "f-1", "nfn": 1}
    folded = Task.folding(Ask.made("ctl-9", 0, 1.5, 1))
    cases = [
        (Task.made("ctl-8", info, folded), Task("ctl-8", info, folded)),
        (Task.made("ctl-8", info), Task("ctl-8", info)),
        (Result.made("ctl-8", info, ("ctl-9",)), Result("ctl-8", info, ("ctl-9",))),
        (Result.made("ctl-8", info), Result("ctl-8", info)),
        (Ack.made("ctl-8", ("ctl-9", "ctl-10")), Ack("ctl-8", ("ctl-9", "ctl-10"))),
        (Ack.made("ctl-8"), Ack("ctl-8")),
    ]
    for made, checked in cases:
        assert made == checked and made.to_header() == checked.to_header()
        assert parse_header(msgpack.packb(made.to_header()), made.TYPE) == checked
