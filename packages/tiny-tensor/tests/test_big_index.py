"""Tensors past 2**31 elements index with 64-bit math. On the NULL device nothing is allocated or run, so the
kernels of such tensors can be built and read here."""

from __future__ import annotations

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
    assert "int ridx" in src and "long long" not in src
