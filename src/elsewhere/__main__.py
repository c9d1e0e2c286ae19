"""``python -m elsewhere``: the command line."""

from .cli import main

raise SystemExit(main())
