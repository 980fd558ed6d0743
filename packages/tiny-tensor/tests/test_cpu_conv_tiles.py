"""Register tiles the hand-written rules choose for convolutions on an AVX2 CPU (8 floats a vector, 2 threads):
kernels scheduled on PYTHON by the Tensor frontend, planned for the C renderer's caps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tiny.codegen.opt import Kernel, Kind
from tiny.codegen.opt.heuristic import hand_opts
from tiny.codegen.program import render_for
from tiny.codegen.renderer.cstyle import CRenderer
from tiny.ir.device import RendererCaps
from tiny.ir.schedule.cache import ScheduleItem
from tiny.ir.uop import Ops
from tiny.tensor import Device, Tensor

CPU = RendererCaps(language="C", vector_width=8, threads=2)


@pytest.mark.parametrize(
    ("shape", "kernel", "padding", "want"),
    [
        ((8, 64, 56, 56), 3, 1, {"x": 8, "cout": 8}),  # an 8-wide row vector serves 8 output channels: 8 vectors
        # a 20-wide row: vectors of 4; the window's rows a loop (one view: opt.merge_windows), its 5 offsets along x
        # written out: room for 16 output channels
        ((8, 32, 24, 24), 5, 0, {"x": 4, "cout": 16}),
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


def test_a_weight_gradient_keeps_one_vector_per_output_of_its_window_row() -> None:
    """dW (cout, cin, 5, 5) = sum over (batch, y, x) of dY * X's window: no output vector forms (5 wide), the
    reduction along x accumulates in vectors, one per output: the tile is a row of the window (5) by 2 output
    channels (10 vectors); the window's rows are a loop, its view one load (no gates to fold by writing it out)."""
    x = Tensor.empty(8, 16, 24, 24, device="PYTHON").realize()
    w = Tensor(np.zeros((16, 16, 5, 5), np.float32), device="PYTHON", requires_grad=True)
    g = Tensor.empty(8, 16, 20, 20, device="PYTHON").realize()
    (x.conv2d(w) * g).sum().backward()
    assert w.grad is not None
    *_, item = [i for i in w.grad.schedule() if i.ast.op is Ops.SINK]
    k = Kernel(item.ast, CPU)
    k.apply_opts(hand_opts(k))
    assert sorted(p.size for p in k.of_kind(Kind.UPCAST)) == [2, 5]
    assert [p.size for p in k.of_kind(Kind.UNROLL)] == [4]
    assert sum(u.op is Ops.READ for u in k.ast.toposort) == 2  # X's 25 window views are one


@pytest.mark.parametrize(
    ("shape", "cout", "kernel", "padding"), [((128, 32, 24, 24), 32, 5, 0), ((128, 32, 10, 10), 64, 3, 0)]
)
def test_a_cpu_convolution_keeps_output_channels_innermost(
    shape: tuple[int, ...], cout: int, kernel: int, padding: int
) -> None:
    """On the CPU device (output channels a multiple of the vector) the forward pass, the input's and the weight's
    gradients each compute output channels innermost in memory: vectors of output channels, tiled along x."""
    n, c, h, w_ = shape
    x = Tensor.empty(n, c, h, w_, device="CPU").realize()
    x.requires_grad = True
    w = Tensor(np.zeros((cout, c, kernel, kernel), np.float32), device="CPU", requires_grad=True)
    y = x.conv2d(w, padding=padding)
    g = Tensor.empty(*y.shape, device="CPU").realize()
    dx, dw = y.gradient(x, w, gradient=g)
    for t, channels in ((y, cout), (dx, c), (dw, cout)):
        item = max((i for i in t.schedule() if i.ast.op is Ops.SINK), key=_reduced_elements)
        k = Kernel(item.ast, CPU)
        store = k.ast.src[0].view
        inner = store.strides.index(1)
        assert channels % store.shape[inner] == 0 and store.shape[inner] % 8 == 0  # (all of them, or a panel's)
        k.apply_opts(hand_opts(k))
        vector = [p.size for p in k.of_kind(Kind.UPCAST) if p.dim == inner]
        assert vector and vector[0] % 8 == 0
        assert 4 * 8 <= math.prod(p.size for p in k.of_kind(Kind.UPCAST)) <= 96  # 4 to 12 vectors of accumulators


def _reduced_elements(item: ScheduleItem) -> int:
    """The elements the biggest reduction of a scheduled kernel reads (0 without one)."""
    reductions = [u for u in item.ast.toposort if u.op is Ops.REDUCE_AXIS]
    return max((math.prod(r.src[0].shape) for r in reductions), default=0)


def test_a_channels_last_weight_gradient_tiles_output_channels_by_a_window_row() -> None:
    """MNIST's conv2 weight gradient on the CPU (channels-last, summed over groups of two images): 16 output channels
    by the whole 5-wide window row (10 vectors: a loaded input value serves 5 window offsets along the row as the
    row moves), the reduction along the output row unrolled by 4, and the group's two images a loop (not unrolled:
    that would halve the row's unroll)."""
    x = Tensor.empty(8, 32, 24, 24, device="CPU").realize()
    w = Tensor(np.zeros((32, 32, 5, 5), np.float32), device="CPU", requires_grad=True)
    y = x.conv2d(w)
    (dw,) = y.gradient(w, gradient=Tensor.empty(*y.shape, device="CPU").realize())
    item = max((i for i in dw.schedule() if i.ast.op is Ops.SINK), key=_reduced_elements)
    k = Kernel(item.ast, CPU)
    assert k.full_shape == (4, 2, 20, 20, 32, 5, 5, 32)  # (groups, images, y, x, cin, ky, kx, cout)
    k.apply_opts(hand_opts(k))
    assert {p.dim: p.size for p in k.of_kind(Kind.UPCAST)} == {7: 16, 6: 5}
    assert [(p.dim, p.size) for p in k.of_kind(Kind.UNROLL)] == [(3, 4)]


@pytest.mark.parametrize(("h", "kernel", "padding"), [(24, 5, 0), (10, 3, 1)])
def test_a_channels_last_input_gradient_skips_the_rows_of_padding(h: int, kernel: int, padding: int) -> None:
    """The input gradient is a convolution of the output gradient padded by kernel-1 (less the forward's padding):
    its padded columns are written into a copy, its rows stay a band of one view (opt.merge_windows), and the loop
    over the kernel's rows runs only over the rows that are there (tiny.codegen.narrow): no load is gated, none
    reads a row of zeros."""
    x = Tensor.empty(8, 32, h, h, device="CPU").realize()
    w = Tensor.empty(32, 32, kernel, kernel, device="CPU").realize()
    x.requires_grad = True
    y = x.conv2d(w, padding=padding)
    (dx,) = y.gradient(x, gradient=Tensor.empty(*y.shape, device="CPU").realize())
    item = max((i for i in dx.schedule() if i.ast.op is Ops.SINK), key=_reduced_elements)
    (window,) = [u.view for u in Kernel(item.ast, CPU).ast.toposort if u.op is Ops.READ and u.view.bands]
    (band,) = window.bands
    rows = h + 2 * padding - kernel + 1  # the output gradient's, padded by kernel - 1 above and below: row y + ky of
    assert band[2:] == (1, kernel - 1, rows + kernel - 1)  # it is real where k - 1 <= y + ky < rows + k - 1
    uops = render_for(item.ast, CRenderer("x86_64;vector_width=8;threads=2;")).uops
    assert any(u.op is Ops.RANGE and u.end.op is not Ops.CONST for u in uops)
    assert not any(u.op is Ops.LOAD and u.address.gate is not None for u in uops)


@pytest.mark.parametrize("kw", [dict(stride=2, padding=1), dict(dilation=2, padding=2)], ids=str)
def test_a_strided_or_dilated_channels_last_convolution_writes_all_its_padding(kw: dict) -> None:
    """With a stride or dilation along the rows a kernel row's reads are no band a loop bound follows: the padded
    copy has the rows' zeros too, and the window is one plain view (no band, no gate)."""
    x = Tensor.empty(8, 32, 16, 16, device="CPU").realize()
    w = Tensor.empty(32, 32, 3, 3, device="CPU").realize()
    item = max((i for i in x.conv2d(w, **kw).schedule() if i.ast.op is Ops.SINK), key=_reduced_elements)
    views = [u.view for u in Kernel(item.ast, CPU).ast.toposort if u.op is Ops.READ]
    assert len(views) == 2 and not any(v.bands or v.mask for v in views)


@pytest.mark.parametrize(("c", "stride", "spare"), [(512, 1, 16), (128, 2, 16), (256, 1, 16), (96, 1, 0), (64, 2, 0)])
def test_a_channels_last_input_copy_leaves_a_line_after_positions_a_multiple_of_1kb_apart(
    c: int, stride: int, spare: int
) -> None:
    """The padded channels-last copy a 3 x 3 convolution reads keeps a cache line of unused channels after each
    position where the tile's positions would be a multiple of 1 KB apart (512 channels: 2 KB, or 4 KB at a stride
    of 2, all in one or two of the L1's sets); the convolution reads its channels only."""
    x = Tensor.empty(8, c, 14, 14, device="CPU").realize()
    w = Tensor.empty(64, c, 3, 3, device="CPU").realize()
    y = x.conv2d(w, padding=1, stride=stride)
    item = max((i for i in y.schedule() if i.ast.op is Ops.SINK), key=_reduced_elements)
    # the kernel's dims (n, y, x, [panels,] cout, cin, ky, kx): the input's window reads run along cin
    windows = [u.view for u in item.ast.toposort if u.op is Ops.READ and u.view.strides[-3] == 1]
    assert len(windows) == 9 and all(v.strides[2] == stride * (c + spare) for v in windows)


@pytest.mark.parametrize(("cout", "kernel"), [(128, 3), (256, 1), (48, 3)])
def test_a_channels_last_convolution_reads_its_weight_in_panels_of_two_vectors(cout: int, kernel: int) -> None:
    """The weight's copy is in panels (C_out / width, C_in, *kernel, width) where two vectors divide C_out: the
    tile's vectors of output channels read one contiguous block down the reduction, where rows of all C_out put them
    C_out apart; with C_out innermost otherwise (48 on AVX-512's 32-wide panels)."""
    from tiny.ir.device import Device
    from tiny.ir.dtypes import dtypes

    lanes = Device["CPU"].renderer.caps.vector_lanes(dtypes.float32)
    width = 2 * lanes if cout % (2 * lanes) == 0 else 0
    x = Tensor.empty(8, 64, 14, 14, device="CPU").realize()
    w = Tensor.empty(cout, 64, kernel, kernel, device="CPU").realize()
    item = max((i for i in x.conv2d(w, padding=kernel // 2).schedule() if i.ast.op is Ops.SINK), key=_reduced_elements)
    # the weight: the read that is the same for every position; its stride along C_in (third from the end)
    (weight,) = [u.view for u in item.ast.toposort if u.op is Ops.READ and u.view.strides[0] == 0]
    assert weight.strides[-3] == kernel * kernel * (width or cout)


def test_a_big_bodied_kernel_that_is_no_tile_is_held_to_a_lowering_size() -> None:
    """The MNIST CNN's backward: its second max pool's gradient through the batch norm is a 229-node body over a
    6 x 6 plane, which the rules wrote out whole for a vector of channels (288 values a thread with 8-lane vectors,
    576 with 16: 130k nodes lowered to simplify to 1.8k, 2 s of a cold MNIST step). A kernel that is not a register
    tile is held to LOWERED_NODES nodes (AST nodes x values per thread)."""
    from tiny.codegen.opt.heuristic import LOWERED_NODES, TILE_NODES
    from tiny.examples.mnist import MnistCNN
    from tiny.nn.state import get_parameters

    Tensor.manual_seed(0)
    model = MnistCNN()
    with Tensor.train():
        model(Tensor.empty(8, 1, 28, 28)).sum().backward()
    grads = [p.grad for p in get_parameters(model) if p.grad is not None]
    biggest = 0
    for item in grads[0].schedule(*grads[1:]):
        if item.ast.op is not Ops.SINK:
            continue
        k, nodes = Kernel(item.ast, CPU), len(item.ast.toposort)
        k.apply_opts(hand_opts(k))
        if not (k.reduce_dims and nodes <= TILE_NODES):  # (a register tile's body is small: not held)
            assert nodes * k.lanes() <= LOWERED_NODES or k.lanes() == 1, (nodes, k.lanes())
            biggest = max(biggest, nodes)
    assert biggest > 200, "the max pool's backward is there (the test would say nothing)"


def _needs_sixteen_lanes() -> None:
    """The rules below are AVX-512's, and the schedule they act on is laid out for the host (its panels two of its
    vectors wide): on a host of 8 lanes (AVX2) the kernel is another one."""
    if Device["CPU"].renderer.caps.vector_width != 16:
        pytest.skip("the CPU here has no 16-lane vectors (AVX-512): the schedule's panels are this host's")


@pytest.mark.parametrize("shape", [(8, 256, 14, 14), (8, 512, 7, 7), (8, 128, 28, 28)])
def test_a_channels_last_convolution_tiles_seven_positions_on_sixteen_lane_vectors(shape: tuple[int, ...]) -> None:
    """AVX-512 (16 lanes, 32 registers): a 3 x 3 convolution over rows of 7, 14 or 28 positions (ResNet-50's last
    stages) tiles 7 positions of a row by two vectors of output channels, 14 accumulators, where 8 and 4 divide no
    row of 7 and 14 (it kept 2 positions of a 14-wide row and none of a 7-wide one: 141 and 87 GFLOPS against 303
    and 221 on 2 cores)."""
    _needs_sixteen_lanes()
    n, c, h, w = shape
    x = Tensor.empty(n, c, h, w, device="CPU").realize()
    weight = Tensor.empty(c, c, 3, 3, device="CPU").realize()
    item = max((i for i in x.conv2d(weight, padding=1).schedule() if i.ast.op is Ops.SINK), key=_reduced_elements)
    k = Kernel(item.ast, RendererCaps(language="C", vector_width=16, threads=2))
    k.apply_opts(hand_opts(k))
    assert sorted(p.size for p in k.of_kind(Kind.UPCAST)) == [7, 32]


def test_a_convolution_over_a_weight_past_the_cache_loops_over_its_output_channel_blocks_outermost() -> None:
    """A 3 x 3 convolution of 1280 channels over 8 x 8 (a Stable Diffusion UNet's innermost stage): its weight, 59
    MB, is read once, each block of output channels' slice while every position passes it, where all of it streamed
    past each tile of positions (2 x 1280 x 8 x 8 on 2 AVX-512 cores: 36 -> 23 ms); a weight that fits stays inner.
    The same for a weight copied in panels (1280 channels: 40 of 32) and one with all output channels innermost
    (1296 and 272: no whole number of panels)."""
    _needs_sixteen_lanes()
    for c, want in ((1280, True), (1296, True), (272, False)):
        x = Tensor.empty(2, c, 8, 8, device="CPU").realize()
        weight = Tensor.empty(c, c, 3, 3, device="CPU").realize()
        item = max((i for i in x.conv2d(weight, padding=1).schedule() if i.ast.op is Ops.SINK), key=_reduced_elements)
        k = Kernel(item.ast, RendererCaps(language="C", vector_width=16, threads=2))
        k.apply_opts(hand_opts(k))
        # the weight: read as vectors, the same for every position (n is its first dim); its blocks, the dims it
        # varies along (its output channels', or its panels')
        weight_view = next(u.view for u in k.ast.toposort if u.op is Ops.READ and u.view.strides[0] == 0)
        first = next(p for p in k.axes if p.kind in (Kind.GLOBAL, Kind.THREAD))
        assert (weight_view.strides[first.dim] != 0) is want, (c, [(p.kind, p.dim, p.size) for p in k.axes])
