"""assign and __setitem__: writes land in the tensor's buffer, every view sees them, pending reads do not."""

from __future__ import annotations

import numpy as np
import pytest

from tiny.tensor import Tensor, dtypes


def base(device: str, dtype=np.float32) -> tuple[Tensor, np.ndarray]:
    a = np.arange(12).reshape(3, 4).astype(dtype)
    return Tensor(a, device=device).realize(), a.copy()


@pytest.mark.parametrize(
    "index",
    [(1, slice(None, None, 2)), (slice(None), 3), 0, (Ellipsis, -1), (slice(2, 0, -1), slice(1, 3)), (None, 1)],
)
def test_setitem_basic_indices_match_numpy(device: str, index) -> None:
    t, a = base(device)
    t[index] = -5.0
    a[index[1:] if isinstance(index, tuple) and index[0] is None else index] = -5.0
    np.testing.assert_array_equal(t.numpy(), a)


def test_setitem_with_a_tensor_value_broadcasts(device: str) -> None:
    t, a = base(device)
    t[:, 1:3] = Tensor([[10.0, 20.0]], device=device)
    a[:, 1:3] = [[10.0, 20.0]]
    np.testing.assert_array_equal(t.numpy(), a)


def test_every_view_of_the_buffer_sees_the_write(device: str) -> None:
    t, a = base(device)
    flat, col = t.reshape(12), t.T[2]
    t[1] = 0.0
    a[1] = 0.0
    np.testing.assert_array_equal(flat.numpy(), a.reshape(12))
    np.testing.assert_array_equal(col.numpy(), a.T[2])


def test_a_view_whose_values_were_read_still_sees_later_writes(device: str) -> None:
    """Reading a view (numpy, tolist, item) reads it through a copy made for the read: the view stays a view, as a
    PyTorch view does. It used to become that copy, so `v = x[1:]; v.numpy(); x += 1` left v at the old values."""
    t, a = base(device)
    views = {"slice": (t[1:], lambda m: m[1:]), "strided": (t[:, ::2], lambda m: m[:, ::2])}
    views |= {"transposed": (t.T, lambda m: m.T), "row": (t[2], lambda m: m[2])}
    for v, _ in views.values():
        v.numpy()
    t += 1
    a += 1
    t[0, 1] = -5.0
    a[0, 1] = -5.0
    for name, (v, of) in views.items():
        np.testing.assert_array_equal(v.numpy(), of(a), err_msg=name)
    assert t[1, 1].item() == a[1, 1] and t[1].tolist() == a[1].tolist()


def test_writing_through_a_permuted_view_changes_the_base(device: str) -> None:
    t, a = base(device)
    v = t.T
    v[0] = 9.0
    a.T[0] = 9.0
    np.testing.assert_array_equal(t.numpy(), a)


def test_pending_readers_see_the_values_from_before(device: str) -> None:
    t, a = base(device)
    before = t * 2 + 1  # recorded before the write, realized after it
    t[0] = 100.0
    np.testing.assert_array_equal(before.numpy(), a * 2 + 1)


def test_overlapping_source_and_target(device: str) -> None:
    t = Tensor(np.arange(6, dtype=np.float32), device=device).realize()
    t[1:] = t[:-1]
    np.testing.assert_array_equal(t.numpy(), [0, 0, 1, 2, 3, 4])


def test_integer_and_bool_tensors(device: str) -> None:
    i = Tensor(np.arange(6, dtype=np.int64) * (2**40), device=device).realize()
    i[2:4] = 2**50 + 1  # exact: integers are not routed through float
    assert i.tolist() == [0, 2**40, 2**50 + 1, 2**50 + 1, 4 * 2**40, 5 * 2**40]
    b = Tensor([True, False, True], device=device).realize()
    b[1] = True
    assert b.tolist() == [True, True, True]


def test_assign_a_whole_tensor_and_an_unrealized_target(device: str) -> None:
    x = Tensor([1.0, 2.0, 3.0], device=device) * 1  # not realized yet
    x.assign(x * 2)
    assert x.tolist() == [2.0, 4.0, 6.0]
    x.assign(7)
    assert x.tolist() == [7.0, 7.0, 7.0]


def test_bad_writes_are_refused(device: str) -> None:
    w = Tensor([1.0, 2.0], device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        w[0] = 3.0
    e = Tensor([1.0], device=device).realize().expand(3)
    with pytest.raises(RuntimeError, match="expanded"):
        e.assign(Tensor([1.0, 2.0, 3.0], device=device))
    t = Tensor([1.0, 2.0], device=device)
    with pytest.raises(ValueError, match="broadcast"):
        t[0:2] = Tensor([1.0, 2.0, 3.0], device=device)
    assert t.dtype == dtypes.float32


def test_setitem_with_tensor_indices_matches_torch(device: str) -> None:
    torch = pytest.importorskip("torch")
    t, a = base(device)
    ref = torch.tensor(a)
    rows, cols = [0, 2, 2], [1, 3, 0]
    t[Tensor(rows, device=device), Tensor(cols, device=device)] = Tensor([5.0, 6.0, 7.0], device=device)
    ref[torch.tensor(rows), torch.tensor(cols)] = torch.tensor([5.0, 6.0, 7.0])
    np.testing.assert_array_equal(t.numpy(), ref.numpy())
    t[Tensor([1], device=device)] = 0.0
    ref[torch.tensor([1])] = 0.0
    np.testing.assert_array_equal(t.numpy(), ref.numpy())


# ---------------------------------------------------------------- in-place operators and requires_grad=


INPLACE = {
    "+=": (lambda a, b: a.__iadd__(b)),
    "-=": (lambda a, b: a.__isub__(b)),
    "*=": (lambda a, b: a.__imul__(b)),
    "/=": (lambda a, b: a.__itruediv__(b)),
    "//=": (lambda a, b: a.__ifloordiv__(b)),
    "%=": (lambda a, b: a.__imod__(b)),
    "**=": (lambda a, b: a.__ipow__(b)),
}


@pytest.mark.parametrize("op", list(INPLACE))
def test_inplace_operators_write_through_the_buffer(device: str, op: str) -> None:
    torch = pytest.importorskip("torch")
    a = np.array([[1.5, -2.0, 3.0], [4.0, 0.5, -6.0]], np.float32)
    b = np.array([2.0, -1.5, 0.5], np.float32)
    t = Tensor(a, device=device).realize()
    view = t.T  # a view of the same memory sees the write
    ours = INPLACE[op](t, Tensor(b, device=device))
    ref = INPLACE[op](torch.tensor(a), torch.tensor(b))
    assert ours is t
    np.testing.assert_allclose(t.numpy(), ref.numpy(), rtol=1e-6)
    np.testing.assert_allclose(view.numpy(), ref.numpy().T, rtol=1e-6)


def test_inplace_bit_operators_on_ints(device: str) -> None:
    t = Tensor(np.array([12, 5, -3], np.int32), device=device).realize()
    t &= 6
    t |= 1
    t ^= 3
    t <<= 2
    t >>= 1
    x = np.array([12, 5, -3], np.int32)
    x &= 6
    x |= 1
    x ^= 3
    x <<= 2
    x >>= 1
    assert t.tolist() == x.tolist()


def test_inplace_refuses_a_float_result_in_an_int_tensor(device: str) -> None:
    t = Tensor([1, 2], device=device)
    with pytest.raises(TypeError, match="float32 and cannot be written into this int"):
        t /= 2
    with pytest.raises(ValueError, match="does not fit"):
        t += Tensor([[1], [2]], device=device)


def test_inplace_on_a_leaf_that_requires_grad(device: str) -> None:
    w = Tensor([1.0, 2.0], device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        w += 1
    (w * w).sum().backward()
    with Tensor.no_grad():  # an optimizer's update: allowed, as in PyTorch
        w -= 0.5 * w.grad
    assert w.tolist() == [0.0, 0.0] and w.requires_grad


def test_inplace_on_a_tensor_computed_from_a_leaf_keeps_the_gradient(device: str) -> None:
    torch = pytest.importorskip("torch")
    w, tw = Tensor([1.0, -2.0], device=device, requires_grad=True), torch.tensor([1.0, -2.0], requires_grad=True)
    for x, leaf in ((w, w), (tw, tw)):
        y = x * 3
        y += x * x
        y *= 2
        (y * y).sum().backward()
        assert leaf.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy())


@pytest.mark.parametrize("realized", [False, True], ids=["lazy", "realized"])
def test_views_taken_before_an_inplace_op_on_the_gradient_path_follow_it(device: str, realized: bool) -> None:
    """A view of a tensor that is then changed in place (a gradient flowing through it) sees the new values, and the
    gradient through the view goes through the change, as in PyTorch. It kept the old value: v = a[1:]; a += 1 gave
    v without the 1 and a gradient without it (silently)."""
    torch = pytest.importorskip("torch")
    data = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    w, tw = Tensor(data, device=device, requires_grad=True), torch.tensor(data, requires_grad=True)
    got = []
    for x, lib in ((w, "tiny"), (tw, "torch")):
        a = x * 2
        if realized and lib == "tiny":
            a.realize()
        views = [a[1:], a.T, a.reshape(12)[::3], a[2]]
        a += x * x
        a *= 3
        loss = sum((v * v).sum() * (i + 1) for i, v in enumerate(views))
        loss.backward()
        got.append([np.asarray(v.detach().numpy()) for v in views] + [x.grad.numpy()])
    for mine, theirs in zip(*got):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_inplace_on_a_view_changes_what_it_views(device: str, grad: bool) -> None:
    """v = a[1:]; v += 1 changes a (and every other view of a) where v lies, as in PyTorch, whether a is computed
    (lazy), memory, or on a gradient path. It changed a copy of v alone, silently."""
    torch = pytest.importorskip("torch")
    data = np.arange(12, dtype=np.float32).reshape(3, 4) / 5
    w, tw = Tensor(data, device=device, requires_grad=grad), torch.tensor(data, requires_grad=grad)
    got = []
    for x in (w, tw):
        a = x * 2
        other = a.T
        v = a[1:, ::2]
        v += 1
        a[0] *= 3
        row = a[2]
        row -= x[0]
        outs = [a, other, v, row]
        if grad:
            sum((o * o).sum() * (i + 1) for i, o in enumerate(outs)).backward()
            outs.append(x.grad)
        got.append([o.detach().numpy() for o in outs])
    for mine, theirs in zip(*got):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "make",
    [
        lambda d: Tensor.zeros(2, 3, device=d, requires_grad=True),
        lambda d: Tensor.ones(3, device=d, requires_grad=True),
        lambda d: Tensor.full((2,), 1.5, device=d, requires_grad=True),
        lambda d: Tensor.arange(0.0, 3.0, device=d, requires_grad=True),
        lambda d: Tensor.linspace(0, 1, 4, device=d, requires_grad=True),
        lambda d: Tensor.eye(2, device=d, requires_grad=True),
        lambda d: Tensor.rand(2, 2, device=d, requires_grad=True),
        lambda d: Tensor.randn(3, device=d, requires_grad=True),
        lambda d: Tensor.uniform(3, device=d, requires_grad=True),
        lambda d: Tensor.ones(3, device=d).zeros_like(requires_grad=True),
        lambda d: Tensor.kaiming_uniform(2, 3, device=d, requires_grad=True),
    ],
    ids=["zeros", "ones", "full", "arange", "linspace", "eye", "rand", "randn", "uniform", "zeros_like", "kaiming"],
)
def test_creation_functions_take_requires_grad(device: str, make) -> None:
    t = make(device)
    assert t.requires_grad is True
    (t * 2).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), np.full(t.shape, 2.0, np.float32))


def test_requires_grad_on_ints_and_requires_grad_(device: str) -> None:
    with pytest.raises(TypeError, match="only float tensors"):
        Tensor.zeros(2, dtype="int32", device=device, requires_grad=True)
    t = Tensor([1.0, 2.0], device=device)
    assert t.requires_grad_() is t and t.requires_grad is True
    assert t.requires_grad_(False).requires_grad is False
    with pytest.raises(TypeError, match="takes a bool"):
        t.requires_grad_("yes")


def test_a_gradient_flows_through_what_is_written_into_a_plain_tensor() -> None:
    """x.add_(w) with only w requiring grad (x a plain tensor, as a running buffer): the gradient reaches w through
    every later in-place op, as in PyTorch (it raised 'no gradient rule for ASSIGN')."""
    torch = pytest.importorskip("torch")

    w0 = np.array([0.5, 1.0, 2.0], np.float32)
    x, w = Tensor(np.ones(3, np.float32)), Tensor(w0, requires_grad=True)
    x.add_(w, alpha=2)
    x.mul_(w)
    x += w * w
    (x * x).sum().backward()
    xt, wt = torch.ones(3), torch.tensor(w0, requires_grad=True)
    xt.add_(wt, alpha=2)
    xt.mul_(wt)
    xt += wt * wt
    (xt * xt).sum().backward()
    np.testing.assert_allclose(x.numpy(), xt.detach().numpy(), rtol=1e-6)
    assert w.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-6)


def test_writes_through_slices_under_no_grad_reach_the_tensor(device: str) -> None:
    """Under no_grad every op's result is detached; a slice is still a view of its tensor's memory, so t[i] = x and
    t[:, j] += y write t (they wrote a copy of the slice, silently: an optimizer's or a cache's update lost)."""
    t = Tensor.zeros(4, 3, device=device).contiguous().realize()
    want = np.zeros((4, 3), np.float32)
    with Tensor.no_grad():
        t[2:3] = Tensor.ones(1, 3, device=device)
        t[:, 1:2] += 5
        t[0].assign(Tensor([7.0, 8.0, 9.0], device=device))
    want[2:3] = 1
    want[:, 1:2] += 5
    want[0] = [7, 8, 9]
    np.testing.assert_array_equal(t.numpy(), want)


# ---------------------------------------------------------------- several writes in one realize


def test_writes_assigned_together_are_one_schedule_and_pending_readers_see_the_values_from_before(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A language model's keys and values into their caches: the two writes and what they compute are one schedule
    (sequential assigns made one each), and a pending tensor that reads a cache sees it as before the writes."""
    import tiny.tensor.tensor as tensor_module
    from tiny.tensor.inplace import assign_together

    keys, k = base(device)
    values, v = base(device)
    before = keys * 2  # pending, reads the keys' memory
    new_k = Tensor(np.full((2, 4), -1.0, np.float32), device=device) * 3
    new_v = Tensor(np.full((4,), 7.0, np.float32), device=device) + 1  # broadcast into the rows, as assign() does
    schedules = []
    made = tensor_module.create_schedule
    monkeypatch.setattr(tensor_module, "create_schedule", lambda targets: schedules.append(targets) or made(targets))
    assign_together((keys[1:3], new_k), (values[0:2], new_v))
    assert len(schedules) == 2  # the pending reader (first), then both writes with what they compute
    k[1:3], v[0:2] = -3.0, 8.0
    np.testing.assert_array_equal(keys.numpy(), k)
    np.testing.assert_array_equal(values.numpy(), v)
    np.testing.assert_array_equal(before.numpy(), np.arange(12).reshape(3, 4) * 2)


def test_writes_that_read_each_others_memory_are_done_in_order(device: str) -> None:
    """As assign() one after another, of values made before either write (so each reads the other's memory from
    before, as PyTorch's eager values would; one schedule may write one before computing the other), and two writes
    into one buffer land in order."""
    from tiny.tensor.inplace import assign_together

    a = Tensor([1.0, 2.0], device=device).realize()
    b = Tensor([10.0, 20.0], device=device).realize()
    assign_together((a, b + 1), (b, a * 3))
    np.testing.assert_array_equal(a.numpy(), [11.0, 21.0])
    np.testing.assert_array_equal(b.numpy(), [3.0, 6.0])
    t, x = base(device)
    five, six = Tensor.full((2, 4), 5.0, device=device), Tensor.full((2, 4), 6.0, device=device)
    assign_together((t[0:2], five), (t[1:3], six))
    x[0:2], x[1:3] = 5.0, 6.0
    np.testing.assert_array_equal(t.numpy(), x)


def test_writes_assigned_together_refuse_what_assign_refuses(device: str) -> None:
    from tiny.tensor.inplace import assign_together

    t, _ = base(device)
    u, _ = base(device)
    with pytest.raises(ValueError, match="shape"):
        assign_together((t, Tensor.ones(5, device=device)), (u, Tensor.ones(4, device=device)))
    with pytest.raises(RuntimeError, match="expanded"):
        assign_together((Tensor.ones(1, device=device).realize().expand(4), Tensor.ones(4, device=device)))
