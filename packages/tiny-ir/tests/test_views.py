"""Views against NumPy: random chains of movement ops on a NumPy array and on a View must read the same elements.

A View is read two ways: directly from its fields, and through `to_index` (the UOps a kernel computes), evaluated
with exec_alu on constant indices. Padding reads as 0, so the source buffer holds 1..n.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from typing import Any

import numpy as np
import pytest

from tiny.ir.alu import exec_alu
from tiny.ir.dtypes import dtypes
from tiny.ir.uop import Ops, UOp
from tiny.ir.views import View, strides_for_shape

MAX_SIZE = 240

# ---------------------------------------------------------------- reading a view


def read_direct(view: View, src: np.ndarray) -> np.ndarray:
    """Every element of the view from its shape, strides, offset and mask."""
    out = np.zeros(view.shape, dtype=src.dtype)
    for idx in itertools.product(*(range(s) for s in view.shape)):
        if view.mask is not None and not all(lo <= i < hi for i, (lo, hi) in zip(idx, view.mask)):
            continue
        offset = view.offset + sum(i * st for i, st in zip(idx, view.strides))
        assert 0 <= offset < len(src), f"{view} reads offset {offset} at {idx}, outside a buffer of {len(src)}"
        out[idx] = src[offset]
    return out


def evaluate(u: UOp) -> Any:
    """The value of a graph of constants and ALU ops."""
    values: dict[UOp, Any] = {}
    for n in u.toposort:
        if n.op is Ops.CONST:
            values[n] = n.arg
        else:
            values[n] = exec_alu(n.op, n.dtype, tuple(values[s] for s in n.src))
    return values[u]


def read_by_index(view: View, src: np.ndarray) -> np.ndarray:
    """Every element of the view through to_index, the way a kernel computes the address and the gate."""
    out = np.zeros(view.shape, dtype=src.dtype)
    for idx in itertools.product(*(range(s) for s in view.shape)):
        offset, valid = view.to_index([UOp.const(dtypes.int32, i) for i in idx])
        if valid is not None and not evaluate(valid):
            continue
        at = evaluate(offset)
        assert 0 <= at < len(src), f"{view} reads offset {at} at {idx}"
        out[idx] = src[at]
    return out


# ---------------------------------------------------------------- random movement ops


def _factorizations(n: int, rng: random.Random) -> tuple[int, ...]:
    """A random shape with n elements, 1 to 4 dims, size-1 dims sprinkled in."""
    if n == 0:
        return tuple(rng.choice([0, 1, 2, 3]) if i else 0 for i in range(rng.randint(1, 3)))
    dims: list[int] = []
    rest = n
    for _ in range(rng.randint(0, 3)):
        divisors = [d for d in range(2, rest + 1) if rest % d == 0]
        if not divisors:
            break
        d = rng.choice(divisors)
        dims.append(d)
        rest //= d
    dims.append(rest)
    if rng.random() < 0.3:
        dims.insert(rng.randint(0, len(dims)), 1)
    rng.shuffle(dims)
    return tuple(dims)


def random_reshape(shape: tuple[int, ...], rng: random.Random) -> tuple[int, ...]:
    size = math.prod(shape)
    kind = rng.random()
    if kind < 0.35 and len(shape) >= 2:  # merge two neighbours: the case that needs them laid out together
        i = rng.randrange(len(shape) - 1)
        return shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2 :]
    if kind < 0.7:  # split one dim
        i = rng.randrange(len(shape))
        divisors = [d for d in range(2, shape[i]) if shape[i] % d == 0]
        if divisors:
            d = rng.choice(divisors)
            return shape[:i] + (d, shape[i] // d) + shape[i + 1 :]
    return _factorizations(size, rng)


def random_op(shape: tuple[int, ...], rng: random.Random) -> tuple[str, Any]:
    size = math.prod(shape)
    while True:
        op = rng.choice(["reshape", "reshape", "permute", "expand", "pad", "shrink", "shrink", "flip"])
        if op == "reshape":
            return op, random_reshape(shape, rng)
        if op == "permute":
            order = list(range(len(shape)))
            rng.shuffle(order)
            return op, tuple(order)
        if op == "expand" and 1 in shape:
            new = tuple(rng.choice([1, 2, 3]) if s == 1 else s for s in shape)
            if math.prod(new) <= MAX_SIZE:
                return op, new
        if op == "pad":
            padding = tuple((rng.choice([0, 0, 1, 2]), rng.choice([0, 0, 1, 2])) for _ in shape)
            if math.prod(s + b + a for s, (b, a) in zip(shape, padding)) <= MAX_SIZE:
                return op, padding
        if op == "shrink" and size:
            bounds = []
            for s in shape:
                lo = rng.randint(0, s // 2)
                hi = rng.randint(max(lo + 1, s - s // 2), s) if rng.random() > 0.03 else lo  # rarely empty
                bounds.append((lo, hi))
            return op, tuple(bounds)
        if op == "flip":
            return op, tuple(i for i in range(len(shape)) if rng.random() < 0.5)


def apply_numpy(a: np.ndarray, op: str, arg: Any) -> np.ndarray:
    if op == "reshape":
        return a.reshape(arg)
    if op == "permute":
        return a.transpose(arg)
    if op == "expand":
        return np.broadcast_to(a, arg)
    if op == "pad":
        return np.pad(a, arg)
    if op == "shrink":
        return a[tuple(slice(lo, hi) for lo, hi in arg)]
    return np.flip(a, arg) if arg else a


def apply_view(v: View, op: str, arg: Any) -> View | None:
    return getattr(v, op)(arg)


def numpy_reshapes_without_copy(a: np.ndarray, shape: tuple[int, ...]) -> bool:
    """Whether NumPy can give this reshape as a view of the same memory."""
    try:
        np.reshape(a, shape, copy=False)
    except ValueError:
        return False
    except TypeError:  # NumPy < 2.1 has no copy=: ask by setting the shape in place
        b = a.view()
        try:
            b.shape = shape
        except AttributeError:
            return False
    return True


def test_random_movement_chains_match_numpy() -> None:
    rng = random.Random(1234)
    counts: Counter[str] = Counter()
    for _ in range(300):
        shape = _factorizations(rng.choice([1, 6, 12, 24, 30, 36, 48]), rng)
        size = math.prod(shape)
        src = np.arange(1, size + 1, dtype=np.int64)
        base = src[: max(size, 0)].reshape(shape)
        arr = base  # element values; 0 is padding
        strided: np.ndarray | None = base  # the same, still a view of src's memory (until a pad copies)
        view = View.create(shape)
        ops = []
        for _ in range(rng.randint(1, 7)):
            op, arg = random_op(view.shape, rng)
            new = apply_view(view, op, arg)
            counts[op] += 1
            if new is None:
                assert op == "reshape"
                counts["reshape is not one view"] += 1
                if view.mask is None and strided is not None:
                    assert not numpy_reshapes_without_copy(strided, arg), (view, arg)
                    counts["numpy copies too"] += 1
                continue
            if op == "reshape" and view.mask is None and strided is not None:
                # every reshape NumPy does in place, a View does too
                assert numpy_reshapes_without_copy(strided, arg), (view, arg)
                counts["reshape of a strided view"] += 1
            ops.append((op, arg))
            view = new
            arr = apply_numpy(arr, op, arg)
            strided = None if op == "pad" or strided is None else apply_numpy(strided, op, arg)
            assert view.shape == arr.shape, ops
            np.testing.assert_array_equal(read_direct(view, src), arr, err_msg=str(ops))
            if strided is not None:
                assert view.mask is None
                np.testing.assert_array_equal(read_direct(view, src), strided, err_msg=str(ops))
        np.testing.assert_array_equal(read_by_index(view, src), arr, err_msg=str(ops))
        counts["chains"] += 1
        if view.mask is not None:
            counts["masked at the end"] += 1
        if view.size == 0:
            counts["empty at the end"] += 1
    # the generator reached every case it is meant to
    assert counts["reshape is not one view"] >= 10, counts
    assert counts["numpy copies too"] >= 10, counts
    assert counts["reshape of a strided view"] >= 50, counts
    assert counts["masked at the end"] >= 30, counts
    assert counts["empty at the end"] >= 1, counts
    assert counts["reshape is not one view"] < counts["reshape"] / 2, counts


def test_span_is_the_range_of_offsets_read() -> None:
    rng = random.Random(99)
    for _ in range(200):
        shape = _factorizations(rng.choice([6, 12, 24]), rng)
        view = View.create(shape)
        for _ in range(rng.randint(1, 5)):
            op, arg = random_op(view.shape, rng)
            view = apply_view(view, op, arg) or view
        offsets = [
            view.offset + sum(i * st for i, st in zip(idx, view.strides))
            for idx in itertools.product(*(range(s) for s in view.shape))
            if view.mask is None or all(lo <= i < hi for i, (lo, hi) in zip(idx, view.mask))
        ]
        assert view.span() == ((min(offsets), max(offsets)) if offsets else (0, -1)), view


# ---------------------------------------------------------------- targeted cases


def test_create_normalizes() -> None:
    assert View.create((2, 3)) == View((2, 3), (3, 1), 0, None)
    assert View.create((1, 4)).strides == (0, 1)  # size-1 dims get stride 0
    assert View.create((1, 4), (4, 1)) == View.create((1, 4))
    assert View.create((2, 3), mask=((0, 2), (0, 3))).mask is None  # a mask that covers everything is none
    assert strides_for_shape((2, 1, 3)) == (3, 0, 1)
    assert strides_for_shape(()) == ()
    assert View.create(()).size == 1 and View.create(()).contiguous


def test_contiguous_detection() -> None:
    v = View.create((2, 3, 4))
    assert v.contiguous
    assert not v.permute((1, 0, 2)).contiguous
    assert v.permute((1, 0, 2)).permute((1, 0, 2)) == v
    assert v.reshape((6, 4)).contiguous and v.reshape((24,)).contiguous
    assert v.shrink(((0, 2), (0, 3), (0, 4))).contiguous
    assert not v.shrink(((1, 2), (0, 3), (0, 4))).contiguous  # an offset
    assert not v.flip((2,)).contiguous and v.flip((2,)).flip((2,)) == v
    assert not View.create((1, 4)).expand((3, 4)).contiguous
    padded = v.pad(((1, 1), (0, 0), (2, 0)))
    assert not padded.contiguous
    assert padded.shrink(((1, 3), (0, 3), (2, 6))) == v  # shrinking the padding away gives the original back


def test_pad_and_shrink_masks() -> None:
    v = View.create((4,)).pad(((2, 1),))
    assert v == View((7,), (1,), -2, ((2, 6),))
    assert v.shrink(((0, 3),)) == View((3,), (1,), -2, ((2, 3),))
    assert v.shrink(((3, 5),)) == View((2,), (1,), 1, None)  # all valid: no mask
    assert v.flip((0,)).mask == ((1, 5),)
    two = View.create((2, 3)).pad(((1, 0), (0, 2)))
    assert two.mask == ((1, 3), (0, 3)) and two.shape == (3, 5)
    assert View.create((3,)).pad(((0, 0),)) == View.create((3,))  # no padding: the same view


def test_padding_a_padded_view_keeps_one_mask() -> None:
    v = View.create((2,)).pad(((1, 1),)).pad(((2, 0),))
    assert v.shape == (6,) and v.mask == ((3, 5),)
    src = np.arange(1, 3)
    np.testing.assert_array_equal(read_by_index(v, src), [0, 0, 0, 1, 2, 0])


def test_empty_masks() -> None:
    v = View.create((4,)).pad(((3, 0),)).shrink(((0, 2),))  # only padding left
    assert v.empty_mask and v.mask == ((0, 0),) and v.strides == (0,) and v.offset == 0
    assert v.span() == (0, -1)
    offset, valid = v.to_index([UOp.const(dtypes.int32, 1)])
    assert valid is not None and evaluate(valid) is False
    one = View.create((1,)).pad(((1, 0),)).shrink(((0, 1),))
    assert one.empty_mask and one.expand((5,)).empty_mask
    assert v.reshape((2, 1)).empty_mask and v.permute((0,)).empty_mask and v.flip((0,)).empty_mask
    assert View.create((3,), mask=((2, 1),)).empty_mask  # lo >= hi anywhere: nothing is valid


def test_size_zero() -> None:
    v = View.create((0, 4))
    assert v.size == 0 and v.span() == (0, -1)
    assert v.reshape((4, 0, 2)).shape == (4, 0, 2)
    assert v.permute((1, 0)).shape == (4, 0)
    assert View.create((3, 4)).shrink(((1, 1), (0, 4))).size == 0
    assert View.create((0,)).pad(((1, 1),)).shape == (2,)
    np.testing.assert_array_equal(read_by_index(View.create((0,)).pad(((1, 1),)), np.arange(1, 2)), [0, 0])


def test_reshape_rules() -> None:
    v = View.create((2, 3, 4))
    with pytest.raises(ValueError, match="cannot reshape"):
        v.reshape((5, 5))
    assert v.reshape((2, 3, 4)) is v
    t = v.permute((2, 1, 0))  # (4, 3, 2), strides (1, 4, 12)
    assert t.reshape((4, 6)) is None  # merging dims that are not laid out one after the other
    assert t.reshape((2, 2, 3, 2)) == View.create((2, 2, 3, 2), (2, 1, 4, 12))  # splitting is always fine
    assert t.reshape((4, 1, 3, 2)).strides == (1, 0, 4, 12)
    ex = View.create((1, 3)).expand((4, 3))
    assert ex.reshape((12,)) is None
    assert View.create((1, 1)).expand((4, 3)).reshape((12,)) == View.create((12,), (0,))  # stride 0 merges
    pad = View.create((2, 3)).pad(((0, 0), (1, 1)))  # (2, 5)
    assert pad.reshape((2, 5, 1)).mask == ((0, 2), (1, 4), (0, 1))  # untouched padded dims keep their mask
    assert pad.reshape((10,)) is None  # merging a padded dim
    assert View.create((6,)).pad(((0, 2),)).reshape((2, 4)) is None  # splitting a padded dim
    fl = View.create((2, 3)).flip((0, 1))
    assert fl.reshape((6,)) == View.create((6,), (-1,), 5)  # flipped dims still lie one after the other


def test_expand_rules() -> None:
    with pytest.raises(ValueError, match="cannot expand"):
        View.create((2, 3)).expand((4, 3))
    e = View.create((2, 1)).expand((2, 5))
    assert e.strides == (1, 0) and e.shape == (2, 5)
    padded = View.create((1, 3)).pad(((1, 0), (0, 0)))  # (2, 3) with dim 0 masked to (1, 2)
    assert padded.shrink(((1, 2), (0, 3))).expand((4, 3)).mask is None


def test_to_index_with_loop_variables() -> None:
    v = View.create((3, 4)).permute((1, 0)).pad(((1, 0), (0, 2)))
    r0, r1 = UOp.range(5, 0), UOp.range(5, 1)
    offset, valid = v.to_index([r0, r1])
    assert offset.dtype == dtypes.int32 and valid is not None and valid.dtype == dtypes.bool
    src = np.arange(1, 13)
    for i, j in itertools.product(range(5), range(5)):
        env = {r0: i, r1: j}
        for n in offset.toposort + valid.toposort:
            if n not in env:
                env[n] = n.arg if n.op is Ops.CONST else exec_alu(n.op, n.dtype, tuple(env[s] for s in n.src))
        want = np.pad(src.reshape(3, 4).T, ((1, 0), (0, 2)))[i, j]
        assert (src[env[offset]] if env[valid] else 0) == want
    idx64 = [UOp.const(dtypes.int64, 0)] * 2
    assert v.to_index(idx64)[0].dtype == dtypes.int64
    assert View.create((3,)).to_index([UOp.const(dtypes.int32, 2)])[1] is None  # no mask: no condition


# ---------------------------------------------------------------- bands (a window merged into one view)


def test_a_band_masks_a_window_over_padded_rows() -> None:
    # x (4 rows, 2 cols) with 2 rows of padding above and below, read by 3-row windows: out[r, c, j] = xp[r + j, c],
    # valid where the row read is a real one: 2 <= r + j < 6
    x = np.arange(1, 9, dtype=np.float32)
    v = View((6, 2, 3), (2, 1, 2), -4, None, ((0, 2, 1, 2, 6),))
    xp = np.pad(x.reshape(4, 2), ((2, 2), (0, 0)))
    want = np.stack([xp[j : j + 6] for j in range(3)], axis=-1)
    np.testing.assert_array_equal(read_by_index(v, x), want)


def test_a_banded_view_merges_dims_outside_its_bands_and_no_other_movement() -> None:
    v = View((6, 3, 2, 4), (8, 8, 4, 1), -16, None, ((0, 1, 1, 2, 6),))
    merged = v.reshape((6, 3, 8))  # the band's dims stay, numbered as before
    assert merged is not None and merged.bands == v.bands and merged.strides == (8, 8, 1)
    w = View((2, 6, 3), (4, 8, 8), -16, None, ((1, 2, 1, 2, 6),))
    assert w.reshape((12, 3)) is None  # (a band's dim merged away)
    u = View((2, 2, 6, 3), (8, 4, 8, 8), -16, None, ((2, 3, 1, 2, 6),))
    assert u.reshape((4, 6, 3)).bands == ((1, 2, 1, 2, 6),)  # dims after the merge move down by one
    for move in (lambda: v.permute((1, 0, 2, 3)), lambda: v.pad(((0, 0),) * 4), lambda: v.flip((0,))):
        with pytest.raises(ValueError, match="banded view"):
            move()
