"""A real notebook run by a real kernel (nbclient, ipykernel): what a Jupyter user sees of a
job, of a failed task's error and of the jobs table, and the progress bar of
``job.wait(progress=True)`` without ipywidgets.

The kernel is this interpreter (a kernel spec of our own, found first through
``JUPYTER_PATH``), so it imports the elsewhere under test; it runs in a private elsewhere
home. The notebook, ``job_display.ipynb``, names its job ``nb <demo> & [b]co[/b]`` and fails a
task with ``bad <input> 3 & more``: every place that shows them must escape them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

nbclient = pytest.importorskip(
    "nbclient", reason="nbclient is not installed (pip install -e '.[test]' brings it)"
)
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed")
pytest.importorskip("ipykernel", reason="ipykernel is not installed")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NOTEBOOK = Path(__file__).with_name("job_display.ipynb")
KERNEL = "elsewhere-test"
NAME = "nb <demo> & [b]co[/b]"
NAME_HTML = "nb &lt;demo&gt; &amp; [b]co[/b]"


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The notebook after a kernel ran every cell (in a fresh elsewhere home)."""
    tmp = tmp_path_factory.mktemp("notebook")
    spec = tmp / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "elsewhere tests", "language": "python",
    }))  # fmt: skip
    env = {
        "JUPYTER_PATH": str(tmp / "jupyter"),  # our kernel spec, whatever else is installed
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "IPYTHONDIR": str(tmp / "ipython"),
        "ELSEWHERE_HOME": str(tmp / "home"),
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        nb = nbformat.read(NOTEBOOK, as_version=4)
        client = nbclient.NotebookClient(
            nb, kernel_name=KERNEL, timeout=90, resources={"metadata": {"path": str(tmp)}}
        )
        try:
            client.execute()
        finally:
            _stop_workers(tmp / "home")
    return nb


def _stop_workers(home: Path) -> None:
    """End the kernel's local workers: those started for ``home`` (they outlive the kernel, as
    detached workers do)."""
    import psutil

    from workerprocs import worker_pids

    for pid in worker_pids(home):
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def _cell(nb: Any, source_start: str) -> Any:
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith(source_start):
            return cell
    raise AssertionError(f"no cell starting {source_start!r}")


def _outputs(cell: Any, kind: str) -> list[dict[str, Any]]:
    return [o for o in cell.outputs if o.output_type == kind]


def _html(cell: Any) -> str:
    [result] = _outputs(cell, "execute_result")
    assert "text/plain" in result.data  # a plain view too, for consoles and diffs
    return str(result.data["text/html"])


def test_no_cell_failed_nor_asked_for_ipywidgets(executed: Any) -> None:
    for cell in executed.cells:
        if cell.cell_type != "code":
            continue
        assert not _outputs(cell, "error"), cell.outputs
        text = "".join(o.get("text", "") for o in _outputs(cell, "stream"))
        assert "ipywidgets" not in text, text


def test_the_progress_bar_shows_in_the_notebook_and_ends_complete(executed: Any) -> None:
    cell = _cell(executed, "# 8 tasks")
    shown = [o for o in _outputs(cell, "display_data") if "text/html" in o.data]
    assert shown, f"no progress bar among {cell.outputs}"
    bar = str(shown[-1].data["text/html"])
    assert NAME_HTML in bar, bar  # the name as text: neither HTML nor rich markup
    assert "8/8" in bar, bar  # the last look, kept once the wait is over
    assert "8/8" in str(shown[-1].data["text/plain"])


def test_a_job_shows_its_state_and_task_counts_escaped(executed: Any) -> None:
    html = _html(_cell(executed, "# 8 tasks"))
    assert 'class="elsewhere-job"' in html
    assert NAME_HTML in html and "<demo>" not in html, html
    assert "failed</b>" in html  # the job's state
    assert "7 finished</span>" in html and "1 failed</span>" in html, html
    assert "8 of 8 tasks done" in html and "on local" in html, html


def test_a_failed_tasks_error_shows_its_type_message_and_traceback_escaped(executed: Any) -> None:
    html = _html(_cell(executed, "job.results()[3]"))
    assert "ValueError" in html, html
    assert "bad &lt;input&gt; 3 &amp; more" in html and "<input>" not in html, html
    assert "remote traceback" in html and "in work" in html, html


def test_the_status_of_check_shows_the_counts(executed: Any) -> None:
    html = _html(_cell(executed, "job.check()"))
    assert "7 finished</span>" in html and "1 failed</span>" in html, html


def test_the_jobs_table_shows_every_job_escaped(executed: Any) -> None:
    html = _html(_cell(executed, "ew.jobs()"))
    assert html.startswith('<table class="elsewhere-jobs"'), html
    assert html.count("<tr>") == 2, html  # the header and the one job
    assert NAME_HTML in html and "<demo>" not in html, html
    assert "7 finished</span>" in html and "local" in html, html
