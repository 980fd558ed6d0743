"""Gradients against PyTorch: the same function, the same inputs, forward values and every input's gradient."""

from __future__ import annotations

import contextlib
import gc
import weakref

import numpy as np
import pytest
from torch_compare import compare

from tiny.ir.device import buffer_of
from tiny.ir.uop import Ops
from tiny.tensor import Tensor

torch = pytest.importorskip("torch")


UNARY = {
    "neg": lambda x: -x,
    "exp": lambda x: x.exp(),
    "log": lambda x: (x.abs() + 0.5).log(),
    "sqrt": lambda x: (x.abs() + 0.1).sqrt(),
    "rsqrt": lambda x: (x.abs() + 0.1).rsqrt(),
    "reciprocal": lambda x: (x.abs() + 0.5).reciprocal(),
    "sin": lambda x: x.sin(),
    "cos": lambda x: x.cos(),
    "tanh": lambda x: x.tanh(),
    "sigmoid": lambda x: x.sigmoid(),
    "relu": lambda x: x.relu(),
    "abs": lambda x: x.abs(),
    "square": lambda x: x * x,
    "pow3": lambda x: x**3,
    "clamp": lambda x: x.clamp(-0.5, 0.7),
    "silu": lambda x: x * x.sigmoid(),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(device: str, name: str) -> None:
    compare(device, UNARY[name], (3, 5))


BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (b.abs() + 0.5),
    "maximum": lambda a, b: a.maximum(b),
    "minimum": lambda a, b: a.minimum(b),
    "where": lambda a, b: (
        torch.where(a > b, a * 2, b * 3) if isinstance(a, torch.Tensor) else (a > b).where(a * 2, b * 3)
    ),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_with_broadcasting(device: str, name: str) -> None:
    compare(device, BINARY[name], (4, 1, 3), (5, 1))


def test_reductions(device: str) -> None:
    compare(device, lambda x: x.sum(1), (3, 4, 2))
    compare(device, lambda x: x.sum((0, 2), keepdim=True), (3, 4, 2))
    compare(device, lambda x: x.mean(-1), (3, 4))
    compare(device, lambda x: x.amax(1) if isinstance(x, torch.Tensor) else x.max(1), (3, 4))
    compare(device, lambda x: x.amin(0) if isinstance(x, torch.Tensor) else x.min(0), (3, 4))
    compare(device, lambda x: x.softmax(-1), (3, 5))
    compare(device, lambda x: x.log_softmax(1), (3, 5))


def test_movement(device: str) -> None:
    compare(device, lambda x: x.reshape(6, 2).permute(1, 0) * 2, (3, 4))
    compare(device, lambda x: x.flip(0)[1:, ::2], (4, 5))
    compare(device, lambda x: x.unsqueeze(1).expand(3, 4, 2), (3, 2))
    compare(device, lambda x: x.transpose(0, 1).flatten(), (3, 4))
    compare(
        device, lambda x: (x.pad((1, 2)) if isinstance(x, Tensor) else torch.nn.functional.pad(x, (1, 2))) + 1, (3, 4)
    )


def test_matmul_and_a_small_network(device: str) -> None:
    compare(device, lambda x, w: x @ w, (4, 3), (3, 5))
    compare(device, lambda x, w: x @ w, (2, 4, 3), (3, 5))
    compare(device, lambda x, w1, w2: ((x @ w1).relu() @ w2).softmax(-1), (6, 4), (4, 8), (8, 3))


# ---- non-smooth points follow PyTorch


def test_relu_at_zero_and_abs_at_zero(device: str) -> None:
    data = [np.array([-1.0, 0.0, 2.0], dtype=np.float32)]
    compare(device, lambda x: x.relu(), data=data)
    compare(device, lambda x: x.abs(), data=data)


def test_max_ties_share_the_gradient(device: str) -> None:
    data = [np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], dtype=np.float32)]
    compare(device, lambda x: x.amax(1) if isinstance(x, torch.Tensor) else x.max(1), data=data)
    data2 = [np.array([1.0, 2.0, 3.0], dtype=np.float32), np.array([1.0, 5.0, 3.0], dtype=np.float32)]
    compare(device, lambda a, b: a.maximum(b), data=data2)


def test_clamp_bounds(device: str) -> None:
    data = [np.array([-1.0, -0.5, 0.0, 0.7, 1.0], dtype=np.float32)]
    compare(device, lambda x: x.clamp(-0.5, 0.7), data=data)


# ---- the autograd API


def test_grad_accumulates_and_backward_of_a_scalar(device: str) -> None:
    a = Tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    (a * a).sum().backward()
    (a * 3).sum().backward()
    assert a.grad is not None and a.grad.tolist() == [5.0, 7.0, 9.0]


def test_backward_needs_a_gradient_for_a_non_scalar(device: str) -> None:
    a = Tensor([1.0, 2.0], device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="one element"):
        (a * 2).backward()
    with pytest.raises(ValueError, match="shape"):
        (a * 2).backward(Tensor([1.0, 2.0, 3.0], device=device))


def test_gradient_is_functional(device: str) -> None:
    a = Tensor([1.0, 2.0], device=device, requires_grad=True)
    b = Tensor([3.0, 4.0], device=device, requires_grad=True)
    ga, gb = (a * b).sum().gradient(a, b)
    assert ga is not None and gb is not None
    assert ga.tolist() == [3.0, 4.0] and gb.tolist() == [1.0, 2.0]
    assert a.grad is None and b.grad is None


def test_detach_and_no_grad_cut_the_graph(device: str) -> None:
    a = Tensor([1.0, 2.0], device=device, requires_grad=True)
    (ga,) = ((a * 2).detach() * a).sum().gradient(a)
    assert ga is not None and ga.tolist() == [2.0, 4.0]
    with Tensor.no_grad():
        b = a * 5
    with pytest.raises(RuntimeError, match="does not depend"):
        b.sum().backward()


def test_backward_after_the_loss_was_read(device: str) -> None:
    w = Tensor([0.5, -1.0], device=device, requires_grad=True)
    loss = (w * w).sum()
    assert loss.item() == pytest.approx(1.25)  # realizes the loss (and renames its graph to a buffer)
    loss.backward()
    assert w.grad is not None and w.grad.tolist() == [1.0, -2.0]


def test_only_float_tensors_require_grad(device: str) -> None:
    with pytest.raises(TypeError, match="float"):
        Tensor([1, 2], device=device, requires_grad=True)


def test_train_and_eval_switch() -> None:
    assert not Tensor.is_training()
    with Tensor.train():
        assert Tensor.is_training()
        with Tensor.eval():
            assert not Tensor.is_training()
        assert Tensor.is_training()

    @Tensor.train()
    def step() -> bool:
        return Tensor.is_training()

    assert step() and not Tensor.is_training()


# ---- gradients are lazy and fuse


def test_linear_relu_backward_takes_at_most_three_kernels(device: str) -> None:
    x = Tensor(np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32), device=device)
    w = Tensor(np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32), device=device, requires_grad=True)
    b = Tensor(np.zeros(3, dtype=np.float32), device=device, requires_grad=True)
    (x @ w + b).relu().sum().backward()
    assert w.grad is not None and b.grad is not None
    items = w.grad.schedule(b.grad)
    assert len([i for i in items if i.ast.op is Ops.SINK]) <= 3


# ---- gradients read what the forward pass computed


def test_backward_reads_realized_forward_values_instead_of_recomputing(device: str) -> None:
    """Batch norm's running statistics realize the forward pass up to each norm while the model runs; the backward
    pass reads the convolutions computed then (their buffers, kept alive with the graph) instead of computing them
    again, also where no tensor holds them any more (the first convolution's output here)."""
    from tiny import nn

    Tensor.manual_seed(0)
    c1, c2, bn = nn.Conv2d(1, 4, 3, device=device), nn.Conv2d(4, 4, 3, device=device), nn.BatchNorm2d(4, device=device)
    x = Tensor.randn(2, 1, 10, 10, device=device).realize()
    forward = [c1(x).relu(), c2(c1(x).relu())]  # the convolutions' kernels, to look for later
    convs = {i.ast for t in forward for i in t.schedule() if i.ast.op is Ops.SINK}
    with Tensor.train():
        y = bn(c2(c1(x).relu()).relu()).max_pool2d(2)  # the running statistics realize both convolutions
        y.sum().backward()
    assert c1.weight.grad is not None and c2.weight.grad is not None
    items = c1.weight.grad.schedule(c2.weight.grad)
    assert convs and not convs & {i.ast for i in items}


def test_backward_reads_a_value_realized_only_as_a_permuted_copy(device: str) -> None:
    """A max realized only as a copy through a permute (a channels-last convolution's input, written while batch
    norm's statistics realize the model up to it) is read back from that copy by the gradient, through the inverse
    permute: the gradient computes no max of its own, and matches what NumPy says."""
    xv = np.random.default_rng(0).standard_normal((4, 6, 8)).astype(np.float32)
    x = Tensor(xv, device=device, requires_grad=True)
    h = x.max(axis=2)  # (4, 6)
    copy = h.permute(1, 0).contiguous().realize()  # the only buffer with the max in it (alive, as a model's is)
    (h * h).sum().backward()
    assert x.grad is not None
    items = [i for i in x.grad.schedule() if i.ast.op is Ops.SINK]
    maxes = [u for i in items for u in i.ast.toposort if u.op is Ops.REDUCE_AXIS and u.arg[0] is Ops.MAX]
    assert not maxes
    m = xv.max(axis=2, keepdims=True)
    hit = (xv == m).astype(np.float32)
    np.testing.assert_allclose(x.grad.numpy(), 2 * m * hit / hit.sum(axis=2, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(copy.numpy(), xv.max(axis=2).T)


def test_backward_never_reads_a_value_computed_before_its_inputs_changed(device: str) -> None:
    """A graph over parameters alone is the same node in the next step; what it computed then is stale once the
    optimizer wrote the parameter: the gradient computes it again."""
    from tiny import nn

    w = Tensor([1.0, 2.0], device=device, requires_grad=True)
    opt = nn.optim.SGD([w], lr=0.5)
    for step in range(3):
        s = (w * w).sum()
        loss = (s * w).sum()
        loss.realize()  # computes s into a buffer of its own on the way
        v = w.numpy()
        opt.zero_grad()
        loss.backward()
        assert w.grad is not None
        want = (v**2).sum() + 2 * v * v.sum()  # d/dw of sum(w*w) * sum(w)
        np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-6, err_msg=f"step {step}")
        opt.step()


def test_a_loop_of_realized_steps_keeps_only_the_last_buffer_where_no_gradient_passes(device: str) -> None:
    """Under no_grad, and outside it over tensors that need no gradient, realize() remembers no graph: step k's
    buffer is not kept alive by step k+1's record of what it read (`x = f(x).realize()` in a loop would otherwise hold
    every step's memory). Over a leaf with requires_grad the record is kept, also through values computed from it."""
    for no_grad in (True, False):
        x = Tensor([0.0, 1.0], device=device).realize()
        steps = []
        with Tensor.no_grad() if no_grad else contextlib.nullcontext():
            for _ in range(6):
                x = (x + 1).realize()
                steps.append(weakref.ref(buffer_of(x.uop.src[0])))
        gc.collect()
        alive = sum(s() is not None for s in steps)
        assert alive <= 2, f"no_grad={no_grad}: {alive} of 6 steps' buffers alive"  # the last (and one a cache holds)
        np.testing.assert_array_equal(x.numpy(), [6.0, 7.0])
    w = Tensor([1.0], device=device, requires_grad=True)
    h = (w * 2).realize()
    y = (h * h).realize()
    del h
    y.sum().backward()  # h's memory is kept by y's record: the gradient reads it
    np.testing.assert_allclose(w.grad.numpy(), [8.0])


def test_values_computed_before_a_tensor_required_grad_are_constants_to_it(device: str) -> None:
    """As in PyTorch: what was computed from a tensor before it required gradients passes none back to it."""
    a = Tensor([1.0, 2.0], device=device)
    h = (a * 2).realize()
    a.requires_grad = True
    (h * a).sum().backward()
    assert a.grad is not None
    np.testing.assert_allclose(a.grad.numpy(), [2.0, 4.0])  # h, not 2 * h + ...


def test_what_realize_records_for_gradients_dies_with_the_buffer(device: str) -> None:
    """realize() remembers on each view it made the graph that view computed; the record goes when the view does, so
    a value no tensor holds any more frees its memory (no table keeps it), while one still held keeps its record for
    backward."""
    x = Tensor([1.0, 2.0], device=device, requires_grad=True)
    y = (x * 3).realize()
    z = (y + 1).realize()
    memory = weakref.ref(buffer_of(z.uop.src[0]))
    assert memory() is not None
    del z
    gc.collect()  # (a node whose graph was walked holds the walk, itself included: a cycle)
    assert memory() is None
    (y * y).sum().backward()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), [18.0, 36.0])
