"""Where the documentation site is, and the address of each of its pages.

The one place the site's address is written in the code: a message that sends its reader to
the documentation names :func:`page`, never a path in the repository (the docs are not in the
wheel). The job-script templates carry the same address in their opening comment, and
``mkdocs.yml``'s ``site_url`` is :data:`DOCS_URL`: ``tests/docs/test_site.py`` checks both, and
that every page named this way exists on the built site.
"""

from __future__ import annotations

#: The published documentation site (the build of ``docs/`` by ``scripts/docs``).
DOCS_URL = "https://elsewhere.readthedocs.io/"


def page(name: str, anchor: str = "") -> str:
    """The address of the site's page ``name`` (its file under ``docs/`` without ``.md``:
    ``"cli"``, ``"schedulers"``, ``"reference/api"``), at ``anchor`` if given."""
    return f"{DOCS_URL}{name}/" + (f"#{anchor}" if anchor else "")
