"""Tensors on several devices (Tensor.shard, .to(devices)) against NumPy and PyTorch on one: values, gradients,
optimizer steps, TinyJit replays, the collectives, a tensor-parallel transformer block, and the errors of bad input.
The devices are instances of the CPU (CPU:0, CPU:1, CPU:2) and, where mixed, PYTHON."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from tensor_helpers import errors_in_threads

from tiny.ir.device import (
    Device,
    DeviceUnavailable,
    RingCollective,
    SharedMemoryCollective,
    UnknownDevice,
    buffer_of,
    collective_for,
)
from tiny.ir.uop import Ops, UOp
from tiny.nn import optim
from tiny.runtime import cpu
from tiny.tensor import Tensor, TinyJit
from tiny.tensor.realize import GlobalCounters

torch = pytest.importorskip("torch")

TWO = ("CPU:0", "CPU:1")
THREE = ("CPU:0", "CPU:1", "CPU:2")


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def part_sizes(t: Tensor) -> list[int]:
    assert t.uop.op is Ops.MULTI and t.uop.arg is not None
    return [u.shape[t.uop.arg] for u in t.uop.src]


# ---------------------------------------------------------------- devices and layouts


def test_instances_of_one_device_are_devices_of_their_own() -> None:
    assert Device["CPU:1"] is not Device["CPU"] and Device["CPU:1"] is not Device["CPU:2"]
    assert Device.canonicalize_many(["cpu:0", "CPU:1"]) == ("CPU", "CPU:1")
    assert (Tensor([1.0, 2.0], device="CPU:2") * 2).tolist() == [2.0, 4.0]


@pytest.mark.parametrize("devices", [TWO, THREE, ("CPU", "PYTHON")])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_shard_and_gather_round_trip(devices: tuple[str, ...], axis: int | None) -> None:
    a = rand(7, 5)
    t = Tensor(a).shard(devices, axis=axis)
    assert t.device == Device.canonicalize_many(devices) and t.shape == (7, 5)
    if axis is not None:  # torch.tensor_split's sizes: the first ones one longer
        assert part_sizes(t) == [len(p) for p in np.array_split(np.arange(a.shape[axis]), len(devices))]
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(t.to("CPU:1").numpy(), a)
    assert t.to("CPU:1").device == "CPU:1"


def test_to_a_tuple_replicates_and_makes_each_copy_where_it_lives() -> None:
    a = rand(3, 4)
    t = Tensor(a, device=TWO)
    assert t.uop.op is Ops.MULTI and t.uop.arg is None and t.device == ("CPU", "CPU:1")
    for part in t.uop.src:  # uploaded to each device: memory already, no copies
        np.testing.assert_array_equal(np.frombuffer(buffer_of(part.src[0]).as_bytes(), np.float32).reshape(3, 4), a)
    np.testing.assert_array_equal(Tensor(a).to(TWO).numpy(), a)
    np.testing.assert_array_equal(Tensor(a).shard(TWO, 0).to(TWO).numpy(), a)  # gathered on each
    assert Tensor.zeros(2, 3, device=TWO).device == ("CPU", "CPU:1")


# ---------------------------------------------------------------- ops


@pytest.mark.parametrize("axis", [0, 1])
def test_elementwise_per_shard_and_with_other_layouts(axis: int) -> None:
    a, b = rand(6, 4), rand(6, 4, seed=1)
    x = Tensor(a).shard(TWO, axis)
    np.testing.assert_allclose((x * 2 + 1).exp().numpy(), np.exp(a * 2 + 1), rtol=1e-6)
    np.testing.assert_allclose((x + Tensor(b).shard(TWO, axis)).numpy(), a + b)
    np.testing.assert_allclose((x - Tensor(b).to(TWO)).numpy(), a - b)  # the replicated one sliced where it lies
    np.testing.assert_allclose((x * Tensor(b).shard(TWO, 1 - axis)).numpy(), a * b)  # resharded
    np.testing.assert_allclose(x.maximum(Tensor(b[:1]).to(TWO)).numpy(), np.maximum(a, b[:1]))  # broadcast
    np.testing.assert_array_equal((x > 0).where(x, 0).numpy(), np.where(a > 0, a, 0))
    out = x * Tensor(b).shard(TWO, axis)
    assert out.uop.arg == axis and part_sizes(out) == [3, 3] if axis == 0 else [2, 2]


@pytest.mark.parametrize("devices", [TWO, THREE])
@pytest.mark.parametrize("axis", [0, 1])
def test_reductions_along_the_split_axis_all_reduce(devices: tuple[str, ...], axis: int) -> None:
    a = rand(7, 9)
    x = Tensor(a).shard(devices, axis)
    for dim in (0, 1, None):
        np.testing.assert_allclose(x.sum(dim).numpy(), a.sum(dim), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(x.max(dim).numpy(), a.max(dim))
        np.testing.assert_allclose(x.mean(dim).numpy(), a.mean(dim), rtol=1e-5, atol=1e-6)
    assert x.sum(axis).uop.arg is None and x.sum(1 - axis).uop.arg == 0  # replicated; split along what is left
    np.testing.assert_array_equal(x.argmax(axis).numpy(), a.argmax(axis))
    np.testing.assert_allclose(x.softmax(axis).numpy(), torch.tensor(a).softmax(axis).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(x.var(axis).numpy(), torch.tensor(a).var(axis).numpy(), rtol=1e-4)


@pytest.mark.parametrize("collective", [RingCollective(), SharedMemoryCollective()])
@pytest.mark.parametrize("shape", [(5, 3), (3, 20001)])  # whole copies; the ring (16384 or more elements a device)
def test_all_reduce_gives_each_device_the_same_bits(collective, shape: tuple[int, ...]) -> None:  # noqa: ANN001
    parts = [Tensor(rand(*shape, seed=i), device=d) for i, d in enumerate(THREE)]
    for op, ref in ((Ops.ADD, np.sum), (Ops.MAX, np.max), (Ops.MUL, np.prod)):
        out = collective.all_reduce(op, [p.uop for p in parts])
        values = [Tensor(u).numpy() for u in out]
        assert [u.device for u in out] == [p.device for p in parts]
        np.testing.assert_allclose(values[0], ref([p.numpy() for p in parts], axis=0), rtol=1e-6, atol=1e-6)
        for v in values[1:]:
            np.testing.assert_array_equal(v, values[0])
    scalars = collective.all_reduce(Ops.ADD, [p.sum().uop for p in parts])  # fewer elements than devices
    assert {Tensor(u).item() for u in scalars} == {Tensor(scalars[0]).item()}


@pytest.mark.parametrize(("devices", "size", "kernels"), [(TWO, 50000, 2), (THREE, 1000, 3), (THREE, 60000, 6)])
def test_cpu_devices_all_reduce_in_place_with_a_kernel_a_step(
    devices: tuple[str, ...], size: int, kernels: int
) -> None:
    """The CPU devices share memory: their all-reduce reads each device's part where it lies, with no copy; one
    kernel a device (the total), or two where more than two devices split a large value (the chunk totals, then each
    device's whole). The gradient goes back the same way."""
    assert isinstance(collective_for(devices), SharedMemoryCollective)
    values = [rand(size, seed=i) for i in range(len(devices))]
    parts = [Tensor(v, device=d).realize() for v, d in zip(values, devices)]
    before = GlobalCounters.kernels, GlobalCounters.copies
    out = [Tensor(u) for u in collective_for(devices).all_reduce(Ops.ADD, [p.uop for p in parts])]
    out[0].realize(*out[1:])
    assert (GlobalCounters.kernels - before[0], GlobalCounters.copies - before[1]) == (kernels, 0)
    for t, d in zip(out, devices):
        assert t.device == Device.canonicalize(d)
        np.testing.assert_allclose(t.numpy(), np.sum(values, axis=0), rtol=1e-6, atol=1e-6)
    x = Tensor(np.stack(values), requires_grad=True)
    y = x.shard(devices, axis=0)
    (y.sum(axis=0) * Tensor(values[0]).to(devices)).sum().backward()  # a sum over the split axis: the all-reduce
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), np.broadcast_to(values[0], x.shape), rtol=1e-6)


SECOND_DEVICE_OPENS = """
import numpy as np
from tiny.ir.device import Device
from tiny.tensor import Tensor, TinyJit
queue = Device["CPU"].queue
step = TinyJit(lambda x: (x * 2 + 1).realize())
x = Tensor(np.arange(4, dtype=np.float32)).realize()
for _ in range(3):
    step(x)
(x + 5).realize()
assert queue.given == 0, queue.given  # one CPU device open: every launch ran where it was given
Device["CPU:1"]
given = queue.given
y = (x + 5).realize()  # a kernel built before: its launch asked for again, now given to the device's thread
assert queue.given == given + 1, (given, queue.given)
z = step(x)  # a replay recorded before
assert queue.given == given + 2, (given, queue.given)
print(y.tolist(), z.tolist())
"""


def test_a_second_cpu_device_opening_sends_launches_given_before_to_the_queue() -> None:
    """While one CPU device is open its kernels run where they are launched, through launchers that are the compiled
    functions themselves; once a second opens, the launchers kept from before (realize's programs, TinyJit's
    recordings) are asked for again and launch on the device's thread, in order with its other work."""
    env = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "THREADS")}
    code = SECOND_DEVICE_OPENS
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[5.0,", "6.0,", "7.0,", "8.0]", "[1.0,", "3.0,", "5.0,", "7.0]"]


def test_cpu_devices_run_side_by_side_on_their_share_of_the_cores() -> None:
    """With several CPU devices open each has its share of the cores and a queue its thread runs in order; copies
    between them wait for both queues, and the host reads a device's memory once its queue is done. A long chain of
    copies around three devices, each followed by work on the receiving device, ends with every value right."""
    for d in THREE:
        Device[d]
    cores = max(1, len(os.sched_getaffinity(0)) // len(cpu._indices))
    assert cpu.queued() and cpu.share() == (cpu.THREADS.value or cores)
    t = Tensor(np.arange(4096, dtype=np.float32), device=THREE[0])
    for step in range(12):
        t = (t.to(THREE[(step + 1) % 3]) + 1).realize()
    np.testing.assert_array_equal(t.numpy(), np.arange(4096, dtype=np.float32) + 12)

    def work(i: int) -> None:  # Python threads giving work to the same devices at once
        x = Tensor(rand(64, 64, seed=i)).shard(TWO, axis=0)
        np.testing.assert_allclose(
            (x @ x.T).sum(1).numpy(), (rand(64, 64, seed=i) @ rand(64, 64, seed=i).T).sum(1), rtol=1e-4
        )

    errors = errors_in_threads(work, 3)
    assert not errors, errors


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_movement_ops_keep_the_axis(axis: int) -> None:
    a = rand(4, 6, 8)
    x = Tensor(a).shard(TWO, axis)
    np.testing.assert_array_equal(x.permute(2, 0, 1).numpy(), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(x.flip(axis).numpy(), np.flip(a, axis))
    np.testing.assert_array_equal(x.pad(((1, 2), (0, 1), (3, 0))).numpy(), np.pad(a, ((1, 2), (0, 1), (3, 0))))
    np.testing.assert_array_equal(x[1:3, 2:5, 1:7].numpy(), a[1:3, 2:5, 1:7])
    np.testing.assert_array_equal(x[:, :, 0].numpy(), a[:, :, 0])
    np.testing.assert_array_equal(
        x[..., None, :].expand(4, 6, 3, 8).numpy(), np.broadcast_to(a[..., None, :], (4, 6, 3, 8))
    )
    np.testing.assert_array_equal(x.reshape(2, 2, 6, 8).numpy(), a.reshape(2, 2, 6, 8))
    if axis < 2:
        np.testing.assert_array_equal(x.reshape(4, 48).numpy(), a.reshape(4, 48))
    else:  # each row of 48 would alternate between the devices
        with pytest.raises(ValueError, match="cuts through the shards"):
            x.reshape(4, 48)
    np.testing.assert_array_equal(Tensor.cat(x, x, dim=axis).numpy(), np.concatenate([a, a], axis))
    assert x.permute(2, 0, 1).uop.arg == (2, 0, 1).index(axis)


@pytest.mark.parametrize("axis", [0, 1])
def test_composite_ops_on_either_axis(axis: int) -> None:
    a = rand(6, 8)
    x = Tensor(a).shard(TWO, axis)
    index = Tensor(np.array([0, 3, 5])).to(TWO)
    np.testing.assert_allclose(x.cumsum(1).numpy(), a.cumsum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(x.sort(1)[0].numpy(), np.sort(a, 1))
    np.testing.assert_array_equal(x[index].numpy(), a[[0, 3, 5]])
    np.testing.assert_array_equal(x.topk(2, 0)[0].numpy(), -np.sort(-a, 0)[:2])
    want = torch.nn.functional.layer_norm(torch.tensor(a), (8,)).numpy()
    np.testing.assert_allclose(x.layernorm().numpy(), want, rtol=1e-5, atol=1e-5)


def test_vocab_parallel_embedding_and_a_convolution_split_by_channels() -> None:
    table = rand(10, 4)
    ids = np.array([[1, 7, 9]])
    emb = Tensor(table).shard(TWO, 0)  # rows 0-4 on one device, 5-9 on the other
    picked = emb[Tensor(ids).to(TWO)]
    np.testing.assert_array_equal(picked.numpy(), table[ids])
    x, w = rand(4, 6, 5, 5), rand(3, 6, 3, 3, seed=1)
    y = Tensor(x).shard(TWO, 1).conv2d(Tensor(w).shard(TWO, 1))  # the partial sums over channels all-reduced
    want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w)).numpy()
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)


def test_reshape_that_cuts_through_shards_is_refused_and_reshard_is_explicit() -> None:
    a = rand(6, 4)
    x = Tensor(a).shard(TWO, 1)  # columns 0-1 and 2-3: flattened, each row's values alternate between the devices
    with pytest.raises(ValueError, match=r"reshape from \(6, 4\) to \(24,\) cuts through the shards of axis 1"):
        x.reshape(24)
    np.testing.assert_array_equal(x.shard(TWO, 0).reshape(24).numpy(), a.reshape(24))
    np.testing.assert_array_equal(x.to(TWO).reshape(24).numpy(), a.reshape(24))
    assert x.shard(TWO, 0).uop.arg == 0 and x.to(TWO).uop.arg is None


@pytest.mark.parametrize("n", [1, 5])
def test_matmul_with_column_and_row_parallel_weights(n: int) -> None:
    a, w = rand(n, 12), rand(12, 10, seed=1)
    want = a @ w
    column = Tensor(a).to(TWO) @ Tensor(w).shard(TWO, 1)
    assert column.uop.arg == 1
    np.testing.assert_allclose(column.numpy(), want, rtol=1e-5, atol=1e-5)
    row = Tensor(a).shard(TWO, 1) @ Tensor(w).shard(TWO, 0)
    assert row.uop.arg is None  # the partial products all-reduced
    np.testing.assert_allclose(row.numpy(), want, rtol=1e-5, atol=1e-5)
    batch = Tensor(a).shard(TWO, 0) @ Tensor(w).to(TWO) if n > 1 else column
    np.testing.assert_allclose(batch.numpy(), want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- autograd, optimizers, TinyJit


@pytest.mark.parametrize("w_axis", [None, 0, 1])
@pytest.mark.parametrize("x_axis", [None, 0])
def test_gradients_match_torch(x_axis: int | None, w_axis: int | None) -> None:
    a, w0, b0 = rand(6, 8), rand(8, 4, seed=1), rand(4, seed=2)
    x = Tensor(a).shard(TWO, x_axis).requires_grad_()
    w = Tensor(w0).shard(TWO, w_axis).requires_grad_()
    b = Tensor(b0).to(TWO).requires_grad_()
    loss = ((x @ w + b).relu() * Tensor(a[:, :4]).to(TWO)).logsumexp(1).mean()
    loss.backward()
    xt, wt, bt = (torch.tensor(v, requires_grad=True) for v in (a, w0, b0))
    lt = ((xt @ wt + bt).relu() * torch.tensor(a[:, :4])).logsumexp(1).mean()
    lt.backward()
    np.testing.assert_allclose(loss.numpy(), lt.item(), rtol=1e-6)
    for mine, theirs, axis in ((x, xt, x_axis), (w, wt, w_axis), (b, bt, None)):
        assert mine.grad.device == ("CPU", "CPU:1") and mine.grad.uop.arg == axis  # laid out as the tensor
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_mixed_devices_and_a_split_root_seeded_by_its_gradient() -> None:
    a, w0 = rand(6, 5), rand(5, 4, seed=1)
    mixed = ("CPU", "PYTHON")
    x = Tensor(a).shard(mixed, 0)
    np.testing.assert_allclose((x * 2).sum(0).numpy(), (a * 2).sum(0), rtol=1e-5)
    np.testing.assert_allclose((x @ Tensor(w0).to(mixed)).relu().numpy(), np.maximum(a @ w0, 0), rtol=1e-5, atol=1e-6)
    w = Tensor(w0).to(TWO).requires_grad_()
    y = Tensor(a).shard(TWO, 0) @ w  # split along the batch: each device's rows seeded by their part of `gradient`
    seed = rand(6, 4, seed=2)
    (grad,) = y.gradient(w, gradient=Tensor(seed).to(TWO))
    np.testing.assert_allclose(grad.numpy(), a.T @ seed, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["replicated", "split"])
def test_a_power_keeps_its_own_derivative_on_each_device(layout: str) -> None:
    a = np.array([[0.0, 1.0, 2.0, -1.0], [4.0, 0.5, 0.0, 3.0]], np.float32)
    for exponent in (1.5, np.full((2, 4), 0.5, np.float32)):
        x = Tensor(a).to(TWO) if layout == "replicated" else Tensor(a).shard(TWO, 1)
        x.requires_grad_()
        e = exponent if isinstance(exponent, float) else Tensor(exponent).to(TWO)
        (x**e).sum().backward()
        xt = torch.tensor(a, requires_grad=True)
        (xt ** (exponent if isinstance(exponent, float) else torch.tensor(exponent))).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-6)  # (inf and nan where torch has them)


@pytest.mark.parametrize("make", [lambda p: optim.SGD(p, lr=0.1, momentum=0.9), lambda p: optim.Adam(p, lr=0.05)])
def test_optimizers_update_sharded_and_replicated_parameters_in_place(make) -> None:  # noqa: ANN001
    w0, b0 = rand(8, 6, seed=3), rand(6, seed=4)
    w, b = Tensor(w0).shard(TWO, 1).requires_grad_(), Tensor(b0).to(TWO).requires_grad_()
    opt = make([w, b])
    wt, bt = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    topt = {
        optim.SGD: lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        optim.Adam: lambda p: torch.optim.Adam(p, lr=0.05),
    }[type(opt)]([wt, bt])
    memory = [u for t in (w, b) for u in t.uop.src]
    for step in range(4):
        a = rand(10, 8, seed=10 + step)
        opt.zero_grad()
        ((Tensor(a).shard(TWO, 0) @ w + b).tanh() ** 2).mean().backward()
        opt.step()
        topt.zero_grad()
        ((torch.tensor(a) @ wt + bt).tanh() ** 2).mean().backward()
        topt.step()
    assert [u for t in (w, b) for u in t.uop.src] == memory  # written where they lie
    np.testing.assert_allclose(w.numpy(), wt.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.numpy(), bt.detach().numpy(), rtol=1e-5, atol=1e-5)
    replicas = [Tensor(u).numpy() for u in b.uop.src]
    np.testing.assert_array_equal(replicas[0], replicas[1])  # the replicas never drift apart


def test_tinyjit_captures_and_replays_a_multi_device_step() -> None:
    w0 = rand(8, 3, seed=5)

    def train(jit: bool) -> list[float]:
        w = Tensor(w0).to(TWO).requires_grad_()
        opt = optim.SGD([w], lr=0.1)

        def step(x: Tensor) -> Tensor:
            opt.zero_grad()
            loss = (x @ w).square().mean()
            loss.backward()
            opt.step()
            return loss.realize()

        run = TinyJit(step) if jit else step
        return [run(Tensor(rand(6, 8, seed=20 + i)).shard(TWO, 0)).item() for i in range(5)]

    np.testing.assert_allclose(train(jit=True), train(jit=False), rtol=1e-6)


# ---------------------------------------------------------------- tensor parallelism: a transformer block


def _block(x, p, heads: int):  # noqa: ANN001, ANN202  (tiny and torch tensors alike)
    """A pre-norm transformer block (causal attention, then a GELU MLP), the same code for tiny and torch."""
    b, t, c = x.shape
    h = (x - x.mean(-1, keepdim=True)) / ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True).add(1e-5).sqrt()
    q, k, v = ((h @ p[name]).reshape(b, t, heads, c // heads).transpose(1, 2) for name in ("wq", "wk", "wv"))
    scores = (q @ k.transpose(-1, -2)) / (c // heads) ** 0.5
    mask = np.triu(np.full((t, t), -1e9, np.float32), 1)
    att = (scores + (Tensor(mask).to(x.device) if isinstance(x, Tensor) else torch.tensor(mask))).softmax(-1)
    x = x + (att @ v).transpose(1, 2).reshape(b, t, c) @ p["wo"]
    hidden = x @ p["w1"]
    hidden = hidden.gelu() if isinstance(x, Tensor) else torch.nn.functional.gelu(hidden)
    return x + hidden @ p["w2"]


def test_a_tensor_parallel_transformer_block_equals_the_unsharded_one() -> None:
    c, heads = 16, 4
    weights = {
        n: rand(*s, seed=i) * 0.3
        for i, (n, s) in enumerate(
            {"wq": (c, c), "wk": (c, c), "wv": (c, c), "wo": (c, c), "w1": (c, 2 * c), "w2": (2 * c, c)}.items()
        )
    }
    a = rand(2, 5, c, seed=9)
    # Megatron's layout: q, k, v and the MLP's first layer split by columns (whole heads on each device), the output
    # projections by rows, so that each sublayer ends in one all-reduce
    axes = {"wq": 1, "wk": 1, "wv": 1, "wo": 0, "w1": 1, "w2": 0}
    params = {n: Tensor(w).shard(TWO, axes[n]).requires_grad_() for n, w in weights.items()}
    x = Tensor(a).to(TWO).requires_grad_()
    out = _block(x, params, heads)
    assert out.uop.arg is None
    (out * Tensor(a).to(TWO)).sum().backward()
    tparams = {n: torch.tensor(w, requires_grad=True) for n, w in weights.items()}
    xt = torch.tensor(a, requires_grad=True)
    ref = _block(xt, tparams, heads)
    (ref * torch.tensor(a)).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    for n, p in params.items():
        assert p.grad.uop.arg == axes[n]
        np.testing.assert_allclose(p.grad.numpy(), tparams[n].grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=n)


# ---------------------------------------------------------------- bad input


def test_errors_name_the_devices_and_shapes() -> None:
    with pytest.raises(ValueError, match=r"axis 0 of shape \(1, 4\) has 1 element\(s\): too few to split over the 2"):
        Tensor(rand(1, 4)).shard(TWO, 0)
    with pytest.raises(ValueError, match=r"shard axis must be an int in \[-2, 2\) for shape \(3, 4\), got 2"):
        Tensor(rand(3, 4)).shard(TWO, 2)
    with pytest.raises(ValueError, match=r"devices must differ"):
        Tensor(rand(3, 4)).shard(("CPU:0", "CPU"), 0)
    with pytest.raises(UnknownDevice, match="unknown device 'NOPE:1'"):
        Tensor(rand(3, 4)).shard(("CPU", "NOPE:1"), 0)
    with pytest.raises(TypeError, match="devices must be a tuple of device names"):
        Tensor(rand(3, 4)).shard((), 0)
    x, y = Tensor(rand(4, 4)).shard(TWO, 0), Tensor(rand(4, 4)).shard(("CPU:1", "CPU:2"), 0)
    with pytest.raises(ValueError, match=r"different devices: \('CPU', 'CPU:1'\) and \('CPU:1', 'CPU:2'\)"):
        x + y
    with pytest.raises(ValueError, match=r"different devices: \('CPU', 'CPU:1'\) and CPU"):
        x * Tensor(rand(4, 4))
    with pytest.raises(ValueError, match=r"different devices: \('CPU', 'CPU:1'\) and \('CPU:1', 'CPU:2'\)"):
        x @ y
    with pytest.raises(
        ValueError, match=r"between a tensor of shape \(4, 4\) on CPU and one of shape \(4, 4\) on \('CPU', 'CPU:1'\)"
    ):
        Tensor(UOp(Ops.ADD, x.dtype, (x.uop, Tensor(rand(4, 4)).uop)))  # (an op that did not check its devices)


def test_a_device_that_cannot_start_is_named() -> None:
    missing = next((s for s in ("CUDA:1", "AMD:1", "HIP:1") if not _opens(s)), None)
    if missing is None:
        pytest.skip("every device tried starts here")
    # (a device whose runtime is installed but cannot start here, or one no installed runtime provides)
    with pytest.raises((DeviceUnavailable, UnknownDevice), match=missing):
        Tensor(rand(4, 4)).shard(("CPU", missing), 0)


def _opens(name: str) -> bool:
    try:
        Device[name]
        return True
    except Exception:  # noqa: BLE001
        return False
