"""Models shipped with rung, as package data: ``edge-tiny`` is the demo model that ``rung
demo`` exports (its card: ``models/edge-tiny/README.md``)."""
