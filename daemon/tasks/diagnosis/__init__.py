"""The ``diagnosis`` kind of task (``kind.py``): what code knows of a snapshot
(``snapshot``), for the shape and the check.
"""
