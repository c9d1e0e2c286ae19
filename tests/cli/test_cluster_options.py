"""An unknown or invalid option of any cluster constructor is a ConfigError that names it, never
a raw TypeError or ValueError from deep inside (``ew.local(memory="4G")`` was a TypeError
where ``ew.slurm(memory="4G")`` said what was wrong). Run as a user's script runs: a Python
of its own, with the schedulers' commands on PATH or not."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(120)

TRY_ALL = """
import json
import elsewhere as ew

SCHEDULERS = ("slurm", "sge", "pbs", "lsf", "htcondor", "flux")
BAD = {  # option: a value of the wrong kind
    "memory": "4G", "bogus": 1, "cores": "four", "cores_per_task": 0, "storage": 3,
    "template": 5, "env_setup": 5, "extra_args": "-x", "status_interval_s": "soon",
    "additional_properties": 5, "walltime": "soon", "mem": "lots", "gpus": "x", "host": 5,
    "remote_storage": 5, "ssh_options": 5, "ssh_config": 5, "max_running": "x", "launcher": 5,
    "syntax_options": 5, "idle_timeout_s": "x", "setup": 5, "host_timeout_s": "x", "key": 5,
    "time": "x", "peers": 5, "port": "x", "interface": 5, "prefer_local": "x", "encrypt": "x",
    "queue": 5, "account": 5, "qos": 5, "mem_per_core": "x", "max_elements": 0,
}
TAKES = {  # what each constructor takes, besides the unknown "bogus" and "memory" (peers: memory)
    "local": {"cores", "cores_per_task", "storage", "additional_properties", "idle_timeout_s"},
    "ssh": {"cores_per_task", "storage", "additional_properties", "remote_storage", "ssh_options",
            "ssh_config", "setup", "host_timeout_s"},
    "peers": {"cores_per_task", "storage", "additional_properties", "key", "time", "peers", "port",
              "interface", "prefer_local", "encrypt", "memory"},
}
makers = {"local": lambda **o: ew.local(**o), "ssh": lambda **o: ew.ssh(["localhost"], **o),
          "peers": lambda **o: ew.peers(**o)}
for s in SCHEDULERS:
    makers[s] = lambda _s=s, **o: ew.batch(_s, **o)
out = {}
for kind, make in makers.items():
    takes = TAKES.get(kind)
    for option, value in BAD.items():
        if takes is not None and option not in takes and option not in ("bogus", "memory"):
            continue  # an unknown option there: "bogus" stands for them
        if kind == "peers" and option == "memory":
            value = "lots"  # a peer task's memory: an option there
        try:
            make(**{option: value})
            out[f"{kind}({option}={value!r})"] = ["accepted", ""]
        except Exception as exc:
            out[f"{kind}({option}={value!r})"] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


def test_every_bad_option_of_every_cluster_is_a_config_error_that_names_it(shell):
    results = json.loads(shell.python(TRY_ALL))
    assert len(results) > 150
    wrong = {
        case: got
        for case, got in results.items()
        if got[0] not in ("ConfigError", "ProfileNotFound")
    }
    assert not wrong, wrong
    for case, (_, message) in results.items():
        option = case.split("(")[1].split("=")[0]
        assert option in message or option.rstrip("s") in message, (case, message)
    local = results["local(memory='4G')"][1]
    assert local.startswith("unknown option memory='4G' for the local cluster: it takes cores, ")
    assert "(did you mean mem?)" in results["slurm(memory='4G')"][1]
