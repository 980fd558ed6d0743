"""Data types: scalars, vectors and pointers, and type promotion as PyTorch does it."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, fields
from typing import Any, Final, Literal

Kind = Literal["v", "b", "i", "u", "f"]  # void, bool, signed integer, unsigned integer, floating point


@dataclass(frozen=True, eq=True)
class DType:
    """A scalar type, or a vector of `count` scalars of one type.

    Interned: equal fields make the very same object (however the dtype was made: a constructor, vec(), ptr(),
    unpickling), so a dtype hashes by identity, without a Python call (every UOp's hash-consing key hashes its
    dtype, and every structure key)."""

    name: str
    itemsize: int  # bytes of one scalar
    kind: Kind
    fmt: str | None  # struct/NumPy format character of the scalar; None where struct has none (bfloat16)
    count: int = 1  # vector width; 1 for a scalar

    def __new__(cls, *args: Any, **kwargs: Any) -> DType:
        key = (cls, *_field_values(cls, args, kwargs))
        if (found := _INTERNED.get(key)) is None:
            found = _INTERNED[key] = object.__new__(cls)
        return found

    # interned: equal dtypes are one object, so identity is equality (and both are C calls)
    __hash__ = object.__hash__
    __eq__ = object.__eq__

    def __reduce__(self) -> tuple:  # rebuilt from its fields (and so interned again when unpickled)
        return (self.__class__, tuple(getattr(self, f.name) for f in fields(self)))

    def __repr__(self) -> str:
        return f"dtypes.{self.name}" if self.count == 1 else f"dtypes.{self.name}.vec({self.count})"

    @property
    def scalar(self) -> DType:
        return self if self.count == 1 else _SCALARS[self.name]

    def vec(self, count: int) -> DType:
        if self.count != 1:
            raise ValueError(f"vec() takes a scalar dtype, got {self!r}")
        return self if count == 1 else DType(self.name, self.itemsize, self.kind, self.fmt, count)

    def ptr(self, size: int = -1, local: bool = False) -> PtrDType:
        return PtrDType(self.name, self.itemsize, self.kind, self.fmt, self.count, base=self, size=size, local=local)

    @property
    def nbytes(self) -> int:
        return self.itemsize * self.count

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in ("i", "u")

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "u"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def bits(self) -> int:
        return self.itemsize * 8

    @property
    def min(self) -> int | float | bool:
        if self.is_bool:
            return False
        if self.is_float:
            return -math.inf
        return 0 if self.is_unsigned else -(2 ** (self.bits - 1))

    @property
    def max(self) -> int | float | bool:
        if self.is_bool:
            return True
        if self.is_float:
            return math.inf
        return 2**self.bits - 1 if self.is_unsigned else 2 ** (self.bits - 1) - 1


@dataclass(frozen=True, eq=True, repr=False)
class PtrDType(DType):
    """A pointer to `base` in global memory, or in local (workgroup) memory when `local`."""

    base: DType | None = None
    size: int = -1  # number of elements, -1 when unknown
    local: bool = False

    __hash__ = object.__hash__  # (interned as every DType)
    __eq__ = object.__eq__

    def __repr__(self) -> str:
        return f"{self.base!r}.ptr({self.size}{', local=True' if self.local else ''})"


_INTERNED: dict[tuple, DType] = {}  # every dtype made, by its class and fields
_FIELDS: dict[type, tuple[tuple[str, Any], ...]] = {}  # each DType class's fields, with their defaults


def _field_values(cls: type, args: tuple, kwargs: dict[str, Any]) -> tuple:
    """The values of a dtype's fields, from the arguments its constructor takes (the dataclass's __init__ checks
    them after: an argument too many or unknown fails there)."""
    if (names := _FIELDS.get(cls)) is None:
        names = _FIELDS[cls] = tuple((f.name, f.default) for f in fields(cls))
    if not kwargs and len(args) == len(names):
        return args
    return (*args, *(kwargs.get(name, default) for name, default in names[len(args) :]))


def _scalar(name: str, itemsize: int, kind: Kind, fmt: str | None) -> DType:
    return DType(name, itemsize, kind, fmt)


class dtypes:  # noqa: N801  (a namespace, named like PyTorch's)
    void: Final = _scalar("void", 0, "v", None)
    bool: Final = _scalar("bool", 1, "b", "?")
    int8: Final = _scalar("int8", 1, "i", "b")
    int16: Final = _scalar("int16", 2, "i", "h")
    int32: Final = _scalar("int32", 4, "i", "i")
    int64: Final = _scalar("int64", 8, "i", "q")
    uint8: Final = _scalar("uint8", 1, "u", "B")
    uint16: Final = _scalar("uint16", 2, "u", "H")
    uint32: Final = _scalar("uint32", 4, "u", "I")
    uint64: Final = _scalar("uint64", 8, "u", "Q")
    float16: Final = _scalar("float16", 2, "f", "e")
    bfloat16: Final = _scalar("bfloat16", 2, "f", None)
    float32: Final = _scalar("float32", 4, "f", "f")
    float64: Final = _scalar("float64", 8, "f", "d")
    # aliases
    half = float16
    float = float32
    double = float64
    int = int32
    long = int64
    uchar = uint8
    # defaults, as in PyTorch
    default_float: DType = float32
    default_int: DType = int64

    @staticmethod
    def all() -> tuple[DType, ...]:
        """Every scalar dtype a tensor can have."""
        return tuple(d for d in _SCALARS.values() if d.kind != "v")

    @staticmethod
    def from_name(name: str) -> DType:
        if (dt := _SCALARS.get(name)) is None:
            raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_SCALARS)}")
        return dt

    @staticmethod
    def from_py(x: object) -> DType:
        """The dtype PyTorch gives a tensor made from this Python value."""
        if isinstance(x, bool):
            return dtypes.bool
        if isinstance(x, int):
            return dtypes.default_int
        if isinstance(x, float):
            return dtypes.default_float
        if isinstance(x, (list, tuple)):
            return max((dtypes.from_py(v) for v in x), key=_category_rank, default=dtypes.default_float)
        if hasattr(x, "dtype") and getattr(x, "shape", None) == ():  # a NumPy scalar: like the number it holds
            return dtypes.from_py(x.item())
        raise TypeError(f"cannot infer a dtype from {type(x).__name__}")


_SCALARS: dict[str, DType] = {
    d.name: d
    for d in (
        dtypes.void,
        dtypes.bool,
        dtypes.int8,
        dtypes.int16,
        dtypes.int32,
        dtypes.int64,
        dtypes.uint8,
        dtypes.uint16,
        dtypes.uint32,
        dtypes.uint64,
        dtypes.float16,
        dtypes.bfloat16,
        dtypes.float32,
        dtypes.float64,
    )
}

_INT_BOUNDS: dict[DType, tuple[int, int]] = {d: (int(d.min), int(d.max)) for d in _SCALARS.values() if d.is_int}

_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}


def _category_rank(d: DType) -> int:
    return _CATEGORY[d.kind]


def promote_types(a: DType, b: DType) -> DType:
    """The result dtype of a binary op on tensors of dtypes a and b, as torch.promote_types gives it.

    bool < integers < floats; within a category the wider wins; a signed and an unsigned integer meet
    in the smallest signed integer that holds both (uint64 with a signed integer gives int64, where
    PyTorch refuses); float16 with bfloat16 gives float32.
    """
    a, b = a.scalar, b.scalar
    if a == b:
        return a
    ca, cb = _CATEGORY[a.kind], _CATEGORY[b.kind]
    if ca != cb:
        return a if ca > cb else b
    if a.is_float:
        if {a.name, b.name} == {"float16", "bfloat16"}:
            return dtypes.float32
        return a if a.itemsize > b.itemsize else b
    if a.kind == b.kind:
        return a if a.itemsize > b.itemsize else b
    signed, unsigned = (a, b) if a.kind == "i" else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    return {1: dtypes.int16, 2: dtypes.int32}.get(unsigned.itemsize, dtypes.int64)


def least_upper_dtype(*ds: DType) -> DType:
    out = ds[0]
    for d in ds[1:]:
        out = promote_types(out, d)
    return out


def to_dtype(x: DType | str) -> DType:
    """Accept a DType or its name ('float32', 'int8' ...)."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        return dtypes.from_name(x)
    raise TypeError(f"expected a DType or a dtype name, got {type(x).__name__}")


def truncate(dtype: DType, x: int | float | bool) -> int | float | bool:
    """Bring a Python value into the range and precision of `dtype`, as storing it would."""
    if type(x) is int and (bounds := _INT_BOUNDS.get(dtype)) is not None and bounds[0] <= x <= bounds[1]:
        return x  # (most constants: an index or a size, already a value of its int dtype)
    if dtype.is_bool:
        return bool(x)
    if dtype.is_int:
        if isinstance(x, float):
            x = _float_to_int(x, dtype)
        mod = 1 << dtype.bits
        x = int(x) & (mod - 1)
        return x - mod if dtype.kind == "i" and x >= mod // 2 else x
    if isinstance(x, int) and not isinstance(x, bool) and abs(x) > 2**53:
        x = _round_int(x, {"float16": 11, "bfloat16": 8, "float32": 24}.get(dtype.name, 53))
    x = float(x)
    if dtype.name == "float32":
        return _round_f32(x)
    if dtype.name == "float16":
        return _round_f16(x)
    if dtype.name == "bfloat16":
        return bf16_to_float(float_to_bf16(x))
    return x


def _float_to_int(x: float, dtype: DType) -> int:
    """A float cast to an integer type, as tiny defines it on every device: toward zero. Where the value
    does not fit (NaN, infinities, too large) int32 gives its minimum, as x86 does, and every other integer
    type gives int64's minimum; narrower types then keep its low bits, as a cast through int64 does."""
    lo = -(2**31) if dtype.kind == "i" and dtype.itemsize == 4 else -(2**63)
    if math.isnan(x) or not lo <= x < -lo:
        return lo
    return int(x)


def _round_int(x: int, mantissa_bits: int) -> int:
    """x rounded to the nearest integer with that many significant bits, ties to even (no double rounding)."""
    sign, mag = (-1 if x < 0 else 1), abs(x)
    drop = mag.bit_length() - mantissa_bits
    if drop <= 0:
        return x
    q, r = divmod(mag, 1 << drop)
    half = 1 << (drop - 1)
    if r > half or (r == half and q & 1):
        q += 1
    return sign * (q << drop)


def _round_f32(x: float) -> float:
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _round_f16(x: float) -> float:
    try:
        return struct.unpack("e", struct.pack("e", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def float_to_bf16(x: float) -> int:
    """The bfloat16 bit pattern of x, rounded to nearest even."""
    if math.isnan(x):
        return 0x7FC0
    bits = struct.unpack("I", struct.pack("f", _round_f32(x)))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16) & 0xFFFF


def bf16_to_float(bits: int) -> float:
    return struct.unpack("f", struct.pack("I", (bits & 0xFFFF) << 16))[0]
