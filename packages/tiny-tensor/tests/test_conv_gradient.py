"""A convolution's input gradient is a convolution too (of the gradient, with the flipped weight), never the
window gradient of its primitives: a buffer kernel-size times the input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensor_helpers import small

from tiny import nn
from tiny.ir.device import Device
from tiny.ir.schedule import layout
from tiny.ir.uop import Ops
from tiny.tensor import Tensor, windows


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _largest_buffer(t: Tensor) -> int:
    return max(b.size for item in t.schedule() for b in item.buffers)


CASES = [
    dict(),
    dict(padding=2),
    dict(padding="same", dilation=2),
    dict(stride=2, padding=1),
    dict(stride=(2, 1), dilation=(1, 2), groups=2),
]


@pytest.mark.parametrize("kw", CASES, ids=str)
def test_input_gradient_is_a_convolution(device: str, kw: dict) -> None:
    xs, ws = (2, 4, 9, 8), (6, 4 // kw.get("groups", 1), 3, 3)
    x = Tensor(_rand(*xs), device=device, requires_grad=True)
    w = Tensor(_rand(*ws, seed=1), device=device, requires_grad=True)
    y = x.conv2d(w, **kw)
    g = Tensor(_rand(*y.shape, seed=2), device=device)
    dx, dw = y.gradient(x, w, gradient=g)
    assert _largest_buffer(dx) < 9 * x.numel()  # no (N, C, OH, OW, 3, 3) window gradient
    tx, tw = torch.tensor(_rand(*xs), requires_grad=True), torch.tensor(_rand(*ws, seed=1), requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, **kw)
    ty.backward(torch.tensor(_rand(*y.shape, seed=2)))
    np.testing.assert_allclose(dx.numpy(), tx.grad.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(dw.numpy(), tw.grad.numpy(), atol=1e-4, rtol=1e-4)


def test_the_rule_survives_a_realize_in_the_middle(device: str) -> None:
    """Batch norm's running statistics realize the forward half-way; the gradient still takes the rule."""
    x = Tensor(_rand(2, 3, 10, 10), device=device, requires_grad=True)
    w1 = Tensor(_rand(4, 3, 3, 3, seed=1), device=device, requires_grad=True)
    w2 = Tensor(_rand(5, 4, 3, 3, seed=2), device=device, requires_grad=True)
    h = x.conv2d(w1).relu()
    h.mean().realize()  # a reader of h computed now: h's reduction becomes a buffer
    h.realize()
    loss = h.conv2d(w2).square().sum()
    dx, dw1 = loss.gradient(x, w1)
    assert _largest_buffer(dx) < 9 * 4 * 8 * 8 * 2
    tx = torch.tensor(_rand(2, 3, 10, 10), requires_grad=True)
    tw1 = torch.tensor(_rand(4, 3, 3, 3, seed=1), requires_grad=True)
    tw2 = torch.tensor(_rand(5, 4, 3, 3, seed=2))
    torch.nn.functional.conv2d(torch.nn.functional.conv2d(tx, tw1).relu(), tw2).square().sum().backward()
    np.testing.assert_allclose(dx.numpy(), tx.grad.numpy(), atol=1e-3, rtol=1e-4)
    np.testing.assert_allclose(dw1.numpy(), tw1.grad.numpy(), atol=1e-3, rtol=1e-4)


def test_transposed_convolution_gradients(device: str) -> None:
    x = Tensor(_rand(2, 4, 5, 6), device=device, requires_grad=True)
    w = Tensor(_rand(4, 3, 3, 3, seed=1), device=device, requires_grad=True)
    y = x.conv_transpose2d(w, stride=2, padding=1, output_padding=1)
    dx, dw = y.square().sum().gradient(x, w)
    assert _largest_buffer(dx) < 9 * y.numel()
    tx = torch.tensor(_rand(2, 4, 5, 6), requires_grad=True)
    tw = torch.tensor(_rand(4, 3, 3, 3, seed=1), requires_grad=True)
    torch.nn.functional.conv_transpose2d(tx, tw, stride=2, padding=1, output_padding=1).square().sum().backward()
    np.testing.assert_allclose(dx.numpy(), tx.grad.numpy(), atol=1e-3, rtol=1e-4)
    np.testing.assert_allclose(dw.numpy(), tw.grad.numpy(), atol=1e-3, rtol=1e-4)


def test_second_derivative_through_the_rule(device: str) -> None:
    x = Tensor(_rand(1, 2, 6, 6), device=device, requires_grad=True)
    w = Tensor(_rand(3, 2, 3, 3, seed=1), device=device, requires_grad=True)
    (dx,) = x.conv2d(w, padding=1).square().sum().gradient(x)
    (dw,) = dx.square().sum().gradient(w)
    tx = torch.tensor(_rand(1, 2, 6, 6), requires_grad=True)
    tw = torch.tensor(_rand(3, 2, 3, 3, seed=1), requires_grad=True)
    (tdx,) = torch.autograd.grad(torch.nn.functional.conv2d(tx, tw, padding=1).square().sum(), tx, create_graph=True)
    tdx.square().sum().backward()
    np.testing.assert_allclose(dw.numpy(), tw.grad.numpy(), atol=1e-2, rtol=1e-3)


def test_transposed_convolution_whose_lanes_fold_to_constants(device: str) -> None:
    """Stride-2 phases written out as lanes: some lanes' sums fold to 0, and must still share the loops of the
    others (the linearizer once pulled the shared loops out of the output loops)."""
    g, w = _rand(2, 6, 5, 4), _rand(6, 4, 3, 3, seed=1)
    y = Tensor(g, device=device).conv_transpose2d(Tensor(w, device=device), stride=2)
    want = torch.nn.functional.conv_transpose2d(torch.tensor(g), torch.tensor(w), stride=2)
    np.testing.assert_allclose(y.numpy(), want.numpy(), atol=1e-4, rtol=1e-4)


def test_gradients_through_batch_norm_statistics_realized_in_training(device: str) -> None:
    """Batch norm's running statistics realize the convolution, the mean and then the variance (built on the
    realized convolution) half-way through the forward; every buffer must expand back into the graph that made
    it wherever it appears, or the gradient stops at the variance's copy of the convolution."""

    x, w1, w2, seed = _rand(2, 3, 8, 8), _rand(4, 3, 3, 3, seed=1), _rand(5, 4, 3, 3, seed=2), _rand(2, 5, 4, 4, seed=3)
    bn = nn.BatchNorm2d(5, device=device)
    t1, t2 = Tensor(w1, device=device, requires_grad=True), Tensor(w2, device=device, requires_grad=True)
    with Tensor.train():
        (bn(Tensor(x, device=device).conv2d(t1).relu().conv2d(t2)) * Tensor(seed, device=device)).sum().backward()
    r1, r2 = torch.tensor(w1, requires_grad=True), torch.tensor(w2, requires_grad=True)
    tbn = torch.nn.BatchNorm2d(5).train()
    conv = torch.nn.functional.conv2d
    (tbn(conv(conv(torch.tensor(x), r1).relu(), r2)) * torch.tensor(seed)).sum().backward()
    np.testing.assert_allclose(t2.grad.numpy(), r2.grad.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(t1.grad.numpy(), r1.grad.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(bn.running_var.numpy(), tbn.running_var.numpy(), atol=1e-5, rtol=1e-5)


# the inputs of the cases of a layout for a CPU's caches (spare channels where positions lie 1 KB apart), whose hundreds
# of channels take the PYTHON emulator minutes (178 and 110 s of CI's tensor session): the same convolutions, channels
# last, run there with fewer channels in the other cases
CPU_CACHE_CASES = {(2, 256, 5, 4), (2, 128, 7, 7)}
# output channels of the cases on a device other than the CPU, at most: the layouts they pick (panels of two vectors
# of 64 channels) are a CPU's, and on the PYTHON emulator (and the AMD mock) 64 channels took 51 s of CI's session
OTHER_DEVICE_CHANNELS = 16

# output channels a multiple of the CPU's float32 vector (8 with AVX2, 16 with AVX-512): on a CPU they are innermost
# in memory (any size here)
CHANNELS_LAST_CASES = [
    ("conv1d", (2, 3, 20), (16, 3, 5), dict(padding=2)),
    ("conv2d", (2, 4, 9, 9), (16, 4, 3, 3), dict(stride=2, padding=1)),
    # output channels in whole panels of two vectors: the weight copied in panels (layout.conv_panel_width)
    ("conv2d", (2, 8, 6, 5), (64, 8, 3, 3), dict(padding=1)),
    ("conv2d", (2, 16, 7, 7), (32, 16, 1, 1), dict(stride=2)),
    ("conv1d", (2, 4, 12), (32, 4, 3), dict(padding=1)),
    ("conv3d", (1, 2, 4, 4, 4), (32, 2, 3, 3, 3), dict(padding=1)),
    # positions 1 KB apart in the padded copy: a line of spare channels after each (layout.spare_channels)
    ("conv2d", (2, 256, 5, 4), (16, 256, 3, 3), dict(padding=1)),
    ("conv2d", (2, 128, 7, 7), (16, 128, 3, 3), dict(stride=2, padding=1)),
    ("conv2d", (2, 3, 10, 9), (32, 3, 5, 3), dict(dilation=(1, 2), padding=(2, 0))),
    ("conv3d", (1, 2, 5, 5, 5), (16, 2, 3, 3, 3), dict(padding=1)),
]


@pytest.mark.parametrize(("op", "xs", "ws", "kw"), CHANNELS_LAST_CASES, ids=str)
def test_channels_last_convolutions_match_torch(
    device: str, op: str, xs: tuple, ws: tuple, kw: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    if device != "CPU" and xs in CPU_CACHE_CASES:
        pytest.skip(f"a CPU's cache layout (spare channels); {device} runs the cases with fewer channels")
    if device != "CPU":
        ws = (min(ws[0], OTHER_DEVICE_CHANNELS), *ws[1:])
    monkeypatch.setattr(layout, "CHANNELS_LAST_MIN_WORK", 0)

    x = Tensor(_rand(*xs), device=device, requires_grad=True)
    w = Tensor(_rand(*ws, seed=1), device=device, requires_grad=True)
    b = Tensor(_rand(ws[0], seed=3), device=device, requires_grad=True)
    y = getattr(x, op)(w, b, **kw)
    if device == "CPU":
        assert windows._channels_last(x, w, y.shape[2:])
    g = _rand(*y.shape, seed=2)
    dx, dw, db = y.gradient(x, w, b, gradient=Tensor(g, device=device))
    tx, tw = torch.tensor(_rand(*xs), requires_grad=True), torch.tensor(_rand(*ws, seed=1), requires_grad=True)
    tb = torch.tensor(_rand(ws[0], seed=3), requires_grad=True)
    ty = getattr(torch.nn.functional, op)(tx, tw, tb, **kw)
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(dx.numpy(), tx.grad.numpy(), atol=1e-3, rtol=1e-4)
    np.testing.assert_allclose(dw.numpy(), tw.grad.numpy(), atol=1e-3, rtol=1e-4)
    np.testing.assert_allclose(db.numpy(), tb.grad.numpy(), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("group_bytes", [1, 1 << 30], ids=["a-group-per-image", "one-group"])
def test_a_channels_last_network_matches_torch(device: str, group_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The MNIST model's shape, small: convolutions keep channels innermost, and the activations, batch norm and
    max pool between them are computed and stored in that order (the scheduler's choice of layout); weight
    gradients sum over groups of images. Forward and every gradient against PyTorch."""
    monkeypatch.setattr(layout, "CHANNELS_LAST_MIN_WORK", 0)
    monkeypatch.setattr(windows, "DW_GROUP_BYTES", group_bytes)
    side = small(device, 16, 12)  # 16: 14, 12, pooled 6, 4, pooled 2; 12 (an emulator): 10, 8, 4, 2, 1
    out_side = ((side - 4) // 2 - 2) // 2
    x, seed = _rand(4, 1, side, side), _rand(4, 10, seed=9)
    shapes = [(8, 1, 3, 3), (8, 8, 3, 3), (16, 8, 3, 3)]
    ws = [_rand(*s, seed=i) for i, s in enumerate(shapes)]
    fc = _rand(10, 16 * out_side**2, seed=7)

    def model(t, w, bn, lin, lib):
        F = lib.nn.functional if lib is torch else None
        pool = (lambda v: F.max_pool2d(v, 2)) if F else (lambda v: v.max_pool2d(2))
        conv = (lambda v, k: F.conv2d(v, k)) if F else (lambda v, k: v.conv2d(k))
        h = pool(bn(conv(conv(t, w[0]).relu(), w[1]).relu()))
        h = pool(conv(h, w[2]).relu())
        return h.reshape(4, -1) @ lin.T if F else h.reshape(4, -1) @ lin.transpose(0, 1)

    tw = [Tensor(w, device=device, requires_grad=True) for w in ws]
    tl = Tensor(fc, device=device, requires_grad=True)
    bn = nn.BatchNorm2d(8, device=device)
    with Tensor.train():
        out = model(Tensor(x, device=device), tw, bn, tl, None)
        (out * Tensor(seed, device=device)).sum().backward()
    rw = [torch.tensor(w, requires_grad=True) for w in ws]
    rl = torch.tensor(fc, requires_grad=True)
    tbn = torch.nn.BatchNorm2d(8).train()
    ref = model(torch.tensor(x), rw, tbn, rl, torch)
    (ref * torch.tensor(seed)).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=1e-4, rtol=1e-4)
    for mine, theirs in zip([*tw, tl, bn.weight, bn.bias], [*rw, rl, tbn.weight, tbn.bias]):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_dropped_convolution_leaves_no_gradient_rule_behind(transposed: bool) -> None:
    """The convolution's own derivative is kept per output node, weakly; the rule is given its node rather than
    holding it, else every convolution a loop built would stay alive with its whole graph."""
    import gc
    import weakref

    from tiny.tensor.gradient import COMPOSITE

    w = Tensor(_rand(3, 3, 3, 3), requires_grad=True)
    nodes = []
    for i in range(20):
        x = Tensor(_rand(1, 3, 8, 8, seed=i), requires_grad=True)
        y = x.conv_transpose2d(w) if transposed else x.conv2d(w)
        (node,) = [n for n in COMPOSITE.keys() if n in y.uop.toposort]  # the rule is there while y lives
        nodes.append(weakref.ref(node))
        del node
        del x, y
    gc.collect()
    assert all(ref() is None for ref in nodes), "a dropped convolution's node (and rule) is freed"


def _conv_twice(op: str, kw: dict, between: str):
    """x -> conv(w) -> [bias, relu] -> conv(w): the weight used by both convolutions (and by a matmul with 'matmul')."""

    def model(x, w, b, lib):
        conv = getattr(lib.nn.functional, op) if lib is torch else (lambda v, k, c=None, **a: getattr(v, op)(k, c, **a))
        h = conv(x, w, b if "bias" in between else None, **kw)
        h = h.relu() if "relu" in between else h
        y = conv(h, w, b if "bias" in between else None, **kw)
        out = (y * y).sum()
        if "matmul" in between:
            flat = w.reshape(w.shape[0], -1)
            out = out + (flat @ flat.T if lib is torch else flat @ flat.transpose(0, 1)).sum()
        return out

    return model


SHARED_WEIGHT_CASES = [
    ("conv2d", dict(), ""),
    ("conv2d", dict(), "bias"),
    ("conv2d", dict(), "relu"),
    ("conv2d", dict(padding=1), "bias relu"),
    ("conv2d", dict(stride=2, padding=1), ""),
    ("conv2d", dict(padding=1, dilation=2), "matmul"),
    ("conv1d", dict(), ""),
    ("conv1d", dict(stride=2, padding=2), "bias relu matmul"),
]


@pytest.mark.parametrize(("op", "kw", "between"), SHARED_WEIGHT_CASES, ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["channels-first", "channels-last"])
def test_a_weight_used_by_two_convolutions_counts_each_path_once(
    device: str, op: str, kw: dict, between: str, channels_last: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x.conv2d(w).conv2d(w): the outer convolution's rule derived its weight gradient through everything below it,
    the inner convolution too, and the walk then added the inner one's gradient again (2 x inner + outer)."""
    if channels_last:  # the other weight-gradient rule (16 channels: innermost on a CPU with 8 or 16 float lanes)
        monkeypatch.setattr(layout, "CHANNELS_LAST_MIN_WORK", 0)
    c, spatial = (16, (7, 6)) if channels_last else (4, (6, 5))
    spatial = spatial[:1] if op == "conv1d" else spatial
    xs, ws = (2, c, *spatial), (c, c, *([3] * len(spatial)))
    x, w, b = _rand(*xs), _rand(*ws, seed=1) * 0.3, _rand(c, seed=2)
    model = _conv_twice(op, kw, between)
    tx, tw, tb = (Tensor(a, device=device, requires_grad=True) for a in (x, w, b))
    if windows._channels_last(tx, tw, spatial) != channels_last:
        pytest.skip(f"{device} does not keep this convolution's channels {'last' if channels_last else 'first'}")
    out = model(tx, tw, tb, None)
    dx, dw, db = out.gradient(tx, tw, tb)
    rx, rw, rb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ref = model(rx, rw, rb, torch)
    ref.backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4)
    np.testing.assert_allclose(dw.numpy(), rw.grad.numpy(), atol=1e-3, rtol=1e-4)
    np.testing.assert_allclose(dx.numpy(), rx.grad.numpy(), atol=1e-3, rtol=1e-4)
    if "bias" in between:
        np.testing.assert_allclose(db.numpy(), rb.grad.numpy(), atol=1e-3, rtol=1e-4)


def test_a_weight_used_by_two_transposed_convolutions_counts_each_path_once(device: str) -> None:
    x, w = _rand(1, 3, 4, 5), _rand(3, 3, 3, 3, seed=1)
    tx, tw = Tensor(x, device=device, requires_grad=True), Tensor(w, device=device, requires_grad=True)
    dx, dw = tx.conv_transpose2d(tw, stride=2).relu().conv_transpose2d(tw, padding=1).square().sum().gradient(tx, tw)
    rx, rw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    F = torch.nn.functional
    F.conv_transpose2d(F.conv_transpose2d(rx, rw, stride=2).relu(), rw, padding=1).square().sum().backward()
    np.testing.assert_allclose(dw.numpy(), rw.grad.numpy(), atol=1e-3, rtol=1e-4)
    np.testing.assert_allclose(dx.numpy(), rx.grad.numpy(), atol=1e-3, rtol=1e-4)


def test_a_convolution_of_a_tensor_with_itself(device: str) -> None:
    """One node as both inputs: the rule cannot tell the input's gradient from the weight's (each alone would miss the
    other, both would count the one the primitives give twice), so the primitives derive it."""
    a = _rand(2, 2, 3, 3)
    t = Tensor(a, device=device, requires_grad=True)
    (dt,) = t.conv2d(t, padding=1).square().sum().gradient(t)
    r = torch.tensor(a, requires_grad=True)
    torch.nn.functional.conv2d(r, r, padding=1).square().sum().backward()
    np.testing.assert_allclose(dt.numpy(), r.grad.numpy(), atol=1e-3, rtol=1e-4)


def test_a_weight_gradient_over_a_long_batch_matches_torch(device: str) -> None:
    """A weight gradient of few outputs over a long reduction (4 images x 32 x 32 positions into 8 x 4 x 3 x 3): on a
    GPU (a device with shared memory: PYTHON) the scheduler splits it into partial products along one reduced axis
    and their sum, and the rules plan the partials with the window read as one view (padded and strided: a band)."""
    xs, ws = (4, 4, 64, 64), (8, 4, 3, 3)
    x = Tensor(_rand(*xs), device=device)
    w = Tensor(_rand(*ws, seed=1), device=device, requires_grad=True)
    y = x.conv2d(w, padding=1, stride=2)
    g = Tensor(_rand(*y.shape, seed=2), device=device)
    (dw,) = y.gradient(w, gradient=g)
    reducing = [i for i in dw.schedule() if any(u.op is Ops.REDUCE_AXIS for u in i.ast.toposort)]
    assert len(reducing) == (2 if Device[device].renderer.caps.has_shared else 1)  # (a GPU's: split in two)
    tw = torch.tensor(_rand(*ws, seed=1), requires_grad=True)
    ty = torch.nn.functional.conv2d(torch.tensor(_rand(*xs)), tw, padding=1, stride=2)
    ty.backward(torch.tensor(_rand(*y.shape, seed=2)))
    np.testing.assert_allclose(dw.numpy(), tw.grad.numpy(), atol=2e-3, rtol=1e-4)
