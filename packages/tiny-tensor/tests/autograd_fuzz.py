"""Random autograd graphs, run in tiny and in PyTorch: the generator, the runner and the shrinker of
test_autograd_fuzz.

A graph is a `Program`: leaves (random data, requires_grad) and 3 to 10 steps, each one op of the table below
written twice as a line of Python, once for tiny and once for PyTorch. Steps take their inputs from every value made
so far, so leaves and intermediates are used several times (tied weights, residual connections, one tensor feeding
two convolutions, a value used before and after `.realize()`). The loss is the sum of each unused value times a
fixed random tensor; both libraries run the very same lines (`exec`), so the printed reproducer is what ran.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812  (the name every PyTorch user reads)

from tiny.tensor import Tensor, dtypes

T = TypeVar("T")
LIBS = ("tiny", "torch")
PREFIX = {"tiny": "x", "torch": "t"}  # x3 in tiny's lines is t3 in PyTorch's
# (rtol, atol relative to the largest reference value, at least 1): a wrong rule is off by O(1), so these leave a
# graph of ten ops room for float32 rounding and still catch any real mismatch
TOLERANCE = {"float32": (2e-3, 2e-4), "float64": (1e-8, 1e-10)}
TIME_LIMIT = 60.0  # seconds tiny may take over one graph (compiling ~40 small kernels); beyond that it hangs
TAME = 1e4
MAX_NUMEL = 256  # values stay small: the fuzz is about derivative rules, not big kernels


@dataclass(frozen=True)
class Leaf:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def line(self, lib: str, seed: int) -> str:
        var = f"{PREFIX[lib]}{self.name[1:]}"
        make = f"data({seed}, {self.name[1:]}, {self.shape})"
        if lib == "tiny":
            return f"{var} = Tensor({make}, dtype=dtypes.{self.dtype}, requires_grad=True)"
        return f"{var} = torch.tensor({make}, dtype=torch.{self.dtype}, requires_grad=True)"


@dataclass(frozen=True)
class Step:
    """out = op(inputs): `code[lib]` is a format string whose {0}, {1} ... are the inputs' names."""

    out: str
    op: str
    inputs: tuple[str, ...]
    code: tuple[str, str]  # (tiny, torch)
    shape: tuple[int, ...]
    dtype: str

    def line(self, lib: str) -> str:
        names = [f"{PREFIX[lib]}{v[1:]}" for v in self.inputs]
        return f"{PREFIX[lib]}{self.out[1:]} = {self.code[LIBS.index(lib)].format(*names)}  # {self.op} {self.shape}"


@dataclass(frozen=True)
class Program:
    seed: int
    leaves: tuple[Leaf, ...]
    steps: tuple[Step, ...]

    def sinks(self) -> list[Step]:
        """The steps whose values no later step reads: the loss is made of them."""
        used = {v for s in self.steps for v in s.inputs}
        return [s for s in self.steps if s.out not in used]

    def lines(self, lib: str) -> list[str]:
        used = {v for s in self.steps for v in s.inputs}
        out = [leaf.line(lib, self.seed) for leaf in self.leaves if leaf.name in used]
        out += [s.line(lib) for s in self.steps]
        p = PREFIX[lib]
        terms = [f"({p}{s.out[1:]} * {_weights(lib, self.seed, s)}).sum()" for s in self.sinks()]
        return [*out, f"{p}loss = " + " + ".join(terms), f"{p}loss.backward()"]

    def source(self) -> str:
        """A script that rebuilds the graph in both libraries and says which leaf gradient differs."""
        leaves = [leaf for leaf in self.leaves if any(leaf.name in s.inputs for s in self.steps)]
        pairs = ", ".join(f"(x{v.name[1:]}, t{v.name[1:]})" for v in leaves)
        return "\n".join(
            [
                "import numpy as np, torch, torch.nn.functional as F",
                "from tiny.tensor import Tensor, dtypes",
                "def data(seed, k, shape): return np.random.default_rng([seed, k]).uniform(-1, 1, shape)",
                *self.lines("tiny"),
                *self.lines("torch"),
                f"for x, t in [{pairs}]:",
                "    g = np.zeros(t.shape) if x.grad is None else x.grad.numpy()",
                "    print(np.abs(g - (0 if t.grad is None else t.grad.numpy())).max())",
            ]
        )


def _weights(lib: str, seed: int, s: Step) -> str:
    """A fixed random tensor (not a leaf) that weights a sink in the loss, so every element's gradient differs."""
    make = f"data({seed}, {1000 + int(s.out[1:])}, {s.shape})"
    if lib == "tiny":
        return f"Tensor({make}, dtype=dtypes.{s.dtype})"
    return f"torch.tensor({make}, dtype=torch.{s.dtype})"


def data(seed: int, k: int, shape: tuple[int, ...]) -> np.ndarray:
    """The values of leaf k of graph `seed` (k >= 1000: the loss's weights), uniform in [-1, 1]."""
    return np.random.default_rng([seed, k]).uniform(-1, 1, shape)


# ---------------------------------------------------------------- the generator


class Builder:
    """The graph being drawn: every value made so far (leaves and steps) with its shape and dtype."""

    def __init__(self, seed: int, rng: np.random.Generator, dtype: str, shared_conv_weight: bool) -> None:
        self.seed, self.rng, self.dtype = seed, rng, dtype
        self.shared_conv_weight = shared_conv_weight
        self.values: dict[str, tuple[tuple[int, ...], str]] = {}
        self.leaves: list[Leaf] = []
        self.steps: list[Step] = []

    def chained_weights(self, x: str) -> set[str]:
        """The weights of the convolutions that x was computed through."""
        return conv_weights_upstream(self.steps).get(x, set())

    def shape(self, name: str) -> tuple[int, ...]:
        return self.values[name][0]

    def leaf(self, shape: tuple[int, ...], dtype: str | None = None) -> str:
        name = f"v{len(self.values)}"
        self.values[name] = (shape, dtype or self.dtype)
        self.leaves.append(Leaf(name, shape, dtype or self.dtype))
        return name

    def pick(
        self,
        fits: Callable[[tuple[int, ...]], bool] = lambda s: True,
        avoid: set[str] | None = None,
        like: str | None = None,
    ) -> str | None:
        """A value whose shape fits (and of the dtype of `like`), recent ones likelier (the graph stays connected)."""
        dtype = self.values[like][1] if like is not None else None
        names = [n for n, (s, d) in self.values.items() if fits(s) and n not in (avoid or set()) and dtype in (None, d)]
        if not names:
            return None
        weights = np.arange(1, len(names) + 1, dtype=np.float64) ** 2
        return str(self.rng.choice(names, p=weights / weights.sum()))

    def operand(self, shape: tuple[int, ...], like: str, avoid: set[str] | None = None) -> str:
        """A value of exactly this shape and like's dtype (PyTorch's matmul, conv, lerp ... take one dtype): an
        existing one (a tied weight, a residual) or, often, a new leaf."""
        same = self.pick(lambda s: s == shape, avoid, like)
        return same if same is not None and self.rng.random() < 0.6 else self.leaf(shape, self.values[like][1])

    def maybe(self, shape: tuple[int, ...], like: str, p: float = 0.5) -> str | None:
        """An optional operand (a bias, a norm's weight)."""
        return self.operand(shape, like) if self.rng.random() < p else None

    def emit(
        self,
        op: str,
        inputs: list[str | None],
        tiny: str,
        torch_code: str,
        shape: tuple[int, ...],
        dtype: str | None = None,
    ) -> bool:
        """Record out = op(inputs); None inputs are written as None. False (nothing recorded) when too big."""
        if math.prod(shape) > MAX_NUMEL or 0 in shape:
            return False
        real = [v for v in inputs if v is not None]
        slots = [f"{{{real.index(v)}}}" if v is not None else "None" for v in inputs]
        code = (tiny.format(*slots), torch_code.format(*slots))
        if dtype is None:
            dtype = "float64" if any(self.values[v][1] == "float64" for v in real) else "float32"
        name = f"v{len(self.values)}"
        self.steps.append(Step(name, op, tuple(real), code, shape, dtype))
        self.values[name] = (shape, dtype)
        return True

    def axis(self, shape: tuple[int, ...]) -> int:
        return int(self.rng.integers(len(shape))) - (len(shape) if self.rng.random() < 0.3 else 0)

    def ints(self, low: int, high: int) -> int:
        """An int in [low, high]."""
        return int(self.rng.integers(low, high + 1))


def conv_weights_upstream(steps: list[Step] | tuple[Step, ...]) -> dict[str, set[str]]:
    """For each value, the weights of the convolutions it was computed through."""
    up: dict[str, set[str]] = {}
    for s in steps:
        up[s.out] = set().union(*(up.get(v, set()) for v in s.inputs))
        if s.op.startswith("conv"):
            up[s.out].add(s.inputs[1])
    return up


def chains_a_conv_weight(steps: tuple[Step, ...]) -> bool:
    """Whether a convolution's input was computed through a convolution with the same weight (issue 24.1)."""
    up = conv_weights_upstream(steps)
    return any(s.op.startswith("conv") and s.inputs[1] in up.get(s.inputs[0], set()) for s in steps)


def random_shape(rng: np.random.Generator) -> tuple[int, ...]:
    if rng.random() < 0.35:  # an image (N, C, H, W), for the convolutions and pools
        return (int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(3, 8)), int(rng.integers(3, 8)))
    return tuple(int(d) for d in rng.integers(1, 6, size=int(rng.integers(1, 4))))


def broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    out = []
    for x, y in zip(((1,) * len(b) + a)[-max(len(a), len(b)) :], ((1,) * len(a) + b)[-max(len(a), len(b)) :]):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(out)


# ---------------------------------------------------------------- the op table

# name -> (tiny, torch): elementwise, shape kept; domains kept safe by construction (log of x^2 + 0.5)
UNARY: dict[str, tuple[str, str]] = {
    "neg": ("(-{0})", "(-{0})"),
    "exp": ("{0}.exp()", "{0}.exp()"),
    "log": ("({0}.square() + 0.5).log()", "({0}.square() + 0.5).log()"),
    "sqrt": ("({0}.square() + 0.5).sqrt()", "({0}.square() + 0.5).sqrt()"),
    "rsqrt": ("({0}.square() + 0.5).rsqrt()", "({0}.square() + 0.5).rsqrt()"),
    "reciprocal": ("(2.0 / ({0}.square() + 0.5))", "(2.0 / ({0}.square() + 0.5))"),
    "sin": ("{0}.sin()", "{0}.sin()"),
    "cos": ("{0}.cos()", "{0}.cos()"),
    "tanh": ("{0}.tanh()", "{0}.tanh()"),
    "sigmoid": ("{0}.sigmoid()", "{0}.sigmoid()"),
    "atan": ("{0}.atan()", "{0}.atan()"),
    "erf": ("{0}.erf()", "{0}.erf()"),
    "abs": ("{0}.abs()", "{0}.abs()"),
    "square": ("{0}.square()", "{0}.square()"),
    "cube": ("{0}.pow(3)", "{0}.pow(3)"),
    "rpow": ("(2.0 ** {0})", "(2.0 ** {0})"),
    "affine": ("({0} * 1.5 - 0.25)", "({0} * 1.5 - 0.25)"),
    "rsub": ("(1.0 - {0})", "(1.0 - {0})"),
    "relu": ("{0}.relu()", "{0}.relu()"),
    "leaky_relu": ("{0}.leaky_relu(0.1)", "F.leaky_relu({0}, 0.1)"),
    "gelu": ("{0}.gelu()", "F.gelu({0})"),
    "gelu_tanh": ("{0}.gelu('tanh')", "F.gelu({0}, approximate='tanh')"),
    "silu": ("{0}.silu()", "F.silu({0})"),
    "softplus": ("{0}.softplus()", "F.softplus({0})"),
    "elu": ("{0}.elu()", "F.elu({0})"),
    "selu": ("{0}.selu()", "F.selu({0})"),
    "mish": ("{0}.mish()", "F.mish({0})"),
    "logsigmoid": ("{0}.logsigmoid()", "F.logsigmoid({0})"),
    "hardtanh": ("{0}.hardtanh(-0.5, 0.5)", "F.hardtanh({0}, -0.5, 0.5)"),
    "softsign": ("{0}.softsign()", "F.softsign({0})"),
    "clip": ("{0}.clip(-0.5, 0.8)", "{0}.clip(-0.5, 0.8)"),
    "contiguous": ("{0}.contiguous()", "{0}.contiguous()"),
    "realize": ("{0}.realize()", "{0}"),  # the value is then used both before and after it was computed
    "stop_gradient": ("({0}.detach() * {0})", "({0}.detach() * {0})"),
}

# name -> (tiny, torch): elementwise on two broadcast operands
BINARY: dict[str, tuple[str, str]] = {
    "add": ("({0} + {1})", "({0} + {1})"),
    "sub": ("({0} - {1})", "({0} - {1})"),
    "mul": ("({0} * {1})", "({0} * {1})"),
    "div": ("({0} / ({1}.square() + 0.5))", "({0} / ({1}.square() + 0.5))"),
    "pow": ("({0}.square() + 0.5).pow({1})", "({0}.square() + 0.5).pow({1})"),
    "maximum": ("{0}.maximum({1})", "torch.maximum({0}, {1})"),
    "minimum": ("{0}.minimum({1})", "torch.minimum({0}, {1})"),
    "where": ("({0} > {1}).where({0}, {1} * 2)", "torch.where({0} > {1}, {0}, {1} * 2)"),
    "lerp": ("{0}.lerp({1}, 0.3)", "{0}.lerp({1}, 0.3)"),
}

PROMOTING = frozenset({"add", "sub", "mul", "div"})  # float32 with float64 is float64 (elsewhere PyTorch refuses)


def op_unary(b: Builder) -> bool:
    name = str(b.rng.choice(list(UNARY)))
    a = b.pick()
    return a is not None and b.emit(name, [a], *UNARY[name], b.shape(a))


def op_binary(b: Builder) -> bool:
    name = str(b.rng.choice(list(BINARY)))
    a = b.pick()
    if a is None:
        return False
    sa = b.shape(a)
    like = None if name in PROMOTING else a
    other = b.pick(lambda s: broadcast(sa, s) is not None, like=like) if b.rng.random() < 0.6 else None
    if other is None:  # a new leaf of a shape that broadcasts: a suffix of a's, some sizes 1
        tail = sa[int(b.rng.integers(len(sa) + 1)) :]
        other = b.leaf(tuple(1 if b.rng.random() < 0.3 else d for d in tail), b.values[a][1])
    if b.rng.random() < 0.5:
        a, other = other, a
    out = broadcast(b.shape(a), b.shape(other))
    return out is not None and b.emit(name, [a, other], *BINARY[name], out)


def op_cast(b: Builder) -> bool:
    a = b.pick()
    if a is None:
        return False
    if b.values[a][1] == "float32":
        return b.emit("cast", [a], "{0}.cast(dtypes.float64)", "{0}.double()", b.shape(a), "float64")
    return b.emit("cast", [a], "{0}.cast(dtypes.float32)", "{0}.float()", b.shape(a), "float32")


def _keep(shape: tuple[int, ...], axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    norm = {a % len(shape) for a in axes}
    return tuple(1 if i in norm else d for i, d in enumerate(shape) if keepdim or i not in norm)


def op_reduce(b: Builder) -> bool:
    a = b.pick(lambda s: len(s) >= 1)
    if a is None:
        return False
    s = b.shape(a)
    keep = bool(b.rng.random() < 0.4)
    name = str(b.rng.choice(["sum", "mean", "max", "min", "prod", "var", "std", "logsumexp", "all"]))
    if name == "all":  # everything to one value
        which = str(b.rng.choice(["sum", "mean", "max"]))
        return b.emit(f"{which} all", [a], f"{{0}}.{which}()", f"{{0}}.{'amax' if which == 'max' else which}()", ())
    if name in ("sum", "mean", "max", "min") and len(s) > 1 and b.rng.random() < 0.4:
        axes = tuple(sorted(int(x) for x in b.rng.choice(len(s), size=2, replace=False)))
        ax = str(axes)
    else:
        axes = (b.axis(s),)
        ax = str(axes[0])
    if name in ("var", "std") and math.prod(s[x] for x in axes) < 2:
        return False
    arg, arg_torch = "{0}", "{0}"
    if name in ("var", "std"):
        # values that are all equal (a gather of one element, repeated) have no gradient of their spread: PyTorch's
        # is its rounding of their mean, amplified; a ramp along the axis keeps them apart (seed 4515)
        d0 = axes[0] % len(s)
        ramp = str((np.arange(s[d0]) * 0.125).reshape([-1 if d == d0 else 1 for d in range(len(s))]).tolist())
        arg, arg_torch = f"({{0}} + Tensor({ramp}))", f"({{0}} + torch.tensor({ramp}))"
    tiny = f"{arg}.{name}({ax}, keepdim={keep})"
    theirs = {"max": "amax", "min": "amin"}.get(name, name)
    return b.emit(name, [a], tiny, f"{arg_torch}.{theirs}({ax}, keepdim={keep})", _keep(s, axes, keep))


def op_scan(b: Builder) -> bool:
    """softmax, log_softmax and the cumulative ops: shape kept, along one axis."""
    a = b.pick(lambda s: len(s) >= 1)
    if a is None:
        return False
    ax = b.axis(b.shape(a))
    name = str(b.rng.choice(["softmax", "log_softmax", "cumsum", "cumprod", "cummax"]))
    both = f"{{0}}.{name}({ax})" + (".values" if name == "cummax" else "")  # (cummax: values and indices in both)
    return b.emit(name, [a], both, both, b.shape(a))


def _factor(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    """A random shape of n elements."""
    dims = []
    while n > 1 and len(dims) < 3:
        divisors = [d for d in range(2, n + 1) if n % d == 0]
        d = int(rng.choice(divisors)) if rng.random() < 0.8 else n
        dims.append(d)
        n //= d
    if n > 1:
        dims.append(n)
    dims += [1] * int(rng.random() < 0.3)
    order = rng.permutation(len(dims)) if dims else []
    return tuple(dims[i] for i in order)


def op_movement(b: Builder) -> bool:
    a = b.pick()
    if a is None:
        return False
    s, rng = b.shape(a), b.rng
    name = str(rng.choice(["reshape", "permute", "expand", "pad", "shrink", "slice", "flip", "repeat", "roll"]))
    if name == "reshape":
        new = _factor(rng, math.prod(s))
        return b.emit("reshape", [a], f"{{0}}.reshape({new})", f"{{0}}.reshape({new})", new)
    if not s:
        return False
    if name == "permute":
        perm = tuple(int(p) for p in rng.permutation(len(s)))
        return b.emit("permute", [a], f"{{0}}.permute({perm})", f"{{0}}.permute({perm})", tuple(s[p] for p in perm))
    if name == "expand":  # a new leading dim, or a size-1 dim made wider
        ones = [i for i, d in enumerate(s) if d == 1]
        new = (b.ints(2, 3), *s) if not ones else tuple(b.ints(2, 4) if i in ones else d for i, d in enumerate(s))
        return b.emit("expand", [a], f"{{0}}.expand({new})", f"{{0}}.expand({new})", new)
    if name == "pad":  # some sides padded, some cropped (negative), with 0 or another value
        pairs = [(b.ints(-(d // 2), 2), b.ints(-(d // 2), 2)) for d in s]
        pairs = [(lo, hi) if d + lo + hi > 0 else (0, 0) for (lo, hi), d in zip(pairs, s)]
        flat = tuple(x for pair in reversed(pairs) for x in pair)
        value = float(rng.choice([0.0, 0.5]))
        new = tuple(d + lo + hi for d, (lo, hi) in zip(s, pairs))
        return b.emit(
            "pad", [a], f"{{0}}.pad({tuple(pairs)}, value={value})", f"F.pad({{0}}, {flat}, value={value})", new
        )
    if name in ("shrink", "slice"):
        bounds = []
        for d in s:
            lo = b.ints(0, d - 1)
            bounds.append((lo, b.ints(lo + 1, d)))
        if name == "shrink":
            index = ", ".join(f"{lo}:{hi}" for lo, hi in bounds)
            new = tuple(hi - lo for lo, hi in bounds)
            return b.emit("shrink", [a], f"{{0}}.shrink({tuple(bounds)})", f"{{0}}[{index}]", new)
        steps = [b.ints(1, 3) for _ in s]
        index = ", ".join(f"{lo}:{hi}:{st}" for (lo, hi), st in zip(bounds, steps))
        new = tuple(len(range(lo, hi, st)) for (lo, hi), st in zip(bounds, steps))
        return b.emit("slice", [a], f"{{0}}[{index}]", f"{{0}}[{index}]", new)
    if name == "flip":
        axes = tuple(sorted({b.axis(s) % len(s) for _ in range(b.ints(1, len(s)))}))
        return b.emit("flip", [a], f"{{0}}.flip({axes})", f"{{0}}.flip({axes})", s)
    if name == "repeat":
        reps = tuple(b.ints(1, 2) for _ in s)
        new = tuple(d * r for d, r in zip(s, reps))
        return b.emit("repeat", [a], f"{{0}}.repeat({reps})", f"{{0}}.repeat({reps})", new)
    ax, shift = b.axis(s), b.ints(-3, 3)
    return b.emit("roll", [a], f"{{0}}.roll({shift}, {ax})", f"{{0}}.roll({shift}, {ax})", s)


def op_join(b: Builder) -> bool:
    """cat and stack with another value (often the same one), chunk and transpose."""
    a = b.pick(lambda s: len(s) >= 1)
    if a is None:
        return False
    s = b.shape(a)
    ax = b.axis(s)
    name = str(b.rng.choice(["cat", "stack", "chunk", "transpose"]))
    if name == "cat":
        want = b.ints(1, 3)
        other = b.operand(tuple(want if i == ax % len(s) else d for i, d in enumerate(s)), a)
        new = tuple(d + b.shape(other)[i] if i == ax % len(s) else d for i, d in enumerate(s))
        return b.emit("cat", [a, other], f"{{0}}.cat({{1}}, dim={ax})", f"torch.cat([{{0}}, {{1}}], dim={ax})", new)
    if name == "stack":
        other = b.operand(s, a)
        pos = ax % (len(s) + 1)
        new = (*s[:pos], 2, *s[pos:])
        return b.emit(
            "stack", [a, other], f"{{0}}.stack({{1}}, dim={pos})", f"torch.stack([{{0}}, {{1}}], dim={pos})", new
        )
    if name == "chunk":
        d = s[ax]
        n = b.ints(1, 3)
        size = -(-d // n)
        pieces = -(-d // size)
        i = b.ints(0, pieces - 1)
        new = tuple(min(size, d - i * size) if j == ax % len(s) else e for j, e in enumerate(s))
        return b.emit("chunk", [a], f"{{0}}.chunk({n}, {ax})[{i}]", f"{{0}}.chunk({n}, {ax})[{i}]", new)
    d1 = b.axis(s)
    new = list(s)
    new[ax], new[d1] = new[d1], new[ax]
    return b.emit("transpose", [a], f"{{0}}.transpose({ax}, {d1})", f"{{0}}.transpose({ax}, {d1})", tuple(new))


def op_matmul(b: Builder) -> bool:
    """a @ w with w (k, m) (tied when it is an existing value), a linear layer, or a @ a^T."""
    a = b.pick(lambda s: len(s) >= 1)
    if a is None:
        return False
    s = b.shape(a)
    k = s[-1]
    name = str(b.rng.choice(["matmul", "linear", "gram"]))
    if name == "gram" and len(s) >= 2:
        new = (*s[:-1], s[-2])
        return b.emit("gram", [a], "({0} @ {0}.transpose(-1, -2))", "({0} @ {0}.transpose(-1, -2))", new)
    m = k if b.rng.random() < 0.5 else b.ints(1, 5)
    if name == "linear":
        w, bias = b.operand((m, k), a), b.maybe((m,), a)
        return b.emit("linear", [a, w, bias], "{0}.linear({1}, {2})", "F.linear({0}, {1}, {2})", (*s[:-1], m))
    if b.rng.random() < 0.2:
        w = b.operand((k,), a)
        return b.emit("matvec", [a, w], "({0} @ {1})", "({0} @ {1})", s[:-1])
    w = b.operand((k, m), a)
    return b.emit("matmul", [a, w], "({0} @ {1})", "({0} @ {1})", (*s[:-1], m))


def op_attention(b: Builder) -> bool:
    """scaled_dot_product_attention, often with q, k and v one value."""
    q = b.pick(lambda s: len(s) >= 2)
    if q is None:
        return False
    s = b.shape(q)
    k = q if b.rng.random() < 0.5 else b.operand((*s[:-2], b.ints(1, 4), s[-1]), q)
    v = k if b.rng.random() < 0.5 else b.operand((*b.shape(k)[:-1], b.ints(1, 4)), q)
    causal = bool(b.rng.random() < 0.3)
    code = f"{{0}}.scaled_dot_product_attention({{1}}, {{2}}, is_causal={causal})"
    theirs = f"F.scaled_dot_product_attention({{0}}, {{1}}, {{2}}, is_causal={causal})"
    ins = [q, k, v]
    names = list(dict.fromkeys(ins))
    slots = tuple(f"{{{names.index(x)}}}" for x in ins)
    new = (*s[:-1], b.shape(v)[-1])
    return b.emit("attention", names, code.format(*slots), theirs.format(*slots), new)  # type: ignore[arg-type]


def _conv_weight(b: Builder, shape: tuple[int, ...], x: str) -> str:
    """A convolution's weight: an existing value of that shape (a tied weight) or a new leaf. Until issue 24.1 is
    fixed (x.conv2d(w).conv2d(w): w's gradient counts the inner path twice; fixed on branch trust1) it is never a
    weight x was computed through, unless the graph is drawn with shared_conv_weight."""
    return b.operand(shape, x, None if b.shared_conv_weight else b.chained_weights(x))


def op_conv(b: Builder) -> bool:
    """conv2d, conv1d or conv_transpose2d: stride, padding, dilation, groups and bias drawn."""
    nd = 1 if b.rng.random() < 0.3 else 2
    x = b.pick(lambda s: len(s) == nd + 2 and min(s[2:]) >= 3)
    if x is None or b.rng.random() < 0.15:  # a new input: one tensor feeding two convolutions comes from reuse
        x = b.leaf((b.ints(1, 2), b.ints(1, 3), *(b.ints(4, 7) for _ in range(nd))))
    n, c, *space = b.shape(x)
    k = [b.ints(1, 3) for _ in space]
    stride, dilation, padding = b.ints(1, 2), b.ints(1, 2), b.ints(0, 1)
    transposed = nd == 2 and b.rng.random() < 0.25
    groups = c if c > 1 and b.rng.random() < 0.25 else 1
    cout = c if b.rng.random() < 0.5 else groups * b.ints(1, 3)
    shared = b.shared_conv_weight and b.pick(
        lambda s: len(s) == nd + 2 and s[1] == c, set(b.values) - b.chained_weights(x), x
    )
    if shared:  # issue 24.1's graphs: a weight x was computed through, again
        w, transposed, groups = shared, False, 1
        cout, *k = b.shape(w)[0], *b.shape(w)[2:]
    if transposed:
        out = [(d - 1) * stride - 2 * padding + dilation * (kk - 1) + 1 for d, kk in zip(space, k)]
        w = _conv_weight(b, (c, cout // groups, *k), x)
    else:
        out = [(d + 2 * padding - dilation * (kk - 1) - 1) // stride + 1 for d, kk in zip(space, k)]
        w = shared or _conv_weight(b, (cout, c // groups, *k), x)
    if min(out) < 1:
        return False
    bias = b.maybe((cout,), x, 0.3)
    args = f"stride={stride}, padding={padding}, dilation={dilation}, groups={groups}"
    name = "conv_transpose2d" if transposed else f"conv{nd}d"
    return b.emit(
        name,
        [x, w, bias],
        f"{{0}}.{name}({{1}}, {{2}}, {args})",
        f"F.{name}({{0}}, {{1}}, {{2}}, {args})",
        (n, cout, *out),
    )


def _pool_out(d: int, k: int, stride: int, pad: int, ceil: bool) -> int:
    out = (d + 2 * pad - k + (stride - 1 if ceil else 0)) // stride + 1
    return out - 1 if ceil and (out - 1) * stride >= d + pad else out


def op_pool(b: Builder) -> bool:
    """max_pool and avg_pool (2d on (N, C, H, W), 1d on (N, C, L)), and adaptive_avg_pool2d."""
    x = b.pick(lambda s: len(s) in (3, 4) and min(s[2:]) >= 2)
    if x is None:
        return False
    n, c, *space = b.shape(x)
    nd = len(space)
    k = b.ints(2, min(3, *space))
    stride, pad, ceil = b.ints(1, k), b.ints(0, k // 2), bool(b.rng.random() < 0.3)
    out = tuple(_pool_out(d, k, stride, pad, ceil) for d in space)
    kind = str(b.rng.choice(["max", "avg", "adaptive"] if nd == 2 else ["max", "avg"]))
    if kind == "adaptive":
        size = tuple(b.ints(1, d) for d in space)
        tiny = f"{{0}}.adaptive_avg_pool2d({size})"
        return b.emit("adaptive_avg_pool2d", [x], tiny, f"F.adaptive_avg_pool2d({{0}}, {size})", (n, c, *size))
    args = f"{k}, stride={stride}, padding={pad}, ceil_mode={ceil}"
    if kind == "avg":
        args += f", count_include_pad={bool(b.rng.random() < 0.5)}"
    name = f"{kind}_pool{nd}d"
    return b.emit(name, [x], f"{{0}}.{name}({args})", f"F.{name}({{0}}, {args})", (n, c, *out))


def _nested(rng: np.random.Generator, shape: tuple[int, ...], high: int) -> str:
    """A nested list literal of random ints in [0, high), as both libraries' tensor constructors read it."""
    return str(rng.integers(0, high, size=shape).tolist())


def op_index(b: Builder) -> bool:
    """Advanced indexing with repeated indices, gather, masked_fill and tril."""
    a = b.pick(lambda s: len(s) >= 1)
    if a is None:
        return False
    s = b.shape(a)
    name = str(b.rng.choice(["index", "gather", "masked_fill", "tril"]))
    if name == "index":
        dim = b.ints(0, len(s) - 1)
        picks = _nested(b.rng, (b.ints(1, 4),), s[dim])
        index = ":, " * dim + picks
        new = (*s[:dim], len(eval(picks)), *s[dim + 1 :])  # noqa: S307  (our own literal)
        return b.emit("index", [a], f"{{0}}[{index}]", f"{{0}}[{index}]", new)
    if name == "gather":
        dim = b.ints(0, len(s) - 1)
        new = tuple(b.ints(1, 4) if i == dim else b.ints(1, d) for i, d in enumerate(s))
        idx = _nested(b.rng, new, s[dim])
        return b.emit(
            "gather", [a], f"{{0}}.gather({dim}, Tensor({idx}))", f"{{0}}.gather({dim}, torch.tensor({idx}))", new
        )
    if name == "masked_fill":
        mask = str((b.rng.random(s[-1:]) < 0.4).tolist())
        tiny = f"{{0}}.masked_fill(Tensor({mask}), 0.5)"
        return b.emit("masked_fill", [a], tiny, f"{{0}}.masked_fill(torch.tensor({mask}), 0.5)", s)
    if len(s) < 2:
        return False
    diag = b.ints(-1, 1)
    return b.emit("tril", [a], f"{{0}}.tril({diag})", f"{{0}}.tril({diag})", s)


def op_norm(b: Builder) -> bool:
    """layer_norm, rms_norm, batch_norm (training, the batch's statistics) and group_norm, weights often tied."""
    a = b.pick(lambda s: len(s) >= 2)
    if a is None:
        return False
    s = b.shape(a)
    name = str(b.rng.choice(["layer_norm", "rms_norm", "batch_norm", "group_norm"]))
    if name in ("layer_norm", "rms_norm"):
        ns = s[-2:] if b.rng.random() < 0.3 else s[-1:]
        w = b.maybe(ns, a)
        if name == "rms_norm":
            return b.emit(name, [a, w], f"{{0}}.rms_norm({ns}, {{1}})", f"F.rms_norm({{0}}, {ns}, {{1}})", s)
        bias = b.maybe(ns, a)
        return b.emit(
            name, [a, w, bias], f"{{0}}.layer_norm({ns}, {{1}}, {{2}})", f"F.layer_norm({{0}}, {ns}, {{1}}, {{2}})", s
        )
    c = s[1]
    w, bias = b.maybe((c,), a), b.maybe((c,), a)
    if name == "batch_norm":
        if math.prod(s) // c < 2:
            return False
        tiny = "{0}.batch_norm(None, None, {1}, {2}, training=True)"
        return b.emit(name, [a, w, bias], tiny, "F.batch_norm({0}, None, None, {1}, {2}, training=True)", s)
    groups = int(b.rng.choice([g for g in range(1, c + 1) if c % g == 0]))
    if (w is None) != (bias is None) or c // groups * math.prod(s[2:]) < 2:  # PyTorch refuses these
        return False
    tiny = f"{{0}}.group_norm({groups}, {{1}}, {{2}})"
    return b.emit(name, [a, w, bias], tiny, f"F.group_norm({{0}}, {groups}, {{1}}, {{2}})", s)


def op_loss(b: Builder) -> bool:
    """mse, l1, cross entropy (class indices or probabilities), nll and binary cross entropy."""
    a = b.pick(lambda s: len(s) >= 1)
    if a is None:
        return False
    s = b.shape(a)
    reduction = str(b.rng.choice(["mean", "sum", "none"]))
    red = f"reduction='{reduction}'"
    name = str(b.rng.choice(["mse_loss", "l1_loss", "cross_entropy", "nll_loss", "bce_logits", "bce"]))
    same = s if reduction == "none" else ()
    if name in ("mse_loss", "l1_loss", "bce_logits", "bce"):
        target = b.operand(s, a, {a} if name == "l1_loss" else None)  # |x - x| has no derivative at 0
        code = {
            "mse_loss": ("{0}.mse_loss({1}, %s)", "F.mse_loss({0}, {1}, %s)"),
            "l1_loss": ("{0}.l1_loss({1}, %s)", "F.l1_loss({0}, {1}, %s)"),
            "bce_logits": (
                "{0}.binary_cross_entropy_with_logits({1}.sigmoid(), %s)",
                "F.binary_cross_entropy_with_logits({0}, {1}.sigmoid(), %s)",
            ),
            "bce": (
                "{0}.sigmoid().binary_cross_entropy({1}.sigmoid(), %s)",
                "F.binary_cross_entropy({0}.sigmoid(), {1}.sigmoid(), %s)",
            ),
        }[name]
        return b.emit(name, [a, target], code[0] % red, code[1] % red, same)
    # class dim 1 of (N, C, ...), or the only dim of (C,)
    rest = (s[0], *s[2:]) if len(s) > 1 else ()
    out = rest if reduction == "none" else ()
    smooth = float(b.rng.choice([0.0, 0.1]))
    if name == "cross_entropy" and b.rng.random() < 0.3:  # class probabilities, from another value
        p = b.operand(s, a)
        dim = 1 if len(s) > 1 else 0
        tiny = f"{{0}}.cross_entropy({{1}}.softmax({dim}), {red}, label_smoothing={smooth})"
        theirs = f"F.cross_entropy({{0}}, {{1}}.softmax({dim}), {red}, label_smoothing={smooth})"
        return b.emit(name, [a, p], tiny, theirs, out)
    c = s[1] if len(s) > 1 else s[0]
    target = _nested(b.rng, rest, c) if rest else str(b.ints(0, c - 1))
    if name == "cross_entropy":
        tiny = f"{{0}}.cross_entropy(Tensor({target}), {red}, label_smoothing={smooth})"
        theirs = f"F.cross_entropy({{0}}, torch.tensor({target}), {red}, label_smoothing={smooth})"
        return b.emit(name, [a], tiny, theirs, out)
    dim = 1 if len(s) > 1 else 0
    tiny = f"{{0}}.log_softmax({dim}).nll_loss(Tensor({target}), {red})"
    return b.emit(name, [a], tiny, f"F.nll_loss({{0}}.log_softmax({dim}), torch.tensor({target}), {red})", out)


# name -> (how often, how to draw one)
OPS: dict[str, tuple[float, Callable[[Builder], bool]]] = {
    "unary": (4, op_unary),
    "binary": (4, op_binary),
    "cast": (0.5, op_cast),
    "reduce": (2, op_reduce),
    "scan": (1, op_scan),
    "movement": (3, op_movement),
    "join": (1.5, op_join),
    "matmul": (2, op_matmul),
    "attention": (0.5, op_attention),
    "conv": (2.5, op_conv),
    "pool": (1.5, op_pool),
    "index": (1.5, op_index),
    "norm": (1, op_norm),
    "loss": (1, op_loss),
}


def generate(seed: int, attempt: int = 0, shared_conv_weight: bool = False) -> Program:
    """Graph `seed` (drawn again with another attempt when its values run wild): 3 to 10 ops on 1 or 2 leaves
    and the leaves the ops add. shared_conv_weight lets two convolutions share a weight (issue 24.1)."""
    rng = np.random.default_rng([seed, attempt])
    b = Builder(seed, rng, "float64" if rng.random() < 0.35 else "float32", shared_conv_weight)
    for _ in range(b.ints(1, 2)):
        b.leaf(random_shape(rng))
    count = b.ints(3, 10)
    names = list(OPS)
    weights = np.array([OPS[n][0] for n in names])
    while len(b.steps) < count:
        OPS[str(rng.choice(names, p=weights / weights.sum()))][1](b)
    return Program(seed, tuple(b.leaves), tuple(b.steps))


# ---------------------------------------------------------------- running, comparing, shrinking


@dataclass(frozen=True)
class Outcome:
    values: dict[str, np.ndarray]  # each sink's forward value, and the loss's
    grads: dict[str, np.ndarray]  # each used leaf's gradient (zeros where it got none)


def run(program: Program, lib: str) -> Outcome:
    """Run the program's lines in one library and read back the sinks, the loss and the leaves' gradients."""
    space = {"np": np, "torch": torch, "F": F, "Tensor": Tensor, "dtypes": dtypes, "data": data}
    exec("\n".join(program.lines(lib)), space)  # noqa: S102  (lines the generator wrote)
    p = PREFIX[lib]
    used = {v for s in program.steps for v in s.inputs}
    leaves = [leaf for leaf in program.leaves if leaf.name in used]
    values = {s.out: space[p + s.out[1:]] for s in program.sinks()}
    values["loss"] = space[p + "loss"]
    grads = {leaf.name: space[p + leaf.name[1:]].grad for leaf in leaves}
    if lib == "tiny":  # everything in one schedule: fewer kernels to compile than one realize per tensor
        wanted = [t for t in (*values.values(), *grads.values()) if t is not None]
        wanted[0].realize(*wanted[1:])
    return Outcome(
        {k: _numpy(t) for k, t in values.items()},
        {k: np.zeros(_shape(program, k)) if t is None else _numpy(t) for k, t in grads.items()},
    )


def _numpy(t: Tensor | torch.Tensor) -> np.ndarray:
    return t.numpy() if isinstance(t, Tensor) else t.detach().numpy()


class Hang(Exception):
    """tiny took longer than TIME_LIMIT over one graph."""


def limited(fn: Callable[[], T], seconds: float | None = None) -> T:
    """fn(), interrupted by Hang after some seconds (TIME_LIMIT): a rewrite that never ends is a finding too."""
    seconds = seconds or TIME_LIMIT

    def stop(signum: int, frame: object) -> None:
        raise Hang(f"no result after {seconds:.0f} s")

    before = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)  # again each second: a finalizer may swallow one
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def tame(outcome: Outcome) -> bool:
    arrays = [*outcome.values.values(), *outcome.grads.values()]
    return all(np.isfinite(a).all() and (a.size == 0 or np.abs(a).max() <= TAME) for a in arrays)


def mismatches(program: Program, ref: Outcome | None = None) -> list[str]:
    """What tiny computes differently from PyTorch (each sink, the loss, each leaf's gradient); an error tiny
    raises is one mismatch. Tolerances: `tolerance_class`."""
    ref = ref or run(program, "torch")
    try:
        got = limited(lambda: run(program, "tiny"))
    except Exception as e:  # noqa: BLE001  (any error is a finding, reported with the graph)
        return [f"tiny raised {type(e).__name__}: {e}"]
    rtol, atol = TOLERANCE[tolerance_class(program)]
    found = []
    for kind, ours, theirs in (("value", got.values, ref.values), ("gradient of", got.grads, ref.grads)):
        for name, want in theirs.items():
            have = ours[name]
            if have.shape != want.shape:
                found.append(f"{kind} {name}: shape {have.shape}, PyTorch {want.shape}")
                continue
            bound = atol * max(1.0, float(np.abs(want).max(initial=0))) + rtol * np.abs(want)
            err = np.abs(have.astype(np.float64) - want)
            if not (err <= bound).all():  # NaN too
                at = np.unravel_index(int(np.argmax(np.where(np.isnan(err), np.inf, err - bound))), err.shape)
                found.append(f"{kind} {name}: {have[at]} at {tuple(int(i) for i in at)}, PyTorch {want[at]}")
    return found


def tolerance_class(program: Program) -> str:
    """float32's when any value of the graph is float32, else float64's."""
    if any(s.dtype == "float32" for s in program.steps) or any(v.dtype == "float32" for v in program.leaves):
        return "float32"
    return "float64"


def draw(seed: int, shared_conv_weight: bool = False) -> tuple[Program, Outcome]:
    """Graph `seed` and PyTorch's outcome: the first attempt whose reference values stay finite and moderate."""
    for attempt in range(50):
        program = generate(seed, attempt, shared_conv_weight)
        ref = run(program, "torch")
        if tame(ref):
            return program, ref
    raise AssertionError(f"autograd fuzz seed {seed}: no attempt of 50 kept its values below {TAME}")


def fails(program: Program) -> bool:
    """Whether a (shrunk) program still shows a mismatch; one PyTorch rejects or that runs wild does not."""
    try:
        ref = run(program, "torch")
    except Exception:  # noqa: BLE001  (dropping an op can leave a graph PyTorch refuses)
        return False
    return tame(ref) and bool(mismatches(program, ref))


def _without(program: Program, i: int, bypass: bool) -> Program | None:
    """The program without step i: its readers read its first input of the same shape (bypass), or are dropped
    too (and theirs, and so on)."""
    step = program.steps[i]
    if bypass:
        twin = next((v for v in step.inputs if _shape(program, v) == step.shape), None)
        if twin is None:
            return None
        steps = [
            replace(s, inputs=tuple(twin if v == step.out else v for v in s.inputs))
            for s in program.steps
            if s is not step
        ]
    else:
        gone = {step.out}
        steps = []
        for s in program.steps:
            if s.out in gone or gone & set(s.inputs):
                gone.add(s.out)
            else:
                steps.append(s)
    return replace(program, steps=tuple(steps)) if steps else None


def _shape(program: Program, name: str) -> tuple[int, ...]:
    return next(
        v.shape for v in (*program.leaves, *program.steps) if (v.name if isinstance(v, Leaf) else v.out) == name
    )


def shrink(program: Program) -> Program:
    """Drop steps while the program still fails, until no single step can go."""
    progress = True
    while progress:
        progress = False
        for i in reversed(range(len(program.steps))):
            for bypass in (True, False):
                smaller = _without(program, i, bypass)
                if smaller is not None and fails(smaller):
                    program, progress = smaller, True
                    break
            if progress:
                break
    return program


def check_seed(seed: int, shared_conv_weight: bool = False) -> str | None:
    """None when graph `seed` matches PyTorch; else what differs, and a shrunk reproducer."""
    program, ref = draw(seed, shared_conv_weight)
    found = mismatches(program, ref)
    if not found:
        return None
    if any(line.startswith("tiny raised Hang") for line in found):
        # (not shrunk: each try would wait out the time limit again, and the alarm that ended the run may have struck
        # inside a lock or a thread's start, which later runs in this process can trip over; rerun the seed alone)
        return f"autograd fuzz seed {seed} ({len(program.steps)} ops): {found[0]}; rerun the seed alone to tell"
    small = shrink(program)
    return "\n".join(
        [
            f"autograd fuzz seed {seed} ({len(program.steps)} ops): tiny differs from PyTorch",
            *(f"  {line}" for line in found),
            f"reproducer ({len(small.steps)} of the {len(program.steps)} ops kept; mismatches now: "
            f"{'; '.join(mismatches(small))}):",
            small.source(),
        ]
    )
