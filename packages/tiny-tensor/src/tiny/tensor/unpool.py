"""max_unpool: each value put back where max_pool's indices say it came from, zeros elsewhere (torch's
max_unpool1d/2d)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tiny.ir.uop import UOp
from tiny.tensor.base import TensorBase
from tiny.tensor.gradient import Grads, set_composite_rule
from tiny.tensor.windows import IntOrSeq, pool_ints

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor


class UnpoolOps(TensorBase):
    __slots__ = ()

    def max_unpool2d(
        self,
        indices: Tensor,
        kernel_size: IntOrSeq,
        stride: IntOrSeq | None = None,
        padding: IntOrSeq = 0,
        output_size: Sequence[int] | None = None,
    ) -> Tensor:
        """(N, C, H, W) values put at their flat indices (from max_pool2d(..., return_indices=True)) in planes of
        output_size (default: (H - 1) * stride - 2 * padding + kernel_size each way), zeros elsewhere, as torch's
        max_unpool2d. Two values with one index: the later one in the plane is kept.

        >>> y, i = Tensor([[[[1.0, 4.0], [3.0, 2.0]]]]).max_pool2d(2, return_indices=True)
        >>> y.max_unpool2d(i, 2).tolist()
        [[[[0.0, 4.0], [0.0, 0.0]]]]
        """
        return self._max_unpool(indices, kernel_size, stride, padding, output_size, 2)

    def max_unpool1d(
        self,
        indices: Tensor,
        kernel_size: IntOrSeq,
        stride: IntOrSeq | None = None,
        padding: IntOrSeq = 0,
        output_size: Sequence[int] | None = None,
    ) -> Tensor:
        """max_unpool2d's inverse of max_pool1d over (N, C, L).

        >>> y, i = Tensor([[[1.0, 3.0, 2.0, 0.0]]]).max_pool1d(2, return_indices=True)
        >>> y.max_unpool1d(i, 2).tolist()
        [[[0.0, 3.0, 2.0, 0.0]]]
        """
        return self._max_unpool(indices, kernel_size, stride, padding, output_size, 1)

    def _max_unpool(
        self,
        indices: Tensor,
        kernel_size: IntOrSeq,
        stride: IntOrSeq | None,
        padding: IntOrSeq,
        output_size: Sequence[int] | None,
        nd: int,
    ) -> Tensor:
        name = f"max_unpool{nd}d"
        if self.ndim not in (nd + 1, nd + 2):
            raise ValueError(f"{name}() needs input (N, C, {nd} spatial dims) or (C, ...), got shape {self.shape}")
        if not isinstance(indices, TensorBase) or indices.shape != self.shape or not indices.dtype.is_int:
            got = f"{indices.dtype.name} of shape {indices.shape}" if isinstance(indices, TensorBase) else indices
            raise ValueError(f"{name}() needs integer indices of the input's shape {self.shape}, got {got}")
        kernel = pool_ints(kernel_size, nd, "kernel_size", name, 1)
        strides = kernel if stride is None else pool_ints(stride, nd, "stride", name, 1)
        pads = pool_ints(padding, nd, "padding", name, 0)
        spatial = self.shape[-nd:]
        default = tuple((s - 1) * st - 2 * p + k for s, st, p, k in zip(spatial, strides, pads, kernel))
        out = default if output_size is None else tuple(output_size)[-nd:]
        if len(out) != nd or any(not isinstance(o, int) or o < 1 for o in out):
            raise ValueError(f"{name}() output_size gives {nd} sizes of at least 1, got {output_size!r}")
        for o, d, st in zip(out, default, strides):
            if not d - st < o < d + st:
                raise ValueError(f"{name}() output_size {tuple(out)} is not within a stride of {default}")
        lead = self.shape[:-nd]
        planes = math.prod(lead)
        tensor, where = type(self), indices.reshape(planes, -1)
        flat = tensor.zeros(planes, math.prod(out), dtype=self.dtype, device=self.device)
        put = flat.scatter(1, where, self.reshape(planes, -1))

        def unpool_grads(node: UOp, inputs: tuple[UOp, ...], g: UOp, needed: tuple[bool, ...]) -> Grads:
            """Each value's gradient is the output's gradient where its index put it, as torch's: two values with
            one index both take it (scatter's own rule gives the overwritten one none)."""
            return (tensor(g).gather(1, where).uop,) if needed[0] else (None,)

        set_composite_rule(put.uop, (self.reshape(planes, -1).uop,), unpool_grads)
        return put.reshape(*lead, *out)
