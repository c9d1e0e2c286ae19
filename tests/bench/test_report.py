"""``bench/report.py`` turns the benchmark scripts' JSON figures into ``bench/README.md``: every
figure beside its alternative with its ratio and its date, the newest figure of each kind, the
carried-over ones marked, and no path of the machine that measured them. No benchmark runs here:
the figures are written by the scripts' own recorder (``report.Figures``) or by hand."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

# a path of the machine: "/" after a space, quote, parenthesis or the start, then a folder
ABSOLUTE_PATH = re.compile(r"(?:^|[\s(`'\"=])/[\w.-]+/")


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("bench_report", BENCH / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(report, bench: str, argv: list[str], date: str):
    fig = report.Figures(bench, argv)
    fig.date, fig.time = date, "10:00"
    return fig


@pytest.fixture
def figures(report, tmp_path: Path) -> Path:
    """A folder of figures as the scripts write them: a local run (with a job-size series and
    samples), a slurm run, and an older slurm run carried over by hand."""
    folder = tmp_path / "figures"
    local = _run(
        report, "local", ["--rounds", "3", "--json", str(folder / "local.json")], "2026-11-30"
    )
    local.compare("cold10k", "10 000 no-op tasks from cold", ("ew.map", 0.0582),
                  [("PPE.map(chunksize)", 0.0385), ("PPE, one submit per task", 1.75)], "s",
                  variants=[("ew.map(seed=False)", 0.0659)])  # fmt: skip
    local.compare("memory", "2 000 calls returning 1 MB each: peak RSS", ("ew.Executor", 109.0),
                  [("ProcessPoolExecutor", 27.0)], "MB")  # fmt: skip
    local.compare("latency", "Result latency of lone calls, median", ("ew.Executor", 0.0006),
                  [("ProcessPoolExecutor", 0.00014), ("loky", float("nan"))], "s",
                  samples={"ew.Executor": [0.0005, 0.0006, 0.002], "ProcessPoolExecutor": [0.0001, 0.00014]})  # fmt: skip
    for n, ours, theirs in ((10, 1000.0, 500.0), (10_000_000, 5.0e6, 1.6e6)):
        local.compare("sweep", "No-op tasks from cold: tasks per second", ("ew.map", ours),
                      [("PPE.map(chunksize)", theirs)], "tasks/s", better="higher", tasks=n)  # fmt: skip
    local.write(folder / "local.json")
    slurm = _run(report, "slurm", ["--n", "1000", f"--json={folder / 'slurm.json'}"], "2026-12-06")
    slurm.compare(
        "all back", "1 000 no-op tasks: all results back", ("ew.submit (defaults)", 141.5), [], "s"
    )
    slurm.write(folder / "slurm.json")
    stamp = {"date": "2026-12-02", "time": "09:00", "cores": 2, "load": [3.1, 3.4]}
    carried = {
        "format": report.FORMAT, "bench": "slurm", "command": "bench/slurm.py --n 1000", **stamp,
        "python": "3.11.7", "carried": True, "why": "submitit is not installed here now",
        "figures": [
            {"group": "all back", "name": "1 000 no-op tasks: all results back", "system": "ew.submit (defaults)",
             "elsewhere": True, "value": 130.42, "unit": "s", "better": "lower", "ratio": 2.284,
             "against": "submitit map_array", **stamp},
            {"group": "all back", "name": "1 000 no-op tasks: all results back", "system": "submitit map_array",
             "elsewhere": False, "value": 297.87, "unit": "s", "better": "lower", "ratio": 2.284,
             "against": "ew.submit (defaults)", "against_value": 130.42, **stamp},
        ],
    }  # fmt: skip
    (folder / "slurm-carried.json").write_text(json.dumps(carried))
    return folder


def _line(readme: str, *parts: str) -> str:
    """The one line of ``readme`` that holds every one of ``parts``."""
    lines = [ln for ln in readme.splitlines() if all(p in ln for p in parts)]
    assert len(lines) == 1, (parts, lines)
    return lines[0]


def test_the_recorder_writes_no_path_and_drops_what_was_not_measured(
    report, figures: Path, tmp_path: Path
) -> None:
    text = (figures / "local.json").read_text()
    assert str(tmp_path) not in text
    doc = json.loads(text)
    assert doc["command"] == "bench/local.py --rounds 3"  # --json FILE left out
    assert json.loads((figures / "slurm.json").read_text())["command"] == "bench/slurm.py --n 1000"
    systems = [f["system"] for f in doc["figures"]]
    assert "loky" not in systems  # NaN: not measured
    for f in doc["figures"]:
        assert f["date"] == "2026-11-30" and f["cores"] >= 1 and len(f["load"]) == 2
    ew = next(f for f in doc["figures"] if f["system"] == "ew.map" and f["group"] == "cold10k")
    assert ew["elsewhere"] and ew["against"] == "PPE.map(chunksize)"
    assert ew["ratio"] == pytest.approx(0.0385 / 0.0582, rel=1e-3)


def test_the_readme_holds_every_figure_with_its_ratio_and_date(
    report, figures: Path, tmp_path: Path
) -> None:
    readme = tmp_path / "README.md"
    assert report.main(["--from", str(figures), "--readme", str(readme), "--no-plots"]) == 0
    text = readme.read_text()
    # elsewhere's figure beside each alternative, the ratio being elsewhere's lead over it
    _line(text, "ew.map: 58.2 ms", "PPE.map(chunksize): 38.5 ms", "0.66x", "2026-11-30")
    _line(text, "PPE, one submit per task: 1.75 s", "30.1x", "2026-11-30")
    _line(text, "ew.map(seed=False): 65.9 ms", "PPE.map(chunksize): 38.5 ms", "0.58x", "2026-11-30")
    _line(text, "ew.Executor: 109 MB", "ProcessPoolExecutor: 27 MB", "0.25x", "2026-11-30")
    _line(text, "ew.Executor: 600 us", "ProcessPoolExecutor: 140 us", "0.23x", "2026-11-30")
    # the job-size series: one row per size, the alternative's column with elsewhere's lead
    _line(text, "| 10 |", "1.0k/s", "500.0/s (2.00x)", "2026-11-30")
    _line(text, "| 10 000 000 |", "5.00M/s", "1.60M/s (3.12x)", "2026-11-30")
    # the newer run's figure replaces the carried one; the carried alternative keeps its own
    # ratio and date, marked, and says against what it was measured
    assert "ew.submit (defaults): 130.42 s" not in text
    _line(text, "ew.submit (defaults): 141.50 s", "2026-12-06")
    _line(text, "submitit map_array: 297.87 s", "2.28x (against ew.submit (defaults) of that run: 130.42 s)",
          "2026-12-02, carried over")  # fmt: skip
    assert "submitit is not installed here now" in text
    # how each figure was measured, with the machine's load, and how to regenerate the page
    _line(text, "`bench/local.py --rounds 3`", "2026-11-30", "load")
    assert "bench/report.py" in text
    assert "![" not in text  # --no-plots: no image to link
    assert str(tmp_path) not in text
    assert not ABSOLUTE_PATH.search(text), ABSOLUTE_PATH.search(text)


def test_the_plots_are_drawn_and_linked_relative_to_the_readme(
    report, figures: Path, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    readme, img = tmp_path / "bench" / "README.md", tmp_path / "docs" / "img"
    readme.parent.mkdir()
    assert report.main(["--from", str(figures), "--readme", str(readme), "--img", str(img)]) == 0
    for name in (report.THROUGHPUT_PNG, report.ROUNDTRIP_PNG):
        assert (img / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](../docs/img/{name})" in readme.read_text()
    assert not ABSOLUTE_PATH.search(readme.read_text())


def test_a_file_that_is_not_figures_is_refused(report, tmp_path: Path) -> None:
    (tmp_path / "other.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match=r"other\.json"):
        report.load(tmp_path)
