"""Mistakes fail where the user made them, with a Python error that says what was expected and what was given.

The failing calls are only recorded, never realized: the error must come from the call itself, not from a
compiler or a kernel later on. The last test checks the other side: every dtype a device claims, it runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tensor_helpers import assert_matches, np_dtype

from tiny.ir.device import UnknownDevice
from tiny.tensor import Device, Tensor, dtypes


@pytest.fixture
def x(device) -> Tensor:
    return Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)


@pytest.fixture
def null_without():
    """Device NULL with some dtypes taken out of its renderer's caps (restored afterwards)."""
    renderer = Device["NULL"].renderer
    saved = renderer.caps

    def drop(*dts):
        renderer.caps = dataclasses.replace(saved, dtypes=saved.dtypes - set(dts))
        return "NULL"

    yield drop
    renderer.caps = saved


# ---------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    "sa,sb",
    [((2, 3), (2,)), ((2, 3, 4), (3, 3)), ((4,), (5,)), ((2, 1, 3), (2, 2, 1, 4)), ((0,), (2,))],
)
def test_broadcast_mismatch(device, sa, sb):
    a, b = Tensor.ones(*sa, device=device), Tensor.ones(*sb, device=device)
    for op in (lambda: a + b, lambda: a * b, lambda: a < b, lambda: a.maximum(b), lambda: (a > 0).where(a, b)):
        with pytest.raises(ValueError, match="broadcast") as e:
            op()
        assert str(sa) in str(e.value) or str(sb) in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "sa,sb", [((2, 3), (2, 3)), ((3,), (4,)), ((2, 3), (4,)), ((5,), (4, 2)), ((2, 2, 3), (2, 4, 3))]
)
def test_matmul_inner_mismatch(device, sa, sb):
    a, b = Tensor.ones(*sa, device=device), Tensor.ones(*sb, device=device)
    with pytest.raises(ValueError) as e:
        a @ b
    msg = str(e.value)
    assert str(sa) in msg and str(sb) in msg, msg


def test_matmul_batch_mismatch_and_scalars(device):
    with pytest.raises(ValueError, match="broadcast"):
        Tensor.ones(2, 3, 4, device=device) @ Tensor.ones(3, 4, 5, device=device)
    with pytest.raises(ValueError, match="at least 1 dimension"):
        Tensor(2.0, device=device) @ Tensor.ones(3, device=device)
    with pytest.raises(TypeError, match="int"):
        Tensor.ones(3, device=device) @ 2


@pytest.mark.parametrize("shape", [(4, 2), (7,), (-1, 4), (5, -1), (-1, -1), (0, -1), (-2, -3)])
def test_reshape_wrong_size(x, shape):
    with pytest.raises(ValueError) as e:
        x.reshape(shape)
    msg = str(e.value)
    assert str(tuple(shape)) in msg or "-1" in msg, msg
    if shape.count(-1) < 2:
        assert "(2, 3)" in msg, msg


@pytest.mark.parametrize("order", [(0, 0), (0,), ()])
def test_bad_permute(x, order):
    with pytest.raises(ValueError) as e:
        x.permute(order)
    assert "permute" in str(e.value) and str(order) in str(e.value), str(e.value)


def test_permute_axis_out_of_range(x):
    with pytest.raises(IndexError, match="axis 2 is out of range.*2 dimension"):
        x.permute(0, 2)
    with pytest.raises(IndexError, match="axis 2 is out of range.*2 dimension"):
        x.permute(1, 0, 2)


@pytest.mark.parametrize("shape", [(4, 3), (2, 6), (3,), (3, 2, 4)])
def test_expand_non_one_dim(x, shape):
    with pytest.raises(ValueError) as e:
        x.expand(shape)
    msg = str(e.value)
    assert "(2, 3)" in msg and str(shape) in msg, msg


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.sum(2),
        lambda t: t.sum(-3),
        lambda t: t.max((0, 5)),
        lambda t: t.min(axis=7),
        lambda t: t.mean(-4),
        lambda t: t.softmax(3),
        lambda t: t.log_softmax(-3),
        lambda t: t.transpose(0, 2),
        lambda t: t.flip(2),
        lambda t: t.squeeze(3),
        lambda t: t.unsqueeze(4),
        lambda t: t.flatten(3),
    ],
    ids=[
        "sum",
        "sum-neg",
        "max",
        "min",
        "mean",
        "softmax",
        "log_softmax",
        "transpose",
        "flip",
        "squeeze",
        "unsqueeze",
        "flatten",
    ],
)
def test_axis_out_of_range(x, op):
    with pytest.raises(IndexError) as e:
        op(x)
    msg = str(e.value)
    assert "out of range" in msg and "dimension" in msg, msg


@pytest.mark.parametrize(
    "op, torch_op",
    [
        (lambda t: t.flip((0, 0)), None),
        (lambda t: t.flip((1, -1)), None),
        (lambda t: t.sum((0, -2)), None),
        (lambda t: t.max((1, 1)), lambda t: t.amax((1, 1))),
        (lambda t: t.squeeze((0, 0)), None),
    ],
    ids=["flip", "flip-neg", "sum", "max", "squeeze"],
)
def test_a_dim_named_twice(x, op, torch_op):
    """PyTorch refuses a dim named twice ("dim 0 appears multiple times"); tiny used it once, silently."""
    with pytest.raises(ValueError, match="appears more than once") as e:
        op(x)
    assert "dim " in str(e.value) and "2 dimension" in str(e.value), str(e.value)
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="multiple times"):
        (torch_op or op)(torch.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize(
    "index,words",
    [(2, "index 2"), (-3, "index -3"), ((0, 3), "index 3"), ((1, -4), "index -4"), ((0, 0, 0), "too many indices")],
)
def test_int_index_out_of_range(x, index, words):
    with pytest.raises(IndexError, match=words) as e:
        x[index]
    if "index" in words and "too" not in words:
        assert "size" in str(e.value), str(e.value)


def test_unsupported_indices(x):
    with pytest.raises(TypeError, match="1.0"):
        x[1.0]
    with pytest.raises(TypeError):
        x[True]
    with pytest.raises(IndexError, match="ellipsis"):
        x[..., ...]
    with pytest.raises(ValueError, match="step"):
        x[::0]


def test_bad_shrink_pad_bitcast(x):
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        x.shrink(((0, 3), (0, 1)))
    with pytest.raises(ValueError, match="pairs"):
        x.pad(((1, 1),))
    with pytest.raises(ValueError, match="pairs"):
        x.pad((1,))
    with pytest.raises(ValueError, match="float32.*int8"):
        x.bitcast(dtypes.int8)


def test_bad_creation(device):
    with pytest.raises(ValueError, match="shape"):
        Tensor([[1.0], [1.0, 2.0]], device=device)
    with pytest.raises(TypeError, match="str"):
        Tensor("abc", device=device)
    with pytest.raises(ValueError, match="negative"):
        Tensor.zeros(-1, 2, device=device)
    with pytest.raises(ValueError, match="step"):
        Tensor.arange(0, 5, 0, device=device)
    with pytest.raises(ValueError, match="float128"):
        Tensor([1.0], device=device, dtype="float128")
    with pytest.raises(ValueError, match="one element.*\\(2, 3\\)"):
        Tensor.ones(2, 3, device=device).item()
    with pytest.raises(TypeError, match="0-d"):
        len(Tensor(1.0, device=device))


def test_bad_operands(x):
    with pytest.raises(TypeError, match="str"):
        x + "a"
    with pytest.raises(TypeError, match="float32"):
        x & x
    with pytest.raises(TypeError, match="float32"):
        x << 1
    with pytest.raises(TypeError, match="float32"):
        _ = ~x
    b = x > 1
    with pytest.raises(TypeError, match="bool"):
        _ = -b
    with pytest.raises(TypeError, match="bool"):
        b - b
    with pytest.raises(ValueError, match=r"max\(\).*empty"):
        Tensor.ones(0, 3, device=x.device).max(0)
    with pytest.raises(ValueError, match=r"min\(\).*empty"):
        Tensor.ones(2, 0, device=x.device).min()


# ---------------------------------------------------------------- devices and dtypes


@pytest.mark.parametrize("name", ["NOPE", "cpu:?", "", "GPU9000:LLVM"])
def test_unknown_device(name):
    with pytest.raises(UnknownDevice) as e:
        Tensor([1.0], device=name)
    assert repr(name) in str(e.value), str(e.value)
    with pytest.raises(UnknownDevice):
        Tensor.ones(2, device=name)
    with pytest.raises(UnknownDevice):
        Tensor([1.0], device="CPU").to(name)


def test_unknown_device_lists_the_known_ones():
    with pytest.raises(UnknownDevice, match="CPU") as e:
        Tensor([1.0], device="NOPE")
    assert "NULL" in str(e.value)
    assert isinstance(e.value, ValueError)  # catchable as the ValueError it is


def test_bad_default_device_only_affects_default_placement(device, monkeypatch):
    # DEVICE names the default device; a wrong one must not break tensors placed explicitly
    monkeypatch.setenv("DEVICE", "NOPE")
    t = Tensor([1.0, 2.0], device=device)
    out = (t + 1).sum()
    assert out.device == device and out.item() == 5.0
    with pytest.raises(UnknownDevice, match="NOPE"):
        Tensor([1.0])


def test_dtype_the_device_cannot_run(null_without):
    dev = null_without(dtypes.float64)
    with pytest.raises(TypeError, match="float64") as e:
        Tensor([1.0], device=dev, dtype=dtypes.float64)
    assert "NULL" in str(e.value), str(e.value)
    for make in (
        lambda: Tensor(1.0, device=dev, dtype=dtypes.float64),
        lambda: Tensor(np.array([1.0, 2.0]), device=dev),  # NumPy float64 stays float64
        lambda: Tensor([1.0], device=dev).cast(dtypes.float64),
        lambda: Tensor([1], device=dev, dtype=dtypes.int64).bitcast(dtypes.float64),
        lambda: Tensor.zeros(2, device=dev, dtype=dtypes.float64),
        lambda: Tensor.full((2,), 3.0, dtype="float64", device=dev),
        lambda: Tensor.arange(3, device=dev, dtype="float64"),
        lambda: Tensor.eye(2, device=dev, dtype=dtypes.float64),
        lambda: Tensor.rand(3, device=dev, dtype=dtypes.float64),
        lambda: Tensor([1.0], device=dev).sum(dtype=dtypes.float64),
        lambda: Tensor([1.0], device=dev).full_like(2.0, dtype=dtypes.float64),
        lambda: Tensor([1.0], device="CPU", dtype=dtypes.float64).to(dev),
    ):
        with pytest.raises(TypeError, match="float64"):
            make()
    # float32 still works on that device
    assert Tensor([1.0], device=dev).dtype == dtypes.float32


def test_without_int64_the_default_int_is_int32(null_without):
    dev = null_without(dtypes.int64)
    t = Tensor([1, 2], device=dev)  # Python ints: int64 in PyTorch, int32 on a device without it
    assert t.dtype == dtypes.int32 and t.sum().dtype == dtypes.int32 and t.argmax().dtype == dtypes.int32
    with pytest.raises(TypeError, match="int64"):
        t.sum(dtype=dtypes.int64)  # asked for: refused at the call
    with pytest.raises(TypeError, match="int64"):
        Tensor([1, 2], device=dev, dtype="int64")


def test_caps_are_restored_after_the_fixture():
    assert dtypes.float64 in Device["NULL"].renderer.caps.dtypes
    assert dtypes.int64 in Device["NULL"].renderer.caps.dtypes


def test_mixing_devices(python_device):
    cpu = Tensor([[1.0, 2.0, 3.0]], device="CPU")
    other = Tensor([[1.0, 2.0, 3.0]], device=python_device)
    for op in (
        lambda: cpu + other,
        lambda: other * cpu,
        lambda: cpu < other,
        lambda: cpu.maximum(other),
        lambda: cpu.minimum(other),
        lambda: cpu.T @ other,
        lambda: cpu & (other > 1),
    ):
        with pytest.raises(ValueError, match="different devices") as e:
            op()
        assert "CPU" in str(e.value) and python_device in str(e.value), str(e.value)


@pytest.mark.parametrize("which", ["cond", "x", "y"])
def test_mixing_devices_in_where(python_device, which):
    # only recorded, never realized: a kernel reading another device's memory must not be made at all
    on = {k: ("CPU" if k != which else python_device) for k in ("cond", "x", "y")}
    cond = Tensor([True, False], device=on["cond"])
    x, y = Tensor([1.0, 2.0], device=on["x"]), Tensor([3.0, 4.0], device=on["y"])
    with pytest.raises(ValueError, match="different devices"):
        cond.where(x, y)
    # with a Python scalar in place of one branch
    with_scalar = {"cond": lambda: cond.where(1.0, y), "x": lambda: cond.where(x, 0.0), "y": lambda: cond.where(1.0, y)}
    with pytest.raises(ValueError, match="different devices"):
        with_scalar[which]()


def test_mixing_devices_with_rmatmul(python_device):
    # a list on the left of @ goes to the right operand's device
    w = Tensor([[1.0], [2.0]], device=python_device)
    out = [[3.0, 4.0]] @ w
    assert out.device == python_device
    assert_matches(out, [[11.0]], dtypes.float32)


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int64, dtypes.bool, dtypes.uint8])
def test_mean_of_int_tensor(device, dtype):
    t = Tensor([1, 2, 3], device=device, dtype=dtype)
    with pytest.raises(TypeError) as e:
        t.mean()
    assert "mean" in str(e.value) and dtype.name in str(e.value), str(e.value)
    with pytest.raises(TypeError):
        t.mean(0)
    assert_matches(
        t.float().mean(), np.array([1, 2, 3], dtype=np.dtype(dtype.fmt)).astype(np.float64).mean(), dtypes.float32
    )


# ---------------------------------------------------------------- every dtype a device claims, it runs


def test_every_supported_dtype_runs(device):
    """A dtype in the renderer's caps must compile and compute: never a compiler or loader error."""
    claimed = sorted(Device[device].renderer.caps.dtypes, key=lambda d: d.name)
    assert dtypes.float32 in claimed and dtypes.bool in claimed
    vals = np.array([1, 0, 3, 2], dtype=np.int64)
    for dt in claimed:
        arr = (vals != 0) if dt.is_bool else vals.astype(np_dtype(dt))
        t = Tensor(arr, device=device, dtype=dt)
        assert_matches(t, arr, dt, what=dt.name)
        assert_matches(t.cast(dtypes.float32), arr.astype(np.float32), dtypes.float32, what=dt.name)
        assert_matches(Tensor(arr.astype(np.float32), device=device).cast(dt), arr, dt, what=dt.name)
        assert_matches(t.max(), arr.max(), dt, what=dt.name)
        if dt.is_bool:
            assert_matches((t == t).where(t, t ^ True), arr, dt, what=dt.name)
            continue
        # arithmetic, a comparison and a select in one kernel
        assert_matches((t > 1).where(t * t + t, t - 1), np.where(arr > 1, arr * arr + arr, arr - 1), dt, what=dt.name)
        sum_dt = dt if dt.is_float else dtypes.uint64 if dt == dtypes.uint64 else dtypes.int64
        assert_matches(t.sum(), arr.astype(np.float64).sum(), sum_dt, what=dt.name)
