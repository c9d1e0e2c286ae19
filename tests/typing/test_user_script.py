"""A user's code type-checks: ``mypy --strict`` and pyright (strict) on scripts that use the API.

- ``user_script.py`` uses the public API broadly and must check without an error;
- ``wrong_script.py`` holds mistakes (an option of the wrong type, an unknown option, a result
  used as the wrong type, a misspelt name): exactly those must be reported, so the test fails
  if the API's types fall back to ``Any``;
- ``reveal_script.py``: the inferred result types (``ew.map`` of an int function is
  ``list[int]``).

The two checkers run once, side by side, on the three scripts (about 10 s of CPU each, most
of it reading the package), as a user runs them: its own strict configuration, the installed
package found through its ``py.typed``. The options' TypedDicts are compared with the
signatures they describe, so that a new option cannot be left out of them.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SCRIPTS = {name: HERE / f"{name}.py" for name in ("user_script", "wrong_script", "reveal_script")}
_EXPECT = re.compile(r"#\s*expect:\s*([\w-]+)\s*\|\s*(\w+)\s*$")
_REVEAL = re.compile(r"reveal_type\(.*#\s*reveal:\s*(.+?)\s*$")
_QUALIFIED = re.compile(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])")  # "elsewhere.util.errors." etc.


def _marked(path: Path, pattern: re.Pattern[str]) -> dict[int, re.Match[str]]:
    lines = path.read_text().splitlines()
    return {n: m for n, line in enumerate(lines, 1) if (m := pattern.search(line))}


def _unqualified(type_text: str) -> str:
    return _QUALIFIED.sub("", type_text)


# -- mypy ----------------------------------------------------------------------------------------
_MYPY_LINE = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+): (?P<sev>error|note): (?P<msg>.*?)(?:  \[(?P<code>[\w-]+)\])?$"
)


@pytest.fixture(scope="module")
def checked(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, subprocess.CompletedProcess[str] | None]:
    """mypy --strict and pyright (strict) run at once on the three scripts, each in a folder of
    its own with a user's strict configuration (not this project's); None: not installed."""
    runs: dict[str, tuple[list[str], Path] | None] = {"mypy": None, "pyright": None}
    if importlib.util.find_spec("mypy") is not None:
        tmp = tmp_path_factory.mktemp("mypy")
        (tmp / "mypy.ini").write_text("[mypy]\nstrict = True\n")
        runs["mypy"] = ([sys.executable, "-m", "mypy", "--config-file", str(tmp / "mypy.ini"),
                         "--cache-dir", str(tmp / "cache"), "--no-error-summary", "--no-pretty",
                         *map(str, SCRIPTS.values())], tmp)  # fmt: skip
    if importlib.util.find_spec("pyright") is not None:
        tmp = tmp_path_factory.mktemp("pyright")
        (tmp / "pyrightconfig.json").write_text(json.dumps({"typeCheckingMode": "strict"}))
        runs["pyright"] = ([sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable,
                            "-p", str(tmp / "pyrightconfig.json"), *map(str, SCRIPTS.values())], tmp)  # fmt: skip
    procs = {name: subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (cmd, cwd) in ((n, r) for n, r in runs.items() if r is not None)}  # fmt: skip
    done: dict[str, subprocess.CompletedProcess[str] | None] = dict.fromkeys(runs)
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


@pytest.fixture(scope="module")
def mypy_report(checked) -> dict[str, list[tuple[int, str, str, str]]]:
    """``{script: [(line, severity, code, message)]}`` from ``mypy --strict``."""
    proc = checked["mypy"]
    if proc is None:
        pytest.skip("mypy is not installed (it is in the test extra)")
    assert proc.returncode in (0, 1), (
        f"mypy failed to run ({proc.returncode}): {proc.stdout}{proc.stderr}"
    )
    report: dict[str, list[tuple[int, str, str, str]]] = {name: [] for name in SCRIPTS}
    by_path = {str(p): name for name, p in SCRIPTS.items()}
    for line in proc.stdout.splitlines():
        m = _MYPY_LINE.match(line)
        if m is None or m["path"] not in by_path:
            assert not line.strip() or line.startswith(" "), f"mypy said: {line}\n{proc.stderr}"
            continue
        report[by_path[m["path"]]].append((int(m["line"]), m["sev"], m["code"] or "", m["msg"]))
    return report


def test_mypy_strict_accepts_the_user_script(mypy_report):
    errors = [r for r in mypy_report["user_script"] if r[1] == "error"]
    assert errors == [], "\n".join(
        f"user_script.py:{n}: {msg}  [{code}]" for n, _, code, msg in errors
    )


def test_mypy_strict_reports_exactly_the_mistakes(mypy_report):
    expected = {(n, m[1]) for n, m in _marked(SCRIPTS["wrong_script"], _EXPECT).items()}
    got = {(n, code) for n, sev, code, _ in mypy_report["wrong_script"] if sev == "error"}
    assert len(expected) >= 14
    assert got == expected, (
        f"missed: {sorted(expected - got)}; unexpected: "
        f"{sorted(r for r in mypy_report['wrong_script'] if (r[0], r[2]) in got - expected)}"
    )


def test_mypy_infers_the_result_types(mypy_report):
    expected = {n: m[1] for n, m in _marked(SCRIPTS["reveal_script"], _REVEAL).items()}
    got = {}
    for n, sev, _, msg in mypy_report["reveal_script"]:
        assert sev == "note", f"reveal_script.py:{n}: {msg}"
        got[n] = _unqualified(msg.removeprefix("Revealed type is ").strip('"'))
    assert expected[min(expected)] == "list[int]"  # the first: ew.map of an int function
    assert got == expected


# -- pyright ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pyright_report(checked) -> dict[str, list[tuple[int, str, str, str]]]:
    """``{script: [(line, severity, rule, message)]}`` from pyright in strict mode."""
    proc = checked["pyright"]
    if proc is None:
        pytest.skip("pyright is not installed (it is in the test extra; it runs on node)")
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"pyright did not run ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    report: dict[str, list[tuple[int, str, str, str]]] = {name: [] for name in SCRIPTS}
    by_path = {str(p): name for name, p in SCRIPTS.items()}
    for d in out["generalDiagnostics"]:
        name = by_path[str(Path(d["file"]))]
        report[name].append(
            (d["range"]["start"]["line"] + 1, d["severity"], d.get("rule", ""), d["message"])
        )
    return report


def test_pyright_accepts_the_user_script(pyright_report):
    errors = [r for r in pyright_report["user_script"] if r[1] != "information"]
    assert errors == [], "\n".join(
        f"user_script.py:{n}: {msg} ({rule})" for n, _, rule, msg in errors
    )


def test_pyright_reports_exactly_the_mistakes(pyright_report):
    expected = {n: m[2] for n, m in _marked(SCRIPTS["wrong_script"], _EXPECT).items()}
    rules: dict[int, set[str]] = {}
    for n, sev, rule, _ in pyright_report["wrong_script"]:
        if sev == "error":
            rules.setdefault(n, set()).add(rule)
    assert set(rules) == set(expected), f"expected errors on lines {sorted(expected)}, got {rules}"
    missing = {n: (want, rules[n]) for n, want in expected.items() if want not in rules[n]}
    assert not missing, missing


def test_pyright_infers_the_result_types(pyright_report):
    expected = {n: m[1] for n, m in _marked(SCRIPTS["reveal_script"], _REVEAL).items()}
    got = {}
    for n, sev, _, msg in pyright_report["reveal_script"]:
        assert sev == "information", f"reveal_script.py:{n}: {msg}"
        got[n] = _unqualified(msg.rpartition(" is ")[2].strip('"'))
    assert got == expected


# -- the typed surface is complete ---------------------------------------------------------------
def test_every_export_is_visible_to_type_checkers():
    """Each name of ``elsewhere.__all__`` is re-exported (``from M import X as X``) in the block
    type checkers read, from the module the lazy loader takes it from."""
    import elsewhere

    tree = ast.parse(Path(elsewhere.__file__).read_text())
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                if alias.asname == alias.name:
                    typed[alias.name] = node.module or ""
    assert set(typed) == set(elsewhere.__all__)
    loader = elsewhere._EXPORTS  # type: ignore[attr-defined]
    assert {n: m for n, m in typed.items() if n != "__version__"} == loader


def _keywords(fn: typing.Callable[..., object], *leave_out: str) -> dict[str, str]:
    params = inspect.signature(fn).parameters.values()
    return {p.name: str(p.annotation) for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in ("self", *leave_out) and not p.name.startswith("_")}  # fmt: skip


def _fields(td: type) -> dict[str, str]:
    return {k: getattr(v, "__forward_arg__", v) for k, v in td.__annotations__.items()}


def test_the_options_name_what_the_constructors_take():
    """The TypedDicts of api/options.py list each constructor's keyword options, with the same
    types: an option added to a cluster (or to create_job) must be added there too."""
    from elsewhere.api import executor, functions, options
    from elsewhere.backends.batch import BatchCluster
    from elsewhere.backends.local import LocalCluster
    from elsewhere.backends.peer import PeerCluster
    from elsewhere.backends.ssh import SSHCluster

    pairs = [
        (options.JobOptions, _keywords(functions.create_job, "on", "name")),
        (options.LocalOptions, _keywords(LocalCluster, "cores")),
        (options.SSHOptions, _keywords(SSHCluster, "nodes")),
        (options.PeerOptions, _keywords(PeerCluster, "group")),
        (options.BatchOptions, _keywords(BatchCluster, "check")),  # check: for rebuilding only
    ]
    for td, takes in pairs:
        assert _fields(td) == takes, td.__name__
    assert set(executor._JOB_OPTIONS) == set(_fields(options.JobOptions))  # the Executor's
    extra = {options.SlurmOptions: "sbatch", options.QsubOptions: "qsub",
             options.BsubOptions: "bsub", options.FluxOptions: "flux"}  # fmt: skip
    for td, word in extra.items():
        assert set(_fields(td)) - set(_fields(options.BatchOptions)) == {word}, td.__name__
