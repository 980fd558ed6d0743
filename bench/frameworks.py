"""The frameworks the suite compares: tiny, and the references NumPy, PyTorch and tinygrad where installed (and
with --gpu "peak", the GPU's copy bandwidth as PyTorch measures it).

Each `*_done` function makes sure the work behind its tensors has finished, so the time taken covers it.
"""

from __future__ import annotations

import importlib.metadata

import numpy as np

from tiny.tensor import Device, Tensor

try:
    import torch
except ImportError:  # the column says "not installed"
    torch = None

try:
    import tinygrad
    import tinygrad.helpers
    import tinygrad.nn
    import tinygrad.nn.optim
    import tinygrad.nn.state
except ImportError:  # the column says "not installed"
    tinygrad = None

try:
    from tiny.tensor import TinyJit
except ImportError:  # not built yet: the rows that want it run un-jitted or say n/a
    TinyJit = None


def versions() -> dict[str, str | None]:
    """Each framework's version, None where it is not installed."""
    return {
        "numpy": np.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "tinygrad": importlib.metadata.version("tinygrad") if tinygrad is not None else None,
    }


def installed(framework: str) -> bool:
    """Whether the framework can be imported here ("peak" is measured with PyTorch)."""
    if framework in ("torch", "peak"):
        return torch is not None
    return tinygrad is not None if framework == "tinygrad" else framework in ("tiny", "numpy")


def tiny_done(*tensors: Tensor) -> None:
    """Realize the tensors and wait for their device to finish (the CPU device runs synchronously)."""
    tensors[0].realize(*tensors[1:])
    for device in {t.device for t in tensors}:
        Device[device].synchronize()


def torch_done(*tensors: object) -> None:
    """Wait for the GPU behind the torch tensors; eager work on the CPU is done when the op returns."""
    for device in {t.device for t in tensors}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def tinygrad_done(*tensors: object) -> None:
    tinygrad.Tensor.realize(*tensors)
    for device in {t.device for t in tensors}:
        tinygrad.Device[device].synchronize()


def tiny_upload(array: np.ndarray, device: str) -> Tensor:
    """A realized tiny tensor holding the array's values."""
    return Tensor(array, device=device).realize()


def torch_upload(array: np.ndarray, device: str) -> object:
    """A torch tensor on the device holding the array's values (on "cpu", the array's own memory)."""
    return torch.from_numpy(array).to(device)


def tinygrad_upload(array: np.ndarray) -> object:
    return tinygrad.Tensor(array).realize()


def random_arrays(shape: tuple[int, ...], count: int) -> list[np.ndarray]:
    """`count` float32 arrays uniform in [0, 1), the same in every framework's setup (seed 0)."""
    rng = np.random.default_rng(0)
    return [rng.random(shape, dtype=np.float32) for _ in range(count)]
