"""Indexing and joining: advanced indexing, gather/scatter, cat/stack/split, sorting."""

from __future__ import annotations

from tiny.tensor.base import TensorBase


class IndexingOps(TensorBase):
    __slots__ = ()
