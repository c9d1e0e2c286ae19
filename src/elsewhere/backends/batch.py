"""The shared base of every batch scheduler (SLURM, SGE, PBS, LSF, HTCondor, Flux).

A scheduler brings a *syntax* (``elsewhere.schedulers``): a state table, a
job-script template and pure command builders and parsers. This base does
the rest, the same way for all of them::

    job.submit()
      └─ submit_independent: size the array (packing.py: the queue's usable
         slots, the tasks' measured times, tasks_per_element); one element per
         chunk of tasks, or fewer elements than tasks that claim them from the
         job's queue (claiming.py); write submissions/<n>.json (element k ->
         its tasks, [] when it claims them); render
         the script; mirror the job folder up (remote_storage); run the
         submit command (here, or on the login node over ssh); keep the
         native ids with set_job_cluster_data
    job.check() / wait()
      └─ poll + job_state: mirror results down; one status command for all
         jobs of this cluster, at most every status_interval_s (backing off
         while nothing changes); accounting for jobs that left the queue;
         elements that ended without a result for some of their tasks make
         those tasks failed: "lost", with the scheduler's reason

The worker on the other side is ``python -m elsewhere.worker --job DIR``; it
reads which tasks are its own from the environment the script exports:

    ELSEWHERE_SUBMISSION   path of submissions/<n>.json (a list of chunks)
    ELSEWHERE_ARRAY_VAR    the name of the scheduler's array index variable
    ELSEWHERE_ARRAY_BASE   the scheduler's first index (SGE, LSF: 1)
    ELSEWHERE_WALLTIME_S   with walltime=: an element that claims stops in time
    ELSEWHERE_JOB_DIR      the job folder (as the worker sees it)
    ELSEWHERE_WORKER_ID    optional; default derived from host, pid, index
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..folder.store import write_json
from ..util.command import PythonCommand
from ..util.errors import CommandNotFound, ConfigError, ElsewhereError, SchedulerError
from .base import (
    Cluster,
    ensure_post_constructed,
    option_seconds,
    option_text,
    option_words,
    refuse_unknown,
)
from .batchstatus import BatchStatus, chunk_tasks
from .packing import packed_record, plan_job
from .remote import RemoteCluster, clean_environment

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..folder.handle import JobHandle
    from ..schedulers.capacity import FreeCpus
    from ..schedulers.syntax import NativeStatus, SchedulerSyntax
    from .packing import Packing

#: Variables of a submitting shell that must not leak into a new job
#: (submitting from inside an allocation is a common trap).
LEAKY_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "PBS_", "LSB_", "SGE_TASK", "FLUX_")

def _parse_mem_mb(value: Any, what: str = "mem") -> int | None:
    if value is None:
        return None
    from ..schedulers.resources import parse_memory_mb

    return parse_memory_mb(value, what=what)


class BatchCluster(BatchStatus, RemoteCluster):
    """A batch scheduler reached through its commands.

    Args:
        queue: the queue (partition on SLURM).
        partition: the same as queue, in SLURM's word.
        account: what to charge (account, project).
        qos: the quality of service (SLURM; LSF's service class).
        walltime: per array element: "90min", "1h30m", "01:00:00", "1-12:00:00", seconds.
        mem: memory per task ("4G", "512M"; a bare number is MiB: docs/units.md).
        mem_per_core: memory per core, instead of mem.
        gpus: GPUs per task.
        cores_per_task: cores each task gets (as on every cluster).
        tasks_per_element: tasks run one after another in each array element, given to it.
            Default: one element per task while the job has no more tasks than the queue
            has usable slots (sinfo, ``qstat -g c``), else that many elements, which claim
            the tasks from the job's queue as they go (docs/schedulers.md, "Packing").
        max_elements: the most array elements one job gets (default 1000).
        max_running: at most this many elements run at once (SLURM %N).
        template: a template's name (config dir or built in) or its text.
        env_setup: shell lines before the run line ("module load python").
        extra_args: words added to the submit command; they win over the template.
        python: the worker's interpreter, or a command line that ends in one:
            "apptainer exec --nv img.sif python3", "module load python/3.11 && python3",
            a list of words. Its words are quoted one by one in the job script, setup
            before ; or && becomes lines before the run line (docs/schedulers.md).
            Default: this interpreter, or "python3" on a remote host.
        host: run scheduler commands on this login node over ssh (ssh_options,
            ssh_config: as for ssh nodes).
        remote_storage: the job folder's place on the cluster when it shares
            no file system with this machine (mirrored both ways).
        status_interval_s: least time between two status commands.
        syntax_options: settings for the scheduler's syntax (e.g. SLURM accounting).
        launcher: the MPI launcher of communicating jobs inside the allocation
            (default per scheduler: "srun --mpi=pmix" on SLURM, else "mpiexec").
        storage: where job folders go on this machine (default ``<home>/jobs``).
        additional_properties: free settings that job-script templates read
            (``additional.get("pe", "smp")``); any name is accepted.
        check: run the post-construct checks (commands on PATH, the template renders)
            now; False when a cluster is rebuilt only to read a job.
    """

    kind: ClassVar[str] = ""
    #: The key of the syntax in elsewhere.schedulers (defaults to ``kind``).
    syntax_name: ClassVar[str] = ""
    #: Any name: job-script templates (a user's own included) read what they like from
    #: ``additional`` (``additional.get("pe", "smp")``).
    properties = None
    capabilities = frozenset({"communicating", "retry_resources"})

    def __init__(
        self,
        *,
        queue: str | None = None,
        partition: str | None = None,
        account: str | None = None,
        qos: str | None = None,
        walltime: str | int | None = None,
        mem: str | int | None = None,
        mem_per_core: str | int | None = None,
        gpus: int = 0,
        cores_per_task: int = 1,
        tasks_per_element: int | None = None,
        max_elements: int = 1000,
        max_running: int | None = None,
        template: str | None = None,
        env_setup: list[str] | tuple[str, ...] = (),
        extra_args: list[str] | tuple[str, ...] = (),
        python: str | Sequence[str] | None = None,
        host: str | None = None,
        remote_storage: str | None = None,
        ssh_options: list[str] | tuple[str, ...] = (),
        ssh_config: str | None = None,
        status_interval_s: float = 5.0,
        syntax_options: dict[str, Any] | None = None,
        launcher: str | None = None,
        storage: str | Path | None = None,
        additional_properties: dict[str, Any] | None = None,
        check: bool = True,
        **scheduler_args: Any,
    ) -> None:
        super().__init__(host=host, remote_storage=remote_storage, ssh_options=ssh_options, ssh_config=ssh_config,
                         cores_per_task=cores_per_task, storage=storage,
                         additional_properties=additional_properties)  # fmt: skip
        from ..schedulers import get_syntax
        from ..schedulers.resources import parse_walltime

        for option, text in (("queue", queue), ("partition", partition), ("account", account), ("qos", qos),
                             ("launcher", launcher)):  # fmt: skip
            option_text(option, text)
        if syntax_options is not None and not isinstance(syntax_options, dict):
            raise ConfigError(f"syntax_options must be a dict, not {syntax_options!r}")
        if queue and partition and queue != partition:
            raise ConfigError(f"queue={queue!r} and partition={partition!r} disagree; give one")
        self.queue = queue or partition
        self.account = account
        self.qos = qos
        self.walltime_s = parse_walltime(walltime) if walltime is not None else None
        self.walltime = walltime
        if mem is not None and mem_per_core is not None:
            raise ConfigError("give mem (per task) or mem_per_core, not both")
        self.mem = mem
        self.mem_per_core = mem_per_core
        per_core = _parse_mem_mb(mem_per_core, "mem_per_core")
        total = _parse_mem_mb(mem)
        self.mem_per_core_mb = per_core if per_core else (
            math.ceil(total / cores_per_task) if total else None)
        if not isinstance(gpus, int) or gpus < 0:
            raise ConfigError(f"gpus must be a non-negative integer, not {gpus!r}")
        self.gpus = gpus
        if tasks_per_element is not None and (not isinstance(tasks_per_element, int) or tasks_per_element < 1):
            raise ConfigError(f"tasks_per_element must be a positive integer, not {tasks_per_element!r}")
        self.tasks_per_element = tasks_per_element
        if not isinstance(max_elements, int) or max_elements < 1:
            raise ConfigError(f"max_elements must be a positive integer, not {max_elements!r}")
        self.max_elements = max_elements
        if max_running is not None and (not isinstance(max_running, int) or max_running < 1):
            raise ConfigError(f"max_running must be a positive integer, not {max_running!r}")
        self.max_running = max_running
        self.template = option_text("template", template)
        self.env_setup = option_words("env_setup", env_setup)
        # the scheduler's own name for free extra arguments: sbatch=[...], qsub=[...]
        extra = option_words("extra_args", extra_args)
        for key, value in scheduler_args.items():
            if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                extra += list(value)
            else:
                refuse_unknown(self, {key: value})  # names what it takes
        self.extra_args = extra
        self._scheduler_args = dict(scheduler_args)
        self.python = python
        self._command = (PythonCommand.parse(python) if python is not None else
                         PythonCommand(("python3",) if host else (sys.executable,)))
        self.status_interval_s = option_seconds("status_interval_s", status_interval_s)
        self.syntax_options = dict(syntax_options or {})
        self.launcher = launcher
        self.syntax: SchedulerSyntax = get_syntax(self.syntax_name or self.kind, **self.syntax_options)
        self._status_cache: tuple[float, dict[str, NativeStatus]] | None = None
        self._max_array: int | None = None  # the scheduler's largest array, once asked
        self._status_jobs: set[str] = set()
        self._interval = self.status_interval_s
        self._last_change = 0.0
        self.commands_run: list[list[str]] = []
        self._check = check
        if check:
            ensure_post_constructed(self)

    # -- description ----------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        s: dict[str, Any] = {
            "queue": self.queue, "account": self.account, "qos": self.qos, "walltime": self.walltime,
            "mem": self.mem, "mem_per_core": self.mem_per_core, "gpus": self.gpus,
            "tasks_per_element": self.tasks_per_element, "max_elements": self.max_elements,
            "max_running": self.max_running, "template": self.template, "env_setup": self.env_setup,
            "extra_args": self.extra_args, "python": self.python,
            "status_interval_s": self.status_interval_s, "syntax_options": self.syntax_options,
            "launcher": self.launcher,
            **super().settings(),
        }
        return s

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> Cluster:
        return cls(check=False, **settings)

    # -- where commands run -------------------------------------------------------
    def _run(self, argv: list[str], *, check: bool = True, timeout: float = 120.0, cwd: str | None = None) -> Any:
        """Run one scheduler command, without the submitting shell's scheduler variables."""
        clean = [*clean_environment(LEAKY_PREFIXES), *argv] if not self.host else argv
        self.commands_run.append(list(argv))
        try:
            return self.run_command(clean, check=check, timeout=timeout, cwd=cwd)
        except CommandNotFound as exc:
            raise CommandNotFound(f"{argv[0]!r} is not installed on {self.host or 'this machine'} (is this a "
                                  f"{self.kind} submit host?)", command=argv, returncode=exc.returncode,
                                  stderr=exc.stderr) from None  # fmt: skip
        except SchedulerError as exc:
            name = argv[0] if argv[0] not in ("sh", "bash") else f"{self.syntax.submit_command} (via {argv[0]})"
            raise SchedulerError(f"{name} failed", command=argv, returncode=exc.returncode,
                                 stderr=exc.stderr) from None  # fmt: skip

    def post_construct(self) -> None:
        from ..schedulers.syntax import ScriptContext

        if not self.host:
            import shutil

            for cmd in {self.syntax.submit_command, self.syntax.status_command, self.syntax.cancel_command}:
                if shutil.which(cmd) is None:
                    raise CommandNotFound(
                        f"the {self.kind} cluster needs {cmd!r}, which is not on PATH here "
                        f"(is this a {self.kind} submit host? or give host= to submit from a login node)",
                        command=[cmd])
        # The template must render with every field.
        self.syntax.render_script(
            ScriptContext(job_name="check", run_line="true", log_dir="/tmp", cores_per_task=self.cores_per_task),
            self._template_text())

    def _template_text(self) -> str | None:
        if not self.template:
            return None
        if "\n" in self.template:
            return self.template
        from ..schedulers.jobscripts import find_template

        return find_template(self.template, self.kind)

    # -- building the script ----------------------------------------------------
    def python_command(self) -> PythonCommand:
        """How the job script starts Python: ``python=``, parsed (its setup lines go after
        ``env_setup``, its words quoted one by one on the run line)."""
        return self._command

    def script_context(self, job: JobHandle, n_elements: int, submission: str, *, resources: dict[str, Any] | None = None) -> Any:
        from ..schedulers import ScriptContext, parse_walltime

        resources = dict(resources or {})
        command = self.python_command()
        wdir = self.worker_dir(job)
        run_line = command.shell("-m", "elsewhere.worker", "--job", wdir)
        base = self.syntax.array_index_base
        mem_per_core_mb = self.mem_per_core_mb
        if "mem" in resources:
            mem_per_core_mb = math.ceil(_parse_mem_mb(resources.pop("mem")) / self.cores_per_task)  # type: ignore[operator]
        walltime_s = self.walltime_s
        if "walltime" in resources:
            walltime_s = parse_walltime(resources.pop("walltime"))
        if resources:
            raise ConfigError(f"unknown resources for {self.kind}: {sorted(resources)} (use mem=, walltime=)")
        env = {
            "ELSEWHERE_SUBMISSION": f"{wdir}/submissions/{submission}.json",
            "ELSEWHERE_ARRAY_VAR": self.syntax.array_index_var,
            "ELSEWHERE_ARRAY_BASE": str(base),
            "PYTHONUNBUFFERED": "1",
        }
        if walltime_s:  # an element that claims its tasks stops claiming in time (run/jobrun.py)
            env["ELSEWHERE_WALLTIME_S"] = str(int(walltime_s))
        if not self.host and not self.python:
            # the worker runs this interpreter, which may not have elsewhere installed
            from ..hosts.spawn import python_env

            env["PYTHONPATH"] = python_env()["PYTHONPATH"]
        return ScriptContext(
            job_name=ScriptContext.safe_name(f"ew-{job.name}"),
            run_line=run_line,
            log_dir=f"{wdir}/logs/scheduler",
            array_size=n_elements,
            array_first=base,
            max_running=self.max_running,
            cores_per_task=self.cores_per_task,
            mem_per_core_mb=mem_per_core_mb,
            walltime_s=walltime_s,
            queue=self.queue,
            account=self.account,
            qos=self.qos,
            gpus=self.gpus,
            env_setup=[*self.env_setup, *command.setup],
            env=env,
            additional=self.additional_properties,
        )

    def job_script(self, job: JobHandle) -> str:
        """The script that would be submitted for ``job`` (its first array)."""
        sub = job.store.path / "submissions" / "0.sh"
        if sub.exists():
            return sub.read_text()
        plan = self.packing(job, max(1, job.n_tasks))
        return self.syntax.render_script(self.script_context(job, plan.elements, "0"), self._template_text())

    # -- how tasks go into elements (packing.py) ---------------------------------
    def packing(self, job: JobHandle, n: int) -> Packing:
        """How ``n`` tasks of ``job`` go into array elements (:func:`~.packing.plan_job`)."""
        return plan_job(self, job, n)

    def free_cpus(self) -> FreeCpus | None:
        """The queue's idle and usable CPUs now (``syntax.build_free_cpus``: SLURM's sinfo,
        Grid Engine's ``qstat -g c``); None where the scheduler cannot be asked or does not say."""
        build = getattr(self.syntax, "build_free_cpus", None)
        argv = build(self.queue) if build is not None else None
        try:
            res = self._run(argv, check=False, timeout=30) if argv else None
            return self.syntax.parse_free_cpus(res.text, self.queue) if res and res.returncode == 0 else None
        except (ElsewhereError, ValueError):
            return None  # not installed, or output it cannot read: size without it

    def max_array_size(self) -> int:
        """The scheduler's largest array, read from it where it can be (once per cluster)."""
        if self._max_array is not None:
            return self._max_array
        self._max_array = self.syntax.default_max_array_size
        argv = self.syntax.build_max_array_size()
        if argv:
            try:
                res = self._run(argv, check=False, timeout=30)
                if res.returncode == 0:
                    got = self.syntax.parse_max_array_size(res.text)
                    if got:
                        self._max_array = got
            except SchedulerError:
                pass
        return self._max_array

    # -- plugin operations ------------------------------------------------------
    def native_after(self, job: JobHandle) -> bool:
        """Whether the scheduler holds ``job`` for ``job.after`` itself (``dependency.py``)."""
        from .dependency import dependency_words

        return dependency_words(self, job) is not None

    def _dependency(self, job: JobHandle) -> list[str] | None:
        from .dependency import dependency_words

        return dependency_words(self, job, submitting=True)

    def submit_independent(self, job: JobHandle) -> None:
        """One array job (two where the scheduler's largest array is smaller) for
        ``job.tasks``: every task at first, the ones to run again on a retry or a rerun of
        lost tasks (with ``job.resources``: ``mem=``, ``walltime=``... raised for them).
        With ``job.after`` (``native_after``), the scheduler holds it until they finished OK."""
        n = job.n_tasks
        plan = self.packing(job, len(job.tasks))
        with job.store.locked_queue() as q:
            if plan.claims:  # packed: the elements claim these tasks from the queue
                q.submit(max_workers=q.live_members() + plan.elements)
            else:
                q.submit(assigned=n, max_workers=n)  # tasks are assigned to array elements, not claimed
                q.assign(job.tasks)
        self._submit_tasks(job, job.tasks, resources=job.resources or None, after=self._dependency(job), plan=plan)


    def submit_communicating(self, job: JobHandle) -> None:
        """One job of N ranks; the template starts them with the scheduler's MPI launcher."""
        import dataclasses

        ranks = job.n_tasks
        with job.store.locked_queue() as q:
            q.submit(assigned=ranks, max_workers=ranks)
        data = self.get_job_cluster_data(job)
        subs = data.setdefault("submissions", [])
        (job.store.path / "submissions").mkdir(mode=0o700, exist_ok=True)
        (job.store.path / "logs" / "scheduler").mkdir(mode=0o700, parents=True, exist_ok=True)
        write_json(job.store.path / "submissions" / "0.json", [[0, ranks]])
        ctx = self.script_context(job, 1, "0")
        env = {k: v for k, v in ctx.env.items() if not k.startswith(("ELSEWHERE_SUBMISSION", "ELSEWHERE_ARRAY"))}
        if os.geteuid() == 0:
            # Open MPI refuses root unless told; harmless for other MPIs.
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        additional = dict(ctx.additional)
        if self.launcher:
            additional["mpi_launcher"] = self.launcher
        ctx = dataclasses.replace(ctx, communicating=True, ranks=ranks, array_size=1, array_last=None,
                                  run_line=ctx.run_line + " --mpi", env=env, additional=additional)
        text = self.syntax.render_script(ctx, self._template_text())
        path = job.store.path / "submissions" / "0.sh"
        path.write_text(text)
        path.chmod(0o700)
        self.mirror_up(job)
        after = self._dependency(job) or []
        argv = self.syntax.build_submit(f"{self.worker_dir(job)}/submissions/0.sh", [*after, *self.extra_args])
        native = self.syntax.parse_submit(self._run(argv, cwd=f"{self.worker_dir(job)}/logs/scheduler").text)
        subs.append({"name": "0", "native_id": native, "elements": 1, "tasks": ranks,
                     "submitted": time.time(), "communicating": True})
        self.set_job_cluster_data(job, data)
        self._status_jobs.add(native)
        self._status_cache = None

    def _submit_tasks(self, job: JobHandle, tasks: list[int], resources: dict[str, Any] | None = None,
                      after: list[str] | None = None, plan: Packing | None = None) -> None:  # fmt: skip
        if not tasks:
            return
        plan = plan or self.packing(job, len(tasks))
        per = plan.per_element
        chunks: list[list[int]] = [[] for _ in range(plan.elements)] if plan.claims else []  # []: it claims
        for i in range(0, len(tasks), per) if per else ():
            part = tasks[i : i + per]
            contiguous = part[-1] - part[0] == len(part) - 1
            chunks.append([part[0], part[-1] + 1] if contiguous else [-1, *part])
        limit = max(1, min(self.max_array_size(), self.max_elements if not self.tasks_per_element else 10**9))
        data = self.get_job_cluster_data(job)
        subs = data.setdefault("submissions", [])
        (job.store.path / "submissions").mkdir(mode=0o700, exist_ok=True)
        (job.store.path / "logs" / "scheduler").mkdir(mode=0o700, parents=True, exist_ok=True)
        pieces = [chunks[i : i + limit] for i in range(0, len(chunks), limit)]
        scripts: list[tuple[str, list[list[int]]]] = []
        for piece in pieces:
            name = str(len(subs) + len(scripts))
            write_json(job.store.path / "submissions" / f"{name}.json", piece)
            ctx = self.script_context(job, len(piece), name, resources=resources)
            text = self.syntax.render_script(ctx, self._template_text())
            path = job.store.path / "submissions" / f"{name}.sh"
            path.write_text(text)
            path.chmod(0o700)
            scripts.append((name, piece))
        self.mirror_up(job)
        for name, piece in scripts:
            script = f"{self.worker_dir(job)}/submissions/{name}.sh"
            argv = self.syntax.build_submit(script, [*(after or ()), *self.extra_args])
            # Submit from the job's log folder: tools that drop files where they
            # are submitted (qsub's NAME.o123) leave them there, not in the user's folder.
            res = self._run(argv, cwd=f"{self.worker_dir(job)}/logs/scheduler")
            native = self.syntax.parse_submit(res.text)
            subs.append({"name": name, "native_id": native, "elements": len(piece),
                         "tasks": sum(len(chunk_tasks(c)) for c in piece), "submitted": time.time(),
                         **packed_record(job, tasks, plan)})
            self.set_job_cluster_data(job, data)
        self._status_jobs.update(s["native_id"] for s in subs)
        self._status_cache = None

    def delete_job(self, job: JobHandle) -> None:
        st = job.state
        if not st.done:
            self.cancel_job(job)
        try:
            self.discard_copy(job)
        except Exception:
            pass  # the copy there is the user's to remove now: the job is gone here
