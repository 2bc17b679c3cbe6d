"""Offline tools for rung: the training-corpus generator for the demo model (``corpus``)."""
