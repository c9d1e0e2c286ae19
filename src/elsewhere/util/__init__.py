"""The bottom layer: what every other layer speaks.

``errors`` (the exception tree), ``states`` (the task and job state vocabulary), ``units`` (sizes
and durations), ``paths`` (where elsewhere keeps its files), ``progress`` (the progress bar),
``command`` (``python=``: how the other side starts Python), ``signals`` (how a process ended,
in words), ``version``, ``docsite`` (the address of the documentation site and its pages).
Imports nothing of elsewhere.
"""
