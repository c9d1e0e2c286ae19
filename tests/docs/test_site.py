"""The documentation site: it builds with ``mkdocs build --strict`` (a broken link, a missing page
or an API name griffe cannot find fails), its API reference has every public name, cluster and
plugin operation, and every pointer from the code to the site names a page that exists.

One build (about 10 s of CPU) serves every test of this module.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEEDED = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _missing() -> list[str]:
    out = []
    for name in NEEDED:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            out.append(name)
    return out


pytestmark = pytest.mark.skipif(
    bool(_missing()),
    reason=f"the docs packages are not installed ({', '.join(_missing())}): pip install -e '.[docs]'",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=280, env=env,
    )  # fmt: skip
    assert run.returncode == 0, (
        f"mkdocs build --strict failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    )
    return out


def _ids(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8")))


def _page(site: Path, name: str) -> Path:
    path = site / name / "index.html"
    assert path.is_file(), f"the site has no page {name}/"
    return path


@pytest.mark.timeout(300)
def test_api_reference_documents_every_public_name(site: Path) -> None:
    import elsewhere

    ids = _ids(_page(site, "reference/api"))
    missing = [n for n in elsewhere.__all__ if f"elsewhere.{n}" not in ids]
    assert not missing, (
        f"elsewhere.__all__ names missing from the API reference: {missing}; "
        "add a `::: elsewhere.NAME` line for each to docs/reference/api.md"
    )


@pytest.mark.timeout(300)
def test_every_plugin_operation_is_documented(site: Path) -> None:
    import elsewhere
    from elsewhere.schedulers.syntax import SchedulerSyntax

    api = _ids(_page(site, "reference/api"))
    ops = [n for n, v in vars(elsewhere.Cluster).items() if not n.startswith("_") and callable(v)]
    assert {"submit_independent", "job_state", "poll", "cancel_job", "report_lost"} <= set(ops)
    missing = [n for n in ops if f"elsewhere.Cluster.{n}" not in api]
    assert not missing, f"Cluster methods missing from the API reference: {missing}"
    handle = [
        n
        for n, v in vars(elsewhere.JobHandle).items()
        if not n.startswith("_") and not inspect.isclass(v)
    ]
    # a member without a docstring is hidden: the handle's own table documents store, resources
    documented = [n for n in handle if f"elsewhere.JobHandle.{n}" in api]
    assert {"tasks", "attempt", "report_lost", "snapshot", "spec"} <= set(documented)

    plugins = _ids(_page(site, "reference/plugins"))
    protocol = [n for n in vars(SchedulerSyntax) if not n.startswith("_")]
    protocol += list(getattr(SchedulerSyntax, "__annotations__", {}))
    missing = sorted(
        {n for n in protocol if f"elsewhere.schedulers.syntax.SchedulerSyntax.{n}" not in plugins}
    )
    assert not missing, f"SchedulerSyntax members missing from the plugin reference: {missing}"


@pytest.mark.timeout(300)
def test_every_cluster_kind_has_its_options_documented(site: Path) -> None:
    from elsewhere.backends import _BUILTIN

    ids = _ids(_page(site, "reference/clusters"))
    missing = [t for t in _BUILTIN.values() if t.replace(":", ".") not in ids]
    assert not missing, f"cluster classes missing from docs/reference/clusters.md: {missing}"
    # each class's settings are its merged __init__ parameters: one table row per setting
    text = _page(site, "reference/clusters").read_text(encoding="utf-8")
    for setting in (
        "idle_timeout_s",
        "remote_storage",
        "tasks_per_element",
        "max_running",
        "multicast_group",
    ):
        assert f"<code>{setting}</code>" in text, setting


def _site_urls() -> dict[str, str]:
    """Every address of the site written in the code: {where: url}."""
    from elsewhere.util.docsite import DOCS_URL

    found: dict[str, str] = {}
    src = ROOT / "src" / "elsewhere"
    for path in sorted([*src.rglob("*.py"), *src.rglob("*.j2")]):
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(re.escape(DOCS_URL) + r"[\w/#.-]*", text):
            found[f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"] = m.group(0)
        for m in re.finditer(
            r"\bpage\(\s*[\"']([\w/-]+)[\"'](?:\s*,\s*[\"']([\w-]+)[\"'])?\s*\)", text
        ):
            found[f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"] = (
                f"{DOCS_URL}{m.group(1)}/" + (f"#{m.group(2)}" if m.group(2) else "")
            )
    return found


@pytest.mark.timeout(300)
def test_the_codes_pointers_to_the_site_name_pages_that_exist(site: Path) -> None:
    from elsewhere.util.docsite import DOCS_URL, page

    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(rf"^site_url: {re.escape(DOCS_URL)}$", config, re.M), (
        "mkdocs.yml site_url is not DOCS_URL"
    )
    assert page("schedulers", "template-fields") == f"{DOCS_URL}schedulers/#template-fields"

    urls = _site_urls()
    templates = sorted((ROOT / "src/elsewhere/schedulers/templates").glob("*.j2"))
    assert templates
    for t in templates:  # each names the page of its fields, and no path of the repository
        text = t.read_text(encoding="utf-8")
        assert "docs/" not in text.replace(DOCS_URL, ""), t.name
        assert f"{DOCS_URL}schedulers/#template-fields" in text, t.name
    assert any(where.startswith("src/elsewhere/api/") for where in urls), (
        "the shell's messages name no page"
    )
    for where, url in urls.items():
        rest = url[len(DOCS_URL) :]
        name, _, anchor = rest.partition("#")
        target = site / name / "index.html"
        assert target.is_file(), f"{where} points to {url}: the site has no such page"
        if anchor:
            assert anchor in _ids(target), f"{where} points to {url}: the page has no such anchor"


def test_docstrings_are_read_as_markdown() -> None:
    """The site's griffe extension: roles, tables, doctests and literal blocks of the
    docstrings become Markdown (what mkdocstrings reads)."""
    spec = importlib.util.spec_from_file_location("griffe_rst", ROOT / "docs/_ext/griffe_rst.py")
    assert spec is not None and spec.loader is not None
    if importlib.util.find_spec("griffe") is None:
        pytest.skip("griffe is not installed (pip install -e '.[docs]')")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = inspect.cleandoc(
        """A :class:`~elsewhere.Job` and :func:`elsewhere.map`.

        ==========  =======================
        name        what
        ==========  =======================
        ``a_very_long_name``  first row
                    goes on here
        ``b``       second
        ==========  =======================

        >>> 1 + 1
        2

        Layout::

            job.json
            payload.log
        """
    )
    md = mod.to_markdown(text)
    assert "A `Job` and `elsewhere.map`." in md
    assert "| name | what |" in md
    assert "| ``a_very_long_name`` | first row goes on here |" in md
    assert "| ``b`` | second |" in md
    assert "```pycon\n>>> 1 + 1\n2\n```" in md
    assert "Layout:\n\n```text\njob.json\npayload.log\n```" in md
    assert "::" not in md and "====" not in md
