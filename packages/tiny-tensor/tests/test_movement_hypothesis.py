"""Property tests: random chains of movement ops, and random basic + advanced indices, against NumPy (on CPU).

Values are distinct and non-zero (1, 2, 3 ...), so an element read from the wrong place, or padding read as data,
shows. Sizes include 0 and 1, axes are given negative as often as not, and the chains make non-contiguous inputs
for the ops after their first. Examples are few and derandomized (each distinct kernel is a compile).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny.tensor import Device, Tensor, dtypes

DEVICE = "CPU"
try:
    Device[DEVICE]
except Exception as e:  # noqa: BLE001  (any failure to open means "skip, and say why")
    pytest.skip(f"device {DEVICE} cannot open here: {type(e).__name__}: {e}", allow_module_level=True)
FEW = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MAX_SIZE = 96  # elements: ops that grow a tensor are not drawn past this

Step = tuple[str, Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray]]


def start_array(draw: st.DrawFn, max_dims: int = 4) -> np.ndarray:
    sizes = st.one_of(st.integers(1, 4), st.just(0)) if draw(st.booleans()) else st.integers(1, 4)
    shape = tuple(draw(st.lists(sizes, min_size=0, max_size=max_dims)))
    dtype = draw(st.sampled_from([np.float32, np.int32]))
    return (np.arange(int(np.prod(shape))) + 1).astype(dtype).reshape(shape)


def axis(draw: st.DrawFn, ndim: int) -> int:
    """An axis of an ndim-dim array, negative half the time."""
    a = draw(st.integers(0, ndim - 1))
    return a - ndim if draw(st.booleans()) else a


# ---------------------------------------------------------------- one random movement op for an array


def reshape_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    n = a.size
    if n == 0:
        shape = tuple(draw(st.permutations(list(a.shape) or [0])))
    else:
        shape, left = [], n
        while left > 1 and len(shape) < 3:
            d = draw(st.sampled_from([k for k in range(1, left + 1) if left % k == 0]))
            shape.append(d)
            left //= d
        shape.append(left)
        if draw(st.booleans()):
            shape[draw(st.integers(0, len(shape) - 1))] = -1
    return f"reshape{tuple(shape)}", lambda t: t.reshape(shape), lambda x: x.reshape(shape)


def permute_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    order = [p - a.ndim if draw(st.booleans()) else p for p in draw(st.permutations(range(a.ndim)))]
    return f"permute{tuple(order)}", lambda t: t.permute(order), lambda x: np.transpose(x, order)


def expand_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    lead = draw(st.lists(st.integers(1, 2), max_size=max(0, 2 - a.ndim)))
    shape = lead + [draw(st.integers(1, 3)) if s == 1 else s for s in a.shape]
    arg = [-1 if s == t and draw(st.booleans()) else t for s, t in zip((None,) * len(lead) + a.shape, shape)]
    return f"expand{tuple(arg)}", lambda t: t.expand(arg), lambda x: np.broadcast_to(x, shape)


def pad_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    pairs = []
    for s in a.shape:  # negative amounts crop, never more than the dim has
        b = draw(st.integers(-min(s, 1), 2))
        pairs.append((b, draw(st.integers(-min(s - max(-b, 0), 1), 2))))
    value = draw(st.sampled_from([0, -7]))

    def ref(x: np.ndarray) -> np.ndarray:
        crop = tuple(slice(max(-b, 0), s - max(-e, 0)) for (b, e), s in zip(pairs, x.shape))
        return np.pad(x[crop], [(max(b, 0), max(e, 0)) for b, e in pairs], constant_values=value) if pairs else x

    return f"pad{pairs}, value={value}", lambda t: t.pad(pairs, value), ref


def pad_mode_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    mode = draw(st.sampled_from(["reflect", "replicate", "circular"]))
    k = draw(st.integers(1, a.ndim))
    limit = {"reflect": lambda s: s - 1, "replicate": lambda s: 2 if s else 0, "circular": lambda s: s}[mode]
    flat = []
    for s in reversed(a.shape[a.ndim - k :]):
        flat += [draw(st.integers(0, min(limit(s), 2))), draw(st.integers(0, min(limit(s), 2)))]
    np_mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    widths = [(0, 0)] * (a.ndim - k) + [(flat[i], flat[i + 1]) for i in range(len(flat) - 2, -1, -2)]

    def ref(x: np.ndarray) -> np.ndarray:
        return np.pad(x, widths, mode=np_mode) if any(b or e for b, e in widths) else x

    return f"pad{tuple(flat)}, mode={mode}", lambda t: t.pad(flat, mode=mode), ref


def shrink_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    bounds = []
    for s in a.shape:
        lo = draw(st.integers(0, s))
        bounds.append((lo, draw(st.integers(lo, s))))
    return (
        f"shrink{bounds}",
        lambda t: t.shrink(bounds),
        lambda x: x[tuple(slice(lo, hi) for lo, hi in bounds)],
    )


def flip_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    axes = sorted(set(draw(st.lists(st.integers(0, a.ndim - 1), min_size=1, max_size=a.ndim))))
    arg = [x - a.ndim if draw(st.booleans()) else x for x in axes]
    return f"flip{arg}", lambda t: t.flip(arg), lambda x: np.flip(x, axes)


def transpose_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    d0, d1 = axis(draw, a.ndim), axis(draw, a.ndim)
    return f"transpose({d0}, {d1})", lambda t: t.transpose(d0, d1), lambda x: np.swapaxes(x, d0, d1)


def flatten_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    s = draw(st.integers(0, a.ndim - 1))
    e = draw(st.integers(s, a.ndim - 1))
    shape = a.shape[:s] + (int(np.prod(a.shape[s : e + 1])),) + a.shape[e + 1 :]
    s_arg, e_arg = (s - a.ndim, e - a.ndim) if draw(st.booleans()) else (s, e)
    return f"flatten({s_arg}, {e_arg})", lambda t: t.flatten(s_arg, e_arg), lambda x: x.reshape(shape)


def squeeze_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    if draw(st.booleans()):
        return "squeeze()", lambda t: t.squeeze(), lambda x: x.reshape([s for s in x.shape if s != 1])
    d = axis(draw, a.ndim)
    return f"squeeze({d})", lambda t: t.squeeze(d), lambda x: np.squeeze(x, d) if x.shape[d] == 1 else x


def unsqueeze_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    d = draw(st.integers(-a.ndim - 1, a.ndim))
    return f"unsqueeze({d})", lambda t: t.unsqueeze(d), lambda x: np.expand_dims(x, d)


def basic_index(draw: st.DrawFn, shape: tuple[int, ...]) -> list[Any]:
    """A random basic index: ints, slices with steps (negative too), None and maybe an ellipsis standing for the dims
    between those indexed at the front and those indexed at the back."""

    def entries(sizes: tuple[int, ...]) -> list[Any]:
        out: list[Any] = []
        for s in sizes:
            kind = draw(st.sampled_from(["int", "slice", "slice", "none"] if s else ["slice", "none"]))
            if kind == "none":
                out.append(None)
            if kind == "int":
                out.append(draw(st.integers(-s, s - 1)))
            else:
                bound = st.one_of(st.none(), st.integers(-s - 1, s + 1))
                step = draw(st.one_of(st.none(), st.sampled_from([1, 2, 3, -1, -2, -3])))
                out.append(slice(draw(bound), draw(bound), step))
        return out

    front = draw(st.integers(0, len(shape)))
    if not draw(st.booleans()):
        return entries(shape[:front])
    back = draw(st.integers(0, len(shape) - front))
    return entries(shape[:front]) + [Ellipsis] + entries(shape[len(shape) - back :])


def getitem_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    index = tuple(basic_index(draw, a.shape))
    return f"[{index}]", lambda t: t[index], lambda x: x[index]


def repeat_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    reps = draw(st.lists(st.integers(1, 2), min_size=a.ndim, max_size=a.ndim + 1))
    return f"repeat{tuple(reps)}", lambda t: t.repeat(reps), lambda x: np.tile(x, reps)


def repeat_interleave_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    r = draw(st.integers(0, 2))
    d = axis(draw, a.ndim)
    return f"repeat_interleave({r}, {d})", lambda t: t.repeat_interleave(r, d), lambda x: np.repeat(x, r, d)


def roll_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    dims = draw(st.lists(st.integers(-a.ndim, a.ndim - 1), min_size=1, max_size=2))
    shifts = [draw(st.integers(-5, 5)) for _ in dims]
    return f"roll({shifts}, {dims})", lambda t: t.roll(shifts, dims), lambda x: np.roll(x, shifts, dims)


def cat_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    """Join with the tensor flipped, or with a second buffer (so that a kernel reads two)."""
    d = axis(draw, a.ndim)
    if draw(st.booleans()):
        return (
            f"cat(itself flipped, dim={d})",
            lambda t: t.cat(t.flip(d) * 2, dim=d),
            lambda x: np.concatenate([x, np.flip(x, d) * 2], d),
        )
    other = -np.arange(a.size, dtype=a.dtype).reshape(a.shape) - 1
    first = draw(st.booleans())

    def ours(t: Tensor) -> Tensor:
        o = Tensor(other, device=DEVICE)
        return o.cat(t, dim=d) if first else t.cat(o, dim=d)

    def ref(x: np.ndarray) -> np.ndarray:
        return np.concatenate([other, x] if first else [x, other], d)

    return f"cat(another buffer, dim={d}, first={first})", ours, ref


def compute_step(draw: st.DrawFn, a: np.ndarray) -> Step:
    """Elementwise work, so that the ops after it move a computed value rather than a buffer."""
    return "* 3 + 1", lambda t: t * 3 + 1, lambda x: x * 3 + 1


STEPS = [
    reshape_step,
    permute_step,
    expand_step,
    pad_step,
    pad_mode_step,
    shrink_step,
    flip_step,
    transpose_step,
    flatten_step,
    squeeze_step,
    unsqueeze_step,
    getitem_step,
    repeat_step,
    repeat_interleave_step,
    roll_step,
    cat_step,
    compute_step,
]
GROWING = {expand_step, pad_step, pad_mode_step, repeat_step, repeat_interleave_step, cat_step}
NEEDS_DIMS = {permute_step, flip_step, transpose_step, flatten_step, squeeze_step, pad_mode_step, roll_step}
NEEDS_DIMS |= {cat_step, repeat_interleave_step}


@st.composite
def chains(draw: st.DrawFn) -> tuple[np.ndarray, list[Step]]:
    a = start_array(draw)
    x, steps = a, []
    for _ in range(draw(st.integers(1, 4))):
        allowed = [s for s in STEPS if (x.ndim or s not in NEEDS_DIMS) and (x.size <= MAX_SIZE or s not in GROWING)]
        if s_allowed := [s for s in allowed if s is not pad_mode_step or 0 not in x.shape]:
            allowed = s_allowed
        step = draw(st.sampled_from(allowed))(draw, x)
        x = step[2](x)
        steps.append(step)
    return a, steps


@FEW
@given(chains())
def test_movement_chains(chain: tuple[np.ndarray, list[Step]]) -> None:
    a, steps = chain
    t, x = Tensor(a, device=DEVICE), a
    for _, ours, ref in steps:
        t, x = ours(t), ref(x)
        assert t.shape == x.shape, f"{[s[0] for s in steps]}: shape {t.shape}, expected {x.shape}"
    got = t.numpy()
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, x, err_msg=str([s[0] for s in steps]))


# ---------------------------------------------------------------- basic + advanced indexing


def torch_rule_reference(a: np.ndarray, index: tuple[Any, ...]) -> np.ndarray:
    """NumPy indexing with PyTorch's rule for ints among advanced indices: ints (and 0-d index arrays) are applied
    first, as basic indexing, so they never separate the advanced indices. Both steps are plain NumPy indexing."""
    scalar = [isinstance(i, int) or (isinstance(i, np.ndarray) and i.ndim == 0) for i in index]
    vector = [isinstance(i, np.ndarray) and i.ndim > 0 for i in index]
    if not any(scalar) or not any(vector):
        return a[index]
    first: list[Any] = []
    for i, s, v in zip(index, scalar, vector):
        if s:
            first.append(int(i))
        elif v:  # an index array or a mask stays for the second step; a mask covers as many dims as it has
            first += [slice(None)] * (i.ndim if i.dtype == np.bool_ else 1)
        else:
            first.append(slice(None) if isinstance(i, slice) else i)
    second = tuple(slice(None) if i is None else i for i, s in zip(index, scalar) if not s)
    return a[tuple(first)][second]


@st.composite
def advanced_indices(draw: st.DrawFn) -> tuple[np.ndarray, list[Any], tuple[Any, ...]]:
    """An array, the index as tiny gets it (tensors, lists, arrays) and as NumPy gets it."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    a = (np.arange(int(np.prod(shape))) + 1).astype(np.float32).reshape(shape)
    b_shape = tuple(draw(st.lists(st.integers(0, 3) if draw(st.booleans()) else st.integers(1, 3), max_size=2)))
    use_mask = draw(st.integers(0, 3)) == 0
    ours: list[Any] = []
    theirs: list[Any] = []
    dim = 0
    masked = False
    while dim < len(shape):
        s = shape[dim]
        kind = draw(st.sampled_from(["int", "slice", "array", "array", "none"]))
        if use_mask and not masked and draw(st.booleans()):
            k = draw(st.integers(1, min(2, len(shape) - dim)))
            m = np.asarray(
                draw(
                    st.lists(
                        st.booleans(),
                        min_size=int(np.prod(shape[dim : dim + k])),
                        max_size=int(np.prod(shape[dim : dim + k])),
                    )
                )
            ).reshape(shape[dim : dim + k])
            ours.append(Tensor(m, device=DEVICE) if draw(st.booleans()) else m)
            theirs.append(m)
            masked, dim = True, dim + k
            continue
        if kind == "none":
            ours.append(None)
            theirs.append(None)
            continue
        if kind == "int":
            i = draw(st.integers(-s, s - 1))
            ours.append(i)
            theirs.append(i)
        elif kind == "slice" or use_mask:
            sl = slice(draw(st.one_of(st.none(), st.integers(-s, s))), None, draw(st.sampled_from([None, 2, -1])))
            ours.append(sl)
            theirs.append(sl)
        else:
            sub = tuple(1 if draw(st.booleans()) else n for n in b_shape[draw(st.integers(0, len(b_shape))) :])
            arr = (
                np.asarray(
                    draw(st.lists(st.integers(-s, s - 1), min_size=int(np.prod(sub)), max_size=int(np.prod(sub))))
                )
                .reshape(sub)
                .astype(np.int64)
            )
            form = draw(st.sampled_from(["tensor", "tensor32", "list", "ndarray"]))
            if form == "list" and (arr.ndim == 0 or arr.size == 0):  # a list cannot say these shapes
                form = "ndarray"
            if form.startswith("tensor"):
                ours.append(Tensor(arr, device=DEVICE, dtype=dtypes.int32 if form == "tensor32" else dtypes.int64))
            else:
                ours.append(arr.tolist() if form == "list" else arr)
            theirs.append(arr)
        dim += 1
    if draw(st.booleans()):
        e = draw(st.integers(0, len(ours)))
        drop = draw(st.integers(0, len(ours) - e))  # an ellipsis standing for some of the trailing full slices
        if all(isinstance(i, slice) and i == slice(None) for i in theirs[e : e + drop]):
            ours[e : e + drop] = [Ellipsis]
            theirs[e : e + drop] = [Ellipsis]
    return a, ours, tuple(theirs)


@FEW
@given(advanced_indices(), st.booleans())
def test_advanced_indexing(case: tuple[np.ndarray, list[Any], tuple[Any, ...]], transposed: bool) -> None:
    a, ours, theirs = case
    t = Tensor(a, device=DEVICE)
    if transposed:  # the same values read through a permuted view of a transposed buffer
        t = Tensor(np.ascontiguousarray(a.T), device=DEVICE).permute(tuple(reversed(range(a.ndim))))
    expect = torch_rule_reference(a, theirs)
    out = t[tuple(ours)]
    assert out.shape == expect.shape, f"index {theirs}: shape {out.shape}, expected {expect.shape}"
    np.testing.assert_array_equal(out.numpy(), expect, err_msg=f"index {theirs}")


def test_torch_rule_reference_is_plain_numpy_without_ints() -> None:
    a = np.arange(24).reshape(2, 3, 4)
    i = np.array([0, 1])
    np.testing.assert_array_equal(torch_rule_reference(a, (i, slice(None), i)), a[i, :, i])
    assert torch_rule_reference(a, (0, slice(None), i)).shape == (3, 2)  # NumPy alone would give (2, 3)


@pytest.mark.parametrize("seed", range(3))
def test_gather_matches_take_along_axis(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.integers(-50, 50, (3, 4, 2)).astype(np.int32)
    for dim in (0, 1, -1):
        shape = list(a.shape)
        shape[dim] = 5
        index = rng.integers(0, a.shape[dim], shape)
        out = Tensor(a, device=DEVICE).gather(dim, Tensor(index, device=DEVICE))
        np.testing.assert_array_equal(out.numpy(), np.take_along_axis(a, index, dim))
