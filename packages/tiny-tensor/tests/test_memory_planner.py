"""The memory planner (tiny.ir.schedule.memory): a schedule's temporary buffers share memory where their lifetimes do
not overlap; the values stay those of NumPy; what a tensor still reads keeps memory of its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tiny.ir.device import Buffer, Device, buffer_of
from tiny.ir.schedule import create_schedule
from tiny.ir.schedule.memory import share_memory
from tiny.tensor import Tensor, TinyJit

rng = np.random.default_rng(0)
DEFAULT = Tensor.zeros(1).device
needs_views = pytest.mark.skipif(
    not Device[DEFAULT].allocator.caps.views, reason=f"{DEFAULT}'s allocator has no views: each buffer its own memory"
)


def _chain(x: Tensor, n: int) -> Tensor:
    for i in range(n):
        x = (x * 2 + i).contiguous()
    return x


def _lifetimes(items) -> dict[int, tuple[int, int]]:
    spans: dict[int, tuple[int, int]] = {}
    for i, (_, buffers) in enumerate(items):
        for b in buffers:
            lo, _ = spans.get(id(b), (i, i))
            spans[id(b)] = (lo, i)
    return spans


def _root(b: Buffer) -> Buffer:
    return b.base if b.base is not None else b


def _planned(out: Tensor) -> tuple[list, list[Buffer]]:
    sched = create_schedule([out.uop])
    temps = [buffer_of(b) for b in sched.fresh if b is not sched.becomes[out.uop].src[0]]
    share_memory(sched.items, temps)
    return sched.items, temps


@needs_views
def test_a_chain_of_temporaries_takes_two_allocations():
    x = Tensor(rng.standard_normal(1024).astype(np.float32))
    items, temps = _planned(_chain(x, 8).sum())
    assert len(temps) == 8
    roots = {id(_root(b)) for b in temps}
    assert len(roots) == 2, f"each temporary is read only by the next kernel: two allocations take turns, got {roots}"


@needs_views
def test_no_two_buffers_alive_at_once_share_memory():
    a = Tensor(rng.standard_normal((64, 64)).astype(np.float32))
    b = Tensor(rng.standard_normal((64, 64)).astype(np.float32))
    h = (a @ b).relu().contiguous()
    g = (h * 2).contiguous() + (a - 1).contiguous()
    out = ((g @ h).softmax(-1).contiguous() * (h + 1).contiguous()).sum(0)
    items, temps = _planned(out)
    spans = _lifetimes(items)
    shared = [b for b in temps if b.base is not None]
    assert shared, "some temporary should reuse an earlier one's memory"
    for x in temps:
        for y in temps:
            if x is not y and _root(x) is _root(y):
                (x0, x1), (y0, y1) = spans[id(x)], spans[id(y)]
                assert x1 < y0 or y1 < x0, f"buffers alive at once share memory: {spans[id(x)]} and {spans[id(y)]}"
                assert _root(x).nbytes >= max(x.nbytes, y.nbytes)


def test_values_with_shared_memory_equal_numpy():
    an = rng.standard_normal((32, 48)).astype(np.float32)
    bn = rng.standard_normal((48, 32)).astype(np.float32)
    a, b = Tensor(an), Tensor(bn)
    h = (a @ b).relu().contiguous()
    out = ((h * 0.02).contiguous() @ (h + 1).contiguous()).exp2().contiguous().sum(1)
    hn = np.maximum(an @ bn, 0)
    np.testing.assert_allclose(out.numpy(), np.exp2((hn * 0.02) @ (hn + 1)).sum(1), rtol=1e-4)
    expected = an.copy()
    for i in range(8):
        expected = expected * 2 + i
    np.testing.assert_allclose(_chain(Tensor(an), 8).numpy(), expected, rtol=1e-6)


def test_a_tensor_that_reads_an_intermediate_keeps_its_memory():
    an = rng.standard_normal(256).astype(np.float32)
    a = Tensor(an)
    kept = (a * 3).contiguous()
    middle = (kept + 1).contiguous()
    out = _chain(middle, 4) + kept
    out.realize()
    # the kernels after `kept`'s last reader in that schedule would have reused its memory, were it a temporary
    np.testing.assert_allclose(kept.numpy(), an * 3, rtol=1e-6)
    np.testing.assert_allclose(middle.numpy(), an * 3 + 1, rtol=1e-6)
    expected = an * 3 + 1
    for i in range(4):
        expected = expected * 2 + i
    np.testing.assert_allclose(out.numpy(), expected + an * 3, rtol=1e-5)


def test_jit_replays_with_shared_memory():
    @TinyJit
    def step(x: Tensor) -> Tensor:
        return (_chain(x, 5) @ _chain(x, 3).T).softmax(-1).realize()

    for _ in range(4):
        xn = rng.standard_normal((16, 16)).astype(np.float32)
        c5, c3 = xn.copy(), xn.copy()
        for k in range(5):
            c5 = c5 * 2 + k
        for k in range(3):
            c3 = c3 * 2 + k
        logits = c5 @ c3.T
        e = np.exp(logits - logits.max(-1, keepdims=True))
        np.testing.assert_allclose(step(Tensor(xn)).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)


def test_buffers_a_copy_reads_keep_their_own_memory():
    x = Tensor(rng.standard_normal(512).astype(np.float32), device="CPU")
    moved = _chain(x, 3).to("CPU:1")
    out = _chain(moved, 3).to("CPU").sum()
    sched = create_schedule([out.uop])
    temps = [buffer_of(b) for b in sched.fresh if b is not sched.becomes[out.uop].src[0]]
    share_memory(sched.items, temps)
    for ast, buffers in sched.items:
        if ast.op.name == "COPY":
            assert all(b.base is None for b in buffers), "a copy's buffers keep their own memory"


def test_devices_without_views_allocate_each_buffer():
    x = Tensor(rng.standard_normal(64).astype(np.float32), device="PYTHON")
    items, temps = _planned(_chain(x, 4).sum())
    assert all(b.base is None for b in temps)


def test_a_gradient_reads_the_forward_buffers_it_saved():
    """A forward realized on a gradient's path keeps its intermediates (autograd reads them again, as saved tensors):
    sin's gradient reads each step's input from its buffer."""
    xn = rng.standard_normal(256).astype(np.float32)
    x = Tensor(xn, requires_grad=True)
    h = x
    for _ in range(6):
        h = (h.sin() * 1.5).contiguous()
    out = h.sum()
    out.numpy()  # the forward runs here, its buffers kept for the backward
    out.backward()
    xt = torch.tensor(xn, requires_grad=True)
    ht = xt
    for _ in range(6):
        ht = ht.sin() * 1.5
    ht.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_jit_keeps_the_schedules_shared_memory_as_planned():
    """TinyJit plans a capture's buffers by size: a buffer whose memory the scheduler gave to a smaller one (a view of
    it) must not go to a third while that view is still read."""
    n = 4096

    @TinyJit
    def step(x: Tensor) -> Tensor:  # (each name rebound: no tensor holds the values between the kernels)
        t = (x.reshape(1, n).expand(2, n) * 2).contiguous()  # 2n
        t = (t[0] + t[1]).contiguous()  # n
        t = (t * 3).contiguous()  # n: the scheduler puts it in the first one's memory
        t = (t.reshape(1, n).expand(2, n) + 1).contiguous()  # 2n: TinyJit must not put it there too
        return (t * 1).sum(0).realize()

    for _ in range(4):
        xn = rng.standard_normal(n).astype(np.float32)
        np.testing.assert_allclose(step(Tensor(xn)).numpy(), 2 * (xn * 4 * 3 + 1), rtol=1e-5)


def test_a_capture_takes_no_more_memory_than_its_replays():
    """TinyJit's plan takes the memory the capture's last pass held (given back first): allocated beside it, a 1B
    model's prompt pass held two more of its 4 MB attention scores at once than it ever needs (the capture 55 MB over
    the weights, the plain call before it 45). Here: 1314816 bytes at most in the capture, 788480 in a replay."""
    allocator = Device[DEFAULT].allocator
    live: dict[int, int] = {}
    peak = [0]
    alloc, free = allocator.alloc, allocator.free

    def counted_alloc(size: int):  # noqa: ANN202
        opaque = alloc(size)
        live[id(opaque)] = size
        peak[0] = max(peak[0], sum(live.values()))
        return opaque

    def counted_free(opaque, size: int) -> None:  # noqa: ANN001
        live.pop(id(opaque), None)
        free(opaque, size)

    @TinyJit
    def step(x: Tensor) -> Tensor:
        for _ in range(3):  # (a pass a realize: the capture gives back each pass's buffers but the last's)
            scores = (x @ x.T).softmax(-1)
            x = (scores @ x).contiguous().realize()
        return x

    xn = rng.standard_normal((256, 64)).astype(np.float32)
    x = Tensor(xn).realize()
    peaks = []
    allocator.alloc, allocator.free = counted_alloc, counted_free
    try:
        for _ in range(3):
            allocator.free_cache()
            peak[0] = sum(live.values())
            step(x)
            peaks.append(peak[0])
    finally:
        allocator.alloc, allocator.free = alloc, free
    assert peaks[1] <= peaks[2], f"the capture held {peaks[1]} bytes at most, a replay {peaks[2]}"
