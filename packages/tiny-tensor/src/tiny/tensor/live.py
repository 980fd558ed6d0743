"""The registry of live tensors: realize() moves every tensor that reads what it computed onto the new buffers, and
in-place writes and TinyJit look for tensors with work pending."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class LiveSet(Generic[T]):
    """Objects held weakly, in the order they were added. A plain list of weak references without callbacks, so
    that adding one is cheap and a death costs nothing; dead references are dropped as the objects are listed, once
    they are half the list or the list has doubled since it was last pruned."""

    __slots__ = ("refs", "limit", "settled")
    MIN_LIMIT = 1024

    def __init__(self, settled: Callable[[T], bool] | None = None) -> None:
        self.refs: list[weakref.ref[T]] = []
        self.limit = self.MIN_LIMIT
        self.settled = settled  # objects for which it says True are listed no more (dropped as the dead are)

    def add(self, obj: T) -> None:
        self.refs.append(weakref.ref(obj))
        if len(self.refs) > self.limit:
            self.alive()

    def alive(self) -> list[T]:
        """The objects alive (and not settled) now; the references to the others are dropped once they are half the
        list, or the list has doubled since it was last pruned."""
        out: list[T] = []
        settled = self.settled
        for ref in self.refs:
            obj = ref()
            if obj is not None and (settled is None or not settled(obj)):
                out.append(obj)
        if 2 * len(out) < len(self.refs) or len(self.refs) > self.limit:
            # (weakref.ref gives back the plain reference an object has already)
            self.refs, self.limit = list(map(weakref.ref, out)), max(self.MIN_LIMIT, 2 * len(out))
        return out

    def __iter__(self) -> Iterator[T]:
        return iter(self.alive())

    def __len__(self) -> int:
        return len(self.alive())
