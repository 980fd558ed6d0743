"""Data types: promotion (against PyTorch where it is installed, and a table of its answers where it is not),
truncation to a dtype's range and precision (against NumPy), bfloat16 bit helpers, vector and pointer types."""

from __future__ import annotations

import dataclasses
import itertools
import math
import pickle
import random
import struct
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from tiny.ir.dtypes import (
    DType,
    PtrDType,
    bf16_to_float,
    dtypes,
    float_to_bf16,
    least_upper_dtype,
    promote_types,
    to_dtype,
    truncate,
)

ALL = dtypes.all()
BAREBONES_UNSIGNED = {"uint16", "uint32", "uint64"}  # PyTorch has them with limited support: it will not promote them

# ---------------------------------------------------------------- promotion

# What torch.promote_types answers (PyTorch 2.x), for a sample of pairs that covers each rule of its lattice.
TORCH_ANSWERS = [
    ("bool", "uint8", "uint8"),
    ("bool", "int8", "int8"),
    ("bool", "int64", "int64"),
    ("bool", "float16", "float16"),
    ("bool", "bfloat16", "bfloat16"),
    ("uint8", "int8", "int16"),  # unsigned meets signed in the next wider signed type
    ("uint8", "int16", "int16"),
    ("uint8", "int32", "int32"),
    ("uint8", "int64", "int64"),
    ("int8", "int16", "int16"),
    ("int16", "int64", "int64"),
    ("int32", "float16", "float16"),  # any float beats any integer, however wide
    ("int64", "bfloat16", "bfloat16"),
    ("uint8", "float32", "float32"),
    ("float16", "bfloat16", "float32"),  # neither holds the other
    ("bfloat16", "float32", "float32"),
    ("float16", "float64", "float64"),
    ("float32", "float64", "float64"),
    ("uint16", "float16", "float16"),  # the barebones unsigned types promote with floats
    ("uint64", "bfloat16", "bfloat16"),
    ("uint32", "float64", "float64"),
]

# Where PyTorch refuses ("Promotion for uint16, uint32, uint64 types is not supported") and we answer: a signed
# integer with an unsigned one meets in the smallest signed integer holding both, int64 when none does (so uint64
# with a signed integer is int64, losing the top half); unsigned with unsigned or bool is the wider one.
OUR_ANSWERS_WHERE_TORCH_REFUSES = [
    ("uint16", "int8", "int32"),
    ("uint16", "int16", "int32"),
    ("uint16", "int32", "int32"),
    ("uint16", "int64", "int64"),
    ("uint32", "int8", "int64"),
    ("uint32", "int32", "int64"),
    ("uint32", "int64", "int64"),
    ("uint64", "int8", "int64"),
    ("uint64", "int64", "int64"),
    ("uint16", "uint8", "uint16"),
    ("uint32", "uint16", "uint32"),
    ("uint64", "uint32", "uint64"),
    ("bool", "uint16", "uint16"),
    ("bool", "uint64", "uint64"),
]


def _d(name: str) -> DType:
    return dtypes.from_name(name)


@pytest.mark.parametrize("a, b, want", TORCH_ANSWERS + OUR_ANSWERS_WHERE_TORCH_REFUSES)
def test_promote_types_table(a: str, b: str, want: str) -> None:
    assert promote_types(_d(a), _d(b)) == _d(want)
    assert promote_types(_d(b), _d(a)) == _d(want)


def test_promote_types_matches_torch_for_every_pair_torch_supports() -> None:
    torch = pytest.importorskip("torch")
    refused = {(a, b) for a, b, _ in OUR_ANSWERS_WHERE_TORCH_REFUSES}
    compared = 0
    for a, b in itertools.product(ALL, ALL):
        ta, tb = getattr(torch, a.name), getattr(torch, b.name)
        try:
            want = torch.promote_types(ta, tb)
        except RuntimeError:
            # only the barebones unsigned types may be refused, and there we answer as documented
            assert {a.name, b.name} & BAREBONES_UNSIGNED, (a, b)
            ours = promote_types(a, b)
            assert ours.is_int or ours.is_bool
            continue
        if (a.name, b.name) in refused or (b.name, a.name) in refused:
            continue  # a newer torch answers where an older one refused; our documented answer stands
        assert promote_types(a, b).name == str(want).removeprefix("torch."), (a, b)
        compared += 1
    assert compared > 100


def test_promote_types_is_a_lattice_join() -> None:
    for a, b in itertools.product(ALL, ALL):
        j = promote_types(a, b)
        assert j == promote_types(b, a)  # commutative
        assert promote_types(a, j) == j and promote_types(b, j) == j  # an upper bound of both
        assert promote_types(a, a) == a  # idempotent
    for a, b, c in itertools.product(ALL, ALL, ALL):
        assert promote_types(promote_types(a, b), c) == promote_types(a, promote_types(b, c)), (a, b, c)


def test_promotion_never_narrows_the_category() -> None:
    rank = {"b": 0, "u": 1, "i": 1, "f": 2}
    for a, b in itertools.product(ALL, ALL):
        j = promote_types(a, b)
        assert rank[j.kind] == max(rank[a.kind], rank[b.kind])
        if j.kind == a.kind:
            assert j.itemsize >= a.itemsize


def test_promote_types_of_vectors_uses_their_scalars() -> None:
    assert promote_types(dtypes.float32.vec(4), dtypes.int8) == dtypes.float32
    assert promote_types(dtypes.int8.vec(2), dtypes.uint8.vec(2)) == dtypes.int16


def test_least_upper_dtype() -> None:
    assert least_upper_dtype(dtypes.bool) == dtypes.bool
    assert least_upper_dtype(dtypes.int8, dtypes.uint8) == dtypes.int16
    assert least_upper_dtype(dtypes.int8, dtypes.uint8, dtypes.float16) == dtypes.float16
    assert least_upper_dtype(dtypes.float16, dtypes.bfloat16, dtypes.int64) == dtypes.float32
    assert least_upper_dtype(dtypes.bool, dtypes.bool, dtypes.uint8) == dtypes.uint8
    for ds in itertools.permutations([dtypes.int8, dtypes.uint16, dtypes.uint8, dtypes.bool]):
        assert least_upper_dtype(*ds) == dtypes.int32


# ---------------------------------------------------------------- names, Python values, properties


def test_from_name_and_to_dtype() -> None:
    for d in ALL:
        assert dtypes.from_name(d.name) is d
        assert to_dtype(d.name) is d
        assert to_dtype(d) is d
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        dtypes.from_name("float8")
    with pytest.raises(TypeError):
        to_dtype(3)  # type: ignore[arg-type]


def test_aliases_and_defaults() -> None:
    assert dtypes.half is dtypes.float16 and dtypes.float is dtypes.float32 and dtypes.double is dtypes.float64
    assert dtypes.int is dtypes.int32 and dtypes.long is dtypes.int64 and dtypes.uchar is dtypes.uint8
    assert dtypes.default_float == dtypes.float32 and dtypes.default_int == dtypes.int64
    assert dtypes.void not in ALL and len(ALL) == 13


def test_from_py_follows_torch_tensor() -> None:
    assert dtypes.from_py(True) == dtypes.bool
    assert dtypes.from_py(3) == dtypes.int64
    assert dtypes.from_py(3.0) == dtypes.float32
    assert dtypes.from_py([True, False]) == dtypes.bool
    assert dtypes.from_py([True, 2]) == dtypes.int64
    assert dtypes.from_py([1, 2.5]) == dtypes.float32
    assert dtypes.from_py([[1, 2], [3, 4]]) == dtypes.int64
    assert dtypes.from_py(()) == dtypes.float32  # torch.tensor([]) is float32
    with pytest.raises(TypeError):
        dtypes.from_py("1")


@pytest.mark.parametrize("d", ALL, ids=lambda d: d.name)
def test_scalar_properties_agree_with_numpy(d: DType) -> None:
    assert d.bits == 8 * d.itemsize and d.nbytes == d.itemsize and d.count == 1 and d.scalar is d
    if d.fmt is not None:
        assert struct.calcsize(d.fmt) == d.itemsize
        assert np.dtype(d.fmt).itemsize == d.itemsize
    if d.is_int:
        info = np.iinfo(np.dtype(d.fmt))
        assert (d.min, d.max) == (int(info.min), int(info.max))
    elif d.is_float:
        assert (d.min, d.max) == (-math.inf, math.inf)
    else:
        assert (d.min, d.max) == (False, True)
    assert sum([d.is_int, d.is_float, d.is_bool]) == 1
    assert d.is_unsigned == (d.name.startswith("uint"))


# ---------------------------------------------------------------- truncate


@pytest.mark.parametrize("d", [d for d in ALL if d.is_int], ids=lambda d: d.name)
def test_truncate_ints_wrap_like_numpy(d: DType) -> None:
    rng = random.Random(d.bits)
    values = [0, 1, -1, d.min, d.max, d.min - 1, d.max + 1, 2**64, -(2**63), 2**63 - 1, 2**70 + 5, -(2**70) - 3]
    values += [rng.randrange(-(2**66), 2**66) for _ in range(200)]
    for v in values:
        want = int(np.array(v & (2**64 - 1), dtype=np.uint64).astype(np.dtype(d.fmt)))
        assert truncate(d, v) == want, (d, v)
        assert d.min <= truncate(d, v) <= d.max


def test_truncate_floats_to_ints_goes_toward_zero() -> None:
    assert truncate(dtypes.int32, 3.9) == 3
    assert truncate(dtypes.int32, -3.9) == -3
    assert truncate(dtypes.int8, 130.5) == -126  # toward zero, then wrapped
    assert truncate(dtypes.uint8, -1.5) == 255
    assert truncate(dtypes.int32, math.nan) == -(2**31)  # does not fit: int32's minimum, as x86 gives
    assert truncate(dtypes.int64, math.inf) == -(2**63)
    assert truncate(dtypes.int32, 3e9) == -(2**31)
    assert truncate(dtypes.uint32, 3e9) == 3_000_000_000  # through int64, then the low bits
    assert isinstance(truncate(dtypes.int16, 2.0), int)


def test_truncate_bool() -> None:
    assert truncate(dtypes.bool, 0) is False
    assert truncate(dtypes.bool, -0.0) is False
    assert truncate(dtypes.bool, 2) is True
    assert truncate(dtypes.bool, math.nan) is True  # as C's (_Bool)NAN and torch's bool(nan)


def _same_float(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@pytest.mark.parametrize("name, np_type", [("float32", np.float32), ("float16", np.float16)])
def test_truncate_floats_round_like_numpy(name: str, np_type: type) -> None:
    d = dtypes.from_name(name)
    finfo = np.finfo(np_type)
    big, tiny = float(finfo.max), float(finfo.smallest_subnormal)
    rng = random.Random(7)
    values = [0.0, -0.0, 1.0, 1 / 3, -2.5, big, -big, tiny, tiny / 2, tiny * 0.5000001, -tiny / 2, math.inf, -math.inf]
    values += [big * (1 + 2.0**-25), big * (1 + 2.0**-11), float(finfo.eps) / 3, 1e-300, 1e300]
    values += [rng.uniform(-2 * big, 2 * big) for _ in range(500)]
    values += [rng.uniform(-1000 * tiny, 1000 * tiny) for _ in range(500)]
    values += [math.ldexp(rng.random(), rng.randrange(-30, 30)) for _ in range(500)]
    with np.errstate(over="ignore"):
        for v in values:
            assert _same_float(truncate(d, v), float(np_type(v))), (name, v)
    assert math.isnan(truncate(d, math.nan))


def test_truncate_float64_is_identity_and_ints_become_floats() -> None:
    assert truncate(dtypes.float64, 0.1) == 0.1
    out = truncate(dtypes.float32, 3)
    assert isinstance(out, float) and out == 3.0
    assert truncate(dtypes.float32, 16777217) == 16777216.0  # 2**24 + 1 is not a float32


def _f32_bits_value(bits: int) -> Fraction:
    """The exact value of a non-negative float32 bit pattern; the pattern of inf counts as 2**128."""
    if bits == 0x7F800000:
        return Fraction(2**128)
    return Fraction(struct.unpack("f", struct.pack("I", bits))[0])


def _bf16_reference(x: float) -> float:
    """The bfloat16 nearest to float32(x), ties to even, chosen by exact arithmetic between the two candidates."""
    with np.errstate(over="ignore"):
        f = float(np.float32(x))
    if not math.isfinite(f):
        return f
    magnitude = struct.unpack("I", struct.pack("f", f))[0] & 0x7FFFFFFF
    lo = magnitude & 0xFFFF0000
    hi = lo + 0x10000
    exact = Fraction(abs(f))
    d_lo, d_hi = exact - _f32_bits_value(lo), _f32_bits_value(hi) - exact
    pick = lo if d_lo < d_hi or (d_lo == d_hi and not (lo >> 16) & 1) else hi
    out = math.inf if pick == 0x7F800000 else float(_f32_bits_value(pick))
    return math.copysign(out, f)


def test_truncate_bfloat16_rounds_to_nearest_even() -> None:
    rng = random.Random(3)
    values = [1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 1 + 2.0**-8 + 2.0**-20, 3.0e38, -3.3895e38]
    values += [3.3895313892515355e38, 3.3961e38, 1e-40, -1e-41, 0.1, 1e39, -1e39]
    values += [math.ldexp(rng.uniform(-1, 1), rng.randrange(-130, 128)) for _ in range(3000)]
    for v in values:
        assert _same_float(truncate(dtypes.bfloat16, v), _bf16_reference(v)), v
    assert truncate(dtypes.bfloat16, 1 + 2.0**-8) == 1.0  # a tie goes to the even mantissa
    assert truncate(dtypes.bfloat16, 1 + 3 * 2.0**-8) == 1 + 2.0**-6
    assert math.isnan(truncate(dtypes.bfloat16, math.nan))
    assert truncate(dtypes.bfloat16, 1e39) == math.inf


def test_bf16_bits() -> None:
    assert float_to_bf16(1.0) == 0x3F80
    assert float_to_bf16(-2.0) == 0xC000
    assert float_to_bf16(0.0) == 0x0000 and float_to_bf16(-0.0) == 0x8000
    assert float_to_bf16(math.inf) == 0x7F80 and float_to_bf16(-math.inf) == 0xFF80
    assert float_to_bf16(math.nan) == 0x7FC0 and math.isnan(bf16_to_float(0x7FC0))
    assert float_to_bf16(3.4028234663852886e38) == 0x7F80  # float32's max rounds up to inf
    assert bf16_to_float(0x3F80) == 1.0 and bf16_to_float(0x0001) == math.ldexp(1, -133)
    assert bf16_to_float(0x13F80) == 1.0  # only the low 16 bits count


def test_bf16_every_bit_pattern_round_trips() -> None:
    for bits in range(1 << 16):
        f = bf16_to_float(bits)
        if math.isnan(f):
            assert math.isnan(bf16_to_float(float_to_bf16(f)))
            continue
        assert float_to_bf16(f) == bits, hex(bits)
        assert truncate(dtypes.bfloat16, f) == f or (f == 0 and truncate(dtypes.bfloat16, f) == 0)


def test_bf16_agrees_with_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = random.Random(11)
    values = [math.ldexp(rng.uniform(-1, 1), rng.randrange(-130, 128)) for _ in range(2000)]
    got = torch.tensor(values, dtype=torch.float32).to(torch.bfloat16).float().tolist()
    for v, want in zip(values, got):
        assert _same_float(truncate(dtypes.bfloat16, v), want), v


# ---------------------------------------------------------------- vectors and pointers


def test_vectors() -> None:
    v = dtypes.float32.vec(4)
    assert v.count == 4 and v.scalar is dtypes.float32 and v.nbytes == 16 and v.itemsize == 4
    assert v == dtypes.float32.vec(4) and hash(v) == hash(dtypes.float32.vec(4))
    assert v != dtypes.float32 and v != dtypes.float32.vec(2) and v != dtypes.int32.vec(4)
    assert dtypes.float32.vec(1) is dtypes.float32
    assert repr(v) == "dtypes.float32.vec(4)" and repr(dtypes.int8) == "dtypes.int8"
    assert v.is_float and not v.is_int
    with pytest.raises(ValueError, match="scalar"):
        v.vec(2)


def test_pointers() -> None:
    p = dtypes.float32.ptr(16)
    assert isinstance(p, PtrDType) and p.base is dtypes.float32 and p.size == 16 and not p.local
    assert p == dtypes.float32.ptr(16) and hash(p) == hash(dtypes.float32.ptr(16))
    assert p != dtypes.float32.ptr(8) and p != dtypes.float32.ptr(16, local=True) and p != dtypes.int32.ptr(16)
    assert p != dtypes.float32  # a pointer is never its element type, whatever the shared fields say
    assert dtypes.float32 != p
    assert dtypes.float32.ptr().size == -1
    assert repr(p) == "dtypes.float32.ptr(16)"
    assert repr(dtypes.half.ptr(4, local=True)) == "dtypes.float16.ptr(4, local=True)"
    vp = dtypes.float32.vec(4).ptr(2)
    assert vp.base == dtypes.float32.vec(4) and vp.count == 4
    assert len({p, dtypes.float32.ptr(16), dtypes.float32, vp}) == 3  # usable as dict and set keys


def test_pickles_are_the_same_in_every_process() -> None:
    """A dtype pickles as its fields, not its cached hash (str hashes differ per process): BEAM keys its disk cache
    by a kernel's pickle, and a dtype unpickled from another process must hash as this process's does."""
    code = (
        "import pickle, sys; from tiny.ir.dtypes import dtypes; "
        "sys.stdout.write(pickle.dumps((dtypes.float32, dtypes.half.vec(4), dtypes.int8.ptr(16))).hex())"
    )
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert len(runs) == 1
    for dt in pickle.loads(bytes.fromhex(runs.pop())):
        assert hash(dt) == hash(type(dt)(*(getattr(dt, f.name) for f in dataclasses.fields(dt))))
