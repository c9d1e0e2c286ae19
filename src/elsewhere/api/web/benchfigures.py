"""The benchmark figures that the Benchmarks view shows: ``bench/figures/*.json``.

The benchmark scripts of a source checkout (``bench/*.py --json FILE``) record their figures
as JSON, one file per run of one script, and ``bench/report.py`` turns the newest figure of
each kind into ``bench/README.md``. The view shows the same figures, read the same way (the
format ``elsewhere-bench/1``, described in ``bench/report.py``; the newest figure of each
benchmark, measurement, system and job size wins). Where from, the first that applies:

1. the folder named by ``elsewhere web --bench-figures DIR`` (``ew.web(bench_figures=DIR)``);
2. the folder named by the environment variable :data:`ENV` (``ELSEWHERE_BENCH_FIGURES``);
3. ``bench/figures`` of the source checkout this package runs from (an editable install,
   or ``src`` on the path: the package is ``<checkout>/src/elsewhere``).

An installed wheel carries no figures: the view then says where it looked and how to point
it at some. Files are read again when the folder changed (a file added, replaced, removed).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["ENV", "FORMAT", "BenchFigures", "locate"]

ENV = "ELSEWHERE_BENCH_FIGURES"
FORMAT = "elsewhere-bench/1"
_MAX_FILE = 4 * 1024 * 1024  # a figures file is a few kilobytes: anything this big is not one
_RUN_KEYS = ("command", "date", "time", "cores", "load", "python", "carried", "why")
_FIGURE_KEYS = ("system", "elsewhere", "value", "unit", "better", "ratio", "against", "date", "time",
                "tasks", "carried", "against_value")  # fmt: skip


def checkout_figures() -> Path | None:
    """``bench/figures`` of the source checkout this package runs from (``<checkout>/src/
    elsewhere``), or None where it was installed (site-packages)."""
    src = Path(__file__).resolve().parents[3]
    return src.parent / "bench" / "figures" if src.name == "src" else None


def locate(given: str | os.PathLike[str] | None = None,
           environ: dict[str, str] | None = None) -> tuple[Path | None, str, list[str]]:  # fmt: skip
    """(the folder of figures or None, how it was found, the places looked at). ``how`` is
    ``"option"``, ``"environment"`` or ``"checkout"``; a folder named by the option or the
    variable is taken even if it is missing or empty (the view says so)."""
    env = os.environ if environ is None else environ
    if given:
        return Path(given).expanduser(), "option", [str(given)]
    if env.get(ENV):
        return Path(env[ENV]).expanduser(), "environment", [f"${ENV} = {env[ENV]}"]
    mine = checkout_figures()
    if mine is not None and mine.is_dir():
        return mine, "checkout", [str(mine)]
    checkout = (
        f"{mine} (no such folder)"
        if mine is not None
        else "a source checkout (installed from a wheel)"
    )
    return None, "", ["--bench-figures (not given)", f"${ENV} (not set)", checkout]


class BenchFigures:
    """The figures of one folder, read when asked and again when the folder changed."""

    def __init__(self, given: str | os.PathLike[str] | None = None) -> None:
        self.folder, self.how, self.searched = locate(given)
        self._stamp: tuple[Any, ...] | None = None
        self._table: dict[str, Any] = {}

    def table(self) -> dict[str, Any]:
        """What the view shows: ``found``, ``folder``, ``how``, ``message``, ``problems`` (files
        that could not be read), and ``benches``: per benchmark script its runs and its
        measurements, each with one figure per system (and job size)."""
        stamp = self._folder_stamp()
        if stamp != self._stamp:
            self._table = self._read()
            self._stamp = stamp
        return self._table

    def _folder_stamp(self) -> tuple[Any, ...]:
        if self.folder is None:
            return ()
        try:
            return tuple(sorted((e.name, e.stat().st_mtime_ns, e.stat().st_size)
                                for e in os.scandir(self.folder) if e.name.endswith(".json")))  # fmt: skip
        except OSError as exc:
            return ("unreadable", str(exc))

    def _read(self) -> dict[str, Any]:
        where = {
            "folder": str(self.folder) if self.folder else "",
            "how": self.how,
            "searched": self.searched,
        }
        if self.folder is None:
            return {**where, "found": False, "benches": [], "problems": [],
                    "message": "no benchmark figures here: they are the bench/figures/*.json of a source checkout "
                               f"(bench/*.py --json FILE writes them); point at a folder of them with "
                               f"`elsewhere web --bench-figures DIR` or ${ENV}"}  # fmt: skip
        docs, problems = read_docs(self.folder)
        benches = current(docs)
        if not benches:
            why = (
                "no such folder"
                if not self.folder.is_dir()
                else "no benchmark figures (*.json) in it"
            )
            return {**where, "found": False, "benches": [], "problems": problems,
                    "message": f"no benchmark figures in {self.folder}: {why}"}  # fmt: skip
        n = sum(len(m["figures"]) for b in benches for m in b["measurements"])
        return {**where, "found": True, "benches": benches, "problems": problems,
                "message": f"{n} figures of {len(benches)} benchmarks, from {len(docs)} runs in {self.folder}"}  # fmt: skip


def read_docs(folder: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The runs recorded in ``folder`` (oldest first), and a line for each file that is not
    one."""
    docs, problems = [], []
    try:
        paths = sorted(folder.glob("*.json"))
    except OSError as exc:
        return [], [f"{folder}: {exc}"]
    for p in paths:
        try:
            if p.stat().st_size > _MAX_FILE:
                raise ValueError("too large to be a figures file")
            doc = json.loads(p.read_text(encoding="utf-8"))
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError(
                    f"not a benchmark figures file (format {doc.get('format') if isinstance(doc, dict) else None!r})"
                )
            if not isinstance(doc.get("figures"), list) or not isinstance(doc.get("bench"), str):
                raise ValueError("no figures")
        except (OSError, ValueError) as exc:
            problems.append(f"{p.name}: {exc}")
            continue
        doc["file"] = p.name
        docs.append(doc)
    docs.sort(key=lambda d: (str(d.get("date", "")), str(d.get("time", ""))))
    return docs, problems


def current(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest figure of each (benchmark, group, measurement, system, job size), grouped
    per benchmark (by name) and measurement (in the order first recorded), with the runs they
    come from."""
    newest: dict[tuple[Any, ...], tuple[dict[str, Any], dict[str, Any]]] = {}
    for doc in docs:  # oldest first: a newer figure of the same kind replaces an older one
        for f in doc["figures"]:
            if not isinstance(f, dict) or not isinstance(f.get("value"), (int, float)):
                continue
            key = (
                doc["bench"],
                f.get("group", ""),
                f.get("name", ""),
                f.get("system", ""),
                f.get("tasks"),
            )
            newest[key] = (f, doc)
    benches: dict[str, dict[str, Any]] = {}
    for (bench, group, name, _system, _tasks), (f, doc) in newest.items():
        b = benches.setdefault(bench, {"bench": bench, "runs": {}, "measurements": {}})
        run = {k: doc[k] for k in _RUN_KEYS if k in doc}
        b["runs"][doc["file"]] = {"file": doc["file"], **run}
        m = b["measurements"].setdefault((group, name), {"group": group, "name": name, "unit": f.get("unit", ""),
                                                         "better": f.get("better", "lower"), "figures": []})  # fmt: skip
        fig = {k: f[k] for k in _FIGURE_KEYS if k in f}
        fig.setdefault("carried", bool(doc.get("carried", False)))
        m["figures"].append(fig)
    out = []
    for bench in sorted(benches):
        b = benches[bench]
        runs = sorted(
            b["runs"].values(), key=lambda r: (str(r.get("date", "")), str(r.get("time", "")))
        )
        out.append({"bench": bench, "runs": runs, "measurements": list(b["measurements"].values())})
    return out
