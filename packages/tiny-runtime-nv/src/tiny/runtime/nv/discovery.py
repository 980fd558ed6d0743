"""Finding NVIDIA's userspace: the driver library (libcuda) and NVRTC, and what versions they are.

Everything here only looks; nothing is loaded into a GPU. The CUDA device uses it to say precisely why
it cannot start on a machine.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class NvidiaStack:
    libcuda: str | None  # path or soname of the driver library, None when absent
    driver_version: int | None  # e.g. 12040 for CUDA 12.4, as cuDriverGetVersion reports
    gpu_count: int  # GPUs the driver sees (0 when it cannot start)
    nvrtc: str | None  # path of libnvrtc, None when absent
    nvrtc_version: tuple[int, int] | None
    problem: str | None  # the first thing that stops CUDA here, in words; None when nothing does


def _load(name: str) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def nvrtc_candidates() -> list[str]:
    """libnvrtc from the nvidia-cuda-nvrtc wheel first, then from a CUDA toolkit on the system."""
    out = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        out += sorted(glob.glob(os.path.join(root, "cuda_nvrtc", "lib", "libnvrtc.so*")))
    for root in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", "/usr/lib/x86_64-linux-gnu"):
        if root:
            out += sorted(
                glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")) + glob.glob(os.path.join(root, "libnvrtc.so*"))
            )
    return [p for p in out if "builtins" not in os.path.basename(p)]


def find_stack() -> NvidiaStack:
    cuda = _load("libcuda.so.1") or _load("libcuda.so")
    driver_version, gpus, problem = None, 0, None
    if cuda is None:
        problem = "no NVIDIA driver: libcuda.so.1 is not installed"
    else:
        v = ctypes.c_int(0)
        if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
            driver_version = v.value
        status = cuda.cuInit(0)
        n = ctypes.c_int(0)
        if status == 0 and cuda.cuDeviceGetCount(ctypes.byref(n)) == 0:
            gpus = n.value
        if gpus == 0:
            problem = f"the NVIDIA driver sees no GPU (cuInit returned {status})"
    nvrtc_path, nvrtc_version = None, None
    for path in nvrtc_candidates():
        lib = _load(path)
        if lib is None:
            continue
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0:
            nvrtc_path, nvrtc_version = path, (major.value, minor.value)
            break
    if problem is None and nvrtc_path is None:
        problem = "no NVRTC: pip install nvidia-cuda-nvrtc, or install a CUDA toolkit"
    libcuda = getattr(cuda, "_name", None) if cuda is not None else None
    return NvidiaStack(libcuda, driver_version, gpus, nvrtc_path, nvrtc_version, problem)
