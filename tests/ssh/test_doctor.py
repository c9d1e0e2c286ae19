"""``elsewhere.api.doctor``: every check against the real loopback sshd (ci/services/sshd.sh);
each kind of breakage gives a failed check that says what to fix."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from elsewhere import __version__
from elsewhere.api.doctor import Check, diagnose, format_report
from elsewhere.util.errors import ConfigError

pytestmark = pytest.mark.timeout(120)
PY = sys.executable  # the "remote" side is this machine: the venv has elsewhere
HOST_CHECKS = ["ssh", "python", "elsewhere", "cores", "memory", "storage"]


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    d = tmp_path / "config"
    d.mkdir()
    monkeypatch.setenv("ELSEWHERE_CONFIG", str(d))
    return d


def by_name(checks: list[Check]) -> dict[str, Check]:
    names = [c.name for c in checks]
    assert len(names) == len(set(names)), names
    return {c.name: c for c in checks}


def only_failure(checks: list[Check]) -> Check:
    failed = [c for c in checks if not c.ok]
    assert len(failed) == 1, format_report(checks)
    assert failed[0].fix
    return failed[0]


# --------------------------------------------------------------------- an ssh destination


def test_a_good_host_passes_every_check(config_dir, sshd, tmp_path):
    store = tmp_path / "remote"
    checks = diagnose(sshd.host, ssh_config=str(sshd.config), python=PY, remote_storage=str(store))
    assert [c.name for c in checks] == HOST_CHECKS
    assert all(c.ok for c in checks), format_report(checks)
    found = by_name(checks)
    assert "root@" in found["ssh"].detail
    assert PY in found["python"].detail and __version__ in found["elsewhere"].detail
    assert "MiB available" in found["memory"].detail and "usable" in found["cores"].detail
    assert str(store) in found["storage"].detail and store.is_dir()
    assert not list(store.iterdir())  # the probe file is gone again
    report = format_report(checks, title=sshd.host)
    assert report.splitlines()[0] == f"elsewhere doctor: {sshd.host}"
    assert report.endswith("all 6 checks passed")


def test_wrong_port_is_unreachable_with_a_fix(config_dir, sshd):
    checks = diagnose(sshd.host, ssh_config=str(sshd.config), ssh_options=["Port=1"], python=PY)
    assert [c.name for c in checks] == ["ssh"]  # nothing else can be asked
    c = only_failure(checks)
    assert c.detail.startswith("HostUnreachable:") and "refused" in c.detail
    assert "port" in c.fix and "Port=1" in c.fix and f"{sshd.host} true" in c.fix
    report = format_report(checks)
    assert "1 problem to fix:" in report and "1. ssh: " in report


def test_unknown_host_key_says_how_to_add_it(config_dir, sshd, tmp_path):
    cfg = tmp_path / "cfg"
    cfg.write_text(sshd.config.read_text().replace(
        "UserKnownHostsFile", f"UserKnownHostsFile {tmp_path}/empty_known_hosts\n  #"))
    c = only_failure(diagnose(sshd.host, ssh_config=str(cfg), python=PY))
    assert c.name == "ssh" and c.detail.startswith("HostKeyError:")
    assert "ssh-keyscan" in c.fix


def test_refused_login_says_which_key(config_dir, sshd):
    c = only_failure(diagnose(f"nobody-here@{sshd.host}", ssh_config=str(sshd.config), python=PY))
    assert c.name == "ssh" and c.detail.startswith("AuthenticationError:")
    assert "authorized_keys" in c.fix


def test_missing_python_fails_python_and_names_the_setting(config_dir, sshd, tmp_path):
    checks = diagnose(sshd.host, ssh_config=str(sshd.config), python="/no/such/python3",
                      remote_storage=str(tmp_path / "r"))
    c = only_failure(checks)
    assert c.name == "python" and "/no/such/python3" in c.detail and "not found" in c.detail
    assert "python=" in c.fix
    # what does not need the interpreter is still checked
    assert by_name(checks)["ssh"].ok and by_name(checks)["storage"].ok


def test_python_without_elsewhere_says_what_to_install(config_dir, sshd, tmp_path):
    system = "/usr/bin/python3"
    if not os.path.exists(system):
        pytest.skip(f"no {system} without elsewhere to try")
    checks = diagnose(sshd.host, ssh_config=str(sshd.config), python=system,
                      remote_storage=str(tmp_path / "r"))
    found = by_name(checks)
    assert not found["elsewhere"].ok
    assert f"pip install 'elsewhere=={__version__}'" in found["elsewhere"].fix


def test_unwritable_storage_fails_storage(config_dir, sshd, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    checks = diagnose(sshd.host, ssh_config=str(sshd.config), python=PY,
                      remote_storage=str(blocker / "jobs"))
    c = only_failure(checks)
    assert c.name == "storage" and str(blocker / "jobs") in c.detail
    assert "remote_storage=" in c.fix


def test_bad_destination_is_a_failed_check_not_an_exception(config_dir):
    c = only_failure(diagnose("host:22"))
    assert c.name == "ssh" and "port" in c.detail


# --------------------------------------------------------------------------------- profiles


def write_profiles(config_dir: Path, text: str) -> None:
    (config_dir / "config.toml").write_text(text)


def test_ssh_profile_with_two_nodes_names_each(config_dir, sshd, tmp_path):
    write_profiles(config_dir, f"""
[profiles.lab]
scheduler = "ssh"
nodes = ["{sshd.host}", "nobody-here@{sshd.host}"]
ssh_config = "{sshd.config}"
python = "{PY}"
remote_storage = "{tmp_path / 'r'}"
""")
    checks = diagnose("lab")
    found = by_name(checks)
    assert found["profile"].ok and "ssh cluster" in found["profile"].detail
    assert all(found[f"{sshd.host} {n}"].ok for n in HOST_CHECKS), format_report(checks)
    bad = found[f"nobody-here@{sshd.host} ssh"]
    assert not bad.ok and bad.detail.startswith("AuthenticationError")
    assert only_failure(checks) is bad


def test_profile_asking_more_cores_than_the_host_has(config_dir, sshd, tmp_path):
    many = (os.cpu_count() or 1) + 64
    write_profiles(config_dir, f"""
[profiles.greedy]
scheduler = "ssh"
nodes = {{ "{sshd.host}" = {many} }}
ssh_config = "{sshd.config}"
python = "{PY}"
remote_storage = "{tmp_path / 'r'}"
""")
    c = only_failure(diagnose("greedy"))
    assert c.name == "cores" and str(many) in c.detail and "at most" in c.fix


def test_batch_profile_over_ssh_checks_commands_and_template(config_dir, sshd, tmp_path):
    if shutil.which("sbatch") is None:
        pytest.skip("no sbatch on this machine (run ci/services/up.sh slurm)")
    write_profiles(config_dir, f"""
[profiles.hpc]
scheduler = "slurm"
host = "{sshd.host}"
ssh_config = "{sshd.config}"
python = "{PY}"
remote_storage = "{tmp_path / 'r'}"
partition = "debug"
walltime = "00:10:00"
""")
    checks = diagnose("hpc")
    assert [c.name for c in checks] == ["profile", "ssh", "python", "elsewhere", "storage",
                                        "scheduler", "template"]
    assert all(c.ok for c in checks), format_report(checks)
    found = by_name(checks)
    assert "sbatch" in found["scheduler"].detail and "squeue" in found["scheduler"].detail
    assert "renders" in found["template"].detail


def test_batch_profile_without_the_scheduler_commands(config_dir, sshd, tmp_path):
    write_profiles(config_dir, f"""
[profiles.notlsf]
scheduler = "lsf"
host = "{sshd.host}"
ssh_config = "{sshd.config}"
python = "{PY}"
remote_storage = "{tmp_path / 'r'}"
""")
    c = only_failure(diagnose("notlsf"))
    assert c.name == "scheduler" and "bsub" in c.detail and "bjobs" in c.detail
    assert "host=" in c.fix


def test_broken_template_fails_template(config_dir, sshd, tmp_path):
    write_profiles(config_dir, f"""
[profiles.broken]
scheduler = "lsf"
host = "{sshd.host}"
ssh_config = "{sshd.config}"
python = "{PY}"
template = "#!/bin/sh\\n#BSUB -q {{{{ no_such_field }}}}\\n{{{{ run_line }}}}\\n"
""")
    found = by_name(diagnose("broken"))
    assert not found["template"].ok and "no_such_field" in found["template"].detail
    assert "elsewhere template" in found["template"].fix


def test_bad_profiles_are_failed_checks(config_dir):
    write_profiles(config_dir, """
[profiles.nokind]
partition = "x"
[profiles.unknown]
scheduler = "no-such-scheduler"
[profiles.badarg]
scheduler = "ssh"
nodes = ["a"]
no_such_setting = 1
""")
    for name, words in [("nokind", "scheduler ="), ("unknown", "correct"), ("badarg", "correct")]:
        c = only_failure(diagnose(name))
        assert c.name == "profile" and words in c.fix, (name, c)
    write_profiles(config_dir, "[profiles.x\n")
    c = only_failure(diagnose("x"))
    assert c.name == "profile" and "config.toml" in c.fix


def test_local_needs_no_ssh(config_dir, ew_home):
    checks = diagnose("local")
    assert [c.name for c in checks] == ["python", "elsewhere", "cores", "memory", "storage"]
    assert all(c.ok for c in checks), format_report(checks)


# ------------------------------------------------------------------------------ the values


def test_a_failed_check_must_say_what_to_fix():
    with pytest.raises(ConfigError, match="what to fix"):
        Check("ssh", False, "refused")
    with pytest.raises(ConfigError):
        Check("", True, "x")
    assert Check("ssh", True, "fine").fix == ""


def test_report_numbers_the_fixes_in_order():
    text = format_report([Check("a", True, "fine"), Check("bb", False, "broken", "mend it"),
                          Check("c", False, "gone", "find it")])
    assert text.splitlines() == [
        "  ok    a   fine",
        "  FAIL  bb  broken",
        "  FAIL  c   gone",
        "",
        "2 problems to fix:",
        "  1. bb: mend it",
        "  2. c: find it",
    ]
