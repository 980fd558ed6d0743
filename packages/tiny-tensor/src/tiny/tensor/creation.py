"""Creating tensors: constants, ranges, identity matrices, random numbers (the same on every device) and the
weight initializers of torch.nn.init."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tiny.ir.device import Device, device_supports
from tiny.ir.dtypes import DType, dtypes, to_dtype, truncate
from tiny.ir.multi import multi, relayout, shard_bounds
from tiny.ir.sint import check_size, highest, lowest, ssub
from tiny.ir.uop import Ops, UOp
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import check_dtype, default_int, on_device, wide_ints
from tiny.tensor.shapes import prod, shape_arg

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool
Shape = int | Sequence[int]


def _leaf_option(make: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Give a creation function PyTorch's requires_grad= keyword: requires_grad=True makes what it creates a
    leaf that gradients accumulate into (a float tensor only, as requires_grad says)."""

    @functools.wraps(make)
    def made(*args: Any, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        out = make(*args, **kwargs)
        if requires_grad is not None:
            out.requires_grad = requires_grad
        return out

    return made


class _Rng:
    """The counter-based generator's state: a seed and how many draws have been made."""

    seed: int = 0
    counter: int = 0


RNG = _Rng()


class CreationOps(TensorBase):
    __slots__ = ()

    # ---- constants and ranges

    @classmethod
    @_leaf_option
    def full(
        cls, shape: Sequence[int] | int, fill: Scalar, dtype: DType | str | None = None, device: str | None = None
    ) -> Tensor:
        """A tensor of one value (an expanded scalar: it takes no memory until computed with).

        >>> Tensor.full((2, 2), 7).tolist()
        [[7, 7], [7, 7]]
        """
        shape = shape_arg(shape)
        return cls(fill, device=device, dtype=dtype).reshape((1,) * len(shape)).expand(shape)

    @classmethod
    @_leaf_option
    def zeros(cls, *shape: Shape, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Zeros, float32 unless dtype says otherwise.

        >>> Tensor.zeros(2, 3).tolist()
        [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
        """
        return cls.full(shape_arg(shape), 0, dtype or dtypes.default_float, device)

    @classmethod
    @_leaf_option
    def ones(cls, *shape: Shape, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Ones, float32 unless dtype says otherwise.

        >>> Tensor.ones(3, dtype="int32").tolist()
        [1, 1, 1]
        """
        return cls.full(shape_arg(shape), 1, dtype or dtypes.default_float, device)

    @classmethod
    @_leaf_option
    def empty(cls, *shape: Shape, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """A tensor whose values are not specified, as torch.empty; here they are zeros, so nothing is left unset.

        >>> Tensor.empty(2, 2).shape
        (2, 2)
        """
        return cls.zeros(*shape, dtype=dtype, device=device)

    @classmethod
    @_leaf_option
    def arange(
        cls,
        start: Scalar,
        stop: Scalar | None = None,
        step: Scalar = 1,
        dtype: DType | str | None = None,
        device: str | None = None,
    ) -> Tensor:
        """Evenly spaced values in [start, stop), like torch.arange: start + i * step for i below
        ceil((stop - start) / step). Computed on the device when used; creating even a huge range allocates nothing.

        >>> Tensor.arange(1, 7, 2).tolist()
        [1, 3, 5]
        """
        if stop is None:
            start, stop = 0, start
        if isinstance(start, UOp) or isinstance(stop, UOp):
            return _symbolic_arange(cls, start, stop, step, dtype, device)
        n = _arange_length(start, stop, step)
        dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
        dt = to_dtype(dtype) if dtype is not None else on_device(dtypes.from_py([start, stop, step]), dev)
        if dt.is_bool:
            raise TypeError("arange() computes numbers and cannot make bool values (as PyTorch); give a number dtype")
        check_dtype(dev, dt)
        last = start + (n - 1) * step if n else start
        if dt.is_int:
            if any(isinstance(v, float) and not v.is_integer() for v in (start, stop, step)):
                raise ValueError(
                    f"arange({start}, {stop}, {step}, dtype={dt.name}): an integer dtype needs whole numbers for "
                    "start, stop and step (PyTorch truncates them, differently for int32 and int64)"
                )
            start, step, last = int(start), int(step), int(last)
            wide = default_int(dev)
            for v in (start, last):
                if not dt.min <= v <= dt.max:
                    raise ValueError(
                        f"arange({start}, {stop}, {step}) of {n} values reaches {v}, which {dt.name} cannot hold "
                        f"(it holds {dt.min}..{dt.max})"
                    )
            if not all(wide.min <= v <= wide.max for v in (start, last, last - start)):
                raise ValueError(
                    f"arange({start}, {stop}, {step}) is counted in {wide.name} on {dev}, which cannot hold its values"
                )
            counted = _counting(cls, n, wide, dev)
            return (counted * step + start).cast(dt) if n else cls.full((0,), 0, dt, dev)
        for v in (start, last):
            if math.isinf(truncate(dt, v)):
                raise ValueError(f"arange({start}, {stop}, {step}) of {n} values reaches {v}, past {dt.name}'s range")
        if n - 1 > default_int(dev).max:
            raise ValueError(f"arange() of {n} values counts past {default_int(dev).name}, the widest int on {dev}")
        if n == 0:
            return cls.full((0,), 0, dt, dev)
        wide = dtypes.float64 if device_supports(dev, dtypes.float64) else dtypes.float32
        return (_counting(cls, n, default_int(dev), dev).cast(wide) * step + start).cast(dt)

    @classmethod
    @_leaf_option
    def linspace(
        cls, start: float, end: float, steps: int, dtype: DType | str | None = None, device: str | None = None
    ) -> Tensor:
        """`steps` evenly spaced values from start to end, both included, like torch.linspace.

        >>> Tensor.linspace(0, 1, 5).tolist()
        [0.0, 0.25, 0.5, 0.75, 1.0]
        """
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise ValueError(f"linspace() needs a number of steps that is an int >= 0, got {steps!r}")
        for name, v in (("start", start), ("end", end)):
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise TypeError(f"linspace() takes a number as {name}, got {type(v).__name__}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if dt == dtypes.bool:
            raise TypeError("linspace() computes numbers and cannot make bool values (as PyTorch); give a number dtype")
        i = np.arange(steps, dtype=np.float64)
        step = (end - start) / (steps - 1) if steps > 1 else 0.0
        # the first half counts up from start, the second down from end: both ends are exact
        values = np.where(i < max(steps // 2, 1), start + i * step, end - (steps - 1 - i) * step)
        return cls(values, device=device, dtype=dt)

    @classmethod
    @_leaf_option
    def eye(cls, n: int, m: int | None = None, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """The n x m identity matrix.

        >>> Tensor.eye(2).tolist()
        [[1.0, 0.0], [0.0, 1.0]]
        """
        m = n if m is None else m
        rows = cls.arange(n, device=device).reshape(n, 1)
        cols = cls.arange(m, device=device).reshape(1, m)
        return (rows == cols).cast(dtype or dtypes.default_float)

    @_leaf_option
    def full_like(self, fill: Scalar, dtype: DType | str | None = None) -> Tensor:
        """A tensor of one value with this one's shape, device and (unless given) dtype; on several devices, split
        along the same axis as this one.

        >>> Tensor([1, 2]).full_like(9).tolist()
        [9, 9]
        """
        out = type(self).full(self.shape, fill, dtype or self.dtype, self.device)
        if self.uop.op is Ops.MULTI and self.uop.arg is not None:  # (slices of the one value on each device)
            out = self._new(multi(relayout(out.uop, self.uop.arg, shard_bounds(self.uop)), self.uop.arg))
        return out

    @_leaf_option
    def zeros_like(self, dtype: DType | str | None = None) -> Tensor:
        """Zeros shaped like this tensor.

        >>> Tensor([1.5, 2.5]).zeros_like().tolist()
        [0.0, 0.0]
        """
        return self.full_like(0, dtype)

    @_leaf_option
    def ones_like(self, dtype: DType | str | None = None) -> Tensor:
        """Ones shaped like this tensor.

        >>> Tensor([1.5, 2.5]).ones_like().tolist()
        [1.0, 1.0]
        """
        return self.full_like(1, dtype)

    @_leaf_option
    def empty_like(self, dtype: DType | str | None = None) -> Tensor:
        """Unspecified values shaped like this tensor; here zeros, as Tensor.empty.

        >>> Tensor([1.5, 2.5]).empty_like().shape
        (2,)
        """
        return self.zeros_like(dtype)

    # ---- random numbers: a counter-based hash of (seed, draw, position), computed with integer ops and
    # correctly rounded float ops only, so that every device gives the same numbers

    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        """Restart the random numbers from `seed`: the draws that follow repeat, on every device.

        >>> Tensor.manual_seed(1); a = Tensor.rand(3); Tensor.manual_seed(1); (Tensor.rand(3) == a).tolist()
        [True, True, True]
        """
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"manual_seed() takes an int, got {type(seed).__name__}")
        RNG.seed, RNG.counter = seed, 0

    @classmethod
    def _random_bits(cls, shape: tuple[int, ...], device: str | None) -> Tensor:
        """Uniform uint32 bits from a counter-based hash: the same numbers on every device."""
        RNG.counter += 1
        key = _mix32(_mix32(RNG.seed & 0xFFFFFFFF) ^ _mix32(RNG.seed >> 32) ^ RNG.counter)
        n = prod(shape)
        counter = cls.arange(n, dtype=dtypes.uint32, device=device)
        # the key uploaded, not a constant: every draw of one shape is the same kernel, scheduled and compiled once (a
        # model's random initial weights took a compile per parameter)
        x = counter ^ cls(np.array([key], np.uint32), device=device).reshape(())
        for mult in (0x7FEB352D, 0x846CA68B):
            x = (x ^ (x >> 16)) * mult
        x = x ^ (x >> 16)
        return x.reshape(shape)

    @classmethod
    @_leaf_option
    def rand(cls, *shape: Shape, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Uniform samples in [0, 1), on a grid as fine as the dtype's significand (2**-24 for float32).

        >>> x = Tensor.rand(100); x.min().item() >= 0 and x.max().item() < 1
        True
        """
        dt = _float_dtype(dtype, "rand")
        bits = _SIGNIFICAND_BITS.get(dt, 24)
        wide = dtypes.float64 if bits > 24 else dtypes.float32
        k = cls._random_bits(shape_arg(shape), device) >> (32 - bits)  # an integer below 2**bits: exact as a float
        return (k.cast(wide) * 2.0**-bits).cast(dt)

    @classmethod
    @_leaf_option
    def randn(cls, *shape: Shape, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Standard normal samples (Box-Muller on two uniform draws).

        >>> Tensor.randn(2, 3).shape
        (2, 3)
        """
        dt = _float_dtype(dtype, "randn")
        shp = shape_arg(shape)
        u = ((cls._random_bits(shp, device) >> 8) + 1).cast(dtypes.float32) * 2.0**-24  # in (0, 1]: log(u) is finite
        turn = cls._random_bits(shp, device) >> 8  # the angle, in 2**-24 turns
        return ((_log_unit(u) * -2).sqrt() * _cos_turns(turn)).cast(dt)

    @classmethod
    @_leaf_option
    def randint(
        cls,
        low: int,
        high: int | Sequence[int] | None = None,
        shape: Shape | None = None,
        dtype: DType | str | None = None,
        device: str | None = None,
    ) -> Tensor:
        """Uniform integers in [low, high), int64 unless dtype says otherwise; randint(high, shape) starts at 0.

        >>> x = Tensor.randint(3, 7, (100,)); x.min().item() >= 3 and x.max().item() < 7
        True
        """
        if shape is None and isinstance(high, (tuple, list)):
            low, high, shape = 0, low, high  # torch.randint(high, size)
        if high is None:
            low, high = 0, low
        for name, v in (("low", low), ("high", high)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"randint() takes an int as {name}, got {v!r}")
        if low >= high:
            raise ValueError(f"randint() needs low < high, got low={low} and high={high}")
        dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
        dt = to_dtype(dtype) if dtype is not None else default_int(dev)
        if dtype is None and (low < dt.min or high - 1 > dt.max):
            wide_ints(dev, f"randint() of [{low}, {high}) needs int64")
        if dt.is_bool or (dt.is_int and (low < dt.min or high - 1 > dt.max)):
            raise ValueError(f"randint() of [{low}, {high}) does not fit dtype {dt.name}")
        shp = shape_arg(shape if shape is not None else ())
        span = high - low
        bits = cls._random_bits(shp, dev)
        if span > 2**32:  # a 64-bit draw from two 32-bit ones
            bits = (bits.cast(dtypes.uint64) << 32) | cls._random_bits(shp, dev).cast(dtypes.uint64)
        offset = bits % span if span < 2**32 else bits.cast(dtypes.uint64) % span
        if dt.is_float:
            return (offset.cast(default_int(dev)) + low).cast(dt)
        return offset.cast(dt) + low  # wraps back into range where low < 0

    @classmethod
    @_leaf_option
    def uniform(
        cls,
        *shape: Shape,
        low: float = 0.0,
        high: float = 1.0,
        dtype: DType | str | None = None,
        device: str | None = None,
    ) -> Tensor:
        """Uniform samples in [low, high).

        >>> x = Tensor.uniform(100, low=-2, high=2); x.min().item() >= -2 and x.max().item() < 2
        True
        """
        dt = _float_dtype(dtype, "uniform")
        return (cls.rand(*shape, device=device) * (high - low) + low).cast(dt)

    @classmethod
    @_leaf_option
    def normal(
        cls,
        *shape: Shape,
        mean: float = 0.0,
        std: float = 1.0,
        dtype: DType | str | None = None,
        device: str | None = None,
    ) -> Tensor:
        """Normal samples with the given mean and standard deviation.

        >>> Tensor.normal(2, 3, mean=1.0, std=0.5).shape
        (2, 3)
        """
        dt = _float_dtype(dtype, "normal")
        if std < 0:
            raise ValueError(f"normal() needs std >= 0, got {std}")
        return (cls.randn(*shape, device=device) * std + mean).cast(dt)

    @_leaf_option
    def rand_like(self, dtype: DType | str | None = None) -> Tensor:
        """Uniform samples in [0, 1) shaped like this tensor (its dtype unless one is given).

        >>> Tensor.zeros(2, 3).rand_like().shape
        (2, 3)
        """
        return type(self).rand(*self.shape, dtype=dtype or self._random_dtype("rand_like"), device=self.device)

    @_leaf_option
    def randn_like(self, dtype: DType | str | None = None) -> Tensor:
        """Standard normal samples shaped like this tensor (its dtype unless one is given).

        >>> Tensor.zeros(2, 3).randn_like().shape
        (2, 3)
        """
        return type(self).randn(*self.shape, dtype=dtype or self._random_dtype("randn_like"), device=self.device)

    def _random_dtype(self, name: str) -> DType:
        if not self.dtype.is_float:
            raise TypeError(f"{name}() of a {self.dtype.name} tensor needs a float dtype=")
        return self.dtype

    # ---- weight initializers, as torch.nn.init (fans from the shape: (out, in, *kernel))

    @classmethod
    @_leaf_option
    def xavier_uniform(
        cls, *shape: Shape, gain: float = 1.0, dtype: DType | str | None = None, device: str | None = None
    ) -> Tensor:
        """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)), as torch.nn.init.xavier_uniform_.

        >>> Tensor.xavier_uniform(3, 5).abs().max().item() <= (6 / 8) ** 0.5
        True
        """
        fan_in, fan_out = _fans(shape_arg(shape), "xavier_uniform")
        a = gain * math.sqrt(6.0 / (fan_in + fan_out))
        return cls.uniform(*shape, low=-a, high=a, dtype=dtype, device=device)

    glorot_uniform = xavier_uniform

    @classmethod
    @_leaf_option
    def xavier_normal(
        cls, *shape: Shape, gain: float = 1.0, dtype: DType | str | None = None, device: str | None = None
    ) -> Tensor:
        """N(0, std**2) with std = gain * sqrt(2 / (fan_in + fan_out)), as torch.nn.init.xavier_normal_.

        >>> Tensor.xavier_normal(3, 5).shape
        (3, 5)
        """
        fan_in, fan_out = _fans(shape_arg(shape), "xavier_normal")
        std = gain * math.sqrt(2.0 / (fan_in + fan_out))
        return cls.normal(*shape, std=std, dtype=dtype, device=device)

    @classmethod
    @_leaf_option
    def kaiming_uniform(
        cls,
        *shape: Shape,
        a: float = 0.0,
        mode: str = "fan_in",
        nonlinearity: str = "leaky_relu",
        dtype: DType | str | None = None,
        device: str | None = None,
    ) -> Tensor:
        """U(-b, b) with b = gain * sqrt(3 / fan), as torch.nn.init.kaiming_uniform_ (a: leaky_relu's slope).

        >>> Tensor.kaiming_uniform(4, 6).abs().max().item() <= (6 / 6) ** 0.5
        True
        """
        std = _gain(nonlinearity, a) / math.sqrt(_fan(shape_arg(shape), mode, "kaiming_uniform"))
        bound = math.sqrt(3.0) * std
        return cls.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device)

    @classmethod
    @_leaf_option
    def kaiming_normal(
        cls,
        *shape: Shape,
        a: float = 0.0,
        mode: str = "fan_in",
        nonlinearity: str = "leaky_relu",
        dtype: DType | str | None = None,
        device: str | None = None,
    ) -> Tensor:
        """N(0, std**2) with std = gain / sqrt(fan), as torch.nn.init.kaiming_normal_.

        >>> Tensor.kaiming_normal(4, 6).shape
        (4, 6)
        """
        std = _gain(nonlinearity, a) / math.sqrt(_fan(shape_arg(shape), mode, "kaiming_normal"))
        return cls.normal(*shape, std=std, dtype=dtype, device=device)

    @classmethod
    @_leaf_option
    def scaled_uniform(cls, *shape: Shape, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """U(-1, 1) / sqrt(number of elements).

        >>> Tensor.scaled_uniform(4, 4).abs().max().item() <= 0.25
        True
        """
        n = prod(shape_arg(shape))
        scale = 1 / math.sqrt(n) if n else 1.0
        return cls.uniform(*shape, low=-scale, high=scale, dtype=dtype, device=device)


# ---------------------------------------------------------------- helpers

# the bits of each float dtype's significand: rand() fills them all
_SIGNIFICAND_BITS = {dtypes.float16: 11, dtypes.bfloat16: 8, dtypes.float32: 24, dtypes.float64: 32}
_LN2 = math.log(2)


def _float_dtype(dtype: DType | str | None, name: str) -> DType:
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if not dt.is_float:
        raise TypeError(f"{name}() makes floats; got dtype {dt.name} (use randint for integers)")
    return dt


def _mix32(x: int) -> int:
    x &= 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & 0xFFFFFFFF
    x = ((x ^ (x >> 15)) * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _horner(x: Tensor, coeffs: Sequence[float]) -> Tensor:
    out = x * coeffs[-1] + coeffs[-2]
    for c in reversed(coeffs[:-2]):
        out = out * x + c
    return out


def _log_unit(u: Tensor) -> Tensor:
    """ln(u) for float32 u in [2**-24, 1], from the exponent bits and a series (no device log: same on all)."""
    bits = u.bitcast(dtypes.uint32)
    e = (bits >> 23).cast(dtypes.int32) - 127  # u = m * 2**e with m in [1, 2)
    m = ((bits & 0x7FFFFF) | 0x3F800000).bitcast(dtypes.float32)
    high = m > math.sqrt(2)  # m in [sqrt(1/2), sqrt(2)) keeps the series short
    m, e = high.where(m * 0.5, m), e + high.cast(dtypes.int32)
    s = (m - 1) / (m + 1)  # ln(m) = 2 atanh(s), |s| <= 0.172
    return e.cast(dtypes.float32) * _LN2 + 2 * s * _horner(s * s, [1 / (2 * k + 1) for k in range(6)])


def _cos_turns(turn: Tensor) -> Tensor:
    """cos(2 pi turn / 2**24) for uint32 turn < 2**24, by quadrant and a Taylor series (no device sin)."""
    quadrant = turn >> 22
    f = (turn & 0x3FFFFF).cast(dtypes.float32) * 2.0**-22  # the position in the quadrant, in [0, 1)
    odd = (quadrant & 1).cast(dtypes.bool)
    x = odd.where(1 - f, f) * (math.pi / 2)  # cos in quadrants 1 and 3 is -+sin, a cos of the mirrored angle
    c = _horner(x * x, [(-1) ** k / math.factorial(2 * k) for k in range(9)])
    flip = (quadrant == 1) | (quadrant == 2)
    return flip.where(-c, c)


def _fans(shape: tuple[int, ...], name: str) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight shaped (out, in, *kernel), as torch.nn.init computes them."""
    if len(shape) < 2:
        raise ValueError(f"{name}() needs a shape of at least 2 dimensions (out, in, ...), got {shape}")
    receptive = prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _fan(shape: tuple[int, ...], mode: str, name: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"{name}() takes mode='fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _fans(shape, name)
    fan = fan_in if mode == "fan_in" else fan_out
    if fan == 0:
        raise ValueError(f"{name}() of shape {shape} has {mode} 0")
    return fan


def _gain(nonlinearity: str, a: float) -> float:
    """torch.nn.init.calculate_gain: the factor that keeps a layer's output variance for this nonlinearity."""
    linear = ("linear", "identity", "sigmoid", "conv1d", "conv2d", "conv3d")
    if nonlinearity in linear or nonlinearity.startswith("conv_transpose"):
        return 1.0
    gains = {"tanh": 5.0 / 3, "relu": math.sqrt(2.0), "selu": 0.75, "leaky_relu": math.sqrt(2.0 / (1 + a * a))}
    if nonlinearity not in gains:
        raise ValueError(f"unknown nonlinearity {nonlinearity!r}; expected one of {sorted((*linear, *gains))}")
    return gains[nonlinearity]


def _arange_length(start: Scalar, stop: Scalar, step: Scalar) -> int:
    """How many values arange(start, stop, step) has, by torch.arange's rule: ceil((stop - start) / step), exact for
    ints and in double precision otherwise; a step that leads away from stop is an error, as in PyTorch."""
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if not isinstance(v, (int, float)):
            raise TypeError(f"arange() takes a number as {name}, got {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"arange() needs a finite {name}, got {v}")
    if step == 0:
        raise ValueError("arange() step must not be zero")
    if (step > 0 and start > stop) or (step < 0 and start < stop):
        raise ValueError(f"arange({start}, {stop}, {step}): a step of that sign never goes from start to stop")
    if all(isinstance(v, int) for v in (start, stop, step)):
        return -((start - stop) // step)
    return math.ceil((float(stop) - float(start)) / float(step))


def _symbolic_arange(
    cls: type[Tensor], start: Any, stop: Any, step: Any, dtype: DType | str | None, device: str | None
) -> Tensor:
    """arange where start or stop is a size of bound Variables (step 1): start, start + 1, ... below stop, counted
    to the largest length the Variables allow and cut to the length they give."""
    if step != 1:
        raise ValueError(f"arange() with a symbolic start or stop takes step 1, got step {step!r}")
    start, stop = check_size(start, "arange()'s start"), check_size(stop, "arange()'s stop")
    n = ssub(stop, start)
    if lowest(n) < 0:
        raise ValueError(f"arange({start}, {stop}): stop may be below start for some values of the Variables")
    dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
    dt = to_dtype(dtype) if dtype is not None else default_int(dev)
    check_dtype(dev, dt)
    wide = default_int(dev)
    most = highest(n)
    counted = _counting(cls, most, wide, dev) if most else cls.full((0,), 0, wide, dev)
    counted = counted.shrink(((0, n),))
    first = cls(start, device=dev).cast(wide) if isinstance(start, UOp) else start
    return (counted + first).cast(dt)


def _counting(cls: type[Tensor], n: int, dtype: DType, device: str) -> Tensor:
    """0, 1, ..., n-1 in an integer dtype: an ARANGE, which takes no memory; each kernel that reads it computes its
    values in place from the index (a causal mask is a comparison of two loop counters)."""
    return cls(UOp(Ops.ARANGE, dtype, (UOp(Ops.DEVICE, arg=device),), n))
