"""``python -m elsewhere``: the command line."""

from .api.cli import main

raise SystemExit(main())
