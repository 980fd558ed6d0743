"""Register tiles the hand-written rules choose for convolutions on an AVX2 CPU (8 floats a vector, 2 threads):
kernels scheduled on PYTHON by the Tensor frontend, planned for the C renderer's caps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tiny.codegen.heuristic import hand_opts
from tiny.codegen.opt import Kernel, Kind
from tiny.ir.device import RendererCaps
from tiny.ir.uop import Ops
from tiny.tensor import Tensor

CPU = RendererCaps(language="C", vector_width=8, threads=2)


@pytest.mark.parametrize(
    ("shape", "kernel", "padding", "want"),
    [
        ((8, 64, 56, 56), 3, 1, {"x": 8, "cout": 8}),  # an 8-wide row vector serves 8 output channels: 8 vectors
        ((8, 32, 24, 24), 5, 0, {"x": 4, "cout": 8}),  # a 20-wide row: vectors of 4; 25 offsets keep the tile smaller
    ],
)
def test_a_convolution_tiles_output_channels_against_a_row_vector(
    shape: tuple[int, ...], kernel: int, padding: int, want: dict[str, int]
) -> None:
    n, c, h, w = shape
    x = Tensor.empty(n, c, h, w, device="PYTHON").realize()
    weight = Tensor.empty(c, c, kernel, kernel, device="PYTHON").realize()
    *_, item = [i for i in x.conv2d(weight, padding=padding).schedule() if i.ast.op is Ops.SINK]  # (after the pad)
    k = Kernel(item.ast, CPU)
    k.apply_opts(hand_opts(k))
    dims = {p.dim: p.size for p in k.of_kind(Kind.UPCAST)}
    # the kernel's dims: (n, cout, cin, y, x, ky, kx) (n and the groups dim of 1 are one run of memory: merged)
    assert {"x": dims.get(4), "cout": dims.get(1)} == want
    assert k.lanes() <= 1024


def test_a_weight_gradient_keeps_one_vector_per_output_of_its_window() -> None:
    """dW (cout, cin, 5, 5) = sum over (batch, y, x) of dY * X's window: no output vector forms (5 wide), the
    reduction along x accumulates in vectors, one per output: the tile is the 5 x 5 window (25 vectors), not more."""
    x = Tensor.empty(8, 16, 24, 24, device="PYTHON").realize()
    w = Tensor(np.zeros((16, 16, 5, 5), np.float32), device="PYTHON", requires_grad=True)
    g = Tensor.empty(8, 16, 20, 20, device="PYTHON").realize()
    (x.conv2d(w) * g).sum().backward()
    assert w.grad is not None
    *_, item = [i for i in w.grad.schedule() if i.ast.op is Ops.SINK]
    k = Kernel(item.ast, CPU)
    k.apply_opts(hand_opts(k))
    assert math.prod(p.size for p in k.of_kind(Kind.UPCAST)) == 25
    assert [p.size for p in k.of_kind(Kind.UNROLL)] == [4]
