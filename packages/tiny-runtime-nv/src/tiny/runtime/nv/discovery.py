"""Finding NVIDIA's userspace: the driver library (libcuda) and NVRTC, and what versions they are.

Everything here only looks; nothing is loaded into a GPU. The CUDA device uses it to say precisely why
it cannot start on a machine.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from tiny.ir.device import DeviceUnavailable
from tiny.runtime.nv.nvrtc import find_nvrtc


@dataclass(frozen=True)
class NvidiaStack:
    libcuda: str | None  # path or soname of the driver library, None when absent
    driver_version: int | None  # e.g. 12040 for CUDA 12.4, as cuDriverGetVersion reports
    gpu_count: int  # GPUs the driver sees (0 when it cannot start)
    nvrtc: str | None  # path of the libnvrtc the driver can take, None when absent
    nvrtc_version: tuple[int, int] | None
    problem: str | None  # the first thing that stops CUDA here, in words; None when nothing does


def _load(name: str) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


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
    try:
        nvrtc = find_nvrtc(driver_version)
        nvrtc_path, nvrtc_version = nvrtc.path, nvrtc.version
    except DeviceUnavailable as e:
        problem = problem or str(e)
    libcuda = getattr(cuda, "_name", None) if cuda is not None else None
    return NvidiaStack(libcuda, driver_version, gpus, nvrtc_path, nvrtc_version, problem)
