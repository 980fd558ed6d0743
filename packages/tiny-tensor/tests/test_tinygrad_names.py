"""tinygrad's names (tiny.tensor.tinygrad_names, tiny.nn.tinygrad_names) against what PyTorch computes for the same
thing, forward and backward."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tiny import nn
from tiny.tensor import Device, Tensor

torch = pytest.importorskip("torch")
F = torch.nn.functional


def check(
    device: str,
    ours: Callable,
    theirs: Callable,
    *arrays: np.ndarray,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    """ours(*tiny tensors) against theirs(*torch tensors): the values, and the gradient of every float input."""
    ts = [Tensor(a, device=device, requires_grad=a.dtype.kind == "f") for a in arrays]
    rs = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    out, ref = ours(*ts), theirs(*rs)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=atol, rtol=rtol)
    if not ref.requires_grad:
        return
    seed = np.random.default_rng(1).uniform(-1, 1, size=ref.shape).astype(np.float32)
    out.backward(Tensor(seed, device=device))
    ref.backward(torch.tensor(seed))
    for i, (t, r) in enumerate(zip(ts, rs)):
        if r.grad is not None:
            assert t.grad is not None, f"input {i} got no gradient"
            np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), atol=atol, rtol=rtol, err_msg=f"input {i}")


def uniform(*shape: int, low: float = -2.0, high: float = 2.0, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


# ---------------------------------------------------------------- losses


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_sparse_categorical_crossentropy_is_cross_entropy_with_classes_last(
    device: str, reduction: str, label_smoothing: float
) -> None:
    y = np.array([[0, 4, 2], [3, 3, 1]], dtype=np.int32)
    check(
        device,
        lambda x, t: x.sparse_categorical_crossentropy(t, label_smoothing=label_smoothing, reduction=reduction),
        lambda x, t: F.cross_entropy(
            x.reshape(-1, 5), t.reshape(-1).long(), label_smoothing=label_smoothing, reduction=reduction
        ).reshape(t.shape if reduction == "none" else ()),
        uniform(2, 3, 5),
        y,
    )


def test_sparse_categorical_crossentropy_leaves_out_ignore_index(device: str) -> None:
    y = np.array([1, 7, 0, 7], dtype=np.int32)
    check(
        device,
        lambda x, t: x.sparse_categorical_crossentropy(t, ignore_index=7, label_smoothing=0.1),
        lambda x, t: F.cross_entropy(x, t.long(), ignore_index=7, label_smoothing=0.1),
        uniform(4, 3),
        y,
    )


def test_sparse_categorical_crossentropy_takes_float_labels(device: str) -> None:
    x = Tensor(uniform(3, 4), device=device)
    ints = x.sparse_categorical_crossentropy(Tensor([0, 3, 2], device=device)).item()
    assert x.sparse_categorical_crossentropy(Tensor([0.0, 3.0, 2.0], device=device)).item() == pytest.approx(ints)


def test_sparse_categorical_crossentropy_says_which_shape_it_wanted(device: str) -> None:
    with pytest.raises(ValueError, match=r"need Y of shape \(4,\).*got \(3,\)"):
        Tensor(uniform(4, 3), device=device).sparse_categorical_crossentropy(Tensor([0, 1, 2], device=device))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_crossentropy(device: str, reduction: str) -> None:
    check(
        device,
        lambda p, t: p.binary_crossentropy(t, reduction=reduction),
        lambda p, t: F.binary_cross_entropy(p, t, reduction=reduction),
        uniform(3, 4, low=0.05, high=0.95),
        (uniform(3, 4, seed=2) > 0).astype(np.float32),
    )


def test_binary_crossentropy_logits(device: str) -> None:
    w = uniform(4, low=0.5, high=2, seed=3)
    check(
        device,
        lambda x, t: x.binary_crossentropy_logits(t, pos_weight=Tensor(w, device=device)),
        lambda x, t: F.binary_cross_entropy_with_logits(x, t, pos_weight=torch.tensor(w)),
        uniform(3, 4, low=-5, high=5),
        (uniform(3, 4, seed=2) > 0).astype(np.float32),
    )


# ---------------------------------------------------------------- normalization


def test_layernorm_is_layer_norm_without_affine(device: str) -> None:
    check(device, lambda x: x.layernorm(), lambda x: F.layer_norm(x, (6,)), uniform(2, 3, 6))


@pytest.mark.parametrize("axis", [(0, 2), 1, (-2, -1)])
def test_layernorm_over_any_axes(device: str, axis: int | tuple[int, ...]) -> None:
    def reference(x):  # noqa: ANN001, ANN202
        mean = x.mean(dim=axis, keepdim=True)
        return (x - mean) / torch.sqrt(x.var(dim=axis, keepdim=True, unbiased=False) + 1e-3)

    check(device, lambda x: x.layernorm(axis, eps=1e-3), reference, uniform(2, 3, 4))


def test_batchnorm_with_given_statistics_is_eval_batch_norm(device: str) -> None:
    mean, var = uniform(3, seed=4), uniform(3, low=0.5, high=2, seed=5)
    invstd = (1 / np.sqrt(var + 1e-5)).astype(np.float32)
    check(
        device,
        lambda x, w, b: x.batchnorm(w, b, Tensor(mean, device=device), Tensor(invstd, device=device)),
        lambda x, w, b: F.batch_norm(x, torch.tensor(mean), torch.tensor(var), w, b, training=False, eps=1e-5),
        uniform(2, 3, 4, 4),
        uniform(3, seed=6),
        uniform(3, seed=7),
    )


def test_batchnorm_along_several_axes_without_affine(device: str) -> None:
    mean, invstd = uniform(3, 4, seed=4), uniform(3, 4, low=0.5, high=2, seed=5)
    check(
        device,
        lambda x: x.batchnorm(None, None, Tensor(mean, device=device), Tensor(invstd, device=device), axis=(1, 2)),
        lambda x: (x - torch.tensor(mean)[:, :, None]) * torch.tensor(invstd)[:, :, None],
        uniform(2, 3, 4, 5),
    )


def test_batchnorm_says_what_the_statistics_should_hold(device: str) -> None:
    x = Tensor(uniform(2, 3), device=device)
    with pytest.raises(ValueError, match="mean must hold 3 values"):
        x.batchnorm(None, None, Tensor([0.0, 0.0], device=device), Tensor([1.0, 1.0, 1.0], device=device))


# ---------------------------------------------------------------- composition, bits, division, activations


def test_sequential_applies_each_callable_in_turn(device: str) -> None:
    w = uniform(4, 3, seed=8)
    check(
        device,
        lambda x: x.sequential([lambda h: h.linear(Tensor(w, device=device)), Tensor.relu, lambda h: h * 2]),
        lambda x: torch.nn.Sequential(torch.nn.Identity())(F.relu(F.linear(x, torch.tensor(w))) * 2),
        uniform(2, 3),
    )


def test_sequential_of_nothing_is_self(device: str) -> None:
    x = Tensor([1.0, 2.0], device=device)
    assert x.sequential([]) is x


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (lambda a, b: a.lshift(b), torch.bitwise_left_shift),
        (lambda a, b: a.rshift(b), torch.bitwise_right_shift),
        (lambda a, b: a.xor(b), torch.bitwise_xor),
        (lambda a, b: a.idiv(b), lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    ],
    ids=["lshift", "rshift", "xor", "idiv"],
)
def test_integer_names(device: str, ours: Callable, theirs: Callable) -> None:
    a = np.array([[7, -7, 12, 0], [1, -16, 255, 9]], dtype=np.int32)
    b = np.array([1, 2, 3, 4], dtype=np.int32)
    check(device, ours, theirs, a, b)
    check(device, lambda x: ours(x, 2), lambda x: theirs(x, 2), a)


def test_xor_of_bools(device: str) -> None:
    a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
    check(device, lambda x, y: x.xor(y), torch.bitwise_xor, a, b)


def test_leakyrelu(device: str) -> None:
    check(device, lambda x: x.leakyrelu(0.2), lambda x: F.leaky_relu(x, 0.2), uniform(3, 4))


# ---------------------------------------------------------------- nn layers


def test_nn_batchnorm_takes_any_rank_and_trains_as_torch() -> None:
    x = uniform(4, 3, 2, 3, 2)
    ours, theirs = nn.BatchNorm(3, eps=1e-3), torch.nn.BatchNorm3d(3, eps=1e-3)
    assert ours.weight is not None and ours.bias is not None
    with Tensor.no_grad():
        ours.weight.assign(Tensor(uniform(3, seed=9)))
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(uniform(3, seed=9)))
    with Tensor.train():
        check(Device.DEFAULT, ours, theirs, x)
    np.testing.assert_allclose(ours.running_mean.numpy(), theirs.running_mean.numpy(), atol=1e-6)
    np.testing.assert_allclose(ours.running_var.numpy(), theirs.running_var.numpy(), atol=1e-6)
    theirs.eval()
    out = ours(Tensor(x)).numpy()
    np.testing.assert_allclose(out, theirs(torch.tensor(x)).detach().numpy(), atol=1e-5)


def test_nn_batchnorm_arguments_in_tinygrads_order() -> None:
    bn = nn.BatchNorm(4, 1e-3, False, False)
    assert (bn.eps, bn.weight, bn.running_mean, bn.momentum) == (1e-3, None, None, 0.1)
    with pytest.raises(ValueError, match="got 3 channels"):
        bn(Tensor.ones(2, 3))


def test_nn_instancenorm_is_affine_instance_norm() -> None:
    x = uniform(2, 3, 4, 5)
    ours, theirs = nn.InstanceNorm(3), torch.nn.InstanceNorm2d(3, affine=True)
    assert ours.weight is not None
    with Tensor.no_grad():
        ours.weight.assign(Tensor(uniform(3, seed=9)))
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(uniform(3, seed=9)))
    check(Device.DEFAULT, ours, theirs, x)


def test_nn_layernorm2d_normalizes_the_channels() -> None:
    x = uniform(2, 3, 4, 5)
    ln = torch.nn.LayerNorm(3)
    # (over 3 values, a pixel whose channels nearly agree divides by a small deviation: float32 rounding shows)
    check(
        Device.DEFAULT,
        nn.LayerNorm2d(3),
        lambda t: ln(t.permute(0, 2, 3, 1)).permute(0, 3, 1, 2),
        x,
        atol=1e-4,
        rtol=1e-3,
    )
