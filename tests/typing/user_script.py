"""A user's script, as someone who runs ``mypy --strict`` (or pyright) on their code writes it.

Type-checked by tests/typing/test_user_script.py, never run: it must check without a single
error. It uses the public API broadly, the way the README and the docs show it.
"""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import elsewhere as ew


def square(x: int) -> int:
    return x * x


def fit(start: float, scale: float) -> dict[str, float]:
    ctx = ew.task()
    return {"start": start, "loss": (start - 1.0) ** 2 * scale, "cores": float(ctx.cores)}


def describe(n: int) -> str:
    return f"{n} on {ew.task().host}"


def total(values: list[int]) -> int:
    return sum(values)


def clusters() -> list[ew.Cluster]:
    """Every built-in constructor with options of the right types."""
    return [
        ew.local(),
        ew.local(4, cores_per_task=2, idle_timeout_s=30, python="/usr/bin/python3"),
        ew.local(storage=Path("/tmp/jobs"), additional_properties={"mpi_launcher": "mpiexec"}),
        ew.ssh(["server1", "user@server2"], python="python3", setup="make -C model"),
        ew.ssh(
            {"server1": 24}, ssh_options=["-p", "2222"], host_timeout_s=30.0, remote_storage="jobs"
        ),
        ew.peers(),
        ew.peers("lab", key="~/.elsewhere/lab.key", memory="4G", time="10min", encrypt=True),
        ew.peers(peers=["10.0.0.2:1701"], detach=True, prefer_local=False, cores_per_task=2),
        ew.slurm(partition="debug", cores_per_task=4, walltime="01:00:00", mem="4G"),
        ew.slurm(account="lab", qos="normal", gpus=1, max_running=10, sbatch=["--exclusive"]),
        ew.slurm(
            host="login.cluster.example",
            remote_storage="scratch/jobs",
            env_setup=["module load python"],
        ),
        ew.batch("sge", queue="all.q", qsub=["-l", "h_vmem=4G"]),
        ew.batch("pbs", walltime=3600, mem_per_core="2G"),
        ew.batch("torque", tasks_per_element=10),
        ew.batch("lsf", bsub=["-R", "rusage[mem=4096]"]),
        ew.batch("htcondor", mem="1G"),
        ew.batch("flux", flux=["--exclusive"], launcher="flux run"),
        ew.batch("mypkg.sched:MyCluster", whatever_the_plugin_reads=3),
        ew.cluster("mylab", cores_per_task=2),
    ]


def with_map(on: ew.Cluster) -> int:
    squares: list[int] = ew.map(square, range(10), on=on)
    losses = ew.map(
        fit, [0.0, 0.5, 1.0], [1.0, 1.0, 2.0], on=on, retries=2, seed=7, timeout="10min"
    )
    best = min(losses, key=lambda r: r["loss"])
    outcomes = ew.map(square, [1, 2, 3], errors="return", keep=True, name="sq", tag="test")
    good = [o for o in outcomes if not isinstance(o, ew.TaskError)]
    combined = ew.map(total, [[1, 2], [3]], combine=True, files=["data.csv", Path("model")])
    print(best["start"], combined)
    return sum(squares) + sum(good)


def with_jobs(on: ew.Cluster) -> None:
    job = ew.submit(describe, [1, 2, 3], on=on, name="describe", env={"OMP_NUM_THREADS": "1"})
    job.wait(timeout=60, progress=False)
    status = job.check()
    if status:
        print(status.counts, status.state.value, status.reasons, job.state is ew.JobState.FINISHED)
    for result in job.results():
        if isinstance(result, ew.TaskError):
            print(result.index, result.reason, result.type_name, result.traceback)
        else:
            print(result.upper())
    for maybe in job.results(partial=True):
        print(maybe if maybe is not None else "not yet")
    first = job.tasks[0]
    value = first.result
    text = value if isinstance(value, str) else value.message
    print(text, first.state.value, first.host, first.seconds, first.log(), job.log(1))
    print(job.name, job.id, job.path, job.n_tasks, len(job), job.seed, job.started, job.finished)
    print(job.get(errors="return"))
    job.retry([0], mem="8G")
    job.tasks[1].cancel()
    job.cancel()
    job.purge()

    built = ew.create_job(on, name="manual", seed=1, job_data={"model": [1.0, 2.0]})
    built.add_task(square, 2)
    built.add_task(describe, 3)
    built.submit().wait()
    print(built.results())

    again = ew.recover("describe")
    print(again.state.done)
    for row in ew.jobs(refresh=False):
        print(row["name"], row["state"])

    mpi = ew.submit_communicating(square, (3,), ranks=4, on=on)
    ranks: list[int | ew.TaskError] = mpi.results()
    print(ranks)


def with_executor() -> float:
    with ew.Executor(max_workers=4, retries=1) as ex:
        fut: cf.Future[int] = ex.submit(square, 3)
        listed: list[dict[str, float]] = list(ex.map(fit, [0.0, 1.0], [1.0, 1.0]))
        done, _ = cf.wait([fut], timeout=30)
        ex.kill(fut)
        print(ex.job.name, done)
        return fut.result() + listed[0]["loss"]


def with_errors() -> None:
    try:
        ew.map(square, [1, 2])
    except ew.TaskError as err:
        print(err.index, err.host, err.reason)
    except ew.TimeoutError:
        print("too slow")
    except (ew.ConfigError, ew.SchedulerError, ew.TransportError, ew.PeerError) as err:
        print(err)
    except ew.ElsewhereError:
        raise
    try:
        ew.recover("nope")
    except ew.JobNotFound:
        pass


def main() -> None:
    print(ew.__version__)
    with_map(clusters()[0])
    with_jobs(ew.local())
    with_executor()
    with_errors()
