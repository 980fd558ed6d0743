"""Autograd, graph to graph: the derivative of each primitive op as a rule, and the walk that applies them.

A rule takes the node and the gradient flowing into it and gives one gradient per source (None where
none flows: comparisons, integer ops, the condition of a WHERE). Composite Tensor ops (softmax, matmul
...) need no rules: they are built from these primitives. Gradients are lazy UOps like everything else,
so forward and backward schedule and fuse together.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

from tiny.ir.dtypes import dtypes, truncate
from tiny.ir.uop import Ops, UOp

Grads = tuple[UOp | None, ...]
_BOOL = dtypes.bool


def full_like(node: UOp, value: float) -> UOp:
    """A constant with node's shape, dtype and device (an expanded scalar, no memory)."""
    c = UOp(Ops.CONST, node.dtype, (UOp(Ops.DEVICE, arg=node.device),), truncate(node.dtype, value))
    if not node.shape:
        return c
    return UOp(Ops.EXPAND, node.dtype, (UOp(Ops.RESHAPE, node.dtype, (c,), (1,) * len(node.shape)),), node.shape)


def _alu(op: Ops, *srcs: UOp) -> UOp:
    return UOp(op, srcs[-1].dtype, srcs)


def _mul(a: UOp, b: UOp) -> UOp:
    return _alu(Ops.MUL, a, b)


def _neg(a: UOp) -> UOp:
    return _alu(Ops.NEG, a)


def _scale(a: UOp, k: float) -> UOp:
    return _mul(a, full_like(a, k))


def _where(cond: UOp, a: UOp, b: UOp) -> UOp:
    return UOp(Ops.WHERE, a.dtype, (cond, a, b))


def _eq(a: UOp, b: UOp) -> UOp:
    ne = UOp(Ops.CMPNE, _BOOL, (a, b))
    return UOp(Ops.CMPNE, _BOOL, (ne, full_like(ne, True)))


def _sum_to(g: UOp, shape: tuple[int, ...]) -> UOp:
    """Sum g over the axes where shape has 1 (undoing an expand)."""
    axes = tuple(i for i, (s, t) in enumerate(zip(shape, g.shape)) if s == 1 and t != 1)
    if not axes:
        return g
    return UOp(Ops.REDUCE_AXIS, g.dtype, (g,), (Ops.ADD, axes))


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(order.index(i) for i in range(len(order)))


def _max_grad(node: UOp, g: UOp) -> Grads:
    """torch.maximum: the larger input takes the gradient; on a tie each takes half."""
    a, b = node.src
    a_wins = UOp(Ops.CMPLT, _BOOL, (b, a))
    tie = _eq(a, b)
    half = _scale(g, 0.5)
    zero = full_like(g, 0)
    return (_where(a_wins, g, _where(tie, half, zero)), _where(a_wins, zero, _where(tie, half, g)))


def _reduce_max_grad(node: UOp, g: UOp) -> Grads:
    """The gradient is shared equally by every element that equals the maximum, as torch.amax does."""
    src = node.source
    out = UOp(Ops.EXPAND, node.dtype, (node,), src.shape)
    hit = UOp(Ops.CAST, src.dtype, (_eq(src, out),))
    count = UOp(Ops.EXPAND, src.dtype, (UOp(Ops.REDUCE_AXIS, src.dtype, (hit,), (Ops.ADD, node.arg[1])),), src.shape)
    share = _alu(Ops.FDIV, hit, count)
    return (_mul(share, UOp(Ops.EXPAND, g.dtype, (g,), src.shape)),)


def _reduce_prod_grad(node: UOp, g: UOp) -> Grads:
    """The product of the other elements, as torch.prod: without dividing by the element where it is 0, so an
    input with one zero gives that zero the product of the rest, and one with two or more zeros gives all 0."""
    src, axes = node.source, node.arg[1]

    def reduced(op: Ops, x: UOp) -> UOp:
        return UOp(Ops.EXPAND, x.dtype, (UOp(Ops.REDUCE_AXIS, x.dtype, (x,), (op, axes)),), src.shape)

    zero = full_like(src, 0)
    is_zero = _eq(src, zero)
    rest = reduced(Ops.MUL, _where(is_zero, full_like(src, 1), src))  # the product of the nonzero elements
    zeros = reduced(Ops.ADD, UOp(Ops.CAST, src.dtype, (is_zero,)))  # how many zeros
    others = _where(
        is_zero,
        _where(_eq(zeros, full_like(zeros, 1)), rest, zero),  # the only zero: the product of the rest
        _where(_eq(zeros, zero), _alu(Ops.FDIV, rest, src), zero),  # no zeros: the product over this element
    )
    return (_mul(others, UOp(Ops.EXPAND, g.dtype, (g,), src.shape)),)


def _reduce_grad(node: UOp, g: UOp) -> Grads:
    op = node.arg[0]
    if op is Ops.ADD:
        return (UOp(Ops.EXPAND, g.dtype, (g,), node.source.shape),)
    if op is Ops.MAX:
        return _reduce_max_grad(node, g)
    if op is Ops.MUL:
        return _reduce_prod_grad(node, g)
    raise NotImplementedError(f"no gradient for a {op.name} reduction")


def _pad_grad(node: UOp, g: UOp) -> Grads:
    bounds = tuple((b, b + s) for (b, _), s in zip(node.arg, node.source.shape))
    return (UOp(Ops.SHRINK, g.dtype, (g,), bounds),)


def _shrink_grad(node: UOp, g: UOp) -> Grads:
    padding = tuple((lo, s - hi) for (lo, hi), s in zip(node.arg, node.source.shape))
    return (UOp(Ops.PAD, g.dtype, (g,), padding),)


def _cast_grad(node: UOp, g: UOp) -> Grads:
    src = node.source
    return (UOp(Ops.CAST, src.dtype, (g,)) if src.dtype.is_float else None,)


def _mod_grad(node: UOp, g: UOp) -> Grads:
    """fmod(a, b) = a - b * trunc(a / b): 1 for a, -trunc(a / b) for b (integers have none)."""
    if not node.dtype.is_float:
        return (None, None)
    a, b = node.src
    return (g, _neg(_mul(g, _alu(Ops.TRUNC, _alu(Ops.FDIV, a, b)))))


def _copy_grad(node: UOp, g: UOp) -> Grads:
    src = node.source
    return (UOp(Ops.COPY, g.dtype, (g, UOp(Ops.DEVICE, arg=src.device)), node.arg), None)  # (read in place, as it)


LN2 = math.log(2)

# one rule per primitive op: (node, incoming gradient) -> a gradient for each source
RULES: dict[Ops, Callable[[UOp, UOp], Grads]] = {
    Ops.ADD: lambda n, g: (g, g),
    Ops.MUL: lambda n, g: (_mul(g, n.src[1]), _mul(g, n.src[0])),
    Ops.NEG: lambda n, g: (_neg(g),),
    Ops.FDIV: lambda n, g: (_alu(Ops.FDIV, g, n.src[1]), _neg(_alu(Ops.FDIV, _mul(g, n), n.src[1]))),
    Ops.RECIP: lambda n, g: (_neg(_mul(g, _mul(n, n))),),
    Ops.SQRT: lambda n, g: (_alu(Ops.FDIV, g, _scale(n, 2)),),
    Ops.EXP2: lambda n, g: (_mul(g, _scale(n, LN2)),),
    Ops.LOG2: lambda n, g: (_alu(Ops.FDIV, g, _scale(n.source, LN2)),),
    Ops.SIN: lambda n, g: (_mul(g, _alu(Ops.SIN, _alu(Ops.ADD, _neg(n.source), full_like(n.source, math.pi / 2)))),),
    Ops.MAX: _max_grad,
    Ops.WHERE: lambda n, g: (None, _where(n.src[0], g, full_like(g, 0)), _where(n.src[0], full_like(g, 0), g)),
    Ops.CAST: _cast_grad,
    Ops.REDUCE_AXIS: _reduce_grad,
    Ops.RESHAPE: lambda n, g: (UOp(Ops.RESHAPE, g.dtype, (g,), n.source.shape),),
    Ops.PERMUTE: lambda n, g: (UOp(Ops.PERMUTE, g.dtype, (g,), _inverse(n.arg)),),
    Ops.EXPAND: lambda n, g: (_sum_to(g, n.source.shape),),
    Ops.PAD: _pad_grad,
    Ops.SHRINK: _shrink_grad,
    Ops.FLIP: lambda n, g: (UOp(Ops.FLIP, g.dtype, (g,), n.arg),),
    Ops.CONTIGUOUS: lambda n, g: (g,),
    Ops.TRUNC: lambda n, g: (full_like(g, 0),),  # flat almost everywhere: zeros, as PyTorch's rounding ops give
    Ops.MOD: _mod_grad,
    Ops.COPY: _copy_grad,
}
# no gradient flows through these: comparisons, integer and bit ops, rounding, bit casts, detach
NO_GRADIENT = frozenset(
    {Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.IDIV, Ops.BITCAST, Ops.DOT4, Ops.SDOT4}
)


# a composite op's own derivative (a convolution's input gradient is a transposed convolution, not the window
# gradient its primitives would give): node -> (its inputs, rule from the node, its inputs and its gradient to one
# gradient per input). The rule is given the node rather than keeping it: a rule that held its own node would keep
# the weakly held key alive, and with it every graph a training loop ever built
CompositeRule = Callable[[UOp, tuple[UOp, ...], UOp, tuple[bool, ...]], Grads]
COMPOSITE: weakref.WeakKeyDictionary[UOp, tuple[tuple[UOp, ...], CompositeRule]] = weakref.WeakKeyDictionary()


def set_composite_rule(node: UOp, inputs: tuple[UOp, ...], rule: CompositeRule) -> None:
    """Give `node`, built from `inputs` by primitives, a derivative of its own: rule(node, inputs, grad of node, which
    inputs need one) gives one gradient per input (None where none is needed), each input taken as an independent
    variable (a rule that derives one through the primitives uses primitive_gradient, which holds the others
    constant). Gradients skip the primitives between; a node whose inputs repeat one node is derived through them."""
    COMPOSITE[node] = (inputs, rule)


def substitute_keeping_rules(root: UOp, mapping: dict[UOp, UOp], done: dict[UOp, UOp] | None = None) -> UOp:
    """Replace nodes by the mapping, rebuilding everything above them; a rebuilt node keeps its composite rule
    (with its inputs replaced the same way). `done`, where given, receives what each node became."""
    done = {} if done is None else done
    for u in root.toposort:
        if u in mapping:
            done[u] = mapping[u]
            continue
        src = tuple(done[s] for s in u.src)
        done[u] = u if src == u.src else u.replace(src=src)
        if done[u] is not u and (composite := COMPOSITE.get(u)) is not None:
            inputs, rule = composite
            COMPOSITE[done[u]] = (tuple(done[i] for i in inputs), rule)
    return done[root]


def compute_gradient(root: UOp, root_grad: UOp, targets: list[UOp]) -> list[UOp | None]:
    """d(root)/d(target) for each target, with root's gradient root_grad; None where root does not depend on it."""
    return _walk(root, root_grad, targets, frozenset(), use_root_rule=True)


def primitive_gradient(node: UOp, inputs: tuple[UOp, ...], node_grad: UOp, target: UOp) -> UOp | None:
    """A composite rule's own use: d(node)/d(target) through the primitives between node and its inputs, each input
    an independent variable. A path from node that reaches the target through another input is not followed: the
    walk that applies the rule adds it, from the gradient the rule gives that input (following it here too would count
    it twice: the weight of `x.conv2d(w).conv2d(w)` through the inner convolution)."""
    return _walk(node, node_grad, [target], frozenset(inputs) - {target}, use_root_rule=False)[0]


def _walk(root: UOp, root_grad: UOp, targets: list[UOp], held: frozenset[UOp], use_root_rule: bool) -> list[UOp | None]:
    """Apply the rules from root down to the targets. `held`: nodes taken as constants (no gradient passes below them);
    use_root_rule=False derives root through its primitives even where it has a composite rule."""
    topo = root.toposort
    wanted = set(targets)
    on_path: set[UOp] = set()
    for u in topo:  # the nodes through which some target reaches root
        if u in wanted or (u not in held and any(s in on_path for s in u.src)):
            on_path.add(u)
    grads: dict[UOp, UOp] = {root: root_grad}
    for node in reversed(topo):
        g = grads.get(node)
        if g is None or node.op in NO_GRADIENT or node.op is Ops.DETACH or not any(s in on_path for s in node.src):
            continue
        composite = COMPOSITE.get(node) if use_root_rule or node is not root else None
        if composite is not None and len(set(composite[0])) < len(composite[0]):
            composite = None  # one node in two of its inputs (x.conv2d(x)): the rule cannot tell them apart
        if composite is not None:
            srcs = composite[0]
            grads_of = composite[1](node, srcs, g, tuple(s in on_path for s in srcs))
        elif node.op in RULES:
            srcs, grads_of = node.src, RULES[node.op](node, g)
        else:
            raise NotImplementedError(f"no gradient rule for {node.op.name}")
        for s, sg in zip(srcs, grads_of):
            if sg is not None and s in on_path:
                grads[s] = _alu(Ops.ADD, grads[s], sg) if s in grads else sg
    return [grads.get(t) for t in targets]
