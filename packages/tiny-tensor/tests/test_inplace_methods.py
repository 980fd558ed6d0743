"""PyTorch's in-place methods (add_, sub_, mul_, div_, clamp_, zero_, fill_, copy_, uniform_, normal_) against
torch: the values, that they return the tensor itself, that every view of the buffer sees the write, the gradient
through a computed tensor, and the refusal on a leaf that requires grad."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tiny.tensor import Tensor

torch = pytest.importorskip("torch")


def start(dtype: type = np.float32) -> np.ndarray:
    return (np.arange(12).reshape(3, 4) - 5).astype(dtype) * (0.5 if dtype == np.float32 else 1)


# each case: a name, the array to start from, and the call (given the library, so the operand is built in each)
CASES: list[tuple[str, np.ndarray, Callable]] = [
    ("add_", start(), lambda t, lib: t.add_(lib([1.0, 2.0, 3.0, 4.0]), alpha=2)),
    ("add_scalar", start(), lambda t, lib: t.add_(1.5)),
    ("sub_", start(), lambda t, lib: t.sub_(lib([[1.0], [2.0], [3.0]]))),
    ("sub_alpha", start(np.int32), lambda t, lib: t.sub_(3, alpha=2)),
    ("mul_", start(), lambda t, lib: t.mul_(lib([0.5, -1.0, 2.0, 3.0]))),
    ("div_", start(), lambda t, lib: t.div_(lib([0.5, -1.0, 2.0, 3.0]))),
    ("div_floor", start(np.int32), lambda t, lib: t.div_(3, rounding_mode="floor")),
    ("div_trunc", start(np.int32), lambda t, lib: t.div_(3, rounding_mode="trunc")),
    ("clamp_", start(), lambda t, lib: t.clamp_(-1.0, 1.5)),
    ("clamp_min", start(np.int32), lambda t, lib: t.clamp_(min=0)),
    ("clip_", start(), lambda t, lib: t.clip_(max=0.25)),
    ("zero_", start(), lambda t, lib: t.zero_()),
    ("fill_", start(), lambda t, lib: t.fill_(3.5)),
    ("fill_int_with_float", start(np.int32), lambda t, lib: t.fill_(2.7)),
    ("fill_0d_tensor", start(), lambda t, lib: t.fill_(lib(-4.0))),
    ("copy_", start(), lambda t, lib: t.copy_(lib([1.0, 2.0, 3.0, 4.0]))),
    ("copy_float_into_int", start(np.int32), lambda t, lib: t.copy_(lib([[1.7], [-2.2], [9.9]]))),
]


def make(device: str) -> Callable:
    return lambda v: Tensor(v, device=device)


@pytest.mark.parametrize(("name", "data", "call"), CASES, ids=[c[0] for c in CASES])
def test_values_and_self_match_torch(device: str, name: str, data: np.ndarray, call: Callable) -> None:
    t, r = Tensor(data, device=device).realize(), torch.tensor(data)
    out, ref = call(t, make(device)), call(r, torch.tensor)
    assert out is t and ref is r
    assert t.dtype.name == str(r.dtype).removeprefix("torch.") or (t.dtype.name, r.dtype) == ("int", torch.int32)
    np.testing.assert_allclose(t.numpy(), r.numpy(), atol=1e-6)


@pytest.mark.parametrize(("name", "data", "call"), CASES, ids=[c[0] for c in CASES])
def test_views_made_before_see_the_write(device: str, name: str, data: np.ndarray, call: Callable) -> None:
    t, r = Tensor(data, device=device).realize(), torch.tensor(data)
    flat, col = t.reshape(12), t.T[1]
    call(t, make(device))
    call(r, torch.tensor)
    np.testing.assert_allclose(flat.numpy(), r.reshape(12).numpy(), atol=1e-6)
    np.testing.assert_allclose(col.numpy(), r.T[1].numpy(), atol=1e-6)


@pytest.mark.parametrize(("name", "data", "call"), CASES, ids=[c[0] for c in CASES])
def test_writing_through_a_view_changes_the_base(device: str, name: str, data: np.ndarray, call: Callable) -> None:
    t, r = Tensor(data.T.copy(), device=device).realize(), torch.tensor(data.T.copy())
    assert call(t.T, make(device)) is not None and call(r.T, torch.tensor) is not None
    np.testing.assert_allclose(t.numpy(), r.numpy(), atol=1e-6)


def test_a_float_result_into_an_int_tensor_is_refused_as_in_torch(device: str) -> None:
    t = Tensor([1, 2], device=device).realize()
    with pytest.raises(RuntimeError):
        torch.tensor([1, 2]).div_(2)
    with pytest.raises(TypeError, match="div_: the result is float32"):
        t.div_(2)
    with pytest.raises(TypeError, match="add_"):
        t.add_(0.5)
    assert t.tolist() == [1, 2]


def test_fill_takes_only_a_number_or_a_0d_tensor(device: str) -> None:
    with pytest.raises(ValueError, match=r"0-d tensor, got a tensor of shape \(2,\)"):
        Tensor([1.0, 2.0], device=device).fill_(Tensor([1.0, 2.0], device=device))


def test_copy_says_which_shapes_do_not_fit(device: str) -> None:
    with pytest.raises(ValueError, match=r"shape \(3,\) does not broadcast to the tensor's shape \(2, 2\)"):
        Tensor.zeros(2, 2, device=device).copy_(Tensor([1.0, 2.0, 3.0], device=device))
    with pytest.raises(TypeError, match="copy_\\(\\) takes a Tensor"):
        Tensor.zeros(2, device=device).copy_([1.0, 2.0])  # type: ignore[arg-type]


# each method and its arguments (given the library, so a tensor operand is built in each)
METHODS: list[tuple[str, Callable]] = [
    ("add_", lambda lib: (1.0,)),
    ("sub_", lambda lib: (1.0,)),
    ("mul_", lambda lib: (2.0,)),
    ("div_", lambda lib: (2.0,)),
    ("clamp_", lambda lib: (0.0, 1.0)),
    ("zero_", lambda lib: ()),
    ("fill_", lambda lib: (1.0,)),
    ("copy_", lambda lib: (lib([5.0, 6.0]),)),
    ("uniform_", lambda lib: ()),
    ("normal_", lambda lib: ()),
]


@pytest.mark.parametrize(("name", "args"), METHODS, ids=[m[0] for m in METHODS])
def test_a_leaf_that_requires_grad_is_refused_outside_no_grad(device: str, name: str, args: Callable) -> None:
    r = torch.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        getattr(r, name)(*args(torch.tensor))
    t = Tensor([1.0, 2.0], device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match=rf"{name}: a leaf tensor that requires grad .*Tensor.no_grad"):
        getattr(t, name)(*args(make(device)))
    assert t.tolist() == [1.0, 2.0]
    with Tensor.no_grad():
        assert getattr(t, name)(*args(make(device))) is t
    assert t.requires_grad and t.tolist() != [1.0, 2.0]


def test_the_refusal_names_the_out_of_place_form(device: str) -> None:
    t = Tensor([1.0], device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"write `x = x.add\(y\)`"):
        t.add_(1.0)
    with pytest.raises(RuntimeError, match=r"write `x = x \+ y`"):  # the operators keep theirs
        t += 1.0


def test_the_gradient_flows_through_a_computed_tensor_as_in_torch(device: str) -> None:
    data = np.array([[0.5, -1.5, 2.0], [1.0, 3.0, -0.25]], dtype=np.float32)
    w_data = np.array([2.0, -1.0, 0.5], dtype=np.float32)

    def steps(x, w):  # noqa: ANN001, ANN202
        y = x * 1.5
        y.add_(w, alpha=2).mul_(w).clamp_(-2.0, 3.0).sub_(0.5).div_(w)
        return y

    x, w = Tensor(data, device=device, requires_grad=True), Tensor(w_data, device=device, requires_grad=True)
    xr, wr = torch.tensor(data, requires_grad=True), torch.tensor(w_data, requires_grad=True)
    out, ref = steps(x, w), steps(xr, wr)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=1e-6)
    out.sum().backward()
    ref.sum().backward()
    assert x.grad is not None and w.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), xr.grad.numpy(), atol=1e-6)
    np.testing.assert_allclose(w.grad.numpy(), wr.grad.numpy(), atol=1e-6)


def test_zero_of_a_computed_tensor_stops_its_gradient(device: str) -> None:
    x = Tensor([1.0, 2.0], device=device, requires_grad=True)
    y = x * 3
    y.zero_()
    (y + x).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [1.0, 1.0]


def test_zero_clears_a_gradient_in_place(device: str) -> None:
    x = Tensor([1.0, 2.0], device=device, requires_grad=True)
    (x * x).sum().backward()
    assert x.grad is not None
    g = x.grad
    assert g.zero_() is g and x.grad.tolist() == [0.0, 0.0]


def test_uniform_and_normal_fill_in_place(device: str) -> None:
    t = Tensor.zeros(4000, device=device).realize()
    view = t.reshape(40, 100)
    assert t.uniform_(-2.0, 3.0) is t
    a = view.numpy()
    assert a.min() >= -2.0 and a.max() < 3.0 and abs(a.mean() - 0.5) < 0.15
    t.normal_(1.0, 0.5)
    b = t.reshape(40, 100).numpy()  # (a view read once is its own copy since: a new view sees the write)
    assert abs(b.mean() - 1.0) < 0.05 and abs(b.std() - 0.5) < 0.05


def test_uniform_of_an_int_tensor_is_refused(device: str) -> None:
    with pytest.raises(RuntimeError):
        torch.tensor([1, 2]).normal_()
    with pytest.raises((TypeError, ValueError), match="uniform"):
        Tensor([1, 2], device=device).uniform_()
