"""max_pool's indices (return_indices=True) and max_unpool, against PyTorch: values, indices (ties, padding,
dilation, ceil_mode, NaN), and max_unpool's gradient (a value two windows chose takes the gradient twice)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tiny.tensor import Tensor

F = torch.nn.functional
CASES = [
    ((2, 3, 8, 9), dict(kernel_size=2)),
    ((1, 2, 7, 7), dict(kernel_size=3, stride=2, padding=1)),
    ((1, 1, 6, 6), dict(kernel_size=2, dilation=2)),
    ((1, 1, 5, 5), dict(kernel_size=2, ceil_mode=True)),
    ((3, 6, 5), dict(kernel_size=(2, 3), stride=1)),  # no batch
]


@pytest.mark.parametrize(("shape", "kw"), CASES, ids=str)
def test_max_pool2d_indices_match_torch(device: str, shape: tuple, kw: dict) -> None:
    a = np.random.default_rng(0).integers(0, 4, shape).astype(np.float32)  # many ties: the first is the index
    y, i = Tensor(a, device=device).max_pool2d(**kw, return_indices=True)
    ty, ti = F.max_pool2d(torch.tensor(a), **kw, return_indices=True)
    np.testing.assert_array_equal(y.numpy(), ty.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())


def test_max_pool1d_indices_and_nan(device: str) -> None:
    a = np.array([[[1.0, np.nan, 3.0, 3.0, -1.0, 2.0]]], np.float32)
    y, i = Tensor(a, device=device).max_pool1d(2, return_indices=True)
    ty, ti = F.max_pool1d(torch.tensor(a), 2, return_indices=True)
    np.testing.assert_array_equal(y.numpy(), ty.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())


@pytest.mark.parametrize(("shape", "kw"), CASES[:3], ids=str)
def test_max_unpool2d_matches_torch_forward_and_backward(device: str, shape: tuple, kw: dict) -> None:
    kw = {k: v for k, v in kw.items() if k != "dilation"}
    a = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    x = Tensor(a, device=device, requires_grad=True)
    y, i = x.max_pool2d(**kw, return_indices=True)
    u = y.max_unpool2d(i, **kw, output_size=shape[-2:])
    (u * u * Tensor(a, device=device)).sum().backward()
    tx = torch.tensor(a, requires_grad=True)
    ty, ti = F.max_pool2d(tx, **kw, return_indices=True)
    tu = F.max_unpool2d(ty, ti, **kw, output_size=shape[-2:])
    (tu * tu * torch.tensor(a)).sum().backward()
    np.testing.assert_allclose(u.numpy(), tu.detach().numpy())
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_max_unpool1d_default_size(device: str) -> None:
    a = np.array([[[1.0, 3.0, 2.0, 0.0, 5.0, 4.0]]], np.float32)
    y, i = Tensor(a, device=device).max_pool1d(2, return_indices=True)
    ty, ti = F.max_pool1d(torch.tensor(a), 2, return_indices=True)
    np.testing.assert_array_equal(y.max_unpool1d(i, 2).numpy(), F.max_unpool1d(ty, ti, 2).numpy())


def test_max_unpool_bad_input_says_what_was_expected() -> None:
    y, i = Tensor(np.ones((1, 1, 4, 4), np.float32)).max_pool2d(2, return_indices=True)
    with pytest.raises(ValueError, match=r"integer indices of the input's shape \(1, 1, 2, 2\), got float32"):
        y.max_unpool2d(i.float(), 2)
    with pytest.raises(ValueError, match="not within a stride of"):
        y.max_unpool2d(i, 2, output_size=(9, 9))
    with pytest.raises(ValueError, match="kernel_size takes an int or 2 ints"):
        y.max_unpool2d(i, 0)
