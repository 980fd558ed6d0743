"""Token embeddings by rows: each token id picks its row of the table through a view, in a jitted copy.

A lookup by a tensor of ids (Embedding.__call__) compares each id with every row of the table: for a 32000-token
vocabulary that is a pass over the whole table per token, 55 ms a token at 2048 wide on two cores, and over a
quantized table it makes the whole table in float32 first. Here each id is a bound Variable instead: its row is a
shrink of the table (of its blocks where the table is quantized: Tensor.blocks), one small kernel per token that a
TinyJit replays, and no more is read than the rows themselves.
"""

from __future__ import annotations

from typing import Any

from tiny.nn import Embedding
from tiny.tensor import Tensor, TinyJit, Variable


def embed_rows(embedding: Embedding, tokens: Tensor | Any) -> Tensor:
    """The embeddings of token ids (batch, length), or of one id that is a bound Variable (batch 1, length 1), as
    `embedding(tokens)` gives them. Where the table takes gradients, the lookup is Embedding's own (a tensor of ids
    compared with every row, which gradients flow through)."""
    weight = embedding.weight
    if not isinstance(tokens, Tensor):
        return _row(weight, tokens).reshape(1, 1, weight.shape[1])
    if weight.requires_grad:
        return embedding(tokens)
    ids = tokens.numpy()
    if ids.dtype.kind not in "iu":
        raise TypeError(f"Embedding takes integer indices, got dtype {tokens.dtype.name}")
    vocab = weight.shape[0]
    if ids.size and (ids.min() < -vocab or ids.max() >= vocab):
        raise IndexError(f"token ids must be in [-{vocab}, {vocab}), got {ids.min()}..{ids.max()}")
    copy = _copies(embedding, ids.size)
    with Tensor.no_grad():  # (no gradient goes through ids: the copies are plain writes)
        for at, token in enumerate(ids.reshape(-1).tolist()):
            copy.step(copy.row.bind(token % vocab), copy.at.bind(at))
        return copy.out[: ids.size].reshape(*ids.shape, weight.shape[1]).contiguous().realize()


def _row(weight: Tensor, token: Any) -> Tensor:
    blocks = weight.blocks()
    return (weight if blocks is None else blocks)[token : token + 1].reshape(1, weight.shape[1])


class _Copies:
    """A table's jitted row copy into `out` (rows to fill, one per token), kept on its Embedding."""

    def __init__(self, embedding: Embedding, rows: int) -> None:
        weight = embedding.weight
        self.weight, self.rows = weight, rows
        self.out = Tensor.empty(rows, weight.shape[1], dtype=weight.dtype, device=weight.device).contiguous().realize()
        self.row = Variable("row", 0, weight.shape[0] - 1)
        self.at = Variable("at", 0, rows - 1)

        out = self.out

        def put(row: Any, at: Any) -> Tensor:  # (the table is no argument: a jit realizes those, a lazy table whole)
            out[at : at + 1] = _row(weight, row)
            return out.realize()

        self.step = TinyJit(put)


def _copies(embedding: Embedding, rows: int) -> _Copies:
    """The copier for at least `rows` ids, made again when the table changes or more rows are asked for (to the
    next power of two, so that prompts of growing lengths reuse one)."""
    kept: _Copies | None = getattr(embedding, "_row_copies", None)
    if kept is None or kept.weight is not embedding.weight or kept.rows < rows:
        kept = _Copies(embedding, 1 << max(rows - 1, 0).bit_length())
        embedding._row_copies = kept  # type: ignore[attr-defined]
    return kept
