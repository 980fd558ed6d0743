"""Symbolic simplification of kernel graphs: constant folding, identities, and integer index algebra.

Integer ADD, MUL and NEG wrap in their dtype, so they form the ring of integers modulo 2**bits: flattening sums,
combining like terms and distributing constants are exact there, whatever the values. IDIV and MOD truncate toward
zero (as in C), so every rule about them checks with bounds that the dividend does not wrap, and where the rule
needs it, that the dividend is not negative. Floats get only rules that are exact in IEEE arithmetic.

Sums are kept in one canonical form: terms in the order they first appear, each `base` or `base * k`, like terms
combined, and the constant last. A sum of more than `_MAX_TERMS` terms is not flattened (only its constants are
gathered), and memos keep the work for a chain of n additions O(n).
"""

from __future__ import annotations

import math
import weakref

from tiny.ir.alu import exec_alu
from tiny.ir.dtypes import DType, dtypes, truncate
from tiny.ir.pattern import PatternMatcher, UPat, graph_rewrite
from tiny.ir.uop import GroupOp, Ops, UOp

__all__ = ["linear_form", "simplify", "symbolic"]

_INTS = tuple(d for d in dtypes.all() if d.is_int)
_INTS_AND_BOOL = (*_INTS, dtypes.bool)
_FLOATS = tuple(d for d in dtypes.all() if d.is_float)
_NON_INTS = (*_FLOATS, dtypes.bool)
_MAX_TERMS = 64  # a sum of more terms is not flattened (its constants still gather at the end)
_MAX_NODES = 256  # an AND chain that reads more nodes is left as it is

Terms = dict[UOp, int]  # base -> its coefficient, in the order the bases first appear
Linear = tuple[Terms, int]  # sum(k * base) + const

# Memos of pure functions of a node, kept as long as the node lives. A chain of n additions then costs O(n):
# each ADD combines the linear forms of its two sources, and a source found canonical is not checked again.
_MISSING = object()
_BASE = object()  # the memo's entry for a base, ({node: 1}, 0): an entry holding its own key would keep it forever
_linear_memo: weakref.WeakKeyDictionary[UOp, Linear | None] = weakref.WeakKeyDictionary()
_canonical_sums: weakref.WeakSet[UOp] = weakref.WeakSet()
_too_big_chains: weakref.WeakSet[UOp] = weakref.WeakSet()


# ---- small predicates


def _is_const(u: UOp) -> bool:
    """A kernel-level constant (not a tensor-level one, which carries a VIEW source)."""
    return u.op is Ops.CONST and not u.src


def _scalar_int(u: UOp) -> bool:
    return u.dtype.is_int and u.dtype.count == 1


def _scalar_int_or_bool(u: UOp) -> bool:
    return (u.dtype.is_int or u.dtype.is_bool) and u.dtype.count == 1


def _wrap(dtype: DType, v: int) -> int:
    """v modulo 2**bits as the signed representative: the coefficients of an int sum live in that ring."""
    v &= (1 << dtype.bits) - 1
    return v - (1 << dtype.bits) if v >= 1 << (dtype.bits - 1) else v


def _fits(dtype: DType, lo: int, hi: int) -> bool:
    """Every value in [lo, hi] is a value of dtype: arithmetic that stays in there did not wrap."""
    return dtype.min <= lo and hi <= dtype.max


# ---- linear forms: an int expression as sum(k * base) + const


def linear_form(u: UOp) -> tuple[dict[UOp, int], int] | None:
    """An int expression as ({base: coefficient}, constant), reading through ADD, NEG and MUL by a constant
    (None past _MAX_TERMS terms)."""
    lin = _linear(u)
    return None if lin is None else (dict(lin[0]), lin[1])


def known_multiple(u: UOp) -> int:
    """The largest int known to divide the int expression u: the gcd of its constant and its terms' coefficients (the
    keys of a prompt chunk's attention so far, chunk * 32 + 32: 32); 1 where that is all that is known."""
    lin = _linear(u)
    return (math.gcd(lin[1], *lin[0].values()) or 1) if lin is not None else 1


def _linear(u: UOp) -> Linear | None:
    """u as sum(k * base) + const, reading through ADD, NEG and MUL by a constant; None past _MAX_TERMS terms.

    Coefficients are wrapped to the dtype and never 0; a base whose bounds meet counts as its constant. The
    result is shared (memoized): copy the dict before changing it."""
    if (hit := _linear_memo.get(u, _MISSING)) is not _MISSING:
        return ({u: 1}, 0) if hit is _BASE else hit  # type: ignore[return-value]
    stack: list[tuple[UOp, bool]] = [(u, False)]
    while stack:  # sources first, without recursing: sums can be thousands of nodes deep
        node, ready = stack.pop()
        if node in _linear_memo:
            continue
        if (parts := _parts(node)) is None:
            leaf = _leaf(node)
            _linear_memo[node] = _BASE if leaf[0] else leaf
        elif ready:
            _linear_memo[node] = _combine(node.dtype, [(_memoized(s), k) for s, k in parts])
        else:
            stack.append((node, True))
            stack.extend((s, False) for s, _ in parts if s not in _linear_memo)
    return _memoized(u)


def _memoized(u: UOp) -> Linear | None:
    hit = _linear_memo[u]
    return ({u: 1}, 0) if hit is _BASE else hit


def _parts(node: UOp) -> list[tuple[UOp, int]] | None:
    """The (source, coefficient) pairs an int ADD, NEG or MUL by a constant sums; None for anything else."""
    if node.op is Ops.ADD:
        a, b = node.src
        return [(a, 1), (b, 1)] if _same_dtype(a, node) and _same_dtype(b, node) else None
    if node.op is Ops.NEG:
        (a,) = node.src
        return [(a, -1)] if _same_dtype(a, node) else None
    if node.op is Ops.MUL:
        a, b = node.src
        if _is_const(b) and _same_dtype(a, node):
            return [(a, b.arg)]
        if _is_const(a) and _same_dtype(b, node):
            return [(b, a.arg)]
    return None


def _same_dtype(a: UOp, b: UOp) -> bool:
    return a.dtype is b.dtype or a.dtype == b.dtype


def _leaf(node: UOp) -> Linear:
    """A constant, a node whose bounds meet (its one value), or a base with coefficient 1."""
    if _is_const(node):
        return {}, _wrap(node.dtype, node.arg)
    if node.vmin == node.vmax:
        return {}, _wrap(node.dtype, int(node.vmin))
    return {node: 1}, 0


def _combine(dtype: DType, parts: list[tuple[Linear | None, int]]) -> Linear | None:
    """sum(k * part): like terms add up, and vanish when their coefficient wraps to 0."""
    terms: Terms = {}
    const = 0
    for lin, k in parts:
        if lin is None:
            return None
        part_terms, part_const = lin
        const += k * part_const
        if not terms and k == 1:
            terms = dict(part_terms)
            continue
        for b, kb in part_terms.items():
            if v := _wrap(dtype, terms.get(b, 0) + k * kb):
                terms[b] = v
            else:
                terms.pop(b, None)
    return None if len(terms) > _MAX_TERMS else (terms, _wrap(dtype, const))


def _build(dtype: DType, terms: Terms, const: int, start: UOp | None = None, clean: bool = False) -> UOp:
    """The canonical sum: terms in order (dropping zeros), `base` for a coefficient of 1, the constant last.

    `start`, a canonical sum, lends the part of its chain (and the term nodes) that these terms share with it.
    `clean` says the terms are a linear form as _linear gives it (bases that do not expand, no (x//c, x%c) pair):
    then each new node is canonical and is marked so, which spares its rewrite the check."""
    items = [(b, k) for b, k in ((b, _wrap(dtype, k)) for b, k in terms.items()) if k != 0]
    out, i, reusable = _shared_prefix(start, items) if start is not None else (None, 0, {})
    for base, k in items[i:]:
        if (term := reusable.get(base)) is None or term[1] != k:
            term = (base if k == 1 else UOp(Ops.MUL, dtype, (base, UOp.const(dtype, k))), k)
            if clean and k != 1:
                _canonical_sums.add(term[0])
        out = term[0] if out is None else UOp(Ops.ADD, dtype, (out, term[0]))
        if clean:
            _canonical_sums.add(out)
    const = _wrap(dtype, const)
    if out is None:
        return UOp.const(dtype, const)
    if const != 0:
        out = UOp(Ops.ADD, dtype, (out, UOp.const(dtype, const)))
        if clean:
            _canonical_sums.add(out)
    if clean:
        _linear_memo[out] = (dict(items), const)
    return out


def _shared_prefix(start: UOp, items: list[tuple[UOp, int]]) -> tuple[UOp | None, int, dict[UOp, tuple[UOp, int]]]:
    """The node of the canonical sum `start` that sums the longest common beginning of items, its length, and
    the term nodes of start by base (with their coefficients), to reuse."""
    if (lin := _linear(start)) is None:
        return None, 0, {}
    start_items = list(lin[0].items())
    spine, term_nodes, node = [], {}, start
    if lin[1] != 0:
        node, _ = node.src
    for base, k in reversed(start_items[1:]):
        spine.append(node)
        node, term = node.src
        term_nodes[base] = (term, k)
    spine.append(node)
    term_nodes[start_items[0][0]] = (node, start_items[0][1])
    spine.reverse()  # spine[i] sums start_items[: i + 1]
    n = 0
    while n < min(len(items), len(spine)) and items[n][0] is start_items[n][0] and items[n][1] == start_items[n][1]:
        n += 1
    return (spine[n - 1] if n else None), n, term_nodes


def _is_built(u: UOp, terms: Terms, const: int) -> bool:
    """Whether _build(u.dtype, terms, const) is u already: checked without building anything, since most sums
    a rewrite meets are canonical and hash-consing a whole new sum for each would cost more than all the rest."""
    dtype = u.dtype
    items = [(b, k) for b, k in ((b, _wrap(dtype, k)) for b, k in terms.items()) if k != 0]
    const = _wrap(dtype, const)
    if not items:
        return _is_const(u) and u.arg == truncate(dtype, const)
    node = u
    if const != 0:
        if node.op is not Ops.ADD:
            return False
        node, last = node.src
        if not (_is_const(last) and last.arg == truncate(dtype, const)):
            return False
    for i in range(len(items) - 1, -1, -1):
        base, k = items[i]
        term = node
        if i > 0:
            if node.op is not Ops.ADD:
                return False
            node, term = node.src
        if not _is_term(term, base, k):
            return False
    return True


def _is_term(term: UOp, base: UOp, k: int) -> bool:
    """Whether term is how _build writes k * base: base itself for k == 1, else base * CONST(k)."""
    if k == 1:
        return term is base
    if term.op is not Ops.MUL:
        return False
    x, c = term.src
    return x is base and _is_const(c) and c.arg == truncate(c.dtype, k)


def _sum_bounds(terms: Terms, const: int) -> tuple[int, int]:
    """The exact (unwrapped) range of sum(k * base) + const, from the bounds of the bases."""
    lo = hi = const
    for base, k in terms.items():
        a, b = k * int(base.vmin), k * int(base.vmax)
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi


def _recombine_divmod(dtype: DType, terms: Terms, const: int) -> tuple[Terms, int]:
    """(x//c)*(c*k) + (x%c)*k -> x*k: C's identity x == (x/c)*c + x%c holds for every x and every c != 0."""
    changed = True
    while changed:
        changed = False
        for base, k in list(terms.items()):
            if base.op is not Ops.MOD or base not in terms:
                continue
            x, c = base.src
            if not _is_const(c) or c.arg == 0 or (inner := _linear(x)) is None:
                continue
            div = UOp(Ops.IDIV, dtype, (x, c))
            if div not in terms or _wrap(dtype, terms[div] - k * c.arg) != 0:
                continue
            del terms[base], terms[div]
            for b, kb in inner[0].items():
                terms[b] = terms.get(b, 0) + k * kb
            const += k * inner[1]
            changed = True
    return terms, const


def _add_to_canonical(u: UOp) -> UOp | None:
    """The quick cases of u = a + b with a a canonical sum, b a constant or one plain term, which is how a chain of
    additions grows: u itself when already canonical (b new), or the sum rebuilt from where b's base sits in it
    (b a like term, or a constant). None where the general fold must decide."""
    a, b = u.src
    if a not in _canonical_sums or (la := _linear(a)) is None:
        return None
    terms, const = la
    if _is_const(b):
        if const == 0 and b.arg != 0 and b.arg == truncate(b.dtype, b.arg):
            return u
        return _build(u.dtype, terms, const + b.arg, start=a, clean=True)
    if (lb := _linear(b)) is None or lb[1] != 0 or len(lb[0]) != 1:
        return None
    ((base, k),) = lb[0].items()
    if base.op in (Ops.MOD, Ops.IDIV):  # maybe a (x//c)*c + x%c pair: the general fold recombines it
        return None
    if base not in terms:
        return u if const == 0 and (b is base if k == 1 else b in _canonical_sums) else None
    return _build(u.dtype, {**terms, base: terms[base] + k}, const, start=a, clean=True)


def _fold_int_arith(u: UOp) -> UOp | None:
    """Int ADD, NEG, and MUL by a constant: flatten, combine like terms, constant last (x*0 -> 0, x*1 -> x,
    (x+c1)*c2 -> x*c2 + c1*c2 ...). A sum too long to flatten only moves its constants to the end."""
    if u.dtype.count != 1 or u in _canonical_sums:
        return None
    if u.op is Ops.MUL and not any(_is_const(s) for s in u.src):  # a product of two variables
        return _fold_bounds(u) or _pull_constants_out(u)
    if u.op is Ops.ADD and (quick := _add_to_canonical(u)) is not None:
        if quick is u:
            _canonical_sums.add(u)
            return None
        return quick
    if (lin := _linear(u)) is None:  # too long to flatten: only the constants move, to the end
        return _gather_constants(u) if u.op is Ops.ADD else None
    terms, const = _recombine_divmod(u.dtype, dict(lin[0]), lin[1])
    if _is_built(u, terms, const):
        _canonical_sums.add(u)
        return None
    left, *_ = u.src
    return _build(u.dtype, terms, const, start=left if left in _canonical_sums else None, clean=True)


def _split_coefficient(u: UOp) -> tuple[UOp, int]:
    """x*c -> (x, c); anything else -> (u, 1)."""
    if u.op is Ops.MUL:
        x, c = u.src
        if _is_const(c):
            return x, c.arg
    return u, 1


def _pull_constants_out(u: UOp) -> UOp | None:
    """(x*c1) * (y*c2) -> (x*y) * (c1*c2), over ints: constants gather outside a product of two variables."""
    a, b = u.src
    (x, c1), (y, c2) = _split_coefficient(a), _split_coefficient(b)
    if c1 == 1 and c2 == 1:
        return None
    return UOp(Ops.MUL, u.dtype, (UOp(Ops.MUL, u.dtype, (x, y)), UOp.const(u.dtype, c1 * c2)))


# ---- constant folding


def _foldable(op: Ops, dtype: DType, values: tuple) -> bool:
    """Whether exec_alu gives this op a meaning on these operands (bit ops need ints, shifts a count >= 0)."""
    if op in (Ops.AND, Ops.OR, Ops.XOR, Ops.IDIV, Ops.MOD):
        return not dtype.is_float
    if op in (Ops.SHL, Ops.SHR):
        return dtype.is_int and values[1] >= 0
    return True


def _fold_constants(u: UOp) -> UOp | None:
    """op(constants) -> the constant exec_alu computes, wrapped or rounded to the dtype; vectors are left alone."""
    if not all(_is_const(s) and s.dtype.count == 1 for s in u.src) or u.dtype.count != 1 or u.dtype.kind == "v":
        return None
    values = tuple(s.arg for s in u.src)
    first, *_ = u.src
    if u.op is Ops.CAST:
        return UOp.const(u.dtype, first.arg)
    if not _foldable(u.op, first.dtype, values):
        return None
    return UOp.const(u.dtype, exec_alu(u.op, u.dtype, values))


def _fold_bounds(u: UOp) -> UOp | None:
    """An int or bool op whose bounds meet has one possible value: that constant."""
    if not _scalar_int_or_bool(u) or u in _canonical_sums:  # a canonical sum of terms is never constant
        return None
    lo, hi = u.vmin_vmax
    return UOp.const(u.dtype, lo) if lo == hi else None


# ---- identities that hold for every dtype, floats included


def _where_const(c: UOp, a: UOp, b: UOp) -> UOp | None:
    """A constant scalar condition picks its branch."""
    if not _is_const(c) or c.dtype.count != 1:
        return None
    return a if c.arg else b


def _add_negative_zero(x: UOp, z: UOp) -> UOp | None:
    """x + (-0.0) -> x: exact in IEEE arithmetic for every x (x + 0.0 is not: -0.0 + 0.0 is 0.0)."""
    if not x.dtype.is_float or not _is_const(z) or z.arg != 0 or math.copysign(1.0, z.arg) > 0:
        return None
    return x


def _load_constant_gate(u: UOp) -> UOp | None:
    addr, alt = u.address, u.alternative
    if addr.op is not Ops.INDEX or (gate := addr.gate) is None or gate.op is not Ops.CONST or alt is None:
        return None
    if not gate.arg:
        return alt
    plain = UOp(Ops.INDEX, addr.dtype, (addr.pointer, addr.offset), addr.arg)
    return UOp(Ops.LOAD, u.dtype, (plain, *(s for s in u.src[1:] if s is not alt)), u.arg)


def _store_true_gate(u: UOp) -> UOp | None:
    addr = u.address
    if addr.op is not Ops.INDEX or (gate := addr.gate) is None or gate.op is not Ops.CONST or not gate.arg:
        return None
    return u.replace(src=(addr.replace(src=(addr.pointer, addr.offset)), u.value))


def _cast_noop(u: UOp, x: UOp) -> UOp | None:
    """A CAST to the dtype it already has."""
    return x if u.dtype == x.dtype else None


def _false_like(u: UOp, x: UOp) -> UOp:
    """x < x and (ints) x != x: False, of u's dtype."""
    return u.const_like(False)


# ---- integer division and remainder by a constant


def _split_multiples(d: UOp, c: UOp, terms: Terms, const: int) -> UOp | None:
    """A non-negative dividend c*q + r: sum//c -> q + r//c and sum%c -> r%c, where r//c is constant if r spans
    less than one multiple of c."""
    dt, cv, is_div = d.dtype, c.arg, d.op is Ops.IDIV
    q = {b: k // cv for b, k in terms.items() if k % cv == 0}
    r = {b: k for b, k in terms.items() if k % cv != 0}
    qc, rc = divmod(const, cv)
    rlo, rhi = _sum_bounds(r, rc)
    if not _fits(dt, rlo, rhi):
        return None
    if rlo // cv == rhi // cv:  # r // c is one constant n (floor and truncation agree: the dividend is >= 0)
        n = rlo // cv
        return _build(dt, q, qc + n) if is_div else _build(dt, r, rc - n * cv)
    if rlo < 0 or not (q or qc):
        return None
    rest = _build(dt, r, rc)
    return _build(dt, {**q, UOp(Ops.IDIV, dt, (rest, c)): 1}, qc) if is_div else UOp(Ops.MOD, dt, (rest, c))


def _fold_divmod(d: UOp, x: UOp, c: UOp) -> UOp | None:
    """(sum) // c and (sum) % c by a constant c > 0, where the sum provably does not wrap:
    all multiples of c -> the quotient exactly (and remainder 0); a non-negative sum splits its multiples of c off;
    a factor g common to c and every coefficient cancels: sum//c -> (sum/g)//(c/g), sum%c -> ((sum/g)%(c/g))*g."""
    if d.dtype.count != 1 or not _is_const(c) or c.arg <= 0 or (lin := _linear(x)) is None:
        return None
    dt, cv, is_div = d.dtype, c.arg, d.op is Ops.IDIV
    terms, const = lin
    lo, hi = _sum_bounds(terms, const)
    if not _fits(dt, lo, hi):
        return None
    if all(k % cv == 0 for k in terms.values()) and const % cv == 0:
        return _build(dt, {b: k // cv for b, k in terms.items()}, const // cv) if is_div else UOp.const(dt, 0)
    if lo >= 0 and (out := _split_multiples(d, c, terms, const)) is not None:
        return out
    if (g := math.gcd(cv, const, *terms.values())) == 1:
        return None
    reduced, cg = _build(dt, {b: k // g for b, k in terms.items()}, const // g), UOp.const(dt, cv // g)
    if is_div:
        return UOp(Ops.IDIV, dt, (reduced, cg))
    return UOp(Ops.MUL, dt, (UOp(Ops.MOD, dt, (reduced, cg)), UOp.const(dt, g)))


def _negative_divisor(d: UOp, x: UOp, c: UOp) -> UOp | None:
    """x // c -> (x // -c) * -1 and x % c -> x % -c for a constant c < 0 (C: the remainder has the sign of x)."""
    if d.dtype.count != 1 or not _is_const(c) or c.arg >= 0 or not _fits(d.dtype, -c.arg, -c.arg):
        return None
    if d.op is Ops.MOD:
        return UOp(Ops.MOD, d.dtype, (x, UOp.const(d.dtype, -c.arg)))
    return UOp(Ops.IDIV, d.dtype, (x, UOp.const(d.dtype, -c.arg))) * -1


def _positive_consts(d: UOp, *cs: UOp) -> bool:
    """d is a scalar op and each of cs a constant > 0."""
    return d.dtype.count == 1 and all(_is_const(c) and c.arg > 0 for c in cs)


def _div_div(d: UOp, x: UOp, a: UOp, b: UOp) -> UOp | None:
    """(x // a) // b -> x // (a*b) for a, b > 0: true for every x, with truncation too."""
    if not _positive_consts(d, a, b) or not _fits(d.dtype, a.arg * b.arg, a.arg * b.arg):
        return None
    return UOp(Ops.IDIV, d.dtype, (x, UOp.const(d.dtype, a.arg * b.arg)))


def _mod_div(d: UOp, x: UOp, m: UOp, a: UOp) -> UOp | None:
    """(x % m) // a -> 0 when m <= a (|x % m| < a), and -> (x // a) % (m / a) when a divides m; for every x."""
    if not _positive_consts(d, m, a):
        return None
    if m.arg <= a.arg:
        return UOp.const(d.dtype, 0)
    if m.arg % a.arg != 0:
        return None
    return UOp(Ops.MOD, d.dtype, (UOp(Ops.IDIV, d.dtype, (x, a)), UOp.const(d.dtype, m.arg // a.arg)))


def _mod_mod(d: UOp, x: UOp, m: UOp, c: UOp) -> UOp | None:
    """(x % m) % c -> x % c when c divides m, and -> x % m when m <= c; for every x (both keep the sign of x)."""
    if not _positive_consts(d, m, c):
        return None
    if m.arg % c.arg == 0:
        return UOp(Ops.MOD, d.dtype, (x, c))
    return UOp(Ops.MOD, d.dtype, (x, m)) if m.arg <= c.arg else None


# ---- comparisons


def _fold_compare(u: UOp, a: UOp, b: UOp) -> UOp | None:
    """An int sum against a constant, where the sum does not wrap: move its constant across
    (x + c1 < c2 -> x < c2 - c1) and divide out the gcd g of its coefficients (g*x < d -> x < ceil(d/g),
    d < g*x -> floor(d/g) < x, g*x != d -> x != d/g, or True when g does not divide d)."""
    if u.dtype.count != 1 or _is_const(a) == _is_const(b):  # exactly one side is a constant
        return None
    const_left = _is_const(a)
    s, d = (b, a.arg) if const_left else (a, b.arg)
    if not _scalar_int(s) or (lin := _linear(s)) is None or not lin[0]:
        return None
    terms, c1 = lin
    dt, lo, hi = s.dtype, *_sum_bounds(terms, 0)
    if not (_fits(dt, lo, hi) and _fits(dt, lo + c1, hi + c1)):
        return None
    g = math.gcd(*terms.values())
    if c1 == 0 and g == 1:
        return None
    reduced, e = _build(dt, {x: k // g for x, k in terms.items()}, 0), d - c1
    if u.op is Ops.CMPNE:
        if e % g != 0:
            return UOp.const(u.dtype, True)
        bound = e // g
    else:
        bound = e // g if const_left else -(-e // g)
    if not _fits(dt, bound, bound):
        return None
    bound_uop = UOp.const(dt, bound)
    pair = (bound_uop, reduced) if const_left and u.op is Ops.CMPLT else (reduced, bound_uop)
    return UOp(u.op, u.dtype, pair)


def _clause_bound(clause: UOp) -> tuple[UOp, bool, int] | None:
    """x < d -> (x, True, d-1): an upper bound on x; d < x -> (x, False, d+1): a lower bound; else None."""
    if clause.op is not Ops.CMPLT:
        return None
    a, b = clause.src
    if _is_const(b) and _scalar_int(a):
        return a, True, b.arg - 1
    if _is_const(a) and _scalar_int(b):
        return b, False, a.arg + 1
    return None


def _flatten(u: UOp, op: Ops) -> list[UOp] | None:
    """The operands of a chain of one associative op, left to right; None when that reads more than _MAX_NODES."""
    out: list[UOp] = []
    stack = [u]
    for _ in range(_MAX_NODES):
        if not stack:
            return out
        node = stack.pop()
        if node in _too_big_chains:
            break
        if node.op is op and node.dtype == u.dtype:
            stack.extend(reversed(node.src))
        else:
            out.append(node)
    _too_big_chains.add(u)
    return None


def _fold_and(u: UOp) -> UOp | None:
    """A chain of bool ANDs (a `valid`): True and repeated clauses drop, False wins, and of the bounds an int gets
    from `x < d` / `d < x` clauses only the tightest on each side stays (contradicting bounds give False)."""
    if u.dtype != dtypes.bool or (clauses := _flatten(u, Ops.AND)) is None:
        return None
    kept: list[UOp] = []
    tightest: dict[tuple[UOp, bool], tuple[int, int]] = {}  # (x, is_upper) -> (index in kept, bound)
    for clause in clauses:
        if _is_const(clause):
            if not clause.arg:
                return UOp.const(dtypes.bool, False)
            continue
        if clause in kept:
            continue
        if (cb := _clause_bound(clause)) is None:
            kept.append(clause)
            continue
        x, upper, v = cb
        if (seen := tightest.get((x, upper))) is None:
            tightest[(x, upper)] = (len(kept), v)
            kept.append(clause)
        elif (v < seen[1]) if upper else (v > seen[1]):
            kept[seen[0]] = clause
            tightest[(x, upper)] = (seen[0], v)
    for (x, upper), (_, v) in tightest.items():
        if upper and (x, False) in tightest and tightest[(x, False)][1] > v:
            return UOp.const(dtypes.bool, False)
    out = UOp.const(dtypes.bool, True) if not kept else kept[0]
    for clause in kept[1:]:
        out = UOp(Ops.AND, dtypes.bool, (out, clause))
    return out


# ---- long sums: gather the constants without flattening


def _gather_constants(u: UOp) -> UOp | None:
    """For int sums too long to flatten: (x + c1) + c2 -> x + (c1 + c2) and (x + c) + y -> (x + y) + c."""
    for inner, other in (u.src, reversed(u.src)):
        if inner.op is not Ops.ADD:
            continue
        x, c = inner.src
        if not _is_const(c):
            continue
        if _is_const(other):
            return UOp(Ops.ADD, u.dtype, (x, UOp.const(u.dtype, c.arg + other.arg)))
        return UOp(Ops.ADD, u.dtype, (UOp(Ops.ADD, u.dtype, (x, other)), c))
    return None


# ---- the rules

_x, _a, _b = UPat.var("x"), UPat.var("a"), UPat.var("b")
_x_int, _a_int, _b_int = UPat.var("x", _INTS), UPat.var("a", _INTS), UPat.var("b", _INTS)
_x_bool = UPat.var("x", dtypes.bool)
_c = UPat.cvar("c")
_DIVMOD = (Ops.IDIV, Ops.MOD)
_ARITH = (Ops.ADD, Ops.MUL, Ops.NEG)
_OTHER_ALU = (GroupOp.ALU - set(_ARITH)) | {Ops.CAST}

symbolic = PatternMatcher(
    [
        # ---- int ADD, MUL and NEG: one rule (folding included), as they are most of an index graph
        (UPat(_ARITH, dtype=_INTS, name="u"), _fold_int_arith),  # canonical sums: x*2 + x*3 -> x*5 ...
        # ---- folding to constants
        (UPat(_OTHER_ALU, name="u"), _fold_constants),  # op(consts) -> const
        (UPat(_ARITH, dtype=_NON_INTS, name="u"), _fold_constants),  # op(consts) -> const, floats and bools
        (UPat(_OTHER_ALU, dtype=_INTS_AND_BOOL, name="u"), _fold_bounds),  # vmin == vmax -> const
        (UPat(_ARITH, dtype=dtypes.bool, name="u"), _fold_bounds),  # vmin == vmax -> const, bools
        # ---- any dtype: only rules that are exact in IEEE arithmetic too
        (UPat(Ops.MUL, dtype=_FLOATS, src=[_x, UPat.const(1)]), lambda x: x),  # x*1 -> x
        (UPat(Ops.FDIV, src=(_x, UPat.const(1))), lambda x: x),  # x/1 -> x
        (UPat(Ops.ADD, dtype=_FLOATS, src=[_x, UPat.cvar("z")]), _add_negative_zero),  # x + -0.0 -> x
        (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(_x,)),)), lambda x: x),  # -(-x) -> x
        (_x.maximum(_x), lambda x: x),  # max(x, x) -> x
        (UPat.var("c").where(_a, _a), lambda c, a: a),  # c ? a : a -> a
        (UPat.var("c").where(_a, _b), _where_const),  # True ? a : b -> a, False ? a : b -> b
        (UPat(Ops.CMPLT, src=(_x, _x), name="u"), _false_like),  # x < x -> False
        (UPat(Ops.CAST, src=(_x,), name="u"), _cast_noop),  # cast to its own dtype -> x
        # ---- bool logic
        (UPat(Ops.AND, dtype=dtypes.bool, name="u"), _fold_and),  # a `valid` chain, tidied
        (_x_bool & UPat.const(True), lambda x: x),  # x & True -> x
        (_x_bool & UPat.const(False), lambda x: x.const_like(False)),  # x & False -> False
        (_x_bool | UPat.const(False), lambda x: x),  # x | False -> x
        (_x_bool | UPat.const(True), lambda x: x.const_like(True)),  # x | True -> True
        (_x & _x, lambda x: x),  # x & x -> x
        (_x | _x, lambda x: x),  # x | x -> x
        (UPat.var("c", dtypes.bool).where(UPat.const(True), UPat.const(False)), lambda c: c),  # c ? True : False -> c
        # ---- memory: a gate known to hold or to fail
        (UPat(Ops.LOAD, name="u"), _load_constant_gate),  # a load gated by False -> its alternative; by True -> plain
        (UPat(Ops.STORE, name="u"), _store_true_gate),  # a store gated by True -> plain
        # ---- ints: identities that hold for vectors too (scalar sums are canonicalized above)
        (_x_int // 1, lambda x: x),  # x//1 -> x
        (_x_int % 1, lambda x: x.const_like(0)),  # x%1 -> 0
        (_x_int & 0, lambda x: x.const_like(0)),  # x&0 -> 0
        (_x_int | 0, lambda x: x),  # x|0 -> x
        (UPat(Ops.XOR, src=[_x_int, UPat.const(0)]), lambda x: x),  # x^0 -> x
        (UPat(Ops.XOR, src=(_x_int, _x_int)), lambda x: x.const_like(0)),  # x^x -> 0
        (UPat(Ops.CMPNE, src=(_x_int, _x_int), name="u"), _false_like),  # x != x -> False (ints only: NaN != NaN)
        # ---- ints: division and remainder by constants
        (UPat(_DIVMOD, src=(_x_int, _c), name="d"), _negative_divisor),  # x//-c -> -(x//c), x%-c -> x%c
        (UPat(_DIVMOD, src=(_x_int, _c), name="d"), _fold_divmod),  # split multiples of c, cancel gcds
        (UPat(Ops.IDIV, src=(_x_int // _a, _b), name="d"), _div_div),  # (x//a)//b -> x//(a*b)
        (UPat(Ops.IDIV, src=(_x_int % UPat.var("m"), _a), name="d"), _mod_div),  # (x%(a*b))//a -> (x//a)%b
        (UPat(Ops.MOD, src=(_x_int % UPat.var("m"), _c), name="d"), _mod_mod),  # (x%(c*k))%c -> x%c
        # ---- ints: comparisons and max
        (UPat((Ops.CMPLT, Ops.CMPNE), src=(_a_int, _b_int), name="u"), _fold_compare),  # x+c1 < c2 -> x < c2-c1
        (_a.maximum(_b), lambda a, b: a if _scalar_int_or_bool(a) and a.vmin >= b.vmax else None),  # a>=b
    ],
    name="symbolic",
)


def simplify(u: UOp) -> UOp:
    """Rewrite u with the symbolic rules until none applies."""
    return graph_rewrite(u, symbolic)
