"""The symbolic rules: each family on its own, then random expressions checked by brute force over every assignment."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiny.ir.alu import exec_alu
from tiny.ir.dtypes import DType, dtypes, truncate
from tiny.ir.symbolic import simplify, symbolic
from tiny.ir.uop import Ops, UOp
from tiny.ir.views import View

i32 = dtypes.int32


def var(name: str, lo: int, hi: int, dtype: DType = i32) -> UOp:
    return UOp(Ops.DEFINE_VAR, dtype, arg=(name, lo, hi))


def special(name: str, size: int) -> UOp:
    return UOp(Ops.SPECIAL, i32, arg=(name, size))


def c(value: Any, dtype: DType = i32) -> UOp:
    return UOp.const(dtype, value)


r = UOp.range(8, 0)  # [0, 7]
s = UOp.range(4, 1)  # [0, 3]
g = special("gidx0", 16)  # [0, 15]
n = var("n", -3, 3)  # takes negative values
big = var("big", i32.min, i32.max)  # anything: arithmetic on it may wrap
f = UOp(Ops.DEFINE_VAR, dtypes.float32, arg=("f", 0, 0))  # an opaque float


# ---- brute-force evaluation


def _variables(u: UOp) -> list[UOp]:
    return [x for x in u.toposort if x.op in (Ops.RANGE, Ops.SPECIAL, Ops.DEFINE_VAR)]


def _values(v: UOp) -> list[int]:
    """Every value of a small variable; the edges and a spread of values between them for a big one."""
    lo, hi = int(v.vmin), int(v.vmax)
    if hi - lo <= 256:
        return list(range(lo, hi + 1))
    return sorted(x for x in {lo, lo + 1, -(2**20) - 3, -7, -1, 0, 1, 5, 2**20 + 1, hi - 1, hi} if lo <= x <= hi)


def evaluate(u: UOp, env: dict[UOp, Any]) -> Any:
    """The value of u where each variable takes its value from env, by exec_alu: the semantics the rules keep."""
    vals: dict[UOp, Any] = {}
    for x in u.toposort:
        if x in env:
            vals[x] = env[x]
        elif x.op is Ops.CONST:
            vals[x] = x.arg
        elif x.op is Ops.CAST:
            (src,) = x.src
            vals[x] = truncate(x.dtype, vals[src])
        else:
            vals[x] = exec_alu(x.op, x.dtype, tuple(vals[y] for y in x.src))
    return vals[u]


def assert_same_values(before: UOp, after: UOp) -> None:
    variables = _variables(before)
    assert set(_variables(after)) <= set(variables), "simplifying must not invent variables"
    for assignment in itertools.product(*(_values(v) for v in variables)):
        env = dict(zip(variables, assignment))
        want, got = evaluate(before, env), evaluate(after, env)
        same = want == got and type(want) is type(got) or (isinstance(want, float) and math.isnan(want) and got != got)
        assert same, f"at {[(v.arg, x) for v, x in env.items()]}: {want!r} became {got!r}\n{before}\n->\n{after}"


def check(before: UOp, expected: UOp | None = None) -> UOp:
    """Simplify, check the value everywhere, that simplifying again changes nothing, and the expected form."""
    after = simplify(before)
    assert_same_values(before, after)
    assert simplify(after) is after, f"not a fixed point:\n{after}"
    if expected is not None:
        assert after is expected, f"expected\n{expected}\ngot\n{after}"
    return after


# ---- constant folding


def test_fold_int_constants() -> None:
    check(c(3) + c(4), c(7))
    check((c(7) // c(-2)), c(-3))  # C truncation
    check((c(-7) % c(2)), c(-1))  # sign of the dividend
    check(c(3).lt(c(4)), c(True, dtypes.bool))
    check(c(100, dtypes.int8) + c(100, dtypes.int8), c(-56, dtypes.int8))  # wraps like the dtype
    check(c(1) << c(4), c(16))
    check(c(5).cast(dtypes.float32), c(5.0, dtypes.float32))


def test_fold_float_constants() -> None:
    check(c(1.5, dtypes.float32) * c(2.0, dtypes.float32), c(3.0, dtypes.float32))
    check(c(0.1, dtypes.float32) + c(0.2, dtypes.float32), c(truncate(dtypes.float32, 0.1 + 0.2), dtypes.float32))
    check(-c(0.0, dtypes.float32), c(-0.0, dtypes.float32))
    check(c(2.7, dtypes.float32).cast(i32), c(2))


def test_no_fold_of_vectors_or_undefined_ops() -> None:
    v2 = i32.vec(2)
    vec = UOp(Ops.ADD, v2, (c((1, 2), v2), c((3, 4), v2)))
    assert simplify(vec) is vec
    shift = c(1) << c(-1)  # a negative shift count has no meaning to fold to
    assert simplify(shift) is shift


# ---- identities


def test_int_identities() -> None:
    check(r + 0, r)
    check(r * 1, r)
    check(big * 0, c(0))
    check(big // 1, big)
    check(big % 1, c(0))
    check(r - r, c(0))
    check(big + (-big), c(0))
    check(big.alu(Ops.NEG).alu(Ops.NEG), big)
    check(big.maximum(big), big)
    check((big & 0), c(0))
    check((big | 0), big)
    check((big ^ big), c(0))
    check(big.ne(big), c(False, dtypes.bool))
    check(big.lt(big), c(False, dtypes.bool))


def test_bool_identities() -> None:
    b = r.lt(5)
    check(b & True, b)
    check(b & False, c(False, dtypes.bool))
    check(b | False, b)
    check(b | True, c(True, dtypes.bool))
    check(b & b, b)
    check(b | b, b)
    check(b.where(c(True, dtypes.bool), c(False, dtypes.bool)), b)


def test_where() -> None:
    check(c(True, dtypes.bool).where(r, s), r)
    check(c(False, dtypes.bool).where(r, s), s)
    check(r.lt(3).where(big, big), big)
    check(r.lt(100).where(r, s), r)  # the condition is decided by bounds


def test_a_load_whose_gate_is_known() -> None:
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(8), (), 0)
    zero = UOp.const(dtypes.float32, 0.0)

    def load(gate: UOp) -> UOp:
        return UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, buf.dtype, (buf, r, gate)), zero))

    assert simplify(load(r.lt(100))) is UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, buf.dtype, (buf, r)),))
    assert simplify(load(r.lt(0))) is zero  # never inside: the alternative, no memory read
    assert simplify(load(r.lt(3))).address.gate is not None  # decided at run time


def test_a_store_whose_gate_holds_is_plain() -> None:
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(8), (), 0)
    value = UOp.const(dtypes.float32, 1.0)

    def store(gate: UOp) -> UOp:
        return UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, r, gate)), value))

    assert simplify(store(r.lt(100))) is UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, r)), value))
    assert simplify(store(r.lt(3))).address.gate is not None  # decided at run time


def test_float_rules_stay_exact() -> None:
    zero, one = c(0.0, dtypes.float32), c(1.0, dtypes.float32)
    for unsafe in (f * zero, f + zero, f - f, zero + f, f * 0, (f + one) + one, f.ne(f), f / f):
        assert simplify(unsafe) is unsafe, f"{unsafe} is not exact for NaN, inf or -0.0"
    assert simplify(f * one) is f
    assert simplify(f / one) is f
    assert simplify(f + c(-0.0, dtypes.float32)) is f
    assert simplify(f.alu(Ops.NEG).alu(Ops.NEG)) is f
    assert simplify(f.maximum(f)) is f
    assert simplify(f.lt(f)) is c(False, dtypes.bool)


# ---- bounds


def test_bounds_fold() -> None:
    check(r.lt(8), c(True, dtypes.bool))
    check(r.lt(0), c(False, dtypes.bool))
    check(r.ne(-1), c(True, dtypes.bool))
    check(s // 4, c(0))
    check(s % 4, s)
    check(r % 8, r)
    check((r + 8) // 4, r // 4 + 2)
    check((r + 8) % 8, r)
    check((s + 4).maximum(s), s + 4)
    check(r.maximum(-1), r)
    check(UOp.range(1, 7) * 5 + s, s)  # a loop that runs once is 0


# ---- canonical sums


def test_like_terms_combine() -> None:
    check(r * 2 + r * 3, r * 5)
    check(r + r, r * 2)
    check(r + s + r, r * 2 + s)
    check(r * 3 - r * 3 + s, s)
    check(((r * 2) * 3), r * 6)


def test_constants_gather_last() -> None:
    check((r + 3) + s + 4, r + s + 7)
    check(c(5) + r, r + 5)
    check(3 * r, r * 3)
    check(big - 1 + 1, big)  # exact: the ring wraps the same way both ways


def test_constants_distribute() -> None:
    check((r + 1) * 3, r * 3 + 3)
    check((r + s) * 4, r * 4 + s * 4)
    check(-(r - s), r * -1 + s)
    check((r * 2) * (s * 3), (r * s) * 6)


def test_div_mod_recombine() -> None:
    check((big // 4) * 4 + big % 4, big)
    check((big // 4) * 8 + (big % 4) * 2, big * 2)
    check((n // -3) * -3 + n % -3, n)
    assert check((n // 4) * 5 + n % 4) is not n
    check((r * 3 + g) // 5 * 10 + (r * 3 + g) % 5 * 2, r * 6 + g * 2)


# ---- division and remainder


def test_split_multiples() -> None:
    check((r * 4 + s) // 4, r)
    check((r * 4 + s) % 4, s)
    check((s + r * 4) // 4, r)
    check((r * 8 + s * 2 + UOp.range(2, 2)) // 2, r * 4 + s)
    check((r * 4 + s + 4) // 4, r + 1)
    check((r * 4 + s + 5) % 4, (s + 1) % 4)  # s + 1 spans two multiples of 4
    check((r * 4 + g) // 4, r + g // 4)
    check((r * 4 + g) % 4, g % 4)
    check((g * 16 + r * 2 + s // 2) // 2 % 8, r)


def test_common_factor() -> None:
    check((r * 4 + s * 2) // 2, r * 2 + s)
    check((n * 6 + 4) // 4, (n * 3 + 2) // 2)  # n < 0 is allowed: cancelling a factor is exact
    check((n * 6 + 4) % 4, ((n * 3 + 2) % 2) * 2)
    check((n * 4) // 4, n)
    check((n * 4) % 4, c(0))


def test_nested_div_mod() -> None:
    check((big // 2) // 3, big // 6)
    check((big % 12) % 4, big % 4)
    check((big % 3) % 4, big % 3)
    check((big % 12) // 4, (big // 4) % 3)
    check((big % 4) // 4, c(0))
    check(big // -4, (big // 4) * -1)
    check(big % -4, big % 4)


def test_negative_dividends_do_not_split() -> None:
    # (n*4 + s)//4 is not n: for n = -1, s = 1 it is -3//4 == 0 with truncation
    assert check((n * 4 + s) // 4) is not n
    assert check((n * 4 + s) % 4) is not s
    check((n + 4) // 4)


def test_wrapping_blocks_division_rules() -> None:
    assert check((big * 4) // 4) is not big  # big*4 wraps
    assert check((big + 4) // 4) is not big // 4 + 1
    x8 = var("x8", -100, 100, dtypes.int8)
    assert check((x8 * 2) // 2) is not x8
    check((x8 + 1).lt(5))
    check((var("z8", -128, 127, dtypes.int8) // 16) // 8)  # not z8 // 128: 128 is no int8
    # the sum fits in int8, but its part y*3 alone does not: splitting the multiples of 4 off must not happen
    x, y = var("x", -2, -1, dtypes.int8), var("y", 3, 43, dtypes.int8)
    check((x * 4 + y * 3) // 4)
    check((x * 4 + y * 3) % 4)
    assert simplify((big + 1).lt(5)) is not big.lt(4)  # big + 1 wraps at the top


# ---- comparisons


def test_compare_moves_constants() -> None:
    check((r + 3).lt(5), r.lt(2))
    check(c(5).lt(r + 3), c(2).lt(r))
    check((r + s + 3).ne(5), (r + s).ne(2))


def test_compare_divides_out_factors() -> None:
    check((r * 4).lt(10), r.lt(3))
    check(c(10).lt(r * 4), c(2).lt(r))
    check((r * 4 + s * 8).lt(13), (r + s * 2).lt(4))
    check((r * 4).ne(10), c(True, dtypes.bool))
    check((r * 4).ne(12), r.ne(3))
    check((n * 4).lt(-5), n.lt(-1))


def test_valid_chain() -> None:
    check(r.lt(5) & r.lt(3), r.lt(3))
    check(r.lt(3) & s.lt(2) & r.lt(5), r.lt(3) & s.lt(2))
    check(c(1).lt(r) & c(3).lt(r) & r.lt(7), c(3).lt(r) & r.lt(7))
    check(c(4).lt(r) & r.lt(3), c(False, dtypes.bool))
    check(r.lt(4) & s.lt(9) & r.lt(4), r.lt(4))
    check(c(-1).lt(r) & r.lt(4), r.lt(4))


def test_padded_index() -> None:
    # a window of 3 sliding over 8 elements padded by 1 on each side: element o + k - 1, valid where in range
    o, k = UOp.range(7, 10), UOp.range(3, 11)
    idx, valid = View.create((8,)).pad(((1, 1),)).to_index([o + k])
    assert valid is not None
    check(idx, o + k + -1)
    check(valid, c(0).lt(o + k))  # o + k <= 8 < 9: that clause is always true
    # a padded, then reshaped index splits back into its dims
    check(((r + 1) * 4 + s - 4) // 4, r)
    check(((r + 1) * 4 + s - 4) % 4, s)
    check(((g // 4) * 4 + g % 4 + 1) // 4, (g + 1) // 4)


# ---- random expressions, checked by brute force


LEAVES_I32 = [r, s, n, special("lidx0", 3), var("m", -5, 2)]
LEAVES_I8 = [UOp.range(6, 20, dtypes.int8), var("p", -4, 4, dtypes.int8), var("q", 100, 127, dtypes.int8)]


def random_int_expr(rng: random.Random, depth: int, leaves: list[UOp], dtype: DType) -> UOp:
    if depth == 0 or rng.random() < 0.15:
        return rng.choice(leaves) if rng.random() < 0.75 else c(rng.randint(-9, 9), dtype)
    a = random_int_expr(rng, depth - 1, leaves, dtype)
    b = random_int_expr(rng, depth - 1, leaves, dtype)
    d1, d2 = rng.choice([1, 2, 3, 4, 5, 6, 8, 16]), rng.choice([1, 2, 3, 4, 5, 8, -2, -3])
    kind = rng.choice(["add", "sub", "mulc", "mul", "neg", "div", "mod", "divmod", "max", "where", "cmp", "and"])
    if kind == "add":
        return a + b
    if kind == "sub":
        return a - b
    if kind == "mulc":
        return a * rng.choice([-3, -1, 2, 3, 4, 8])
    if kind == "mul":
        return a * b
    if kind == "neg":
        return -a
    if kind in ("div", "mod"):
        divisor = b if rng.random() < 0.15 else c(d2, dtype)
        return a // divisor if kind == "div" else a % divisor
    if kind == "divmod":  # nested division and remainder by constants, and index-like sums divided
        pick = rng.randrange(5)
        if pick == 0:
            return (a % d1) % d2
        if pick == 1:
            return (a % d1) // d2
        if pick == 2:
            return (a // d1) // d2
        if pick == 3:
            k = rng.choice([1, -2, 3])
            return (a // d1) * (d1 * k + rng.choice([0, 0, 1])) + a % d1 * k
        return (a * rng.choice([2, 4, 6]) + b) // abs(d2) % d1
    if kind == "max":
        return a.maximum(b)
    if kind == "where":
        return a.lt(b).where(a, b + 1)
    if kind == "cmp":
        return ((a + rng.randint(-9, 9)).lt(rng.randint(-6, 9)) & a.ne(b)).cast(dtype)
    return a & c(rng.choice([1, 3, 7]), dtype)


def random_compare(rng: random.Random, leaves: list[UOp], dtype: DType) -> UOp:
    """A scaled sum plus a constant compared with a constant, with constants big enough to wrap small dtypes."""
    x = sum((rng.choice(leaves) * rng.choice([1, 2, 3, 4, -2]) for _ in range(rng.randint(1, 2))), c(0, dtype))
    x = x + rng.randint(-120, 120)
    d = rng.randint(-120, 120)
    if rng.random() < 0.3:
        return x.ne(d)
    return x.lt(d) if rng.random() < 0.5 else c(d, dtype).lt(x)


def random_valid(rng: random.Random, leaves: list[UOp]) -> UOp:
    """An AND chain of comparisons of small index sums with constants, like the `valid` of a padded view."""
    out: UOp | None = None
    for _ in range(rng.randint(1, 5)):
        x = sum((rng.choice(leaves) * rng.choice([1, 1, 2, 4, -1]) for _ in range(rng.randint(1, 2))), c(0))
        x = x + rng.randint(-4, 4)
        clause = x.lt(rng.randint(-3, 12)) if rng.random() < 0.6 else c(rng.randint(-5, 8)).lt(x)
        if rng.random() < 0.15:
            clause = x.ne(rng.randint(-2, 6))
        out = clause if out is None else (out & clause if rng.random() < 0.85 else out | clause)
    assert out is not None
    return out


@pytest.mark.parametrize("seed", range(6))
def test_random_int32_expressions(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(60):
        check(random_int_expr(rng, rng.randint(1, 4), LEAVES_I32[:3] + [rng.choice(LEAVES_I32[3:])], i32))


@pytest.mark.parametrize("seed", range(4))
def test_random_int8_expressions_that_wrap(seed: int) -> None:
    rng = random.Random(1000 + seed)
    for _ in range(60):
        check(random_int_expr(rng, rng.randint(1, 4), LEAVES_I8, dtypes.int8))


@pytest.mark.parametrize("seed", range(2))
def test_random_int8_comparisons_that_wrap(seed: int) -> None:
    rng = random.Random(3000 + seed)
    for _ in range(150):
        check(random_compare(rng, LEAVES_I8, dtypes.int8))


@pytest.mark.parametrize("seed", range(4))
def test_random_valid_chains(seed: int) -> None:
    rng = random.Random(2000 + seed)
    for _ in range(60):
        check(random_valid(rng, [r, s, n]))


@st.composite
def index_exprs(draw: st.DrawFn, depth: int = 3) -> UOp:
    """Index-like expressions: sums of scaled variables, divided and reduced by constants, and compared."""
    if depth == 0 or draw(st.integers(0, 4)) == 0:
        return draw(st.sampled_from([r, s, n, c(draw(st.integers(-8, 8)))]))
    a, b = draw(index_exprs(depth - 1)), draw(index_exprs(depth - 1))
    k = draw(st.integers(-4, 8))
    d = draw(st.sampled_from([1, 2, 3, 4, 8, -3]))
    op = draw(st.sampled_from(["lin", "div", "mod", "max", "where"]))
    if op == "lin":
        return a * k + b
    if op == "div":
        return (a * k + b) // d
    if op == "mod":
        return (a * k + b) % d
    if op == "max":
        return a.maximum(b)
    return (a * k).lt(b + d).where(a, b)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(index_exprs())
def test_hypothesis_index_expressions(e: UOp) -> None:
    check(e)


# ---- size: 10,000-node graphs (these check the results; the benchmarks, not the tests, time them)


def test_long_chain_of_one_range() -> None:
    x = c(0)
    for _ in range(10_000):
        x = x + r
    assert len(x.toposort) > 10_000
    assert simplify(x) is r * 10_000


def test_long_chain_of_like_terms() -> None:
    ranges = [UOp.range(3 + i, 100 + i) for i in range(8)]
    x, want = c(0), dict.fromkeys(ranges, 0)
    for i in range(3400):  # an ADD, a MUL and a CONST each: over 10,000 nodes
        x = x + ranges[i % 8] * (i + 1)
        want[ranges[i % 8]] += i + 1
    assert len(x.toposort) > 10_000
    first, *rest = want.items()
    expected = first[0] * first[1]
    for var_, k in rest:
        expected = expected + var_ * k
    assert simplify(x) is expected


def test_long_chain_of_distinct_terms() -> None:
    xs = [var(f"v{i}", 0, i + 1) for i in range(5000)]
    x = xs[0]
    for i, v in enumerate(xs[1:]):
        x = x + v + 1 if i % 100 == 0 else x + v  # constants scattered through a sum too long to flatten
    assert len(x.toposort) > 10_000
    assert x.vmax == sum(i + 1 for i in range(5000)) + 50  # bounds of a deep graph do not recurse
    out = simplify(x)
    *_, last = out.src
    assert out.op is Ops.ADD and last is c(50), "the constants gather at the end"
    assert simplify(out) is out


def test_long_float_chain_is_left_alone() -> None:
    x = f
    for i in range(5000):
        x = x + c(float(i), dtypes.float32)  # float addition does not reassociate: nothing to fold
    assert len(x.toposort) > 10_000
    assert simplify(x) is x


def test_matcher_is_named() -> None:
    assert symbolic.name == "symbolic"


def test_linear_forms_let_their_bases_go() -> None:
    """The linear forms' memo holds each node weakly: a base's form (itself, coefficient 1) must not hold the node,
    or every loop counter and load a kernel's index math reads would live on after the kernel is rendered."""
    import gc
    import weakref

    from tiny.ir.symbolic import linear_form

    r = UOp.range(16, 7)
    load = UOp(Ops.SPECIAL, dtypes.int32, (), ("gidx0", 8))
    expr = r * 4 + load * 64 + 3
    assert linear_form(expr) == ({r: 4, load: 64}, 3) and linear_form(r) == ({r: 1}, 0)
    alive = [weakref.ref(u) for u in (r, load, expr)]
    del r, load, expr
    gc.collect()
    assert all(ref() is None for ref in alive)


def test_a_sum_of_terms_is_known_to_be_a_multiple_of_their_common_factor() -> None:
    """known_multiple: the gcd of a size's constant and its terms' coefficients, true for every value of its
    Variables (a prompt chunk's keys so far, chunk * 32 + 32, is a multiple of 32); 1 where nothing more is known."""
    from tiny.ir.sint import Variable, sadd, smul, ssimplify, sym_eval
    from tiny.ir.symbolic import known_multiple

    chunk, pos = Variable("chunk", 0, 15), Variable("pos", 0, 511)
    sizes = {
        ssimplify(smul(sadd(chunk, 1), 32)): 32,
        ssimplify(sadd(smul(chunk, 48), smul(pos, 64))): 16,
        ssimplify(sadd(smul(chunk, 32), 12)): 4,
        ssimplify(sadd(pos, 1)): 1,
        pos: 1,
    }
    for size, multiple in sizes.items():
        assert known_multiple(size) == multiple, (size, known_multiple(size))
        values = [sym_eval(size, {"chunk": c, "pos": p}) for c in range(16) for p in (0, 7, 300, 511)]
        assert all(v % multiple == 0 for v in values)  # (what it says holds at every value)
        assert multiple == 1 or any(v % (2 * multiple) for v in values)  # (and no more is known)
