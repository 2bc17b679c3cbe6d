"""Tasks as data and how they are answered: task files, the runner, per-request shapes, the
validators (ST, fault trees, diagnoses).
"""
