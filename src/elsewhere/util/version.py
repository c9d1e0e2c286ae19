"""The version of elsewhere (the one number: ``elsewhere.__version__`` is this)."""

__version__ = "0.1.0"
