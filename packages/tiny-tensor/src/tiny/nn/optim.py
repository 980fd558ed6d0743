"""Optimizers (SGD, Adam, AdamW, LAMB, LARS), learning-rate schedules and gradient clipping, as in torch.optim.

A step builds every parameter's and every state's new value lazily, writes them with one realize, and so
runs a few fused kernels (one per written tensor), not one per op. The learning rate lives on the device
as a 0-d tensor that a schedule overwrites between steps, so changing it never compiles a new kernel.
"""

from __future__ import annotations

import math

from tiny.ir.multi import expand_multi
from tiny.ir.schedule import memory_of
from tiny.ir.uop import Ops, UOp
from tiny.tensor import Tensor, dtypes
from tiny.tensor.checks import shards_of

__all__ = [
    "Optimizer",
    "SGD",
    "Adam",
    "AdamW",
    "LAMB",
    "LARS",
    "LRScheduler",
    "StepLR",
    "CosineAnnealingLR",
    "LinearLR",
    "OneCycleLR",
    "clip_grad_norm_",
]


class Optimizer:
    """The base of the optimizers: the parameters, a learning rate on the device, zero_grad() and step()."""

    def __init__(self, params: list[Tensor], lr: float) -> None:
        given = list(params)
        if not given:
            raise ValueError("an optimizer needs at least one parameter, got an empty list")
        # tensors that never get a gradient (a batch norm's running statistics, from get_parameters) are left out
        self.params = [p for p in given if p.requires_grad]
        if not self.params:
            raise ValueError(f"none of the {len(given)} tensors given to the optimizer has requires_grad=True")
        devices = {p.device for p in self.params}
        if len(devices) != 1:
            raise ValueError(f"all parameters must be on one device, got {sorted(devices)}")
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        self.device = devices.pop()
        self.lr = _scalar_buffer(lr, self.device)
        self._writes: list[Tensor] = []

    def get_lr(self) -> float:
        return float(self.lr.item())

    def set_lr(self, value: float) -> None:
        """Overwrite the learning rate on the device (the step's kernels read it; nothing recompiles)."""
        self.lr.assign(Tensor([float(value)], device=self.device, dtype=dtypes.float32).reshape(())).realize()

    def zero_grad(self) -> None:
        """Forget the gradients (set them to None, as torch does by default)."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Update every parameter from its .grad: all new values are built lazily and realized together. A
        parameter whose .grad is None (no gradient reached it) is left alone, as in PyTorch."""
        if all(p.grad is None for p in self.params):
            raise RuntimeError("step(): no parameter has a .grad; call backward() first")
        readers = self._pending_readers()  # found before this step makes tensors of its own that read parameters
        with Tensor.no_grad():
            grads = [p.grad for p in self.params]
            self._writes = []
            self._update([None if g is None else g.cast(p.dtype) for p, g in zip(self.params, grads)])
            # computed before the writes (the schedule runs its targets' kernels in order): tensors still pending
            # that read a parameter, so they see the values from before the step as assign() promises; then the
            # lazy gradients, which every write reads
            targets = readers + [g for g in grads if g is not None] + self._writes
            targets[0].realize(*targets[1:])
        self._writes = []

    def _update(self, grads: list[Tensor | None]) -> None:
        """Record the writes of one step; a parameter whose gradient is None keeps its value and its state."""
        raise NotImplementedError

    def _pending_readers(self) -> list[Tensor]:
        memory = {memory_of(part)[0] for p in self.params for part in shards_of(p.uop)}
        params = {id(p) for p in self.params}
        return [t for t in Tensor._pending.alive() if id(t) not in params and any(u in memory for u in t.uop.toposort)]

    def _write(self, target: Tensor, value: Tensor) -> Tensor:
        """Record `target <- value` for this step's realize; later values that read the result see the new one."""
        if value.shape != target.shape:
            raise ValueError(f"internal: update of shape {value.shape} for a tensor of shape {target.shape}")
        node = UOp(Ops.ASSIGN, target.dtype, (target.uop, value.cast(target.dtype).uop))
        if target.uop.op is Ops.MULTI:  # a write on each device (the value laid out as the target is)
            node = expand_multi(node)
        written = Tensor(node)
        written.uop = node  # no_grad would wrap it in a DETACH, which realize would copy into a new buffer
        self._writes.append(written)
        return written

    def _state(self, like: Tensor) -> Tensor:
        return like.zeros_like().contiguous().realize()  # (on several devices: laid out as `like` is)


class SGD(Optimizer):
    """torch.optim.SGD: p -= lr * g, with momentum, dampening, Nesterov momentum and L2 weight decay."""

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        super().__init__(params, lr)
        if momentum < 0 or weight_decay < 0:
            raise ValueError(f"momentum and weight_decay must be >= 0, got {momentum} and {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov momentum needs momentum > 0 and dampening == 0")
        self.momentum, self.dampening, self.weight_decay, self.nesterov = momentum, dampening, weight_decay, nesterov
        self.buffers = [self._state(p) for p in self.params] if momentum else []
        self._started = False

    def _update(self, grads: list[Tensor | None]) -> None:
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if g is None:
                continue
            if self.weight_decay:
                g = g + self.weight_decay * p
            if self.momentum:
                buf = self.buffers[i]
                # the first step starts the buffer at the gradient itself, undamped, as torch does
                new_buf = g if not self._started else self.momentum * buf + (1 - self.dampening) * g
                buf_now = self._write(buf, new_buf)
                g = g + self.momentum * buf_now if self.nesterov else buf_now
            self._write(p, p - self.lr * g)
        self._started = True


class Adam(Optimizer):
    """torch.optim.Adam (and AdamW with decoupled=True): moments with bias correction, optional AMSGrad.

    The bias correction counts the optimizer's steps; PyTorch counts each parameter's, which differs only for a
    parameter that went without a gradient in some step."""

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        decoupled: bool = False,
    ) -> None:
        super().__init__(params, lr)
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        self.betas, self.eps, self.weight_decay, self.amsgrad = betas, eps, weight_decay, amsgrad
        self.decoupled = decoupled
        self.exp_avgs = [self._state(p) for p in self.params]
        self.exp_avg_sqs = [self._state(p) for p in self.params]
        self.max_exp_avg_sqs = [self._state(p) for p in self.params] if amsgrad else []
        # beta1**t and beta2**t, kept on the device so the step's kernels stay the same every step
        self.beta_powers = _scalar_buffer(1.0, self.device, 2)

    def _update(self, grads: list[Tensor | None]) -> None:
        b1, b2 = self.betas
        powers = self._write(self.beta_powers, self.beta_powers * Tensor([b1, b2], device=self.device))
        correction1, correction2 = 1 - powers[0], 1 - powers[1]
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if g is None:
                continue
            if self.weight_decay and not self.decoupled:
                g = g + self.weight_decay * p
            m = self._write(self.exp_avgs[i], b1 * self.exp_avgs[i] + (1 - b1) * g)
            v = self._write(self.exp_avg_sqs[i], b2 * self.exp_avg_sqs[i] + (1 - b2) * g * g)
            if self.amsgrad:
                v = self._write(self.max_exp_avg_sqs[i], self.max_exp_avg_sqs[i].maximum(v))
            denom = v.sqrt() / correction2.sqrt() + self.eps
            base = p * (1 - self.lr * self.weight_decay) if self.weight_decay and self.decoupled else p
            self._write(p, base - (self.lr / correction1) * m / denom)


class AdamW(Adam):
    """torch.optim.AdamW: Adam whose weight decay shrinks the parameter directly (p *= 1 - lr * wd)."""

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, decoupled=True)


class LAMB(Optimizer):
    """LAMB (You et al. 2019): an Adam step scaled per parameter by the trust ratio ||p|| / ||update||.

    torch has no LAMB; this follows the paper with bias correction (adam=True skips the trust ratio).
    """

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        adam: bool = False,
    ) -> None:
        super().__init__(params, lr)
        self.betas, self.eps, self.weight_decay, self.adam = betas, eps, weight_decay, adam
        self.exp_avgs = [self._state(p) for p in self.params]
        self.exp_avg_sqs = [self._state(p) for p in self.params]
        self.beta_powers = _scalar_buffer(1.0, self.device, 2)

    def _update(self, grads: list[Tensor | None]) -> None:
        b1, b2 = self.betas
        powers = self._write(self.beta_powers, self.beta_powers * Tensor([b1, b2], device=self.device))
        correction1, correction2 = 1 - powers[0], 1 - powers[1]
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if g is None:
                continue
            m = self._write(self.exp_avgs[i], b1 * self.exp_avgs[i] + (1 - b1) * g)
            v = self._write(self.exp_avg_sqs[i], b2 * self.exp_avg_sqs[i] + (1 - b2) * g * g)
            update = (m / correction1) / ((v / correction2).sqrt() + self.eps) + self.weight_decay * p
            ratio = 1.0 if self.adam else _trust_ratio(p.square().sum().sqrt(), update.square().sum().sqrt())
            self._write(p, p - self.lr * ratio * update)


class LARS(Optimizer):
    """LARS (You et al. 2017): SGD with momentum whose step is scaled per parameter by a trust ratio.

    ratio = trust_coefficient * ||p|| / (||g|| + weight_decay * ||p||); torch has no LARS.
    """

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        nesterov: bool = False,
        trust_coefficient: float = 0.001,
    ) -> None:
        super().__init__(params, lr)
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
        self.trust_coefficient = trust_coefficient
        self.buffers = [self._state(p) for p in self.params] if momentum else []

    def _update(self, grads: list[Tensor | None]) -> None:
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if g is None:
                continue
            p_norm, g_norm = p.square().sum().sqrt(), g.square().sum().sqrt()
            ratio = _trust_ratio(self.trust_coefficient * p_norm, g_norm + self.weight_decay * p_norm)
            step = (g + self.weight_decay * p) * ratio * self.lr
            if self.momentum:
                buf = self._write(self.buffers[i], self.momentum * self.buffers[i] + step)
                step = step + self.momentum * buf if self.nesterov else buf
            self._write(p, p - step)


def _trust_ratio(num: Tensor, den: Tensor) -> Tensor:
    """num / den, or 1 where either norm is 0 (a fresh zero parameter or a zero update)."""
    return ((num > 0) & (den > 0)).where(num / den, 1.0)


def _scalar_buffer(value: float, device: str, count: int = 0) -> Tensor:
    """A float32 tensor in memory of its own: 0-d, or `count` copies of value."""
    shape = (count,) if count else ()
    return Tensor.full(shape, float(value), device=device, dtype=dtypes.float32).contiguous().realize()


# ---------------------------------------------------------------- gradient clipping


def clip_grad_norm_(params: list[Tensor], max_norm: float, norm_type: float = 2.0) -> Tensor:
    """torch.nn.utils.clip_grad_norm_: scale the gradients so their total norm is at most max_norm.

    Lazy: the scaled gradients fuse into the next optimizer step. Returns the total norm (before clipping).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return Tensor(0.0)
    with Tensor.no_grad():
        if math.isinf(norm_type):
            norms = [g.abs().max() for g in grads]
            total = norms[0]
            for n in norms[1:]:
                total = total.maximum(n)
        else:
            parts = [g.abs().pow(norm_type).sum() for g in grads]
            total = parts[0]
            for part in parts[1:]:
                total = total + part
            total = total.pow(1.0 / norm_type)
        scale = (max_norm / (total + 1e-6)).minimum(1.0)
        for p in params:
            if p.grad is not None:
                p.grad = p.grad * scale.cast(p.grad.dtype)
    return total


# ---------------------------------------------------------------- learning-rate schedules


class LRScheduler:
    """torch.optim.lr_scheduler's protocol: construction sets the lr for epoch 0, step() moves to the next."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        self.base_lr = optimizer.get_lr()
        self.last_epoch = last_epoch
        self._last_lr = self.base_lr
        self.step()

    def lr_at(self, epoch: int) -> float:
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        self._last_lr = self.lr_at(self.last_epoch)
        self.optimizer.set_lr(self._last_lr)

    def get_last_lr(self) -> list[float]:
        return [self._last_lr]


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.gamma ** (epoch // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:  # noqa: N803
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> float:
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LinearLR(LRScheduler):
    """Warmup: the factor on base_lr goes linearly from start_factor to end_factor over total_iters steps."""

    def __init__(
        self,
        optimizer: Optimizer,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
        last_epoch: int = -1,
    ) -> None:
        if not (0 < start_factor <= 1 and 0 <= end_factor <= 1):
            raise ValueError(
                f"start_factor must be in (0, 1] and end_factor in [0, 1], got {start_factor}, {end_factor}"
            )
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> float:
        done = min(epoch, self.total_iters) / self.total_iters
        return self.base_lr * (self.start_factor + (self.end_factor - self.start_factor) * done)


class OneCycleLR(LRScheduler):
    """The 1cycle policy: warm up from max_lr/div_factor to max_lr, then anneal to initial_lr/final_div_factor.

    Like torch with cycle_momentum=False (the momentum is not cycled).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float,
        total_steps: int,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ) -> None:
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        if total_steps <= 0 or not 0 <= pct_start <= 1:
            raise ValueError(f"need total_steps > 0 and pct_start in [0, 1], got {total_steps} and {pct_start}")
        initial, peak = max_lr / div_factor, max_lr
        low = initial / final_div_factor
        warm = float(pct_start * total_steps) - 1
        if three_phase:
            self.phases = [(warm, initial, peak), (2 * warm, peak, initial), (total_steps - 1.0, initial, low)]
        else:
            self.phases = [(warm, initial, peak), (total_steps - 1.0, peak, low)]
        self.total_steps, self.cosine = total_steps, anneal_strategy == "cos"
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> float:
        if epoch > self.total_steps:
            raise ValueError(f"OneCycleLR stepped {epoch + 1} times, more than total_steps={self.total_steps}")
        start_step = 0.0
        for i, (end_step, start_lr, end_lr) in enumerate(self.phases):
            if epoch <= end_step or i == len(self.phases) - 1:
                pct = (epoch - start_step) / (end_step - start_step)
                if self.cosine:
                    return end_lr + (start_lr - end_lr) / 2 * (math.cos(math.pi * pct) + 1)
                return (end_lr - start_lr) * pct + start_lr
            start_step = end_step
        raise AssertionError("unreachable: the last phase always answers")
