"""float64 exp2, log2 and sin for AMD GPUs, which have no instructions for them (LLVM's AMDGPU backend cannot select
llvm.sin.f64 and friends without ROCm's device library, which tiny does not use). The AMDGPU and HIP renderers
call these functions for float64 and define them in the kernel's module: LLVM IR text for one, C for the other, the
same algorithm in both, built on what the hardware has (fma, rint, floor, ldexp, frexp in double):

  exp2(x): n = rint(x), f = x - n in [-1/2, 1/2]; 2**f by its Taylor series in f (14 terms, error < 1e-17);
           ldexp(2**f, n). x is clamped to [-1100, 1100] first (0 and inf come out of ldexp); NaN stays NaN.
  log2(x): x = m * 2**e with m in [sqrt(1/2), sqrt(2)); s = (m-1)/(m+1); ln m = 2 (s + s**3/3 + ... + s**23/23);
           e + ln(m)/ln 2. log2(0) = -inf, log2(inf) = inf, negative and NaN give NaN.
  sin(x):  k = rint(x * 2/pi); r = x - k pi/2 with pi/2 in three parts (Cody and Waite, with fma), |r| <= pi/4;
           sin r or cos r by their Taylor series, signed by k mod 4. Accurate to a few ulp while k*pi/2 is well
           represented (|x| up to about 1e9); beyond that the reduction loses digits (no Payne-Hanek).

The coefficients are computed here, in Decimal, and written as exact double constants.
"""

from __future__ import annotations

import struct
from decimal import Decimal, getcontext

getcontext().prec = 60
_PI = Decimal("3.141592653589793238462643383279502884197169399375105820974944592307816406")
_LN2 = Decimal(2).ln()


def _factorial(n: int) -> Decimal:
    out = Decimal(1)
    for i in range(2, n + 1):
        out *= i
    return out


EXP2_COEFFS = [float(_LN2**k / _factorial(k)) for k in range(14)]  # 2**f = sum c_k f**k
LOG_COEFFS = [float(Decimal(2) / (2 * k + 1)) for k in range(12)]  # ln m = s * sum d_k s**(2k)
SIN_COEFFS = [float((-1) ** k / _factorial(2 * k + 1)) for k in range(10)]  # sin r = r * sum a_k r**(2k)
COS_COEFFS = [float((-1) ** k / _factorial(2 * k)) for k in range(11)]  # cos r = sum b_k r**(2k)
_HALF_PI = _PI / 2
PIO2_1 = float(_HALF_PI)
PIO2_2 = float(_HALF_PI - Decimal(PIO2_1))
PIO2_3 = float(_HALF_PI - Decimal(PIO2_1) - Decimal(PIO2_2))
TWO_OVER_PI = float(2 / _PI)
INV_LN2 = float(1 / _LN2)
SQRT_HALF = float(Decimal("0.5").sqrt())

FUNCTIONS = ("exp2", "log2", "sin")


def _d(x: float) -> str:
    """A double as LLVM IR writes it exactly."""
    return "0x" + struct.pack(">d", x).hex().upper()


# ---------------------------------------------------------------- LLVM IR


def _horner_ir(lines: list[str], name: str, coeffs: list[float], var: str) -> str:
    """p = c_n; p = fma(p, var, c_{n-1}) ... ; returns the name of the result."""
    acc = _d(coeffs[-1])
    for i, c in enumerate(reversed(coeffs[:-1])):
        lines.append(f"  %{name}{i} = call double @llvm.fma.f64(double {acc}, double {var}, double {_d(c)})")
        acc = f"%{name}{i}"
    return acc


def _exp2_ir() -> str:
    lines = [
        "  %lo = call double @llvm.maxnum.f64(double %x, double -1100.0)",
        "  %c = call double @llvm.minnum.f64(double %lo, double 1100.0)",
        "  %n = call double @llvm.rint.f64(double %c)",
        "  %f = fsub double %c, %n",
    ]
    p = _horner_ir(lines, "p", EXP2_COEFFS, "%f")
    lines += [
        "  %ni = fptosi double %n to i32",
        f"  %r = call double @llvm.ldexp.f64.i32(double {p}, i32 %ni)",
        "  %nan = fcmp uno double %x, 0.0",
        "  %out = select i1 %nan, double %x, double %r",
    ]
    return "\n".join(lines)


def _log2_ir() -> str:
    lines = [
        "  %fr = call { double, i32 } @llvm.frexp.f64.i32(double %x)",
        "  %m0 = extractvalue { double, i32 } %fr, 0",
        "  %e0 = extractvalue { double, i32 } %fr, 1",
        f"  %small = fcmp olt double %m0, {_d(SQRT_HALF)}",
        "  %m2 = fmul double %m0, 2.0",
        "  %m = select i1 %small, double %m2, double %m0",
        "  %e1 = sub i32 %e0, 1",
        "  %e = select i1 %small, i32 %e1, i32 %e0",
        "  %num = fsub double %m, 1.0",
        "  %den = fadd double %m, 1.0",
        "  %s = fdiv double %num, %den",
        "  %s2 = fmul double %s, %s",
    ]
    q = _horner_ir(lines, "q", LOG_COEFFS, "%s2")
    inf = _d(float("inf"))
    lines += [
        f"  %ln = fmul double %s, {q}",
        f"  %l2 = fmul double %ln, {_d(INV_LN2)}",
        "  %ef = sitofp i32 %e to double",
        "  %r = fadd double %ef, %l2",
        f"  %isinf = fcmp oeq double %x, {inf}",
        "  %iszero = fcmp oeq double %x, 0.0",
        "  %bad = fcmp ult double %x, 0.0",  # negative or NaN
        f"  %r1 = select i1 %isinf, double {inf}, double %r",
        f"  %r2 = select i1 %iszero, double {_d(float('-inf'))}, double %r1",
        f"  %out = select i1 %bad, double {_d(float('nan'))}, double %r2",
    ]
    return "\n".join(lines)


def _sin_ir() -> str:
    lines = [
        f"  %t = fmul double %x, {_d(TWO_OVER_PI)}",
        "  %k = call double @llvm.rint.f64(double %t)",
        "  %nk = fneg double %k",
        f"  %ra = call double @llvm.fma.f64(double %nk, double {_d(PIO2_1)}, double %x)",
        f"  %rb = call double @llvm.fma.f64(double %nk, double {_d(PIO2_2)}, double %ra)",
        f"  %r = call double @llvm.fma.f64(double %nk, double {_d(PIO2_3)}, double %rb)",
        "  %quarter = fmul double %k, 0.25",
        "  %fl = call double @llvm.floor.f64(double %quarter)",
        "  %q4 = call double @llvm.fma.f64(double %fl, double -4.0, double %k)",  # k mod 4, exact
        "  %finite = fcmp ord double %q4, 0.0",
        "  %q4s = select i1 %finite, double %q4, double 0.0",
        "  %q = fptosi double %q4s to i32",
        "  %r2 = fmul double %r, %r",
    ]
    s = _horner_ir(lines, "s", SIN_COEFFS, "%r2")
    c = _horner_ir(lines, "c", COS_COEFFS, "%r2")
    lines += [
        f"  %sr = fmul double %r, {s}",
        "  %odd = and i32 %q, 1",
        "  %usecos = icmp ne i32 %odd, 0",
        f"  %v = select i1 %usecos, double {c}, double %sr",
        "  %half = and i32 %q, 2",
        "  %flip = icmp ne i32 %half, 0",
        "  %nv = fneg double %v",
        "  %out = select i1 %flip, double %nv, double %v",
    ]
    return "\n".join(lines)


_IR_BODIES = {"exp2": _exp2_ir, "log2": _log2_ir, "sin": _sin_ir}
IR_DECLARES = (
    "declare double @llvm.fma.f64(double, double, double)",
    "declare double @llvm.rint.f64(double)",
    "declare double @llvm.floor.f64(double)",
    "declare double @llvm.maxnum.f64(double, double)",
    "declare double @llvm.minnum.f64(double, double)",
    "declare double @llvm.ldexp.f64.i32(double, i32)",
    "declare { double, i32 } @llvm.frexp.f64.i32(double)",
)


def ir_name(fn: str) -> str:
    return f"tiny_{fn}_f64"


def ir_function(fn: str) -> str:
    """The LLVM IR definition of tiny_<fn>_f64(double) -> double (it needs IR_DECLARES in the module)."""
    body = _IR_BODIES[fn]()
    return f"define internal double @{ir_name(fn)}(double %x) alwaysinline {{\n{body}\n  ret double %out\n}}\n"


# ---------------------------------------------------------------- C


def _horner_c(coeffs: list[float], var: str) -> str:
    acc = repr(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = f"__builtin_fma({acc}, {var}, {c!r})"
    return acc


def c_function(fn: str) -> str:
    """The C definition of `static inline double tiny_<fn>_f64(double x)`."""
    head = f"static inline double {ir_name(fn)}(double x) {{\n"
    if fn == "exp2":
        body = (
            "  double c = __builtin_fmin(__builtin_fmax(x, -1100.0), 1100.0);\n"
            "  double n = __builtin_rint(c), f = c - n;\n"
            f"  double r = __builtin_ldexp({_horner_c(EXP2_COEFFS, 'f')}, (int)n);\n"
            "  return x != x ? x : r;\n"
        )
    elif fn == "log2":
        body = (
            "  int e; double m = __builtin_frexp(x, &e);\n"
            f"  if (m < {SQRT_HALF!r}) {{ m *= 2.0; e -= 1; }}\n"
            "  double s = (m - 1.0) / (m + 1.0), s2 = s * s;\n"
            f"  double r = (double)e + s * {_horner_c(LOG_COEFFS, 's2')} * {INV_LN2!r};\n"
            "  if (x == __builtin_inf()) return x;\n"
            "  if (x == 0.0) return -__builtin_inf();\n"
            '  return (x < 0.0 || x != x) ? __builtin_nan("") : r;\n'
        )
    elif fn == "sin":
        body = (
            f"  double k = __builtin_rint(x * {TWO_OVER_PI!r});\n"
            f"  double r = __builtin_fma(-k, {PIO2_1!r}, x);\n"
            f"  r = __builtin_fma(-k, {PIO2_2!r}, r);\n"
            f"  r = __builtin_fma(-k, {PIO2_3!r}, r);\n"
            "  double q4 = __builtin_fma(__builtin_floor(k * 0.25), -4.0, k);\n"
            "  int q = q4 == q4 ? (int)q4 : 0;\n"
            "  double r2 = r * r;\n"
            f"  double v = (q & 1) ? {_horner_c(COS_COEFFS, 'r2')} : r * {_horner_c(SIN_COEFFS, 'r2')};\n"
            "  return (q & 2) ? -v : v;\n"
        )
    else:
        raise ValueError(f"no float64 {fn} here; expected one of {FUNCTIONS}")
    return head + body + "}\n"
