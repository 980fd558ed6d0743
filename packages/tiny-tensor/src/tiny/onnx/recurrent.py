"""ONNX's recurrent layers (RNN, GRU, LSTM) as tiny tensor ops, unrolled over the sequence."""

from __future__ import annotations

from collections.abc import Callable

from tiny.onnx.model import NodeCall, register
from tiny.tensor import Tensor

Activation = Callable[[Tensor], Tensor]


def _activation(name: str, alpha: float | None, beta: float | None) -> Activation:
    """One of the activations the recurrent ops name (with their alpha and beta where they take them)."""
    table: dict[str, Callable[[float | None, float | None], Activation]] = {
        "Sigmoid": lambda a, b: Tensor.sigmoid,
        "Tanh": lambda a, b: Tensor.tanh,
        "Relu": lambda a, b: Tensor.relu,
        "Softsign": lambda a, b: lambda x: x / (x.abs() + 1),
        "Softplus": lambda a, b: Tensor.softplus,
        "Affine": lambda a, b: lambda x: x * (1.0 if a is None else a) + (0.0 if b is None else b),
        "LeakyRelu": lambda a, b: lambda x: (x < 0).where(x * (0.01 if a is None else a), x),
        "ThresholdedRelu": lambda a, b: lambda x: (x > (1.0 if a is None else a)).where(x, 0.0),
        "ScaledTanh": lambda a, b: lambda x: (x * (1.0 if b is None else b)).tanh() * (1.0 if a is None else a),
        "HardSigmoid": lambda a, b: lambda x: (x * (0.2 if a is None else a) + (0.5 if b is None else b)).clip(0, 1),
        "Elu": lambda a, b: lambda x: (x < 0).where((x.exp() - 1) * (1.0 if a is None else a), x),
    }
    key = next((k for k in table if k.lower() == name.lower()), None)
    if key is None:
        raise ValueError(f"activation {name!r} is not one of {sorted(table)}")
    return table[key](alpha, beta)


def _activations(c: NodeCall, defaults: list[str], directions: int) -> list[list[Activation]]:
    """Per direction, the cell's activations (the attribute lists them for every direction in turn)."""
    names = c.attr("activations", defaults * directions)
    if len(names) == len(defaults):
        names = names * directions
    alphas, betas = c.attr("activation_alpha", []), c.attr("activation_beta", [])
    fns = [
        _activation(n, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None)
        for i, n in enumerate(names)
    ]
    per = len(defaults)
    return [fns[d * per : (d + 1) * per] for d in range(directions)]


class _Setup:
    """What every recurrent op reads the same way: the sequence as (seq, batch, input), the directions, the
    weights per direction, the initial states, clipping."""

    def __init__(self, c: NodeCall, gates: int) -> None:
        self.c = c
        x = c.tensor(0)
        self.layout = c.attr("layout", 0)
        self.x = x.transpose(0, 1) if self.layout else x
        direction = c.attr("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ValueError(f"{c.where}: direction must be forward, reverse or bidirectional, got {direction!r}")
        self.reversed = [direction == "reverse"] if direction != "bidirectional" else [False, True]
        self.w, self.r = c.tensor(1), c.tensor(2)
        self.hidden = c.attr("hidden_size", self.r.shape[-1])
        self.bias = c.opt(3)
        seq, batch = self.x.shape[0], self.x.shape[1]
        if c.has(4) and any(n != seq for n in c.ints(4)):
            raise NotImplementedError(f"{c.where}: sequences of different lengths (sequence_lens {c.ints(4)})")
        self.steps, self.batch, self.gates = seq, batch, gates
        self.clip = c.attr("clip")

    def initial(self, i: int, d: int) -> Tensor:
        if self.c.has(i):
            h = self.c.tensor(i)
            return (h.transpose(0, 1) if self.layout else h)[d]
        return Tensor.zeros(self.batch, self.hidden, dtype=self.x.dtype, device=self.c.device)

    def biases(self, d: int) -> tuple[Tensor | float, Tensor | float]:
        """The input's and the recurrence's biases of direction d, (gates * hidden,) each."""
        if self.bias is None:
            return 0.0, 0.0
        n = self.gates * self.hidden
        return self.bias[d, :n], self.bias[d, n:]

    def clipped(self, t: Tensor) -> Tensor:
        return t.clip(-self.clip, self.clip) if self.clip is not None else t

    def outputs(self, per_direction: list[list[Tensor]], finals: list[list[Tensor]]) -> list[Tensor]:
        """Y (seq, directions, batch, hidden) and the last states (directions, batch, hidden), in the layout asked."""
        y = Tensor.stack(*[Tensor.stack(*hs, dim=0) for hs in per_direction], dim=1)
        states = [Tensor.stack(*f, dim=0) for f in zip(*finals)]
        if self.layout:
            y = y.permute(2, 0, 1, 3)
            states = [s.transpose(0, 1) for s in states]
        return [y, *states]

    def order(self, d: int) -> list[int]:
        return list(range(self.steps))[::-1] if self.reversed[d] else list(range(self.steps))


@register("RNN")
def rnn(c: NodeCall) -> list[Tensor]:
    s = _Setup(c, 1)
    acts = _activations(c, ["Tanh"], len(s.reversed))
    ys, finals = [], []
    for d in range(len(s.reversed)):
        (f,) = acts[d]
        wb, rb = s.biases(d)
        h = s.initial(5, d)
        hs = [None] * s.steps
        for t in s.order(d):
            h = f(s.clipped(s.x[t] @ s.w[d].T + h @ s.r[d].T + wb + rb))
            hs[t] = h
        ys.append(hs)
        finals.append([h])
    return s.outputs(ys, finals)


@register("GRU")
def gru(c: NodeCall) -> list[Tensor]:
    s = _Setup(c, 3)
    acts = _activations(c, ["Sigmoid", "Tanh"], len(s.reversed))
    before_reset = c.attr("linear_before_reset", 0)
    n = s.hidden
    ys, finals = [], []
    for d in range(len(s.reversed)):
        f, g = acts[d]
        wb, rb = s.biases(d)
        w, r = s.w[d], s.r[d]  # gates z, r, h
        wb = wb if isinstance(wb, Tensor) else Tensor.zeros(3 * n, dtype=s.x.dtype, device=c.device)
        rb = rb if isinstance(rb, Tensor) else Tensor.zeros(3 * n, dtype=s.x.dtype, device=c.device)
        h = s.initial(5, d)
        hs = [None] * s.steps
        for t in s.order(d):
            xw = s.x[t] @ w.T + wb
            hr = h @ r[: 2 * n].T + rb[: 2 * n]
            z = f(s.clipped(xw[:, :n] + hr[:, :n]))
            reset = f(s.clipped(xw[:, n : 2 * n] + hr[:, n:]))
            if before_reset:
                cand = g(s.clipped(xw[:, 2 * n :] + reset * (h @ r[2 * n :].T + rb[2 * n :])))
            else:
                cand = g(s.clipped(xw[:, 2 * n :] + (reset * h) @ r[2 * n :].T + rb[2 * n :]))
            h = (1 - z) * cand + z * h
            hs[t] = h
        ys.append(hs)
        finals.append([h])
    return s.outputs(ys, finals)


@register("LSTM")
def lstm(c: NodeCall) -> list[Tensor]:
    s = _Setup(c, 4)
    acts = _activations(c, ["Sigmoid", "Tanh", "Tanh"], len(s.reversed))
    if c.attr("input_forget", 0):
        raise NotImplementedError(f"{c.where}: input_forget=1 (coupled input and forget gates)")
    n = s.hidden
    peep = c.opt(7)
    ys, finals = [], []
    for d in range(len(s.reversed)):
        f, g, hfn = acts[d]
        wb, rb = s.biases(d)
        h, cell = s.initial(5, d), s.initial(6, d)
        pi, po, pf = (peep[d, i * n : (i + 1) * n] for i in range(3)) if peep is not None else (0.0, 0.0, 0.0)
        hs = [None] * s.steps
        for t in s.order(d):
            z = s.x[t] @ s.w[d].T + h @ s.r[d].T + wb + rb  # gates i, o, f, c
            i_gate = f(s.clipped(z[:, :n] + pi * cell))
            f_gate = f(s.clipped(z[:, 2 * n : 3 * n] + pf * cell))
            cand = g(s.clipped(z[:, 3 * n :]))
            cell = f_gate * cell + i_gate * cand
            o_gate = f(s.clipped(z[:, n : 2 * n] + po * cell))
            h = o_gate * hfn(cell)
            hs[t] = h
        ys.append(hs)
        finals.append([h, cell])
    return s.outputs(ys, finals)
