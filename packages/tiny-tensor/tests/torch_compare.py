"""Run one function in tiny and in PyTorch on the same inputs; compare the outputs and every input's gradient."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tiny.tensor import Tensor

torch = pytest.importorskip("torch")


def compare(
    device: str,
    fn: Callable,
    *shapes: tuple[int, ...],
    low: float = -2.0,
    high: float = 2.0,
    data: list[np.ndarray] | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    rng = np.random.default_rng(0)
    arrays = data or [rng.uniform(low, high, size=s).astype(np.float32) for s in shapes]
    ours = [Tensor(a, device=device, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, ref = fn(*ours), fn(*theirs)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=atol, rtol=rtol)
    seed = rng.uniform(-1, 1, size=ref.shape).astype(np.float32)
    out.backward(Tensor(seed, device=device))
    ref.backward(torch.tensor(seed))
    for i, (t, r) in enumerate(zip(ours, theirs)):
        assert t.grad is not None, f"input {i} got no gradient"
        np.testing.assert_allclose(
            t.grad.numpy(), r.grad.numpy(), atol=atol, rtol=rtol, err_msg=f"gradient of input {i}"
        )
