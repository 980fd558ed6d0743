"""tiny.nn layers against torch.nn: the same state_dict keys and shapes, the same outputs and gradients (of the
input and of every parameter) with weights copied from torch, batch norm's running statistics, and the default
initialization's distributions."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tiny import nn
from tiny.ir.device import Device
from tiny.nn.state import get_state_dict
from tiny.tensor import Tensor

torch = pytest.importorskip("torch")
DEVICE = Device.DEFAULT  # where the layers make their parameters: CPU, or what DEVICE names


def copy_weights(ours: object, ref: torch.nn.Module) -> None:
    """Give torch's layer random parameters (and running stats), then copy its state_dict into ours by key."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.rand(p.shape, generator=gen) * 2 - 1)
        for name, b in ref.named_buffers():
            if name == "running_mean":
                b.copy_(torch.rand(b.shape, generator=gen) - 0.5)
            elif name == "running_var":
                b.copy_(torch.rand(b.shape, generator=gen) + 0.5)
    params = dict(ref.named_parameters())
    for name, v in ref.state_dict().items():
        t = Tensor(v.detach().numpy().copy(), device=DEVICE).realize()
        if name in params:
            t.requires_grad = True
        setattr(ours, name, t)


def assert_same_state(ours: object, ref: torch.nn.Module) -> None:
    mine = get_state_dict(ours)
    theirs = ref.state_dict()
    assert list(mine) == list(theirs), f"state_dict keys {list(mine)} != torch's {list(theirs)}"
    for name, v in theirs.items():
        assert mine[name].shape == tuple(v.shape), f"{name}: shape {mine[name].shape} != torch's {tuple(v.shape)}"
    param_names = {name for name, _ in ref.named_parameters()}
    for name, t in mine.items():
        assert bool(t.requires_grad) == (name in param_names), f"{name}: requires_grad={t.requires_grad}"


def check(
    ours: object,
    ref: torch.nn.Module,
    shape: tuple[int, ...],
    train: bool = False,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    call: Callable | None = None,
) -> None:
    """Copy ref's weights into ours, run both on the same input, and compare outputs and all gradients."""
    assert_same_state(ours, ref)
    copy_weights(ours, ref)
    rng = np.random.default_rng(0)
    x_np = rng.uniform(-2, 2, size=shape).astype(np.float32)
    x = Tensor(x_np, device=DEVICE, requires_grad=True)
    xr = torch.tensor(x_np, requires_grad=True)
    ref.train(train)
    with Tensor.train(train):
        out = call(ours, x) if call else ours(x)  # type: ignore[operator]
    ref_out = call(ref, xr) if call else ref(xr)
    np.testing.assert_allclose(out.numpy(), ref_out.detach().numpy(), atol=atol, rtol=rtol, err_msg="output")
    seed = rng.uniform(-1, 1, size=ref_out.shape).astype(np.float32)
    out.backward(Tensor(seed, device=DEVICE))
    ref_out.backward(torch.tensor(seed))
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), xr.grad.numpy(), atol=atol, rtol=rtol, err_msg="input gradient")
    mine = get_state_dict(ours)
    for name, p in ref.named_parameters():
        g = mine[name].grad
        assert g is not None, f"parameter {name} got no gradient"
        np.testing.assert_allclose(g.numpy(), p.grad.numpy(), atol=atol, rtol=rtol, err_msg=f"gradient of {name}")


# ---------------------------------------------------------------- linear and convolutions


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias: bool) -> None:
    check(nn.Linear(5, 3, bias=bias), torch.nn.Linear(5, 3, bias=bias), (2, 4, 5))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"stride": 2, "padding": 1},
        {"dilation": 2, "groups": 2, "bias": False},
        {"padding": "same", "dilation": 2},
        {"padding": 2, "padding_mode": "reflect"},
        {"padding": 1, "padding_mode": "circular", "stride": 2},
    ],
)
def test_conv1d(kwargs: dict) -> None:
    check(nn.Conv1d(4, 6, 3, **kwargs), torch.nn.Conv1d(4, 6, 3, **kwargs), (2, 4, 9))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"stride": (2, 1), "padding": (1, 0)},
        {"groups": 2, "dilation": 2, "bias": False},
        {"padding": "same"},
        {"padding": 1, "padding_mode": "replicate"},
    ],
)
def test_conv2d(kwargs: dict) -> None:
    check(nn.Conv2d(4, 6, 3, **kwargs), torch.nn.Conv2d(4, 6, 3, **kwargs), (2, 4, 7, 6))


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"stride": 2, "padding": 1, "output_padding": 1}, {"groups": 2, "dilation": 2, "bias": False}],
)
def test_conv_transpose1d(kwargs: dict) -> None:
    check(nn.ConvTranspose1d(4, 6, 3, **kwargs), torch.nn.ConvTranspose1d(4, 6, 3, **kwargs), (2, 4, 5))


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"stride": 2, "padding": 1, "output_padding": 1}, {"groups": 2, "stride": (1, 2), "bias": False}],
)
def test_conv_transpose2d(kwargs: dict) -> None:
    check(nn.ConvTranspose2d(4, 2, (3, 2), **kwargs), torch.nn.ConvTranspose2d(4, 2, (3, 2), **kwargs), (2, 4, 4, 5))


# ---------------------------------------------------------------- batch and instance norm


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize(
    ("ours", "ref", "shape"),
    [
        (nn.BatchNorm1d, torch.nn.BatchNorm1d, (6, 3)),
        (nn.BatchNorm1d, torch.nn.BatchNorm1d, (4, 3, 5)),
        (nn.BatchNorm2d, torch.nn.BatchNorm2d, (3, 3, 4, 2)),
    ],
)
def test_batch_norm_forward_backward(ours: type, ref: type, shape: tuple[int, ...], train: bool) -> None:
    check(ours(3), ref(3), shape, train=train)


@pytest.mark.parametrize("kwargs", [{"affine": False}, {"track_running_stats": False}])
@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_options(kwargs: dict, train: bool) -> None:
    check(nn.BatchNorm2d(3, **kwargs), torch.nn.BatchNorm2d(3, **kwargs), (2, 3, 3, 3), train=train)


@pytest.mark.parametrize("momentum", [0.1, 0.3, None])
def test_batch_norm_running_stats(momentum: float | None) -> None:
    ours, ref = nn.BatchNorm2d(3, momentum=momentum), torch.nn.BatchNorm2d(3, momentum=momentum)
    copy_weights(ours, ref)
    rng = np.random.default_rng(2)
    ref.train()
    for step in range(3):
        x_np = rng.normal(step, 1 + step, size=(4, 3, 2, 2)).astype(np.float32)
        with Tensor.train():
            ours(Tensor(x_np, device=DEVICE))
        ref(torch.tensor(x_np))
        for name in ("running_mean", "running_var"):
            np.testing.assert_allclose(
                getattr(ours, name).numpy(), getattr(ref, name).numpy(), atol=1e-5, rtol=1e-5, err_msg=name
            )
        assert ours.num_batches_tracked.item() == ref.num_batches_tracked.item() == step + 1
    # eval uses the running statistics and leaves them as they are
    x_np = rng.normal(size=(2, 3, 2, 2)).astype(np.float32)
    ref.eval()
    with Tensor.eval():
        out = ours(Tensor(x_np, device=DEVICE))
    np.testing.assert_allclose(out.numpy(), ref(torch.tensor(x_np)).detach().numpy(), atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(ours.running_mean.numpy(), ref.running_mean.numpy(), atol=1e-6)
    assert ours.num_batches_tracked.item() == 3


def test_batch_norm_follows_training_mode() -> None:
    bn = nn.BatchNorm1d(2)
    x = Tensor([[1.0, 2.0], [3.0, 6.0]], device=DEVICE)
    with Tensor.eval():
        np.testing.assert_allclose(bn(x).numpy(), x.numpy() / np.sqrt(1 + 1e-5), rtol=1e-6)
    assert bn.num_batches_tracked.item() == 0
    with Tensor.train():
        np.testing.assert_allclose(bn(x).numpy(), [[-1.0, -1.0], [1.0, 1.0]], atol=1e-4)
    assert bn.num_batches_tracked.item() == 1


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize(
    ("ours", "ref", "shape"),
    [
        (nn.InstanceNorm1d, torch.nn.InstanceNorm1d, (3, 4, 6)),
        (nn.InstanceNorm1d, torch.nn.InstanceNorm1d, (4, 6)),
        (nn.InstanceNorm2d, torch.nn.InstanceNorm2d, (2, 4, 3, 3)),
    ],
)
@pytest.mark.parametrize("kwargs", [{}, {"affine": True}, {"affine": True, "track_running_stats": True}])
def test_instance_norm(ours: type, ref: type, shape: tuple[int, ...], train: bool, kwargs: dict) -> None:
    ours_layer, ref_layer = ours(4, **kwargs), ref(4, **kwargs)
    check(ours_layer, ref_layer, shape, train=train)
    if kwargs.get("track_running_stats"):
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            np.testing.assert_allclose(
                getattr(ours_layer, name).numpy(), getattr(ref_layer, name).numpy(), atol=1e-5, err_msg=name
            )


# ---------------------------------------------------------------- layer, group and rms norm


@pytest.mark.parametrize(
    ("shape", "kwargs"),
    [((4,), {}), ((3, 4), {}), ((4,), {"bias": False}), ((4,), {"elementwise_affine": False, "eps": 1e-3})],
)
def test_layer_norm(shape: tuple[int, ...], kwargs: dict) -> None:
    check(nn.LayerNorm(shape, **kwargs), torch.nn.LayerNorm(shape, **kwargs), (2, 3, 4))


@pytest.mark.parametrize("kwargs", [{}, {"affine": False}, {"eps": 1e-2}])
def test_group_norm(kwargs: dict) -> None:
    check(nn.GroupNorm(2, 6, **kwargs), torch.nn.GroupNorm(2, 6, **kwargs), (3, 6, 4))


@pytest.mark.parametrize("kwargs", [{}, {"eps": 1e-3}, {"elementwise_affine": False}])
def test_rms_norm(kwargs: dict) -> None:
    check(nn.RMSNorm((3, 4), **kwargs), torch.nn.RMSNorm((3, 4), **kwargs), (2, 3, 4))


# ---------------------------------------------------------------- embedding, LSTM cell, dropout


@pytest.mark.parametrize("padding_idx", [None, 2, -1])
def test_embedding(padding_idx: int | None) -> None:
    ours = nn.Embedding(7, 3, padding_idx=padding_idx)
    ref = torch.nn.Embedding(7, 3, padding_idx=padding_idx)
    assert_same_state(ours, ref)
    copy_weights(ours, ref)
    idx = np.array([[0, 2, 6], [2, 5, 2]], dtype=np.int64)
    out, ref_out = ours(Tensor(idx, device=DEVICE)), ref(torch.tensor(idx))
    np.testing.assert_allclose(out.numpy(), ref_out.detach().numpy(), rtol=1e-6)
    seed = np.random.default_rng(0).uniform(-1, 1, size=ref_out.shape).astype(np.float32)
    out.backward(Tensor(seed, device=DEVICE))
    ref_out.backward(torch.tensor(seed))
    assert ours.weight.grad is not None
    np.testing.assert_allclose(ours.weight.grad.numpy(), ref.weight.grad.numpy(), atol=1e-6)


def test_embedding_padding_row_starts_at_zero() -> None:
    assert nn.Embedding(5, 4, padding_idx=3).weight.numpy()[3].tolist() == [0.0] * 4


def lstm_call(layer: object, x: Tensor) -> Tensor:
    """Both outputs of an LSTM cell stepped twice from a zero state, as one tensor."""
    h, c = layer(x)  # type: ignore[operator]
    h, c = layer(x * 0.5, (h, c))  # type: ignore[operator]
    return h * 2 + c


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 5), (5,)])
def test_lstm_cell(bias: bool, shape: tuple[int, ...]) -> None:
    check(nn.LSTMCell(5, 4, bias=bias), torch.nn.LSTMCell(5, 4, bias=bias), shape, call=lstm_call)


def test_dropout() -> None:
    x = Tensor.ones(4000, device=DEVICE)
    with Tensor.eval():
        assert nn.Dropout(0.3)(x).numpy().tolist() == [1.0] * 4000
    with Tensor.train():
        out = nn.Dropout(0.25)(x).numpy()
    np.testing.assert_allclose(out[out != 0], np.float32(1 / 0.75))
    assert abs((out == 0).mean() - 0.25) < 0.05
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)


# ---------------------------------------------------------------- default initialization and state


def fan_in_bound(fan_in: int) -> float:
    """torch's bound for these layers: kaiming_uniform(a=sqrt(5)) and the bias rule both give 1/sqrt(fan_in)."""
    return 1 / np.sqrt(fan_in)


@pytest.mark.parametrize(
    ("ours", "ref", "bound"),
    [
        (lambda: nn.Linear(60, 50), lambda: torch.nn.Linear(60, 50), fan_in_bound(60)),
        (lambda: nn.Conv1d(8, 40, 5, groups=2), lambda: torch.nn.Conv1d(8, 40, 5, groups=2), fan_in_bound(4 * 5)),
        (lambda: nn.Conv2d(6, 30, 3), lambda: torch.nn.Conv2d(6, 30, 3), fan_in_bound(6 * 9)),
        (lambda: nn.ConvTranspose1d(40, 12, 3), lambda: torch.nn.ConvTranspose1d(40, 12, 3), fan_in_bound(12 * 3)),
        (
            lambda: nn.ConvTranspose2d(40, 6, 3, groups=2),
            lambda: torch.nn.ConvTranspose2d(40, 6, 3, groups=2),
            fan_in_bound(3 * 9),
        ),
        (lambda: nn.LSTMCell(20, 16), lambda: torch.nn.LSTMCell(20, 16), fan_in_bound(16)),
    ],
)
def test_uniform_initialization_matches_torch(ours: Callable, ref: Callable, bound: float) -> None:
    """Every parameter is U(-b, b) with torch's b; large ones fill it (max near b, spread b/sqrt(3)) as torch's do."""
    mine, theirs = get_state_dict(ours()), ref().state_dict()
    for name, v in theirs.items():
        a = mine[name].numpy()
        assert np.abs(a).max() < bound * (1 + 1e-6), f"{name}: a value beyond torch's bound {bound}"
        assert v.abs().max().item() < bound * (1 + 1e-6), f"{name}: the test's bound is wrong"
        if a.size >= 200:
            assert np.abs(a).max() > 0.95 * bound, name
            np.testing.assert_allclose(a.std(), bound / np.sqrt(3), rtol=0.1, err_msg=name)
            np.testing.assert_allclose(v.std().item(), bound / np.sqrt(3), rtol=0.1, err_msg=name)


def test_constant_and_normal_initialization() -> None:
    bn = nn.BatchNorm1d(4)
    assert bn.weight.tolist() == [1.0] * 4 and bn.bias.tolist() == [0.0] * 4
    assert bn.running_mean.tolist() == [0.0] * 4 and bn.running_var.tolist() == [1.0] * 4
    assert bn.num_batches_tracked.item() == 0 and bn.num_batches_tracked.dtype.is_int
    for layer in (nn.LayerNorm(4), nn.GroupNorm(2, 4), nn.RMSNorm(4), nn.InstanceNorm1d(4, affine=True)):
        assert layer.weight.tolist() == [1.0] * 4, type(layer).__name__
    emb = nn.Embedding(100, 50).weight.numpy()
    assert abs(emb.mean()) < 0.05 and abs(emb.std() - 1) < 0.05


@pytest.mark.parametrize(
    ("ours", "ref"),
    [
        (lambda: nn.Linear(3, 2, bias=False), lambda: torch.nn.Linear(3, 2, bias=False)),
        (lambda: nn.Conv2d(2, 4, (3, 1), bias=False), lambda: torch.nn.Conv2d(2, 4, (3, 1), bias=False)),
        (lambda: nn.BatchNorm2d(3), lambda: torch.nn.BatchNorm2d(3)),
        (lambda: nn.BatchNorm1d(3, affine=False), lambda: torch.nn.BatchNorm1d(3, affine=False)),
        (
            lambda: nn.BatchNorm1d(3, track_running_stats=False),
            lambda: torch.nn.BatchNorm1d(3, track_running_stats=False),
        ),
        (lambda: nn.InstanceNorm2d(3), lambda: torch.nn.InstanceNorm2d(3)),
        (lambda: nn.LayerNorm(3, bias=False), lambda: torch.nn.LayerNorm(3, bias=False)),
        (lambda: nn.Embedding(4, 2), lambda: torch.nn.Embedding(4, 2)),
        (lambda: nn.LSTMCell(3, 2), lambda: torch.nn.LSTMCell(3, 2)),
    ],
)
def test_state_dict_keys_and_shapes(ours: Callable, ref: Callable) -> None:
    layer = ours()
    assert_same_state(layer, ref())


def test_errors_name_the_layer() -> None:
    with pytest.raises(ValueError, match="groups=3"):
        nn.Conv2d(4, 6, 3, groups=3)
    with pytest.raises(ValueError, match=r"BatchNorm1d\(3\) got 4 channels"):
        nn.BatchNorm1d(3)(Tensor.ones(2, 4, device=DEVICE))
    with pytest.raises(TypeError, match="integer indices"):
        nn.Embedding(3, 2)(Tensor([0.0, 1.0], device=DEVICE))


def test_skip_init_leaves_parameters_uncomputed() -> None:
    """Inside skip_init a layer's parameters are their lazy random draws (no memory, no leaf) until replaced, as
    a model loaded from files wants; outside, they are realized leaves."""
    from tiny.ir.schedule import is_realized
    from tiny.nn import Embedding, Linear, skip_init

    with skip_init():
        lazy, table = Linear(64, 32), Embedding(100, 8)
    assert not any(is_realized(t.uop) for t in (lazy.weight, lazy.bias, table.weight))
    assert lazy.weight.requires_grad is None
    plain = Linear(64, 32)
    assert is_realized(plain.weight.uop) and plain.weight.requires_grad
    assert lazy(Tensor.ones(2, 64)).shape == (2, 32)  # (still usable: the draw is computed where it is read)
