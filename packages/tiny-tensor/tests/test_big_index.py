"""Tensors past 2**31 elements index with 64-bit math. On the NULL device nothing is allocated or run, so the
kernels of such tensors can be built and read here."""

from __future__ import annotations

import re

from tiny.ir.uop import Ops
from tiny.tensor import Tensor
from tiny.tensor.realize import compiled


def sources(t: Tensor) -> list[str]:
    return [compiled(item.ast, "NULL")[0].src for item in t.schedule() if item.ast.op is Ops.SINK]


def test_more_than_2_31_elements_index_with_64_bits() -> None:
    n = 2**31 + 8
    big = Tensor.ones(n, device="NULL").contiguous().realize()  # a buffer (NULL allocates nothing)
    (src,) = sources(big[::2] * 3 + 1)
    assert "long long ridx" in src


def test_small_tensors_keep_32_bit_indices() -> None:
    (src,) = sources(Tensor.ones(1000, device="NULL").contiguous().realize()[::2] * 3)
    assert "int ridx" in src and not re.search(r"long long (ridx|alu)\d", src)  # a 64-bit address, 32-bit math


def test_windows_over_more_than_2_31_elements_keep_32_bit_indices() -> None:
    """A reduction over a view of 2.25e9 elements (an expand, as a convolution's windows are) whose offsets stay
    small: every index is a loop counter or an offset below 2**31, so int32 math suffices (WGSL has no other)."""
    x = Tensor.ones(1000, device="NULL").contiguous().realize()
    (src,) = sources(x.reshape(1000, 1, 1).expand(1000, 1500, 1500).sum((1, 2)))
    assert "long long" not in src


def test_windows_over_more_than_2_31_elements_compute_right() -> None:
    x = Tensor.arange(600, dtype="int32") % 7  # sums that fit int32 too (a device without int64 sums in it)
    out = x.reshape(600, 1, 1).expand(600, 2000, 1800).sum((1, 2))
    assert out.tolist() == [i % 7 * 2000 * 1800 for i in range(600)]
