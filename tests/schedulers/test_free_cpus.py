"""The free-CPU query of the batch syntaxes (SLURM's sinfo, Grid Engine's qstat -g c), on
output captured from the real tools (captured/README.md), and its default elsewhere."""

from __future__ import annotations

import pytest

from elsewhere.schedulers import get_syntax
from elsewhere.schedulers.capacity import FreeCpus

SLURM = get_syntax("slurm")
SGE = get_syntax("sge")


def test_slurm_asks_sinfo_for_the_partition_or_the_default_one():
    assert SLURM.build_free_cpus(None) == ["sinfo", "-h", "-o", "%P|%C"]
    assert SLURM.build_free_cpus("debug") == ["sinfo", "-h", "-p", "debug", "-o", "%P|%C"]


def test_slurm_reads_idle_and_usable_cpus(captured):
    text = captured("slurm/sinfo_cpus.txt")  # debug*|3/5/0/8 and other|3/5/0/8
    assert SLURM.parse_free_cpus(text, None) == FreeCpus(idle=5, usable=8)  # the default, once
    assert SLURM.parse_free_cpus(text, "other") == FreeCpus(5, 8)
    assert SLURM.parse_free_cpus(text, "nope") is None
    # CPUs down or drained ("other") are not usable; lines of one partition add up
    assert SLURM.parse_free_cpus("big*|10/2/4/16\nbig*|0/8/0/8\n", "big") == FreeCpus(10, 20)
    # no default marked: every partition listed
    assert SLURM.parse_free_cpus("a|1/1/0/2\nb|0/4/0/4\n", None) == FreeCpus(5, 6)
    assert SLURM.parse_free_cpus("", None) is None
    assert SLURM.parse_free_cpus("sinfo: error: something\ndebug*|n/a\n", None) is None


def test_grid_engine_reads_the_cluster_queue_summary(captured):
    assert SGE.build_free_cpus(None) == ["qstat", "-g", "c"]
    text = captured("sge/qstat_g_c.txt")  # all.q: 2 used, 0 reserved, 6 available of 8
    assert SGE.parse_free_cpus(text, None) == FreeCpus(idle=6, usable=8)
    assert SGE.parse_free_cpus(text, "all.q") == FreeCpus(6, 8)
    assert SGE.parse_free_cpus(text, "all.q@node1") == FreeCpus(6, 8)
    assert SGE.parse_free_cpus(text, "long.q") is None
    # slots in alarm, suspended, disabled or in error are not usable; older versions have no RES
    old = (
        "CLUSTER QUEUE                   CQLOAD   USED  AVAIL  TOTAL aoACDS  cdsuE\n"
        "-------------------------------------------------------------------------\n"
        "all.q                             -NA-      4     12     20      0      4\n"
        "short.q                           0.10      0      2      2      0      0\n"
    )
    assert SGE.parse_free_cpus(old, None) == FreeCpus(14, 18)
    assert SGE.parse_free_cpus(old, "short.q") == FreeCpus(2, 2)
    assert SGE.parse_free_cpus("error: commlib error\n", None) is None


@pytest.mark.parametrize("name", ["pbs", "torque", "slurm-torque", "lsf", "htcondor", "flux"])
def test_schedulers_that_cannot_be_asked_say_so(name):
    syntax = get_syntax(name)
    assert syntax.build_free_cpus(None) is None
    assert syntax.parse_free_cpus("anything", None) is None
