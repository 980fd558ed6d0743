"""The frameworks the suite compares: tiny, and the references NumPy, PyTorch and tinygrad where installed (and
with --gpu "peak", the GPU's copy bandwidth as PyTorch measures it).

Each `*_done` function makes sure the work behind its tensors has finished, so the time taken covers it.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tempfile
from pathlib import Path

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


# ---------------------------------------------------------------- the CPU's compilers (--compiler)

COMPILERS = ("clang", "llvm", "gcc")  # the CPU device's paths: C through clang, LLVM IR in-process, C through gcc
# how near each path should come to clang's figure (issue 25): LLVM within 10%, gcc within 20%
COMPILER_TARGETS = {"llvm": 0.9, "gcc": 0.8}


def compiler_sides(spec: str) -> dict[str, str]:
    """--compiler's sides, each tiny's side on one CPU path: side name -> tiny's device. The first compiler named
    is the "tiny" column (the references' ratios are its), the others are "tiny:NAME". A path this machine lacks is
    a ValueError that says what is missing."""
    names = list(COMPILERS) if spec == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in COMPILERS]
    if unknown or not names:
        raise ValueError(f"--compiler takes {', '.join(COMPILERS)} or all, comma-separated; got {spec!r}")
    from tiny.runtime.cpu import find_clang  # the CPU device's own search, so the bench finds what it would

    sides = {}
    for i, name in enumerate(dict.fromkeys(names)):
        if name == "llvm":
            device = Device.canonicalize("CPU:LLVM")
            Device[device]  # noqa: B018  (opens it: no llvmlite is a DeviceUnavailable saying what to install)
        else:
            cc = find_clang() if name == "clang" else "gcc"
            if cc is None:
                raise ValueError("--compiler clang: no clang on PATH")
            device = Device.canonicalize(f"CPU:{i + 1}:C")  # a CPU device of its own for each C compiler
            Device[device].set_compiler(cc)
        sides["tiny" if i == 0 else f"tiny:{name}"] = device
    return sides


def describe(device: str) -> str:
    """The compiler behind a tiny device, in words ("clang-19: Debian clang version 19.1.7 ...")."""
    return Device[device].describe()


def tiny_process_env(device: str) -> dict[str, str]:
    """What a new Python process needs in its environment to run tiny on the same path as `device` here (a CPU
    device given a compiler by compiler_sides is CPU:C with CC set)."""
    dev = Device[device]
    if getattr(dev, "cc", "") and dev.renderer_name == "C":
        return {"DEVICE": "CPU:C", "CC": dev.cc}
    return {"DEVICE": "CPU:LLVM" if dev.renderer_name == "LLVM" and device.startswith("CPU") else device}


ROOT = Path(__file__).resolve().parent.parent


_PYCACHE: list[tempfile.TemporaryDirectory] = []  # the fresh processes' Python bytecode, this run's


def bytecode_cache() -> str:
    """Where fresh processes keep the bytecode of the Python they import (PYTHONPYCACHEPREFIX), for this process's
    lifetime: a first result is timed as a user's is, tiny's modules read as bytecode as an installed package's are
    (PyTorch's and NumPy's come with theirs), not compiled from source in every process (as they would be where the
    environment says PYTHONDONTWRITEBYTECODE, or a checkout's folders cannot be written). The workloads' warmup
    fills it."""
    if not _PYCACHE:
        _PYCACHE.append(tempfile.TemporaryDirectory(prefix="tiny-bench-pyc-"))
    return _PYCACHE[0].name


def spawn_fresh(code: str, env: dict[str, str], cache: str | None = None) -> None:
    """Run `code` in a new Python (from the checkout's root, so `bench` imports) and wait for it: with an empty
    compile cache, or with the cache file `cache` (tiny's and tinygrad's), and this run's bytecode_cache(). A failure
    raises with its last words."""
    with tempfile.TemporaryDirectory(prefix="tiny-bench-") as scratch:
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        full = dict(os.environ, CACHEDB=cache or os.path.join(scratch, "cache.db"), PYTHONPATH=path) | env
        full.pop("PYTHONDONTWRITEBYTECODE", None)
        full["PYTHONPYCACHEPREFIX"] = bytecode_cache()
        done = subprocess.run([sys.executable, "-c", code], env=full, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the fresh process exited {done.returncode}: {done.stderr.strip()[-400:]}")


def random_arrays(shape: tuple[int, ...], count: int) -> list[np.ndarray]:
    """`count` float32 arrays uniform in [0, 1), the same in every framework's setup (seed 0)."""
    rng = np.random.default_rng(0)
    return [rng.random(shape, dtype=np.float32) for _ in range(count)]
