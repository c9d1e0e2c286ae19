"""How the ``elsewhere`` command writes for people: fitted to where its output goes.

- Colour only on a terminal, and never when ``NO_COLOR`` is set to anything (no-color.org);
  ``FORCE_COLOR`` forces it (rich reads both, and ``TERM=dumb``).
- On a pipe or a file, no line is wrapped: a command in a hint (``elsewhere status
  demo-1767...``) stays on one line, to be copied or grepped; a table takes the width it
  needs (up to :data:`PIPE_WIDTH` columns) rather than the 80 rich assumes there.
- Progress bars show only on a terminal (``elsewhere.util.progress``).

Scripts should read ``--json``: strict JSON, the same wherever it goes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["PIPE_WIDTH", "console"]

#: The widest a line drawn for a pipe or a file may be (a table's natural width, up to this).
PIPE_WIDTH = 1000


def console() -> Any:
    """A rich Console on stdout for the shell's human-readable output (see the module)."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    width = os.environ.get("COLUMNS", "")
    return Console(soft_wrap=True, width=int(width) if width.isdigit() else PIPE_WIDTH)
