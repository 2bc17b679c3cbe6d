"""A fixture's mapping built one entry at a time, when a test first reads it: a test of one
architecture exports one engine, not the sweep (``make quick`` runs one architecture;
``make test`` reads them all)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lazy(Mapping[K, V], Generic[K, V]):
    """``keys`` in order; ``build(key)`` makes a value once, on its first read."""

    def __init__(self, keys: Iterable[K], build: Callable[[K], V]) -> None:
        self._keys = list(keys)
        self._build = build
        self._built: dict[K, V] = {}

    def __getitem__(self, key: K) -> V:
        if key not in self._built:
            if key not in self._keys:
                raise KeyError(key)
            self._built[key] = self._build(key)
        return self._built[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)
