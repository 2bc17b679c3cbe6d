"""Tasks as data and how they are answered: task files, the runner, per-request shapes,
validation and the quality figure (the machinery), the kinds of task by name
(``kinds``), and one package per kind: ``st``, ``fault_tree``, ``diagnosis``.
"""
