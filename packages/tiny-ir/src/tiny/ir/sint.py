"""Symbolic sizes: a Variable, bound to a value, stands where an int stands in a shape.

`Variable("pos", 1, 2048)` is a DEFINE_VAR node; `.bind(5)` a BIND of it to 5. A shape entry is an int or an
int32 expression of variables (a `sint`): `(4, pos)`, `(4, pos + 1)`. Tensors hold bound expressions (their values
are known); the scheduler unbinds them, so that a kernel over `pos` is the same kernel whatever pos is bound to, and
takes the value as an integer argument when it is launched.

Expressions are kept simplified (tiny.ir.symbolic's canonical sums), so two ways to write one size are one node and
compare equal with `==`. Comparisons that decide a shape (is this dim 1? is it empty?) use the variables' ranges: a
size is known to be positive when its lowest value is.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable, Iterable
from typing import Any

from tiny.ir.dtypes import dtypes
from tiny.ir.uop import GroupOp, Ops, UOp

sint = int | UOp

INT32_MAX = 2**31 - 1
# names the renderers give their own parameters, indices and values (data0, gidx1, alu7 ...): a Variable, which is a
# kernel parameter of its own name, may not take one
_RENDERED = re.compile(r"(data|gidx|lidx|acc|alu|ridx|rnext|r|st|val|v|lane|cast|tmp)[0-9]+")


def Variable(name: str, lo: int, hi: int) -> UOp:  # noqa: N802  (a constructor, named as tinygrad's)
    """A symbolic size named `name` that takes values from lo to hi (both included)."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name in _C_WORDS:
        raise ValueError(f"a Variable's name must be an identifier (not a C or Python keyword), got {name!r}")
    if _RENDERED.fullmatch(name) or name.startswith(("_", "tiny_")):
        raise ValueError(f"a Variable's name may not be one the kernels give their own values (as {name!r})")
    for what, v in (("lo", lo), ("hi", hi)):
        if type(v) is not int:
            raise TypeError(f"Variable {name!r}: {what} must be an int, got {type(v).__name__} {v!r}")
    if not 0 <= lo <= hi <= INT32_MAX:
        raise ValueError(f"Variable {name!r} needs 0 <= lo <= hi <= {INT32_MAX}, got lo={lo}, hi={hi}")
    return UOp(Ops.DEFINE_VAR, dtypes.int32, (), (name, lo, hi))


_C_WORDS = frozenset(  # C, OpenCL C, CUDA and WGSL words a kernel parameter cannot be named
    "auto break case char const continue default do double else enum extern float for goto if inline int long register"
    " restrict return short signed sizeof static struct switch typedef union unsigned void volatile while half bool"
    " fn let var loop array ptr bitcast select override discard enable alias uint ulong uchar ushort kernel global"
    " local private constant".split()
)


def is_sym(x: Any) -> bool:
    return isinstance(x, UOp)


def ssimplify(x: sint) -> sint:
    """x simplified; an int where it is one."""
    if type(x) is int:
        return x
    from tiny.ir.symbolic import simplify  # (symbolic imports this package's uop module)

    out = simplify(x)
    return out.arg if out.op is Ops.CONST else out


def as_uop(x: sint) -> UOp:
    return x if isinstance(x, UOp) else UOp.const(dtypes.int32, x)


def sadd(a: sint, b: sint) -> sint:
    return a + b if type(a) is int and type(b) is int else ssimplify(as_uop(a) + as_uop(b))


def ssub(a: sint, b: sint) -> sint:
    return a - b if type(a) is int and type(b) is int else ssimplify(as_uop(a) - as_uop(b))


def smul(a: sint, b: sint) -> sint:
    if type(a) is int and type(b) is int:
        return a * b
    if type(a) is int or type(b) is int:  # (0 and 1 need no node)
        k, s = (a, b) if type(a) is int else (b, a)
        if k == 0:
            return 0
        if k == 1:
            return s
        return ssimplify(s * k)  # (the variable first, as the symbolic rules write a product: one node for both orders)
    return ssimplify(as_uop(a) * as_uop(b))


def sprod(xs: Iterable[sint]) -> sint:
    out: sint = 1
    for x in xs:
        out = smul(out, x)
    return out


def sfloordiv(a: sint, b: sint) -> sint:
    """a // b of sizes (not negative)."""
    if type(a) is int and type(b) is int:
        return a // b
    if type(b) is int and b == 1:
        return a
    return ssimplify(as_uop(a) // as_uop(b))


def smax(a: sint, b: sint) -> sint:
    if type(a) is int and type(b) is int:
        return max(a, b)
    if lowest(a) >= highest(b):
        return a
    if lowest(b) >= highest(a):
        return b
    return ssimplify(as_uop(a).maximum(as_uop(b)))


def smin(a: sint, b: sint) -> sint:
    if type(a) is int and type(b) is int:
        return min(a, b)
    if highest(a) <= lowest(b):
        return a
    if highest(b) <= lowest(a):
        return b
    return ssimplify(-(-as_uop(a)).maximum(-as_uop(b)))


def lowest(x: sint) -> int:
    return x if type(x) is int else int(x.vmin)


def highest(x: sint) -> int:
    return x if type(x) is int else int(x.vmax)


def known_lt(a: sint, b: sint) -> bool:
    """a < b for every value of the variables (b - a, simplified, is at least 1: pos < pos + 1)."""
    return a < b if type(a) is int and type(b) is int else lowest(ssub(b, a)) > 0


def known_le(a: sint, b: sint) -> bool:
    return a <= b if type(a) is int and type(b) is int else lowest(ssub(b, a)) >= 0


def maybe_lt(a: sint, b: sint) -> bool:
    """a < b for some value of the variables."""
    return a < b if type(a) is int and type(b) is int else highest(ssub(b, a)) > 0


# ---- variables and their values


def variables(x: sint) -> list[UOp]:
    """The DEFINE_VAR and BIND nodes of an expression, in the order they appear."""
    return [] if type(x) is int else [u for u in x.toposort if u.op is Ops.DEFINE_VAR or u.op is Ops.BIND]


def sym_eval(x: sint, values: dict[str, int] | None = None) -> int:
    """The value of a size: bound variables take their values, unbound ones the value `values` gives their name."""
    if type(x) is int:
        return x
    done: dict[UOp, Any] = {}
    for u in x.toposort:
        if u.op is Ops.CONST:
            done[u] = u.arg
        elif u.op is Ops.BIND:
            done[u] = u.src[1].arg
        elif u.op is Ops.DEFINE_VAR:  # (a BIND's own variable is one of these, and needs no value)
            done[u] = values[u.arg[0]] if values is not None and u.arg[0] in values else u
        elif u.op is Ops.CAST or u.op in GroupOp.ALU:
            if any(isinstance(done[s], UOp) for s in u.src):
                break
            from tiny.ir.alu import exec_alu

            done[u] = done[u.src[0]] if u.op is Ops.CAST else exec_alu(u.op, u.dtype, tuple(done[s] for s in u.src))
        else:
            raise ValueError(f"{u.op.name} has no value in a size expression")
    if isinstance(value := done.get(x), UOp) or value is None:
        name = next(v.arg[0] for v in x.toposort if v.op is Ops.DEFINE_VAR and isinstance(done.get(v), UOp))
        raise ValueError(f"the size {sym_str(x)} reads Variable {name!r}, which is not bound to a value")
    return int(value)


def has_binds(x: Any) -> bool:
    """Whether an arg (a size, or tuples of them) holds a symbolic size."""
    if type(x) is tuple:
        return any(has_binds(y) for y in x)
    return isinstance(x, UOp)


def map_sizes(x: Any, f: Callable[[UOp], sint]) -> Any:
    """An arg with every symbolic size in it replaced by f(size), its tuples rebuilt."""
    if type(x) is tuple:
        return tuple(map_sizes(y, f) for y in x)
    return f(x) if isinstance(x, UOp) else x


def unbind_size(x: UOp, found: dict[UOp, int]) -> sint:
    """The expression with each BIND replaced by its variable; `found` gets each variable's value (a variable bound
    to two values in one graph is an error)."""
    if x.op is Ops.BIND:  # (the usual size: one bound Variable)
        var, value = x.src[0], x.src[1].arg
        if found.setdefault(var, value) != value:
            raise ValueError(f"Variable {var.arg[0]!r} is bound to {found[var]} and to {value} in one computation")
        return var
    binds = [u for u in x.toposort if u.op is Ops.BIND]
    if not binds:
        return x
    mapping = {}
    for b in binds:
        var, value = b.src[0], b.src[1].arg
        if found.setdefault(var, value) != value:
            raise ValueError(f"Variable {var.arg[0]!r} is bound to {found[var]} and to {value} in one computation")
        mapping[b] = var
    from tiny.ir.uop import substitute

    return ssimplify(substitute(x, mapping))


def bind_size(x: UOp, values: dict[UOp, int]) -> sint:
    """The expression with each variable that `values` names bound to its value there (unbind_size undone)."""
    if x.op is Ops.DEFINE_VAR:
        return x.bind(values[x]) if x in values else x
    mapping = {u: u.bind(values[u]) for u in x.toposort if u.op is Ops.DEFINE_VAR and u in values}
    if not mapping:
        return x
    from tiny.ir.uop import substitute

    return ssimplify(substitute(x, mapping))


def sym_str(x: sint) -> str:
    """A size as a short expression: 4, pos, (pos+1), (n*4)."""
    if type(x) is int:
        return str(x)
    names: dict[UOp, str] = {}
    for u in x.toposort:
        if u.op is Ops.CONST:
            names[u] = str(u.arg)
        elif u.op is Ops.DEFINE_VAR:
            names[u] = u.arg[0]
        elif u.op is Ops.BIND:
            names[u] = names[u.src[0]]
        elif u.op is Ops.NEG:
            names[u] = f"-{names[u.src[0]]}"
        elif u.op is Ops.CAST:
            names[u] = names[u.src[0]]
        elif u.op in _INFIX:
            a, b = (names[s] for s in u.src)
            if u.op is Ops.ADD and b.startswith("-"):
                names[u] = f"({a}-{b[1:]})"
            else:
                names[u] = f"({a}{_INFIX[u.op]}{b})"
        elif u.op is Ops.MAX:
            names[u] = f"max({names[u.src[0]]}, {names[u.src[1]]})"
        else:
            names[u] = f"{u.op.name.lower()}({', '.join(names[s] for s in u.src)})"
    return names[x]


_INFIX = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<"}


def is_size_expr(u: UOp) -> bool:
    """Whether a node is an int32 expression of variables and constants (what a shape may hold)."""
    return (
        all(
            n.op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND) or n.op in GroupOp.ALU or n.op is Ops.CAST for n in u.toposort
        )
        and u.dtype == dtypes.int32
    )


def check_size(x: Any, what: str = "a size") -> sint:
    """x as a size (an int or an expression of variables), or a clear error."""
    if isinstance(x, bool) or not isinstance(x, (int, UOp)):
        raise TypeError(f"{what} must be an int or a bound Variable, got {type(x).__name__} {x!r}")
    if isinstance(x, UOp):
        if not is_size_expr(x):
            raise TypeError(f"{what} must be an int or an int expression of Variables, got a {x.op.name} node")
        return ssimplify(x)
    return int(x)


def divides(a: sint, b: sint) -> bool:
    """Whether a is known to divide b: a product of some of b's factors (of the same variables, ints dividing)."""
    if type(a) is int and type(b) is int:
        return a != 0 and b % a == 0
    (ka, sa), (kb, sb) = factors(a), factors(b)
    return ka != 0 and kb % ka == 0 and all(sb.count(x) >= sa.count(x) for x in set(sa))


def factors(x: sint) -> tuple[int, list[UOp]]:
    """x as an int times a product of factors (a sum, a variable ...)."""
    if type(x) is int:
        return (x, [])
    k, out, todo = 1, [], [x]
    while todo:
        u = todo.pop()
        if u.op is Ops.MUL:
            todo.extend(u.src)
        elif u.op is Ops.CONST:
            k *= u.arg
        else:
            out.append(u)
    return (k, out)


def sdiv_exact(a: sint, b: sint) -> sint | None:
    """a / b where b is known to divide a (a product of some of a's factors), else None."""
    if type(a) is int and type(b) is int:
        return a // b if b != 0 and a % b == 0 else None
    fa, fb = factors(a), factors(b)
    if fb[0] == 0 or fa[0] % fb[0]:
        return None
    rest = list(fa[1])
    for f in fb[1]:
        if f not in rest:
            return None
        rest.remove(f)
    return sprod([fa[0] // fb[0], *rest])


def kernel_variables(ast: UOp) -> list[UOp]:
    """The Variables (DEFINE_VAR) a kernel AST reads: in its views' sizes and its constants' values."""
    found: dict[UOp, None] = {}
    for u in ast.toposort:
        if u.op is Ops.VIEW:
            v = u.arg
            for x in (*v.shape, *v.strides, v.offset, *sum(v.mask or (), ())):
                if isinstance(x, UOp):
                    found.update((y, None) for y in variables(x) if y.op is Ops.DEFINE_VAR)
        elif u.op is Ops.CONST and isinstance(u.arg, UOp):
            found.update((y, None) for y in variables(u.arg) if y.op is Ops.DEFINE_VAR)
        elif u.op is Ops.DEFINE_VAR:
            found[u] = None
    return list(found)
