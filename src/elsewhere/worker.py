"""``python -m elsewhere.worker``: the command every backend starts on the other side.

The worker itself is :mod:`elsewhere.run.worker`; this name is the public, stable one that
job scripts, plugins and jobs submitted by earlier versions call.
"""

from __future__ import annotations

import sys

from .run.worker import main

if __name__ == "__main__":
    sys.exit(main())
