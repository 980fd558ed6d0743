"""tiny.nn.optim against torch.optim: the same parameters and gradients give the same values, step after step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tiny.nn import BatchNorm1d, optim
from tiny.nn.state import get_parameters
from tiny.tensor import GlobalCounters, Tensor
from tiny.tensor.realize import programs

torch = pytest.importorskip("torch")

DEVICE = "CPU"
SHAPES = [(4, 3), (5,), (2, 2, 2)]
STEPS = 4


def fixed_data(seed: int = 0) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Initial parameters, and one gradient per parameter for each step."""
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]
    return params, grads


def run_tiny(make, params: list[np.ndarray], grads: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    ps = [Tensor(p, device=DEVICE, requires_grad=True) for p in params]
    opt = make(ps)
    history = []
    for step_grads in grads:
        for p, g in zip(ps, step_grads):
            p.grad = Tensor(g, device=DEVICE)
        opt.step()
        opt.zero_grad()
        history.append([p.numpy() for p in ps])
    return history


def run_torch(make, params: list[np.ndarray], grads: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    ps = [torch.tensor(p, requires_grad=True) for p in params]
    opt = make(ps)
    history = []
    for step_grads in grads:
        for p, g in zip(ps, step_grads):
            p.grad = torch.tensor(g)
        opt.step()
        opt.zero_grad()
        history.append([p.detach().numpy().copy() for p in ps])
    return history


def assert_histories_close(ours, theirs, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    for step, (a, b) in enumerate(zip(ours, theirs)):
        for i, (x, y) in enumerate(zip(a, b)):
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"step {step}, parameter {i}")


CASES = {
    "sgd": (lambda ps: optim.SGD(ps, lr=0.1), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    "sgd_momentum_wd": (
        lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    ),
    "sgd_nesterov": (
        lambda ps: optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02),
    ),
    "adam": (lambda ps: optim.Adam(ps, lr=0.01), lambda ps: torch.optim.Adam(ps, lr=0.01)),
    "adam_wd_amsgrad": (
        lambda ps: optim.Adam(ps, lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, amsgrad=True),
        lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, amsgrad=True),
    ),
    "adamw": (
        lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    ),
    "adamw_amsgrad": (
        lambda ps: optim.AdamW(ps, lr=0.02, betas=(0.9, 0.99), amsgrad=True),
        lambda ps: torch.optim.AdamW(ps, lr=0.02, betas=(0.9, 0.99), amsgrad=True),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_optimizer_matches_torch(name: str) -> None:
    ours, theirs = CASES[name]
    params, grads = fixed_data()
    assert_histories_close(run_tiny(ours, params, grads), run_torch(theirs, params, grads))


# ---------------------------------------------------------------- LAMB and LARS: torch has neither, NumPy does them


def lamb_reference(params, grads, lr, betas, eps, wd, adam=False):
    b1, b2 = betas
    ps = [p.astype(np.float64) for p in params]
    ms, vs = [np.zeros_like(p) for p in ps], [np.zeros_like(p) for p in ps]
    history = []
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            up = (ms[i] / (1 - b1**t)) / (np.sqrt(vs[i] / (1 - b2**t)) + eps) + wd * ps[i]
            r1, r2 = np.linalg.norm(ps[i]), np.linalg.norm(up)
            ratio = 1.0 if adam or r1 == 0 or r2 == 0 else r1 / r2
            ps[i] = ps[i] - lr * ratio * up
        history.append([p.copy() for p in ps])
    return history


def lars_reference(params, grads, lr, momentum, wd, nesterov, tc):
    ps = [p.astype(np.float64) for p in params]
    bufs = [np.zeros_like(p) for p in ps]
    history = []
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            pn, gn = np.linalg.norm(ps[i]), np.linalg.norm(g)
            ratio = tc * pn / (gn + wd * pn) if pn > 0 and gn + wd * pn > 0 else 1.0
            step = (g + wd * ps[i]) * ratio * lr
            bufs[i] = momentum * bufs[i] + step
            ps[i] = ps[i] - (step + momentum * bufs[i] if nesterov else bufs[i])
        history.append([p.copy() for p in ps])
    return history


@pytest.mark.parametrize("adam", [False, True])
def test_lamb_matches_reference(adam: bool) -> None:
    params, grads = fixed_data(1)
    ours = run_tiny(
        lambda ps: optim.LAMB(ps, lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01, adam=adam), params, grads
    )
    assert_histories_close(ours, lamb_reference(params, grads, 0.01, (0.9, 0.99), 1e-6, 0.01, adam), rtol=1e-4)


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_matches_reference(nesterov: bool) -> None:
    params, grads = fixed_data(2)
    make = lambda ps: optim.LARS(ps, lr=1.0, momentum=0.9, weight_decay=1e-3, nesterov=nesterov, trust_coefficient=0.01)  # noqa: E731
    ours = run_tiny(make, params, grads)
    assert_histories_close(ours, lars_reference(params, grads, 1.0, 0.9, 1e-3, nesterov, 0.01), rtol=1e-4)


# ---------------------------------------------------------------- the step is a few fused kernels


def test_step_is_one_kernel_per_written_tensor() -> None:
    params, grads = fixed_data()
    ps = [Tensor(p, device=DEVICE, requires_grad=True) for p in params]
    opt = optim.Adam(ps, lr=0.01)
    counts = []
    for step_grads in grads[:3]:
        for p, g in zip(ps, step_grads):
            p.grad = Tensor(g, device=DEVICE).realize()
        before = GlobalCounters.kernels
        opt.step()
        counts.append(GlobalCounters.kernels - before)
    # per parameter: exp_avg, exp_avg_sq, the parameter; plus the beta powers: 3 * 3 + 1
    assert counts == [3 * len(ps) + 1] * 3


def test_sgd_step_is_one_kernel_per_parameter() -> None:
    ps = [Tensor(np.ones(s, np.float32), device=DEVICE, requires_grad=True) for s in SHAPES]
    opt = optim.SGD(ps, lr=0.1)
    for p in ps:
        p.grad = Tensor(np.ones(p.shape, np.float32), device=DEVICE).realize()
    before = GlobalCounters.kernels
    opt.step()
    assert GlobalCounters.kernels - before == len(ps)
    np.testing.assert_allclose(ps[0].numpy(), np.full(SHAPES[0], 0.9, np.float32))


def test_lr_changes_between_steps_without_new_kernels() -> None:
    p = Tensor(np.zeros(3, np.float32), device=DEVICE, requires_grad=True)
    opt = optim.SGD([p], lr=1.0)
    for lr in (1.0, 0.5, 0.25):
        opt.set_lr(lr)
        p.grad = Tensor(np.ones(3, np.float32), device=DEVICE)
        opt.step()
    np.testing.assert_allclose(p.numpy(), [-1.75] * 3)
    assert opt.get_lr() == 0.25


def test_step_with_gradients_from_backward() -> None:
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    w = Tensor(np.ones((2, 2), np.float32), device=DEVICE, requires_grad=True)
    tw = torch.ones((2, 2), requires_grad=True)
    ours, theirs = optim.Adam([w], lr=0.1), torch.optim.Adam([tw], lr=0.1)
    for _ in range(3):
        ours.zero_grad()
        (Tensor(x, device=DEVICE) @ w).square().sum().backward()
        ours.step()
        theirs.zero_grad()
        (torch.tensor(x) @ tw).square().sum().backward()
        theirs.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_pending_reader_of_a_parameter_sees_the_values_before_the_step() -> None:
    w = Tensor(np.ones(3, np.float32), device=DEVICE, requires_grad=True)
    loss = (w * 2).sum()
    loss.backward()
    optim.SGD([w], lr=0.5).step()
    assert loss.item() == 6.0
    np.testing.assert_allclose(w.numpy(), [0.0] * 3)


def test_changing_the_lr_compiles_nothing_new() -> None:
    p = Tensor(np.zeros(3, np.float32), device=DEVICE, requires_grad=True)
    opt = optim.Adam([p], lr=1.0)
    compiled = []
    for i in range(4):
        opt.set_lr(0.1 * (i + 1))
        p.grad = Tensor(np.ones(3, np.float32), device=DEVICE)
        opt.step()
        compiled.append(len(programs()))
    assert compiled[1:] == compiled[:1] * 3


def test_step_before_any_backward_is_refused() -> None:
    p = Tensor(np.zeros(3, np.float32), device=DEVICE, requires_grad=True)
    with pytest.raises(RuntimeError, match="no parameter has a .grad"):
        optim.SGD([p]).step()


def test_bad_arguments_are_rejected() -> None:
    p = Tensor(np.zeros(3, np.float32), device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="betas"):
        optim.Adam([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="at least one"):
        optim.SGD([])


# ---------------------------------------------------------------- clip_grad_norm_


@pytest.mark.parametrize("max_norm, norm_type", [(1.0, 2.0), (100.0, 2.0), (0.5, 1.0), (0.3, math.inf)])
def test_clip_grad_norm_matches_torch(max_norm: float, norm_type: float) -> None:
    _, grads = fixed_data(3)
    ps = [Tensor(np.zeros(s, np.float32), device=DEVICE, requires_grad=True) for s in SHAPES]
    tps = [torch.zeros(s, requires_grad=True) for s in SHAPES]
    for p, tp, g in zip(ps, tps, grads[0]):
        p.grad, tp.grad = Tensor(g, device=DEVICE), torch.tensor(g)
    total = optim.clip_grad_norm_(ps, max_norm, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(tps, max_norm, norm_type)
    np.testing.assert_allclose(total.item(), expected.item(), rtol=1e-5)
    for p, tp in zip(ps, tps):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_clipped_step_matches_torch() -> None:
    params, grads = fixed_data(4)
    ours = optim.clip_grad_norm_  # the clip fuses into the step: run both as one training loop

    def tiny_make(ps):
        opt = optim.SGD(ps, lr=0.1, momentum=0.9)
        step = opt.step
        opt.step = lambda: (ours(ps, 1.0), step())  # type: ignore[method-assign]
        return opt

    def torch_make(ps):
        opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
        step = opt.step
        opt.step = lambda: (torch.nn.utils.clip_grad_norm_(ps, 1.0), step())
        return opt

    assert_histories_close(run_tiny(tiny_make, params, grads), run_torch(torch_make, params, grads))


# ---------------------------------------------------------------- learning-rate schedules


SCHEDULES = {
    "step": (
        lambda o: optim.StepLR(o, step_size=3, gamma=0.5),
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
        12,
    ),
    "cosine": (
        lambda o: optim.CosineAnnealingLR(o, T_max=10, eta_min=0.01),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10, eta_min=0.01),
        10,
    ),
    "linear": (
        lambda o: optim.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=4),
        lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=4),
        8,
    ),
    "onecycle": (
        lambda o: optim.OneCycleLR(o, max_lr=0.5, total_steps=20),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=20, cycle_momentum=False),
        19,
    ),
    "onecycle_linear_three_phase": (
        lambda o: optim.OneCycleLR(o, max_lr=0.5, total_steps=20, anneal_strategy="linear", three_phase=True),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(
            o, max_lr=0.5, total_steps=20, anneal_strategy="linear", three_phase=True, cycle_momentum=False
        ),
        19,
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedule_matches_torch(name: str) -> None:
    ours_make, theirs_make, steps = SCHEDULES[name]
    ours_opt = optim.SGD([Tensor(np.zeros(2, np.float32), device=DEVICE, requires_grad=True)], lr=0.2)
    theirs_opt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.2)
    ours, theirs = ours_make(ours_opt), theirs_make(theirs_opt)
    for _ in range(steps):
        np.testing.assert_allclose(ours.get_last_lr(), theirs.get_last_lr(), rtol=1e-6)
        np.testing.assert_allclose(ours_opt.get_lr(), theirs_opt.param_groups[0]["lr"], rtol=1e-6)
        theirs_opt.step()  # torch warns when the schedule steps before the optimizer
        ours.step()
        theirs.step()


def test_schedule_drives_the_step() -> None:
    p = Tensor(np.zeros(1, np.float32), device=DEVICE, requires_grad=True)
    opt = optim.SGD([p], lr=1.0)
    sched = optim.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(3):
        p.grad = Tensor(np.ones(1, np.float32), device=DEVICE)
        opt.step()
        sched.step()
    np.testing.assert_allclose(p.numpy(), [-1.75])


def test_parameters_without_requires_grad_are_left_out() -> None:
    """Adam(get_parameters(model)) with batch norm: its running statistics never get a gradient and are left out."""
    bn = BatchNorm1d(3, device=DEVICE)
    w = Tensor(np.ones((3, 3), np.float32), device=DEVICE, requires_grad=True)
    params = get_parameters([w, bn])
    assert any(p.requires_grad is not True for p in params)  # the running statistics are among them
    opt = optim.Adam(params, lr=0.1)
    assert all(p.requires_grad for p in opt.params) and len(opt.params) == 3  # w, bn.weight, bn.bias
    x = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3), device=DEVICE)
    with Tensor.train():
        bn(x @ w).square().sum().backward()
    opt.step()
    with pytest.raises(ValueError, match="none of the 2 tensors"):
        optim.SGD([bn.running_mean, bn.running_var])


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_a_parameter_without_a_grad_is_skipped_as_in_torch(name: str) -> None:
    params, grads = fixed_data()
    kwargs = {"lr": 0.1, "momentum": 0.9} if name == "SGD" else {"lr": 0.1}
    ours = [Tensor(p, device=DEVICE, requires_grad=True) for p in params]
    theirs = [torch.tensor(p, requires_grad=True) for p in params]
    opt, ref = getattr(optim, name)(ours, **kwargs), getattr(torch.optim, name)(theirs, **kwargs)
    for step in range(2):  # parameter 1 never gets a gradient: it and its state stay as they are
        for i, (p, tp, g) in enumerate(zip(ours, theirs, grads[step])):
            p.grad = None if i == 1 else Tensor(g, device=DEVICE)
            tp.grad = None if i == 1 else torch.tensor(g)
        opt.step()
        ref.step()
    for p, tp in zip(ours, theirs):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ours[1].numpy(), params[1])
