"""Creating tensors: constants and ranges against PyTorch; random numbers that repeat under a seed, are the same
on every device and have the right distribution; the weight initializers of torch.nn.init."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tensor_helpers import small

from tiny.ir.device import device_supports
from tiny.ir.uop import Ops
from tiny.tensor import Tensor, dtypes
from tiny.tensor.checks import default_int

torch = pytest.importorskip("torch")


# ---- constants and ranges


def test_empty_is_zeros(device: str) -> None:
    e = Tensor.empty(2, 3, device=device)
    assert e.shape == (2, 3) and e.dtype == dtypes.float32 and e.device == device
    assert e.tolist() == [[0.0] * 3] * 2  # documented: empty gives zeros
    like = Tensor([[1, 2]], device=device).empty_like()
    assert like.shape == (1, 2) and like.dtype == default_int(device) and like.tolist() == [[0, 0]]
    assert Tensor.empty((4,), dtype="int8", device=device).dtype == dtypes.int8


@pytest.mark.parametrize(
    "start, end, steps", [(0, 1, 5), (-3.5, 10, 7), (2, -2, 9), (1, 1, 4), (0.1, 0.7, 1), (0, 5, 0), (-1, 1, 64)]
)
def test_linspace(device: str, start: float, end: float, steps: int) -> None:
    out = Tensor.linspace(start, end, steps, device=device)
    ref = torch.linspace(start, end, steps).numpy()
    assert out.dtype == dtypes.float32 and out.shape == ref.shape
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6, atol=1e-6)
    if steps > 1:  # both ends exactly
        assert out.numpy()[0] == np.float32(start) and out.numpy()[-1] == np.float32(end)


def test_linspace_dtypes_and_errors(device: str) -> None:
    out = Tensor.linspace(-3, 10, 5, dtype="int32", device=device)
    assert out.dtype == dtypes.int32
    assert out.tolist() == torch.linspace(-3, 10, 5, dtype=torch.int32).tolist()
    half = Tensor.linspace(0, 1, 5, dtype="float16", device=device)
    assert half.dtype == dtypes.float16 and half.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    with pytest.raises(ValueError, match="steps"):
        Tensor.linspace(0, 1, -1, device=device)
    with pytest.raises(ValueError, match="steps"):
        Tensor.linspace(0, 1, 2.5, device=device)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="end"):
        Tensor.linspace(0, "1", 3, device=device)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bool"):  # PyTorch: "linspace_cpu" not implemented for 'Bool'
        Tensor.linspace(0, 1, 3, dtype="bool", device=device)
    with pytest.raises(NotImplementedError):
        torch.linspace(0, 1, 3, dtype=torch.bool)


ARANGES = [
    (5,),
    (0,),
    (1,),
    (3, 3),
    (1, 7, 2),
    (10, 0, -3),
    (-5, 5, 2),
    (100, -100, -7),
    (17,),
    (-300, 700),
    (1, 2, 0.25),
    (0.5, 3),
    (-1, 1, 0.1),  # length 20 by torch's double-precision rule
    (1, 2, 0.1),
    (0, 1, 0.3),
    (2.5, -2.5, -0.5),
    (0.0, 0.0, 0.1),
]


@pytest.mark.parametrize("args", ARANGES, ids=str)
def test_arange_matches_torch(device: str, args: tuple) -> None:
    """Same length, dtype and values as torch.arange: ints exactly, floats to float32 rounding (torch computes
    start + i * step with its SIMD width, so its float values can differ by an ulp from the exact ones)."""
    out, ref = Tensor.arange(*args, device=device), torch.arange(*args)
    assert out.dtype.name == str(ref.dtype).removeprefix("torch.") or out.dtype == default_int(device)
    assert out.shape == tuple(ref.shape)
    if ref.dtype.is_floating_point:
        np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6, atol=1e-7)
    else:
        assert out.tolist() == ref.tolist()


def test_an_arange_takes_no_memory_its_readers_count_it_from_their_index(device: str) -> None:
    """An arange is index math in the kernel that reads it, through any movement (a flip, a stride, padding, a
    broadcast): one kernel, whose only buffer is its output, and no load of a counted value."""
    n = 300
    rows, cols = Tensor.arange(n, device=device), Tensor.arange(5, 3 * n, 3, device=device)
    mask = rows.flip(0)[::7].reshape(-1, 1) >= cols.pad(((2, 1),), value=-4).reshape(1, -1)
    pos = np.arange(n)[::-1][::7].reshape(-1, 1) >= np.pad(np.arange(5, 3 * n, 3), (2, 1), constant_values=-4)
    items = [i for i in mask.schedule() if i.ast.op is Ops.SINK]
    assert len(items) == 1 and len(items[0].buffers) == 1
    assert not any(u.op is Ops.READ for u in items[0].ast.toposort)
    # (integers compare once: >= is "not <", where floats need "> or ==" for NaN)
    assert [u.op for u in items[0].ast.toposort if u.op in (Ops.CMPLT, Ops.CMPNE, Ops.OR)] == [Ops.CMPLT, Ops.CMPNE]
    np.testing.assert_array_equal(mask.numpy(), pos)
    scaled = Tensor.arange(0.5, 900.5, 0.25, device=device).reshape(36, 100).permute(1, 0)[3:90:4]
    want = np.arange(0.5, 900.5, 0.25, dtype=np.float32).reshape(36, 100).T[3:90:4]
    np.testing.assert_allclose(scaled.numpy(), want, rtol=1e-6)


@pytest.mark.parametrize(
    "args, dtype",
    [
        ((4,), "int8"),
        ((200, 0, -50), "uint8"),
        ((3,), "float16"),
        ((0, 3, 0.5), "float64"),
        ((70000, 0, -20000), "int32"),
    ],
    ids=str,
)
def test_arange_dtypes(device: str, args: tuple, dtype: str) -> None:
    if dtype == "float64" and not device_supports(device, dtypes.float64):
        pytest.skip(f"{device} has no float64")
    out = Tensor.arange(*args, dtype=dtype, device=device)
    ref = torch.arange(*args, dtype=getattr(torch, dtype))
    assert out.dtype.name == dtype and out.tolist() == ref.tolist()


def test_arange_refuses_what_does_not_fit_or_leads_nowhere(device: str) -> None:
    with pytest.raises(ValueError, match="8589934591, which int32 cannot hold"):
        Tensor.arange(2**33, dtype="int32", device=device)
    with pytest.raises(ValueError, match="-1, which uint8 cannot hold"):
        Tensor.arange(3, -2, -1, dtype="uint8", device=device)  # torch wraps to 255
    with pytest.raises(ValueError, match="past float16's range"):
        Tensor.arange(0, 80000, 10000, dtype="float16", device=device)  # 70000 rounds to inf
    with pytest.raises(ValueError, match="sign"):  # torch: upper bound and lower bound inconsistent with step sign
        Tensor.arange(0, 5, -1, device=device)
    with pytest.raises(ValueError, match="sign"):
        Tensor.arange(5, 0, device=device)
    with pytest.raises(ValueError, match="finite"):
        Tensor.arange(0, math.inf, device=device)
    with pytest.raises(ValueError, match="whole numbers"):  # torch truncates, to other lengths in int32 and int64
        Tensor.arange(0, 2, 0.5, dtype="int32", device=device)
    with pytest.raises(TypeError, match="bool"):
        Tensor.arange(3, dtype="bool", device=device)
    with pytest.raises(RuntimeError):
        torch.arange(5, 0)


def test_a_huge_arange_allocates_nothing_until_read(device: str) -> None:
    """arange was computed with NumPy on the host: arange(2**40) asked for 8 TiB at once. It is an ARANGE now, which
    takes no memory; a slice of it computes its values from the kernel's index (in 64-bit index math past 2**31)."""
    if default_int(device).itemsize < 8:  # (WEBGPU: int32 is the default int, which 2**40 does not fit)
        with pytest.raises(ValueError, match="int32 cannot hold"):
            Tensor.arange(2**40, device=device)
    else:
        huge = Tensor.arange(2**40, device=device)
        assert huge.shape == (2**40,) and not any(u.op is Ops.BUFFER for u in huge.uop.toposort)
        assert Tensor.arange(2**62, -(2**62), -(2**40), device=device).shape == (2**23,)
        assert huge[-3:].tolist() == [2**40 - 3, 2**40 - 2, 2**40 - 1]
    assert Tensor.arange(3000, device=device)[-3:].tolist() == [2997, 2998, 2999]
    with pytest.raises(ValueError, match="uint64 cannot hold"):
        Tensor.arange(2**64 - 2, 2**64 + 1, dtype="uint64", device=device)


def test_constants_and_ranges_match_torch(device: str) -> None:
    assert Tensor.arange(5, device=device).tolist() == torch.arange(5).tolist()
    assert Tensor.arange(1, 2, 0.25, device=device).tolist() == torch.arange(1, 2, 0.25).tolist()
    assert Tensor.arange(10, 0, -3, device=device).tolist() == torch.arange(10, 0, -3).tolist()
    assert Tensor.eye(2, 3, device=device).tolist() == torch.eye(2, 3).tolist()
    assert Tensor.full((2, 2), 1.5, device=device).tolist() == torch.full((2, 2), 1.5).tolist()
    assert Tensor.ones(2, dtype="int32", device=device).tolist() == [1, 1]
    x = Tensor([[1.0, 2.0]], device=device)
    for like in (x.zeros_like(), x.ones_like(), x.full_like(3.0), x.empty_like()):
        assert like.shape == (1, 2) and like.dtype == dtypes.float32 and like.device == device


# ---- random numbers: reproducible, and the same on every device


def draws(device: str, wide: bool | None = None) -> dict[str, np.ndarray]:
    """One of each random op, after seeding; `wide`: a randint range past int32 (where the device has int64)."""
    Tensor.manual_seed(1234)
    wide = default_int(device) == dtypes.int64 if wide is None else wide
    return {
        "rand": Tensor.rand(5, 7, device=device).numpy(),
        "rand_f16": Tensor.rand(9, dtype="float16", device=device).numpy(),
        "randint": Tensor.randint(-50, 50, (4, 6), device=device).numpy(),
        "randint_wide": Tensor.randint(-(2**40) if wide else -(2**31), 2**40 if wide else 2**31, (5,), device=device)
        .numpy()
        .astype(np.int64),
        "randn": Tensor.randn(6, 8, device=device).numpy(),
        "uniform": Tensor.uniform(12, low=-3.0, high=0.5, device=device).numpy(),
        "normal": Tensor.normal(3, 4, mean=2.0, std=0.1, device=device).numpy(),
        "kaiming": Tensor.kaiming_uniform(4, 3, device=device).numpy(),
    }


def test_manual_seed_repeats_the_numbers(device: str) -> None:
    first, again = draws(device), draws(device)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name], err_msg=name)
    Tensor.manual_seed(1234)
    a, b = Tensor.rand(8, device=device).numpy(), Tensor.rand(8, device=device).numpy()
    assert not np.array_equal(a, b), "two draws after one seed gave the same numbers"
    Tensor.manual_seed(1235)
    assert not np.array_equal(Tensor.rand(8, device=device).numpy(), a), "another seed gave the same numbers"
    Tensor.manual_seed(2**40 + 1234)  # seeds wider than 32 bits count too
    assert not np.array_equal(Tensor.rand(8, device=device).numpy(), a)


def test_same_numbers_on_every_device(device: str, python_device: str) -> None:
    wide = default_int(device) == dtypes.int64
    ours, reference = draws(device, wide), draws(python_device, wide)
    for name in ("rand", "rand_f16", "randint", "randint_wide"):  # integer hashing and exact conversions
        np.testing.assert_array_equal(ours[name], reference[name], err_msg=f"{name} on {device}")
    # the rest uses only correctly rounded float ops (no device exp/log/sin), so it agrees to the bit where the
    # compiler keeps a*b+c as two roundings; clang's default contraction into fma can move the last bit or two
    for name in ("randn", "uniform", "normal", "kaiming"):
        np.testing.assert_allclose(ours[name], reference[name], rtol=1e-6, atol=1e-6, err_msg=f"{name} on {device}")


# ---- random numbers: ranges, dtypes and distributions


def test_draws_of_one_shape_are_one_kernel(device: str) -> None:
    """The random key is uploaded, not a constant in the kernel: every draw of a shape is the same kernel, compiled
    once (a model's random initial weights compiled one a parameter), and still its own numbers."""
    a, b = Tensor.rand(300, device=device), Tensor.rand(300, device=device)
    (ka,), (kb,) = ([i.ast for i in t.schedule() if i.ast.op is Ops.SINK] for t in (a, b))
    assert ka is kb
    assert np.mean(a.numpy() != b.numpy()) > 0.99


def test_rand_dtypes(device: str) -> None:
    for dt, bits in ((dtypes.float32, 24), (dtypes.float16, 11), (dtypes.bfloat16, 8), (dtypes.float64, 32)):
        x = Tensor.rand(small(device, 2000, 48), dtype=dt, device=device)
        assert x.dtype == dt
        v = x.numpy().astype(np.float64)
        assert v.min() >= 0 and v.max() < 1, dt.name
        np.testing.assert_array_equal(v * 2.0**bits, np.floor(v * 2.0**bits), err_msg=f"{dt.name} off its grid")
    with pytest.raises(TypeError, match="floats"):
        Tensor.rand(3, dtype="int32", device=device)
    with pytest.raises(TypeError, match="floats"):
        Tensor.randn(3, dtype="bool", device=device)


def test_uniform_and_normal_distributions(device: str) -> None:
    n = small(device, 40000, 64)
    Tensor.manual_seed(7)
    u = Tensor.rand(n, device=device).numpy().astype(np.float64)
    assert abs(u.mean() - 0.5) < 6 * math.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) < 6 * 0.0745 / math.sqrt(n)
    z = Tensor.randn(n, device=device).numpy().astype(np.float64)
    assert abs(z.mean()) < 6 / math.sqrt(n) and abs(z.std() - 1) < 6 / math.sqrt(2 * n)
    if n >= 10000:  # the shape of the distribution: Kolmogorov-Smirnov against the normal CDF
        zs = np.sort(z)
        cdf = 0.5 * (1 + np.vectorize(math.erf)(zs / math.sqrt(2)))
        assert np.abs(cdf - np.arange(1, n + 1) / n).max() < 1.95 / math.sqrt(n)
        assert abs(((z - z.mean()) ** 4).mean() / z.var() ** 2 - 3) < 0.1  # normal kurtosis
    w = Tensor.uniform(n, low=-3.0, high=0.5, device=device).numpy()
    assert w.min() >= -3 and w.max() < 0.5 and abs(w.mean() + 1.25) < 6 * 3.5 / math.sqrt(12 * n)
    g = Tensor.normal(n, mean=2.0, std=0.1, device=device).numpy().astype(np.float64)
    assert abs(g.mean() - 2) < 0.6 / math.sqrt(n) and abs(g.std() - 0.1) < 0.6 / math.sqrt(2 * n)
    assert Tensor.normal(4, std=0.0, device=device).tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="std"):
        Tensor.normal(3, std=-1.0, device=device)


def test_randint(device: str) -> None:
    n = small(device, 5000, 60)
    x = Tensor.randint(-3, 4, (n,), device=device)
    assert x.dtype == default_int(device) and x.shape == (n,)
    v = x.numpy()
    assert v.min() >= -3 and v.max() <= 3
    assert set(v.tolist()) == set(range(-3, 4)), "some values in [-3, 4) never came"
    assert Tensor.randint(5, (2, 3), device=device).numpy().max() < 5  # torch.randint(high, size)
    assert Tensor.randint(5, shape=(4,), device=device).numpy().min() >= 0
    i8 = Tensor.randint(-128, 128, (n,), dtype="int8", device=device).numpy()
    assert i8.dtype == np.int8 and i8.min() < -64 and i8.max() > 64  # spread over the whole range, wrapped right
    f = Tensor.randint(0, 10, (n,), dtype="float32", device=device).numpy()
    assert f.dtype == np.float32 and (f == np.floor(f)).all() and f.min() >= 0 and f.max() <= 9
    wide = Tensor.randint(0, 2**40, (n,), device=device).numpy()
    assert wide.min() >= 0 and wide.max() < 2**40 and wide.max() > 2**32  # the upper bits are drawn too
    if n >= 1000:
        assert abs(np.bincount(v + 3).astype(np.float64) / n - 1 / 7).max() < 6 * math.sqrt(1 / 7 / n)


def test_randint_errors(device: str) -> None:
    with pytest.raises(ValueError, match="low < high"):
        Tensor.randint(5, 5, (2,), device=device)
    with pytest.raises(ValueError, match="int8"):
        Tensor.randint(0, 300, (2,), dtype="int8", device=device)
    with pytest.raises(TypeError, match="high"):
        Tensor.randint(0, 2.5, (2,), device=device)  # type: ignore[arg-type]


def test_like_random(device: str) -> None:
    x = Tensor.zeros(3, 4, dtype="float16", device=device)
    for r in (x.rand_like(), x.randn_like()):
        assert r.shape == (3, 4) and r.dtype == dtypes.float16 and r.device == device
    assert x.rand_like(dtype="float32").dtype == dtypes.float32
    with pytest.raises(TypeError, match="float dtype"):
        Tensor([1, 2], device=device).randn_like()
    assert Tensor([1, 2], device=device).rand_like(dtype="float32").dtype == dtypes.float32


# ---- initializers: torch.nn.init's fans, gains and bounds


def torch_fans(shape: tuple[int, ...]) -> tuple[int, int]:
    return torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))


INIT_SHAPES = {"CPU": [(256, 128), (64, 16, 3, 3)], "PYTHON": [(8, 6), (4, 2, 3)]}


@pytest.mark.parametrize("which", [0, 1])
def test_uniform_initializers(device: str, which: int) -> None:
    shape = small(device, INIT_SHAPES["CPU"], INIT_SHAPES["PYTHON"])[which]
    fan_in, fan_out = torch_fans(shape)
    gain_relu, gain_leaky = torch.nn.init.calculate_gain("relu"), torch.nn.init.calculate_gain("leaky_relu", 0.2)
    cases = {  # name -> (tensor, torch's bound)
        "xavier_uniform": (Tensor.xavier_uniform(*shape, device=device), math.sqrt(6 / (fan_in + fan_out))),
        "glorot_uniform": (
            Tensor.glorot_uniform(shape, gain=2.0, device=device),
            2 * math.sqrt(6 / (fan_in + fan_out)),
        ),
        "kaiming_uniform": (Tensor.kaiming_uniform(*shape, device=device), gain_relu * math.sqrt(3 / fan_in)),
        "kaiming_fan_out": (
            Tensor.kaiming_uniform(*shape, a=0.2, mode="fan_out", device=device),
            gain_leaky * math.sqrt(3 / fan_out),
        ),
        "kaiming_relu": (Tensor.kaiming_uniform(*shape, nonlinearity="relu", device=device), math.sqrt(6 / fan_in)),
        "kaiming_tanh": (
            Tensor.kaiming_uniform(*shape, nonlinearity="tanh", device=device),
            5 / 3 * math.sqrt(3 / fan_in),
        ),
        "scaled_uniform": (Tensor.scaled_uniform(*shape, device=device), 1 / math.sqrt(math.prod(shape))),
    }
    # torch's own initializer on the same shape reaches the same bound
    ref = torch.nn.init.kaiming_uniform_(torch.empty(shape)).abs().max().item()
    assert ref <= cases["kaiming_uniform"][1] * (1 + 1e-6)
    for name, (t, bound) in cases.items():
        assert t.shape == shape and t.dtype == dtypes.float32, name
        v = np.abs(t.numpy())
        assert v.max() <= bound * (1 + 1e-6), f"{name}: {v.max()} beyond {bound}"
        assert v.max() >= bound * small(device, 0.99, 0.6), f"{name}: {v.max()} far inside {bound}"
        if v.size > 1000:  # uniform on [-b, b] has std b / sqrt(3)
            assert abs(t.numpy().std() - bound / math.sqrt(3)) < 0.03 * bound, name


@pytest.mark.parametrize("which", [0, 1])
def test_normal_initializers(device: str, which: int) -> None:
    shape = small(device, INIT_SHAPES["CPU"], INIT_SHAPES["PYTHON"])[which]
    fan_in, fan_out = torch_fans(shape)
    cases = {  # name -> (tensor, torch's std)
        "xavier_normal": (
            Tensor.xavier_normal(*shape, gain=0.5, device=device),
            0.5 * math.sqrt(2 / (fan_in + fan_out)),
        ),
        "kaiming_normal": (Tensor.kaiming_normal(*shape, device=device), math.sqrt(2 / fan_in)),
        "kaiming_normal_selu": (
            Tensor.kaiming_normal(*shape, mode="fan_out", nonlinearity="selu", device=device),
            0.75 / math.sqrt(fan_out),
        ),
        "kaiming_normal_linear": (
            Tensor.kaiming_normal(*shape, nonlinearity="linear", device=device),
            1 / math.sqrt(fan_in),
        ),
    }
    for name, (t, std) in cases.items():
        assert t.shape == shape and t.dtype == dtypes.float32, name
        v = t.numpy().astype(np.float64)
        assert np.abs(v).max() < 7 * std, name
        if v.size > 1000:
            assert abs(v.std() - std) < 0.03 * std and abs(v.mean()) < 0.05 * std, name
        else:
            assert 0.4 * std < v.std() < 1.6 * std, name


def test_initializer_errors(device: str) -> None:
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        Tensor.xavier_uniform(5, device=device)
    with pytest.raises(ValueError, match="mode"):
        Tensor.kaiming_uniform(3, 4, mode="fan_avg", device=device)
    with pytest.raises(ValueError, match="nonlinearity"):
        Tensor.kaiming_normal(3, 4, nonlinearity="swish", device=device)
    with pytest.raises(ValueError, match="fan_in 0"):
        Tensor.kaiming_normal(3, 0, device=device)
    with pytest.raises(TypeError, match="int"):
        Tensor.manual_seed(1.5)  # type: ignore[arg-type]
