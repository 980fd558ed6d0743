"""The render walker: the one walk through a linearized kernel that every renderer makes.

A renderer that walks (`WalkingRenderer`) gives `rules`, a table from each op to the name of the method that writes
it. `walk` goes through the ops in order, calls the op's method with the `Walk` (the kernel being written) and the
op, and keeps what the method returns as the op's value: a name, an expression, or the registers that hold it.
The walk owns what every language needs besides its text:

- naming: each op's value (`names`), and fresh names for new values, numbered per prefix or by a count shared
  between prefixes (an assembly's labels);
- nesting: the blocks open (a RANGE or an IF, until the ENDRANGE or ENDIF that closes it), which a C-like language
  indents by;
- use counts: how often each value is read (twice by an op whose text names an operand twice);
- inlining: an expression read once is written into its reader while it nests shallower than `inline_depth`, and
  named by a line of its own otherwise;
- the kernel's parameters: the buffers in argument order, the integer variables, the hardware indices that arrive as
  arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, ClassVar

from tiny.ir.device import Renderer
from tiny.ir.uop import GroupOp, Ops, UOp

OPENS = (Ops.RANGE, Ops.IF)  # ops that open a block
CLOSES = (Ops.ENDRANGE, Ops.ENDIF)  # ops that close the block opened last

# The rules of a renderer that writes each op with a method of its own, named after what it writes (LLVM IR, PTX);
# the C dialects and WGSL write expressions through one method and close both kinds of block through another.
ONE_METHOD_PER_OP: dict[Ops, str] = {
    Ops.DEFINE_GLOBAL: "write_buffer",
    Ops.DEFINE_VAR: "write_variable",
    Ops.DEFINE_LOCAL: "write_local",
    Ops.SPECIAL: "write_special",
    Ops.CONST: "write_const",
    Ops.RANGE: "write_range",
    Ops.ENDRANGE: "write_endrange",
    Ops.IF: "write_if",
    Ops.ENDIF: "write_endif",
    Ops.INDEX: "write_index",
    Ops.LOAD: "write_load",
    Ops.STORE: "write_store",
    Ops.DEFINE_ACC: "write_acc",
    Ops.ASSIGN: "write_assign",
    Ops.BARRIER: "write_barrier",
    Ops.VECTORIZE: "write_vectorize",
    Ops.GEP: "write_gep",
    Ops.CAST: "write_cast",
    Ops.BITCAST: "write_bitcast",
    Ops.WMMA: "write_wmma",
    **dict.fromkeys(GroupOp.ALU, "write_alu"),
}


class Walk:
    """One kernel being written: the values named so far, the blocks open, the lines, the parameters.

    first: the number a fresh name's count starts at. inline_depth: how deep an inlined expression may nest (0: every
    expression is named). repeats: the ops whose text names an operand twice (it counts as read twice)."""

    def __init__(
        self, uops: list[UOp], first: int = 0, inline_depth: int = 0, repeats: Collection[Ops] = frozenset()
    ) -> None:
        self.uops = uops
        self.names: dict[UOp, Any] = {}  # each op's value as its language writes it
        self.lines: list[str] = []
        self.blocks: list[UOp] = []  # the RANGEs and IFs open, innermost last
        self.buffers: list[tuple[int, str]] = []  # (argument number, parameter)
        self.variables: list[str] = []  # parameters after the buffers
        self.specials: list[str] = []  # parameters after the variables (hardware indices passed in)
        self.written = {u.address.pointer for u in uops if u.op is Ops.STORE}  # the buffers the kernel stores to
        self.inline_depth = inline_depth
        self.inlined: set[UOp] = set()  # the expressions written into their one reader's text
        self.uses = use_counts(uops, repeats) if inline_depth else {}
        self._nest: dict[UOp, int] = {}  # how deep an inlined expression nests
        self._first = first
        self._counts: dict[str, int] = {}

    @property
    def depth(self) -> int:
        """How many blocks are open."""
        return len(self.blocks)

    def fresh(self, prefix: str, count: str | None = None) -> str:
        """A new name: prefix and a number, counted per prefix or, given `count`, per that count's name."""
        key = prefix if count is None else count
        self._counts[key] = n = self._counts.get(key, self._first - 1) + 1
        return f"{prefix}{n}"

    def given(self, count: str) -> int:
        """How many names a count has given."""
        return self._counts.get(count, self._first - 1) - self._first + 1

    def line(self, text: str) -> None:
        """A line of the body, indented by the blocks open."""
        self.lines.append("  " * (1 + self.depth) + text)

    def operands(self, u: UOp) -> list[Any]:
        """The values of u's sources ('' for a source that has none: a RANGE's end marker ...)."""
        return [self.names.get(s, "") for s in u.src]

    def expression(self, u: UOp, expr: str, declare: Callable[[str], str]) -> str:
        """u's value written as `expr`: the expression itself where u is read once and nests shallow enough (its
        reader writes it in place), else a fresh name given by the line declare(name)."""
        self._nest[u] = 1 + max((self._nest.get(s, 0) for s in u.src), default=0)
        if self.uses.get(u, 0) == 1 and self._nest[u] < self.inline_depth:
            self.inlined.add(u)
            return expr
        self._nest[u] = 0
        name = self.fresh("alu")
        self.line(declare(name))
        return name

    def params(self) -> list[str]:
        """The kernel's parameters in order: buffers by argument number, variables, hardware indices."""
        return [p for _, p in sorted(self.buffers)] + self.variables + self.specials


def use_counts(uops: list[UOp], repeats: Collection[Ops] = frozenset()) -> dict[UOp, int]:
    """How often each value is read; an op in `repeats` reads its operands twice."""
    uses: dict[UOp, int] = {}
    for u in uops:
        for s in u.src:
            uses[s] = uses.get(s, 0) + (2 if u.op in repeats else 1)
    return uses


class WalkingRenderer(Renderer):
    """A renderer whose ops are written by the methods its `rules` name, in the walk's order."""

    rules: ClassVar[dict[Ops, str]] = {}  # op -> the method that writes it: (walk, op) -> the op's value or None

    def walk(self, w: Walk) -> Walk:
        """Write every op of the kernel through its rule, keeping the blocks open and each value's name."""
        table = {op: getattr(self, name) for op, name in self.rules.items()}
        for u in w.uops:
            rule = table.get(u.op)
            if rule is None:
                raise NotImplementedError(f"{type(self).__name__} cannot render {u.op.name}")
            if u.op in CLOSES:
                if not w.blocks or w.blocks[-1] is not u.opened:
                    raise ValueError(f"{u.op.name} does not close the block opened last: the kernel is not nested")
                w.blocks.pop()
            value = rule(w, u)
            if value is not None:
                w.names[u] = value
            if u.op in OPENS:
                w.blocks.append(u)
        return w


class BracedRenderer(WalkingRenderer):
    """A renderer of a language whose blocks are braces (C and its dialects, WGSL): an if opens one, the end of a loop
    or an if closes it; each language writes its own loop header."""

    def write_if(self, w: Walk, u: UOp) -> None:
        w.line(f"if ({w.names[u.condition]}) {{")

    def write_end(self, w: Walk, u: UOp) -> None:
        w.line("}")


def summed_vector(u: UOp) -> UOp | None:
    """The integer vector whose lanes u adds up, each once and in order (((v[0] + v[1]) + v[2]) ... + v[n-1], as a
    vector reduction ends), else None: a renderer whose target sums a vector's lanes at once writes that instead.
    Integer sums only, which come out the same in any order; a float sum's order is its rounding."""
    if u.op is not Ops.ADD or u.dtype.count != 1 or not u.dtype.is_int:
        return None
    terms, node = [], u
    while node.op is Ops.ADD and node.dtype == u.dtype:
        terms.append(node.src[1])
        node = node.src[0]
    terms.append(node)
    vector = node.src[0] if node.op is Ops.GEP else None
    if vector is None or vector.dtype.count != len(terms) or len(terms) < 4:
        return None
    lanes = reversed(terms)
    return vector if all(t.op is Ops.GEP and t.src[0] is vector and t.arg == i for i, t in enumerate(lanes)) else None
