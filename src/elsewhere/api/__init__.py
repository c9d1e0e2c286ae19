"""The user's side: ``ew.map``, ``ew.submit``, ``Job``, ``Executor``, the command line.

Everything here is reached through ``import elsewhere as ew`` or the ``elsewhere`` command;
the modules are the implementation (``functions``, ``job``, ``tasks``, ``executor``, ``mpi``,
``profiles``, ``cli``, ``peer_cli``, ``doctor``, ``demo``).
"""
