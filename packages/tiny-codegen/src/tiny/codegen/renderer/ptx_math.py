"""float64 exp2, log2 and sin for the PTX renderer: PTX has no float64 transcendental instructions (ex2, lg2 and sin
are float32 approximations), so these are written out as instructions: a reduction of the argument, a polynomial by
Horner's rule with fma, and the special values by predicates.

- exp2(x) = 2^n * 2^f with n = rint(x), |f| <= 1/2; 2^f = e^(f ln 2) by its Taylor series to degree 13; the scaling by
  2^n goes in two halves so that subnormal results round once.
- log2(x) = e + log2(m) with m in [sqrt(1/2), sqrt(2)]; log2(m) = 2/ln 2 * atanh(s), s = (m - 1)/(m + 1), by the
  series of atanh to s^23. Subnormal inputs are scaled by 2^54 first.
- sin(x): x = k pi/2 + r with |r| <= pi/4 (pi/2 in two parts, by fma), then sin(r) or cos(r) by their Taylor series
  to degree 17 and 16, by the quadrant k mod 4. Accurate while k fits 32 bits (|x| below about 3e9).

Each is within a few ulp of the correctly rounded result. `k` is the renderer's kernel under construction: it hands
out registers (`k.reg("b64")`) and takes instructions (`k.emit("...")`).
"""

from __future__ import annotations

import math
import struct
from typing import Any


def _d(v: float) -> str:
    return "0d" + struct.pack(">d", v).hex().upper()


_EXP2 = [math.log(2) ** i / math.factorial(i) for i in range(14)]  # 2^f = sum of (f ln 2)^i / i!
_ATANH = [1 / (2 * i + 1) for i in range(12)]  # atanh(s) / s = sum of z^i / (2i + 1), z = s^2
_SIN = [(-1) ** i / math.factorial(2 * i + 1) for i in range(9)]  # sin(r) / r = sum of (-1)^i z^i / (2i + 1)!
_COS = [(-1) ** i / math.factorial(2 * i) for i in range(9)]  # cos(r) = sum of (-1)^i z^i / (2i)!
PIO2_HI = math.pi / 2
PIO2_LO = 6.123233995736766e-17  # pi/2 - PIO2_HI


def _horner(k: Any, x: str, coefficients: list[float]) -> str:
    """sum of coefficients[i] * x^i."""
    acc = k.reg("b64")
    k.emit(f"mov.b64 {acc}, {_d(coefficients[-1])}")
    for c in reversed(coefficients[:-1]):
        k.emit(f"fma.rn.f64 {acc}, {acc}, {x}, {_d(c)}")
    return acc


def _pow2(k: Any, n: str) -> str:
    """2^n as a float64, for a 32-bit n in the normal range [-1022, 1023]."""
    wide, out = k.reg("b64"), k.reg("b64")
    k.emit(f"cvt.s64.s32 {wide}, {n}")
    k.emit(f"add.s64 {wide}, {wide}, 1023")
    k.emit(f"shl.b64 {out}, {wide}, 52")
    return out


def exp2_f64(k: Any, x: str) -> str:
    xc, n_f, f, n, half, rest = (k.reg(t) for t in ("b64", "b64", "b64", "b32", "b32", "b32"))
    k.emit(f"min.f64 {xc}, {x}, {_d(1100.0)}")  # beyond these 2^x is inf or 0 anyway (NaN is put back below)
    k.emit(f"max.f64 {xc}, {xc}, {_d(-1100.0)}")
    k.emit(f"cvt.rni.f64.f64 {n_f}, {xc}")
    k.emit(f"sub.f64 {f}, {xc}, {n_f}")
    p = _horner(k, f, _EXP2)
    k.emit(f"cvt.rzi.s32.f64 {n}, {n_f}")
    k.emit(f"shr.s32 {half}, {n}, 1")
    k.emit(f"sub.s32 {rest}, {n}, {half}")
    out = k.reg("b64")
    k.emit(f"mul.f64 {out}, {p}, {_pow2(k, half)}")
    k.emit(f"mul.f64 {out}, {out}, {_pow2(k, rest)}")
    nan = k.reg("pred")
    k.emit(f"setp.nan.f64 {nan}, {x}, {x}")
    k.emit(f"selp.b64 {out}, {x}, {out}, {nan}")
    return out


def log2_f64(k: Any, x: str) -> str:
    tiny, scaled, bits, e64, e, m, s, num, den, z = (
        k.reg(t) for t in ("pred", "b64", "b64", "b64", "b32", "b64", "b64", "b64", "b64", "b64")
    )
    k.emit(f"setp.lt.f64 {tiny}, {x}, {_d(2.0**-1022)}")  # subnormal (or zero, negative: fixed below): scale up
    k.emit(f"mul.f64 {scaled}, {x}, {_d(2.0**54)}")
    k.emit(f"selp.b64 {scaled}, {scaled}, {x}, {tiny}")
    k.emit(f"mov.b64 {bits}, {scaled}")
    k.emit(f"shr.u64 {e64}, {bits}, 52")
    k.emit(f"and.b64 {e64}, {e64}, 2047")
    k.emit(f"cvt.u32.u64 {e}, {e64}")
    k.emit(f"sub.s32 {e}, {e}, 1023")
    k.emit(f"and.b64 {m}, {bits}, 0xFFFFFFFFFFFFF")
    k.emit(f"or.b64 {m}, {m}, 0x3FF0000000000000")  # the mantissa as a float in [1, 2)
    big = k.reg("pred")
    k.emit(f"setp.gt.f64 {big}, {m}, {_d(math.sqrt(2))}")
    k.emit(f"@{big} mul.f64 {m}, {m}, {_d(0.5)}")
    k.emit(f"@{big} add.s32 {e}, {e}, 1")
    k.emit(f"@{tiny} sub.s32 {e}, {e}, 54")
    k.emit(f"sub.f64 {num}, {m}, {_d(1.0)}")
    k.emit(f"add.f64 {den}, {m}, {_d(1.0)}")
    k.emit(f"div.rn.f64 {s}, {num}, {den}")
    k.emit(f"mul.f64 {z}, {s}, {s}")
    series = _horner(k, z, _ATANH)
    out, ef = k.reg("b64"), k.reg("b64")
    k.emit(f"mul.f64 {out}, {series}, {s}")
    k.emit(f"cvt.rn.f64.s32 {ef}, {e}")
    k.emit(f"fma.rn.f64 {out}, {out}, {_d(2 / math.log(2))}, {ef}")
    bad, zero, inf = k.reg("pred"), k.reg("pred"), k.reg("pred")
    k.emit(f"setp.ltu.f64 {bad}, {x}, {_d(0.0)}")  # negative or NaN: NaN
    k.emit(f"setp.eq.f64 {zero}, {x}, {_d(0.0)}")
    k.emit(f"setp.eq.f64 {inf}, {x}, {_d(math.inf)}")
    k.emit(f"@{zero} mov.b64 {out}, {_d(-math.inf)}")
    k.emit(f"@{inf} mov.b64 {out}, {_d(math.inf)}")
    k.emit(f"@{bad} mov.b64 {out}, {_d(math.nan)}")
    return out


def sin_f64(k: Any, x: str) -> str:
    kf, r, z, q = k.reg("b64"), k.reg("b64"), k.reg("b64"), k.reg("b32")
    k.emit(f"mul.f64 {kf}, {x}, {_d(2 / math.pi)}")
    k.emit(f"cvt.rni.f64.f64 {kf}, {kf}")
    k.emit(f"neg.f64 {r}, {kf}")
    k.emit(f"fma.rn.f64 {r}, {r}, {_d(PIO2_HI)}, {x}")
    neg_k = k.reg("b64")
    k.emit(f"neg.f64 {neg_k}, {kf}")
    k.emit(f"fma.rn.f64 {r}, {neg_k}, {_d(PIO2_LO)}, {r}")
    k.emit(f"mul.f64 {z}, {r}, {r}")
    sin_r = _horner(k, z, _SIN)
    k.emit(f"mul.f64 {sin_r}, {sin_r}, {r}")
    cos_r = _horner(k, z, _COS)
    k.emit(f"cvt.rzi.s32.f64 {q}, {kf}")
    k.emit(f"and.b32 {q}, {q}, 3")
    odd, negate = k.reg("pred"), k.reg("pred")
    out, bit = k.reg("b64"), k.reg("b32")
    k.emit(f"and.b32 {bit}, {q}, 1")
    k.emit(f"setp.ne.u32 {odd}, {bit}, 0")
    k.emit(f"selp.b64 {out}, {cos_r}, {sin_r}, {odd}")
    k.emit(f"and.b32 {bit}, {q}, 2")
    k.emit(f"setp.ne.u32 {negate}, {bit}, 0")
    k.emit(f"@{negate} neg.f64 {out}, {out}")
    return out


def _ilogb(k: Any, x: str) -> str:
    """floor(log2(x)) of a positive finite float64, subnormals included, as a 32-bit integer."""
    bits, e64, m, lz, e, sub = k.reg("b64"), k.reg("b64"), k.reg("b64"), k.reg("b32"), k.reg("b32"), k.reg("pred")
    k.emit(f"mov.b64 {bits}, {x}")
    k.emit(f"shr.u64 {e64}, {bits}, 52")
    k.emit(f"cvt.u32.u64 {e}, {e64}")
    k.emit(f"sub.s32 {e}, {e}, 1023")
    k.emit(f"setp.eq.s32 {sub}, {e}, -1023")  # a subnormal: its exponent is where its highest bit is
    k.emit(f"and.b64 {m}, {bits}, 0xFFFFFFFFFFFFF")
    k.emit(f"clz.b64 {lz}, {m}")
    k.emit(f"@{sub} neg.s32 {lz}, {lz}")
    k.emit(f"@{sub} add.s32 {e}, {lz}, -1011")  # (64 - lz) - 1 - 1074
    return e


def fmod_f64(k: Any, a: str, b: str) -> str:
    """fmod(a, b), exactly: |a| reduced by |b| * 2^e for the largest such that fits, each step exact (the two are
    within a factor of two) and halving the remainder at least, until it is below |b|; the sign is a's. NaN where a
    is infinite, b is zero or either is NaN; a itself where b is infinite."""
    r, big, t, half, p = k.reg("b64"), k.reg("b64"), k.reg("b64"), k.reg("b64"), k.reg("b64")
    done, again, small = k.label("fmod_done"), k.label("fmod_loop"), k.reg("pred")
    k.emit(f"abs.f64 {r}, {a}")
    k.emit(f"abs.f64 {big}, {b}")
    zero = k.reg("pred")
    k.emit(f"setp.eq.f64 {zero}, {big}, {_d(0.0)}")  # fmod(a, 0) is NaN (below); nothing to reduce by
    k.emit(f"@{zero} bra {done}")
    k.put(again)
    k.emit(f"setp.ltu.f64 {small}, {r}, {big}")  # r < |b|, or a NaN: finished
    k.emit(f"@{small} bra {done}")
    infinite = k.reg("pred")
    k.emit(f"setp.eq.f64 {infinite}, {r}, {_d(math.inf)}")
    k.emit(f"@{infinite} bra {done}")
    e = k.reg("b32")
    k.emit(f"sub.s32 {e}, {_ilogb(k, r)}, {_ilogb(k, big)}")
    k.emit(f"mov.b64 {t}, {big}")
    third = k.reg("b32")
    for part in range(3):  # 2^e in three factors: each one a normal float64 for e up to 2098
        if part < 2:
            k.emit(f"div.s32 {third}, {e}, {3 - part}")
        else:
            k.emit(f"mov.b32 {third}, {e}")
        k.emit(f"sub.s32 {e}, {e}, {third}")
        k.emit(f"mul.f64 {t}, {t}, {_pow2(k, third)}")
    over = k.reg("pred")
    k.emit(f"setp.gt.f64 {over}, {t}, {r}")
    k.emit(f"mul.f64 {half}, {t}, {_d(0.5)}")
    k.emit(f"selp.b64 {t}, {half}, {t}, {over}")
    k.emit(f"sub.f64 {r}, {r}, {t}")
    k.emit(f"bra {again}")
    k.put(done)
    out, nan = k.reg("b64"), k.reg("pred")
    k.emit(f"mov.b64 {p}, {a}")
    k.emit(f"and.b64 {p}, {p}, 0x8000000000000000")  # a's sign
    k.emit(f"mov.b64 {out}, {r}")
    k.emit(f"or.b64 {out}, {out}, {p}")
    k.emit(f"abs.f64 {r}, {a}")
    k.emit(f"setp.equ.f64 {nan}, {r}, {_d(math.inf)}")  # a infinite or NaN
    bad = k.reg("pred")
    k.emit(f"setp.equ.f64 {bad}, {big}, {_d(0.0)}")  # b zero or NaN
    k.emit(f"or.pred {nan}, {nan}, {bad}")
    k.emit(f"@{nan} mov.b64 {out}, {_d(math.nan)}")
    return out
