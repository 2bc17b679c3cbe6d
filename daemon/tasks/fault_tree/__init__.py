"""The ``fault_tree`` kind of task (``kind.py``): the tree's checks and analysis
(``analysis``) and its shape while written (``shape``).
"""
