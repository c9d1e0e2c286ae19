"""The peer backend: tasks run on workstations of a peer group (FieldTrip's peer toolbox).

Each machine that offers its cores runs ``elsewhere peer worker``; workers
announce themselves by multicast (or to a static list of peers) and are found
without any central server. For each job, :meth:`PeerCluster.submit_independent`
starts a :class:`~elsewhere.peer.controller.Controller` in this process: it
sends each task straight to a chosen worker and stores each result in the job
folder as it arrives. A job recovered in a new process (``ew.recover``) gets a
new controller from ``poll``, which carries on where the old one stopped.

    ew.map(pow, [1, 2, 3], [2, 2, 2], on=ew.peers())
    with ew.Executor(on=ew.peers(memory="2G", time="10min")) as ex:
        fut = ex.submit(fit, start)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..util import paths
from ..util.errors import ConfigError
from ..util.system import process_started
from .base import Cluster, ensure_post_constructed, option_path, option_typed, refuse_unknown

if TYPE_CHECKING:
    from ..folder.handle import JobHandle
    from ..folder.snapshot import Snapshot
    from ..peer.controller import Controller
    from ..peer.discovery import DiscoveryConfig
    from ..peer.keys import GroupKey
    from ..peer.placement import ControllerSettings

__all__ = ["PeerCluster", "peers"]

_DIARY = ("always", "warning", "error", "never")
_carry_on_here = True
_IN_BACKGROUND = "ELSEWHERE_PEER_BACKGROUND_CONTROLLER"  # set in a detached job's controller process
_HAND_OFF = "ELSEWHERE_PEER_HAND_OFF"  # "0": a process that ends leaves its peer jobs waiting (tests)


def carry_on_here(allowed: bool) -> None:
    """Whether looking at an unfinished peer job whose controller is gone may start a new
    one in this process (the default). The command line's one-shot commands (``status``,
    ``results``, ``logs``, ``cancel``) say no: a controller would end with them, its tasks
    half sent; ``elsewhere wait NAME`` carries a job on."""
    global _carry_on_here
    _carry_on_here = allowed


class PeerCluster(Cluster):
    """Workstations running ``elsewhere peer worker``, found by multicast.

    Args:
        group: the peer group; its key is read from ``<config dir>/peer/GROUP.key``
            (made with ``elsewhere peer keygen GROUP``). Default: the group
            "default" if its key exists, else loopback-only mode (workers of
            this user on this machine, no key).
        key: a key file to use instead of the default place.
        memory: memory each task needs ("2G"; a bare number is MiB); workers offering less refuse it,
            and a task that uses more is stopped.
        time: time each task needs ("10min", "1h30m"; a bare number is seconds); a task past it is
            stopped, and one that takes twice as long runs elsewhere too.
        peers: where multicast is not allowed: the other peers, as "host" or
            "host:port" (their discovery ports).
        port: the discovery port (default 17700).
        multicast_group: the discovery group (default 239.255.77.77); None: no
            multicast, only the ``peers`` listed.
        interface: the local IPv4 address of the network to use.
        diary: when a task's printed output comes back: "always", "warning"
            (if it warned or failed), "error" (if it failed), "never".
        prefer_local: place tasks on workers of this machine first.
        encrypt: tasks and results encrypted on the wire (with a key; default); False: only ``--no-encrypt`` workers.
        cores_per_task: cores each task needs (a worker with fewer refuses it).
        detach: where a submitted job's controller runs. None (default): in this
            process while it lives; when it ends (normally: not killed) each unfinished
            job is handed to a background controller, so that it goes on as jobs of the
            other backends do. True: in a background process of its own from the start
            (``elsewhere wait NAME``, its output in the job folder's ``controller.log``).
            False: in this process only; the job waits when it ends. ``ew.map`` and
            ``ew.Executor``, whose callers wait, keep their controllers in their own
            process whatever this says.
        storage: where job folders go (default ``<home>/jobs``).
        additional_properties: none are read by the peer backend (a name given is refused).
    """

    kind = "peer"
    capabilities = frozenset({"stream"})

    def __init__(
        self,
        group: str | None = None,
        *,
        key: str | os.PathLike[str] | None = None,
        memory: str | int | None = None,
        time: str | float | None = None,
        peers: list[Any] | tuple[Any, ...] = (),
        port: int | None = None,
        multicast_group: str | None = "default",
        interface: str | None = None,
        diary: str = "always",
        prefer_local: bool = True,
        encrypt: bool = True,
        cores_per_task: int = 1,
        detach: bool | None = None,
        storage: str | Path | None = None,
        additional_properties: dict[str, Any] | None = None,
        **unknown: Any,
    ) -> None:
        refuse_unknown(self, unknown)  # as ew.slurm: a ConfigError naming the option, not a TypeError
        super().__init__(cores_per_task=cores_per_task, storage=storage,
                         additional_properties=additional_properties)  # fmt: skip
        self.group = group
        self.key_file = option_path("key", key)
        self.memory = memory
        self.time = time
        from ..peer.discovery import parse_peer

        peers = option_typed("peers", peers, (list, tuple), "a list of 'host:port'") or ()
        self.peers = [list(parse_peer(p, 0)) if not isinstance(p, str) else p for p in peers]
        self.port = port
        self.multicast_group = multicast_group
        self.interface = option_typed("interface", interface, str, "an IPv4 address here")
        self.diary = diary
        self.prefer_local = option_typed("prefer_local", prefer_local, bool, "True or False")
        if encrypt not in (True, False) or detach not in (None, True, False):
            raise ConfigError(f"encrypt must be True or False (got {encrypt!r}), detach True, False or None (got {detach!r})")
        self.encrypt, self.detach = encrypt is True, detach
        self._lock = threading.Lock()
        self._controllers: dict[str, Controller] = {}
        self._spawned: dict[str, tuple[subprocess.Popen[bytes], float]] = {}  # job id -> background controller
        ensure_post_constructed(self)

    def settings(self) -> dict[str, Any]:
        return {
            "group": self.group, "key": self.key_file, "memory": self.memory, "time": self.time,
            "peers": self.peers, "port": self.port, "multicast_group": self.multicast_group,
            "interface": self.interface, "diary": self.diary, "prefer_local": self.prefer_local,
            "detach": self.detach, "encrypt": self.encrypt, **super().settings(),
        }  # fmt: skip

    def post_construct(self) -> None:
        from ..util.units import parse_duration, parse_size

        if self.diary not in _DIARY:
            raise ConfigError(f"diary must be one of {', '.join(_DIARY)}, not {self.diary!r}")
        self.mem_bytes = parse_size(self.memory, what="memory") or 0
        time_s = parse_duration(self.time, what="time") or 0.0
        self.time_s = 0.0 if time_s == float("inf") else time_s
        self.group_key = self._find_key()
        self.discovery = self._discovery()

    def _find_key(self) -> GroupKey | None:
        from ..peer.keys import DEFAULT_GROUP, default_key_path, load_key

        if self.key_file is not None:
            return load_key(self.key_file, self.group)
        path = default_key_path(self.group or DEFAULT_GROUP)
        if path.exists():
            return load_key(path, self.group or DEFAULT_GROUP)
        if self.group is not None and self.group != DEFAULT_GROUP:
            raise ConfigError(
                f"no key for peer group {self.group!r} at {path}: make one with "
                f"`elsewhere peer keygen {self.group}` and copy it to the workers"
            )
        return None  # loopback-only mode

    def _discovery(self) -> DiscoveryConfig:
        from ..peer.discovery import (
            DEFAULT_MULTICAST_GROUP,
            DEFAULT_PORT,
            DiscoveryConfig,
            parse_peer,
        )

        port = self.port or DEFAULT_PORT
        group = DEFAULT_MULTICAST_GROUP if self.multicast_group == "default" else self.multicast_group
        static = tuple(parse_peer(p, port) for p in self.peers)
        return DiscoveryConfig(port=port, multicast_group=group, interface=self.interface,
                               static_peers=static)  # fmt: skip

    def shares_filesystem(self) -> bool:
        # The job records the caller's working directory and sys.path; workers use
        # those that exist there. Code of the user's own modules travels by value.
        return True

    def sends_files(self) -> bool:
        return True  # in the job part, once per worker connection (peer/attached.py)

    def max_workers(self, n_tasks: int) -> int:
        return max(1, n_tasks)

    # -- controllers ---------------------------------------------------------------
    def controller_settings(self, job: JobHandle, data: dict[str, Any]) -> ControllerSettings:
        """What the controller of ``job`` needs to know; a new peer id goes into ``data``
        (the job's cluster data, written by the caller)."""
        from ..peer.announce import new_peer_id
        from ..peer.placement import ControllerSettings

        peer_id = data.get("peer_id")
        if not isinstance(peer_id, str) or len(peer_id) != 32:
            peer_id = data["peer_id"] = new_peer_id()
        return ControllerSettings(
            key=self.group_key, discovery=self.discovery, mem_bytes=self.mem_bytes,
            time_s=self.time_s, cores=self.cores_per_task, diary=self.diary,
            prefer_local=self.prefer_local, peer_id=peer_id, encrypt=self.encrypt,
        )  # fmt: skip

    def counters(self, job: JobHandle) -> dict[str, int]:
        """The counters of ``job``'s controller in this process (see ``Controller.counters``)."""
        with self._lock:
            c = self._controllers.get(job.id)
        return c.counters() if c is not None else {}

    def controller(self, job: JobHandle) -> Controller | None:
        """The live controller of ``job`` in this process, if any."""
        with self._lock:
            c = self._controllers.get(job.id)
        return c if c is not None and c.alive() else None

    def _start_controller(self, job: JobHandle) -> Controller:
        from ..peer.controller import Controller

        with self._lock:
            c = self._controllers.get(job.id)
            if c is not None and c.alive():
                return c
            data = self.get_job_cluster_data(job)
            settings = self.controller_settings(job, data)
            c = Controller(job, settings).start()
            self._controllers[job.id] = c
        _stop_at_exit(self)
        data["controller"] = {"host": socket.gethostname(), "pid": os.getpid(),
                              "create_time": process_started(os.getpid())}  # fmt: skip
        self.set_job_cluster_data(job, data)  # its peer id and where it runs, in one write
        return c

    def _other_controller(self, job: JobHandle) -> dict[str, Any] | None:
        """Where the job's controller runs (host, pid), if in another live process here."""
        spawned = self._spawned.get(job.id)
        if spawned is not None:
            spawned[0].poll()  # (a background controller of ours that ended is reaped)
        info = self.get_job_cluster_data(job).get("controller") or {}
        pid = info.get("pid")
        if not isinstance(pid, int) or pid == os.getpid() or info.get("host") != socket.gethostname():
            return None
        ct = process_started(pid)
        return info if ct is not None and abs(ct - float(info.get("create_time") or 0)) < 0.01 else None

    def _shown_elsewhere(self, job: JobHandle) -> dict[str, Any]:
        """What the job's controller in another live process (there is one) says runs
        (see ``Controller._show``)."""
        import json

        from ..peer.controller import RUNNING_FILE

        try:
            shown = json.loads((job.store.path / RUNNING_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return shown if isinstance(shown, dict) and isinstance(shown.get("running"), dict) else {}

    def _runs_here(self, job: JobHandle) -> bool:
        """Whether this process runs the job's controller (else a background one does:
        ``detach``; an Executor's and ``ew.map``'s, whose callers wait, always run here)."""
        meta = job.spec
        return (not self.detach or os.environ.get(_IN_BACKGROUND) == "1" or bool(meta.get("stream"))
                or bool(meta.get("waited")))  # fmt: skip

    def _carry_on(self, job: JobHandle) -> None:
        """Start the job's controller: here, or in a background process (``detach``; not
        again within a minute of the last, whose log then says why it ended)."""
        if self._runs_here(job):
            self._start_controller(job)
            return
        last = self._spawned.get(job.id)
        if last is not None and time.monotonic() - last[1] < 60.0:
            return
        self._spawn_controller(job)

    def _spawn_controller(self, job: JobHandle) -> None:
        """Run the job's controller in a background process: ``elsewhere wait NAME``."""
        # It reads the tasks from the payload, which names the user's modules: it runs
        # where the job was made, with its sys.path, as the workers' children do.
        meta = job.spec
        cwd = meta.get("cwd") if isinstance(meta.get("cwd"), str) and os.path.isdir(meta["cwd"]) else None
        from ..folder.lifecycle import job_folders

        found = job_folders(meta)
        env = {**os.environ, _IN_BACKGROUND: "1", "ELSEWHERE_HOME": str(paths.home()),
               "PYTHONPATH": os.pathsep.join([*found, *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
        log_path = job.store.path / "controller.log"
        from ..hosts.spawn import spawn_python

        # (its PYTHONPATH is the job's folders: this elsewhere is installed where the job was made)
        proc = spawn_python(["-m", "elsewhere", "wait", job.name, "--no-progress"], log=log_path, cwd=cwd, env=env,
                            importable=False)  # fmt: skip
        self._spawned[job.id] = (proc, time.monotonic())
        data = self.get_job_cluster_data(job)  # it is the job's controller from now on
        data["controller"] = {"host": socket.gethostname(), "pid": proc.pid,
                              "create_time": process_started(proc.pid), "log": str(log_path)}  # fmt: skip
        self.set_job_cluster_data(job, data)

    def _no_controller_note(self, job: JobHandle, info: dict[str, Any] | None) -> str:
        """What runs an unfinished, submitted job that has no controller in this process
        (``info``: :meth:`_other_controller`'s)."""
        if info is not None:
            where = f" (its log: {info['log']})" if info.get("log") else ""
            return f"its controller runs in process {info.get('pid')} on {info.get('host')}{where}"
        spawned = self._spawned.get(job.id)
        if spawned is not None:
            return (f"its background controller ended ({spawned[0].returncode}); its log: "
                    f"{job.store.path / 'controller.log'}")  # fmt: skip
        return (f"no controller runs it now (the process that ran it ended): `elsewhere wait {job.name}` "
                f"or ew.recover({job.name!r}).wait() carries it on; workers keep finished results "
                "for 10 minutes (ew.peers(..., detach=True) runs a job's controller in the background)")

    # -- the plugin operations ---------------------------------------------------------
    def submit_independent(self, job: JobHandle) -> None:
        """Start the job's controller in this process (or in the background, ``detach=True``);
        on a retry, the running controller re-reads the queue and places the tasks again."""
        with job.store.locked_queue() as q:
            q.submit(max_workers=max(1, q.n))
        c = self.controller(job)
        if c is not None:
            c.refresh_queue()
            return
        self._carry_on(job)

    def poll(self, job: JobHandle) -> None:
        c = self.controller(job)
        if c is not None:
            if not self._cancelled_elsewhere(job, c):
                c.refresh_queue()
            return
        with self._lock:
            dead = self._controllers.get(job.id)
        if dead is not None and dead.error is not None:
            from ..util.errors import PeerError

            raise PeerError(f"the peer controller of job {job.name!r} failed: "
                            f"{type(dead.error).__name__}: {dead.error}") from dead.error
        q = job.store.queue()
        if not q.submitted or q.cancelled:
            return
        snap = job.snapshot()
        unfinished = len(snap.final) < snap.n or q.to_rerun or not q.closed
        if unfinished and _carry_on_here and self._other_controller(job) is None:
            self._carry_on(job)

    def _cancelled_elsewhere(self, job: JobHandle, c: Controller) -> bool:
        """If another process (``elsewhere cancel``) cancelled the job, stop its controller
        here, telling the workers to drop its running tasks, before saying so."""
        if not job.store.queue().cancelled:
            return False
        c.cancel()
        c.stop()
        return True

    def job_state(self, job: JobHandle, snapshot: Snapshot) -> Snapshot:
        """What the controller knows: the tasks on workers now, its note, why tasks wait."""
        c = self.controller(job)
        if c is None:
            if len(snapshot.final) < snapshot.n and not snapshot.note:
                info = self._other_controller(job)  # (cluster.json and the process: once a look)
                shown = self._shown_elsewhere(job) if info is not None else {}
                running = {int(i): (str(v[0]), float(v[1])) for i, v in shown.get("running", {}).items()
                           if int(i) not in snapshot.final}  # fmt: skip
                return snapshot.but(running=running,
                                    note=str(shown.get("note") or "") or self._no_controller_note(job, info))
            return snapshot
        on_workers = c.running()
        ended = c.on_the_way()  # ended here, not yet durable in the job folder
        final = job.refresh()  # after asking: what left ``on_workers`` before is written now, or in ``ended``
        running = {i: on_workers[i] for i in final.absent(on_workers)}
        now = time.time()
        for i in final.absent(ended):
            if i not in running:
                running[i] = ("", now)  # its result is on its way to the job folder: not queued again
        return snapshot.but(final=final, kind_counts=dict(job.reader.kind_counts), running=running, note=c.note,
                            reasons={i: r for i, r in dict(c.reasons).items() if i not in final})  # fmt: skip

    def tasks_added(self, job: JobHandle) -> None:
        """The Executor appended a task to a stream job: place it now."""
        c = self.controller(job)
        if c is None:
            c = self._start_controller(job)
        c.tasks_added()

    def executor_link(self, job: JobHandle, on_outcome: Any) -> Controller:
        """For an ``ew.Executor`` on stream job ``job``: its controller in this process,
        which takes tasks in memory (``put``) and calls ``on_outcome(index, ok, value,
        seed)`` with each value as it arrives (the job folder is written all the same)."""
        c = self.controller(job)
        if c is None:
            c = self._start_controller(job)
        c.on_outcome = on_outcome
        return c

    def cancel_job(self, job: JobHandle) -> None:
        c = self.controller(job)
        if c is not None:
            c.cancel()
            c.stop()

    def cancel_task(self, job: JobHandle, index: int) -> None:
        c = self.controller(job)
        if c is not None:
            c.cancel_task(index)

    def delete_job(self, job: JobHandle) -> None:
        with self._lock:
            c = self._controllers.pop(job.id, None)
        if c is not None:
            if c.alive() and not job.state.done:
                c.cancel()
            c.stop()
        if self._other_controller(job) is not None:  # a background controller: it ends with
            if not job.state.done:  # the job (cancelled first), acknowledging its results
                with job.store.locked_queue() as q:
                    q.cancel_job()
                job.store.notify()
            deadline = time.monotonic() + 10.0
            while self._other_controller(job) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
        spawned = self._spawned.pop(job.id, None)
        if spawned is not None and spawned[0].poll() is None:  # ours, and deaf: interrupted
            spawned[0].send_signal(signal.SIGINT)  # (its controller still stops, at exit)
            with contextlib.suppress(subprocess.TimeoutExpired):
                spawned[0].wait(5)

    def stop(self, timeout: float = 5.0) -> list[Controller]:
        """Stop every controller of this cluster object (results so far are kept); returns
        them."""
        with self._lock:
            controllers = list(self._controllers.values())
            self._controllers.clear()
        for c in controllers:
            c.stop(timeout)
        return controllers

    def _leave(self, timeout: float = 2.0) -> None:
        """This process ends: stop its controllers, and (``detach`` left at None) hand
        each unfinished job to a background controller, so that it goes on as jobs of the
        other backends do. An Executor's job ends with its Executor."""
        hand_off = (self.detach is None and os.environ.get(_HAND_OFF, "1") != "0"
                    and os.environ.get(_IN_BACKGROUND) != "1")  # fmt: skip
        for c in self.stop(timeout):
            job = c.job
            if not hand_off or job.spec.get("stream"):
                continue
            with contextlib.suppress(Exception):
                q = job.store.queue()
                if q.submitted and not q.cancelled and not job.state.done:
                    self._spawn_controller(job)


_AT_EXIT: weakref.WeakSet[PeerCluster] = weakref.WeakSet()
_registered = False


def _stop_at_exit(cluster: PeerCluster) -> None:
    """Stop ``cluster``'s controllers when the interpreter exits, rather than cut them off:
    the results they stored are acknowledged (else the workers keep them for their grace,
    and a worker that is stopping waits for them) and the workers hear them leave."""
    global _registered
    if not _registered:
        atexit.register(_stop_all)
        _registered = True
    _AT_EXIT.add(cluster)


def _stop_all() -> None:
    for cluster in list(_AT_EXIT):
        with contextlib.suppress(Exception):
            cluster._leave(timeout=2.0)
    _AT_EXIT.clear()


def peers(group: str | None = None, *, memory: str | int | None = None,
          time: str | float | None = None, **settings: Any) -> PeerCluster:  # fmt: skip
    """The peer network (FieldTrip's peercellfun / peerfeval): see :class:`PeerCluster`."""
    return PeerCluster(group, memory=memory, time=time, **settings)

