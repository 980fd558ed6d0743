"""The keys and values of the positions a language model has seen, kept for the next step's attention."""

from __future__ import annotations

from typing import Any

from tiny.ir.dtypes import DType
from tiny.tensor import Tensor
from tiny.tensor.inplace import assign_together


class KVCache:
    """Keys and values of shape (batch, heads, position, head_dim), preallocated for max_context positions (made on
    the first step, and again when the batch changes). A step writes its keys and values at start_pos (an int, or a
    bound Variable, so that a jitted step replays for every position) and attends over the cache up to its end.

    dtype: what the cache keeps (None: the keys' own dtype). float16 halves its memory and the bytes a decode step's
    attention reads, as llama.cpp keeps its cache; a step still gets its keys and values in its own dtype (each
    widened as read)."""

    def __init__(self, max_context: int, dtype: DType | None = None) -> None:
        self.max_context, self.dtype = max_context, dtype
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def update(self, k: Tensor, v: Tensor, start_pos: Any) -> tuple[Tensor, Tensor]:
        """Write this step's k and v at start_pos; the keys and values of every position up to the step's end."""
        batch, heads, length, head_dim = k.shape
        if self.keys is None or self.values is None or self.keys.shape[0] != batch:
            shape = (batch, heads, self.max_context, head_dim)
            kept = self.dtype or k.dtype
            self.keys = Tensor.zeros(*shape, dtype=kept, device=k.device).contiguous().realize()
            self.values = Tensor.zeros(*shape, dtype=kept, device=v.device).contiguous().realize()
        end, kept = start_pos + length, self.keys.dtype  # (made with the first step's dtype where none was given)
        assign_together(
            (self.keys[:, :, start_pos:end], k.cast(kept)), (self.values[:, :, start_pos:end], v.cast(kept))
        )
        return self.keys[:, :, :end].cast(k.dtype), self.values[:, :, :end].cast(v.dtype)


def causal_mask(length: int, start_pos: Any, device: str | None) -> Tensor | None:
    """Which keys each of `length` queries at positions start_pos.. sees (length, start_pos + length): every cached
    position before start_pos, and its own chunk's up to itself. None for one query (it sees all). start_pos may be
    a bound Variable: the mask is the chunk's triangle padded with True on the left, so a jitted pass over a chunk
    of a prompt replays at every chunk's position."""
    if length == 1:
        return None
    own = Tensor.ones(length, length, dtype="bool", device=device).tril()
    return own.pad(((0, 0), (start_pos, 0)), value=True)
