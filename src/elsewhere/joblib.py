"""``import elsewhere.joblib``: joblib's ``Parallel``, and scikit-learn's ``n_jobs``, on any
elsewhere cluster (docs/joblib.md)::

    import joblib
    import elsewhere as ew
    import elsewhere.joblib  # registers the joblib backend "elsewhere"

    with joblib.parallel_config(backend="elsewhere", on=ew.slurm(partition="debug")):
        search = GridSearchCV(SVC(), grid).fit(X, y)

The backend is :class:`elsewhere.api.joblib_backend.ElsewhereBackend`; :func:`register`
registers it again (under another name, too).
"""

from __future__ import annotations

from .api.joblib_backend import ElsewhereBackend, register

__all__ = ["ElsewhereBackend", "register"]

register()
