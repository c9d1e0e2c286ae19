"""The code of the documentation is real elsewhere: in every Python block of the site's pages
(the guides of docs/guides/ and docs/index.md, and every other page), each ``ew.*`` name exists,
each keyword given to a function or a cluster is one it takes, and each member of a Job
(``job``), an Executor (``ex``), a future (``fut``) or a task's context (``t``, ``ew.task()``) is
one they have; the blocks of the guides marked ``<!-- test: run -->`` run, in order, on local
workers (with a profile "helix" made local for them).
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDES = [ROOT / "docs/index.md", *sorted((ROOT / "docs/guides").glob("*.md"))]
FENCE = re.compile(
    r"^(?P<indent> *)```(?P<lang>\w+)[^\n]*\n(?P<body>.*?)^(?P=indent)```$", re.M | re.S
)
RUN_MARK = "<!-- test: run -->"
WRONG_MARK = "<!-- test: shows mistakes -->"  # a block of deliberate mistakes: not checked


def _blocks(path: Path) -> list[tuple[int, str, bool]]:
    """The Python blocks of a page: (line, code, marked to run)."""
    text = path.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        if m.group("lang") != "python":
            continue
        before = text[: m.start()].rstrip().splitlines()
        marked = bool(before) and before[-1].strip() == RUN_MARK
        if before and before[-1].strip() == WRONG_MARK:
            continue
        out.append((text.count("\n", 0, m.start()) + 1, textwrap.dedent(m.group("body")), marked))
    return out


def _uses_elsewhere(code: str) -> bool:
    return "ew." in code or "import elsewhere" in code


def _cluster_params(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                names.add(p.name)
    return names


def _check_call(call: ast.Call, name: str, where: str) -> list[str]:
    """What is wrong with the keywords of ``ew.<name>(...)``."""
    import elsewhere as ew
    from elsewhere.backends import cluster_class

    keywords = [k.arg for k in call.keywords if k.arg is not None]
    clusters = {"local": "local", "ssh": "ssh", "peers": "peer", "slurm": "slurm"}
    if name in clusters or (
        name == "batch" and call.args and isinstance(call.args[0], ast.Constant)
    ):
        kind = clusters.get(name) or call.args[0].value  # type: ignore[attr-defined]
        if ":" in str(kind):
            return []  # a plugin of the page's own
        cls = cluster_class(kind)
        takes = _cluster_params(cls)
        lists = {k.arg for k in call.keywords if isinstance(k.value, (ast.List, ast.Tuple))}
        batch = any(c.__name__ == "BatchCluster" for c in cls.__mro__)
        wrong = [k for k in keywords if k not in takes and not (batch and k in lists)]
        return [f"{where}: ew.{name}(...) does not take {k}=" for k in wrong]
    fn = getattr(ew, name)
    if name in ("map", "submit", "create_job", "Executor", "submit_communicating"):
        sig = inspect.signature(fn)
        named = {p.name for p in sig.parameters.values() if p.kind != p.VAR_KEYWORD}
        options = {  # those of ew.create_job, which map, submit and Executor pass on
            p for p in inspect.signature(ew.create_job).parameters if not p.startswith("_")
        }
        wrong = [k for k in keywords if k not in named and k not in options]
        return [f"{where}: ew.{name}(...) does not take {k}=" for k in wrong]
    return []


#: every page of the site with Python that uses elsewhere: the guides, and the other pages too
PAGES = sorted(
    p
    for p in (ROOT / "docs").rglob("*.md")
    if "_ext" not in p.parts and any(_uses_elsewhere(b[1]) for b in _blocks(p))
)


def test_every_guide_shows_elsewhere_code() -> None:
    assert len(GUIDES) >= 6 and set(GUIDES) <= set(PAGES), [
        g.name for g in GUIDES if g not in PAGES
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_every_elsewhere_name_and_keyword_in_the_guides_is_real(page: Path) -> None:
    import elsewhere as ew

    problems: list[str] = []
    blocks = [b for b in _blocks(page) if _uses_elsewhere(b[1])]
    for line, code, _ in blocks:
        where = f"{page.relative_to(ROOT)}:{line}"
        try:
            tree = ast.parse(code)
        except SyntaxError as exc:
            problems.append(f"{where}: not Python: {exc}")
            continue
        for node in ast.walk(tree):
            is_ew = (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "ew"
            )
            if is_ew and node.attr not in ew.__all__:  # type: ignore[attr-defined]
                problems.append(f"{where}: ew.{node.attr} is not a public name of elsewhere")  # type: ignore[attr-defined]
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "ew"
                    and node.func.attr in ew.__all__):  # fmt: skip
                problems += _check_call(node, node.func.attr, where)
            problems += _check_member(node, where)
    assert not problems, "\n".join(problems)


def _check_member(node: ast.AST, where: str) -> list[str]:
    """What is wrong with ``job.x``, ``ex.x``, ``t.x`` or ``ew.task().x``: the guides name a
    Job ``job``, an Executor ``ex`` and a task's context ``t``."""
    import concurrent.futures as cf

    import elsewhere as ew

    if not isinstance(node, ast.Attribute):
        return []
    owner = node.value
    types = {"job": ew.Job, "ex": ew.Executor, "t": ew.TaskContext, "fut": cf.Future}
    if isinstance(owner, ast.Name) and owner.id in types:
        cls: type = types[owner.id]
    elif (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Attribute)
            and isinstance(owner.func.value, ast.Name) and owner.func.value.id == "ew"
            and owner.func.attr == "task"):  # fmt: skip
        cls = ew.TaskContext
    else:
        return []
    if hasattr(cls, node.attr) or node.attr in getattr(cls, "__slots__", ()):
        return []
    return [f"{where}: {cls.__name__} has no member {node.attr!r}"]


PRELUDE = """
import itertools
import elsewhere as ew

params = [1, 2, 3]
tbl = {"units": "s"}

def simulate(p, steps=1000):
    return p * steps

def add(a, b):
    return a + b
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "page", [p for p in GUIDES if any(b[2] for b in _blocks(p))], ids=lambda p: p.name
)
def test_the_marked_blocks_of_a_guide_run(page: Path, ew_home: Path, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "config.toml").write_text('[profiles.helix]\nscheduler = "local"\ncores = 2\n')
    work = tmp_path / "work"
    work.mkdir()
    (work / "model.py").write_text("RATE = 2\n")
    script = (
        PRELUDE
        + "".join(
            f"\n# {page.name}:{line}\n{code}" for line, code, marked in _blocks(page) if marked
        )
        + "\nprint('ran to the end')\n"
    )
    env = {**os.environ, "ELSEWHERE_HOME": str(ew_home), "ELSEWHERE_CONFIG": str(config)}
    run = subprocess.run([sys.executable, "-c", script], cwd=work, env=env, capture_output=True,
                         text=True, timeout=150)  # fmt: skip
    assert run.returncode == 0 and "ran to the end" in run.stdout, (
        f"the marked blocks of {page.name} failed:\n{script}\n--- stdout\n{run.stdout[-2000:]}\n"
        f"--- stderr\n{run.stderr[-4000:]}"
    )
