"""Finding AMD's pieces: the kernel driver (/dev/kfd and its topology) and an LLVM toolchain with the
AMDGPU target. Everything here only looks; the AMD device uses it to say why it cannot start."""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

KFD = "/dev/kfd"
TOPOLOGY = "/sys/devices/virtual/kfd/kfd/topology/nodes"


@dataclass(frozen=True)
class AmdStack:
    kfd: bool  # /dev/kfd exists and opens
    gfx_targets: tuple[str, ...]  # e.g. ("gfx1100",) for each GPU node in the topology
    clang: str | None  # a clang that knows the amdgcn target
    lld: str | None  # ld.lld to link code objects
    problem: str | None  # the first thing that stops the AMD device here, in words


def gfx_name(version: int) -> str:
    """KFD's gfx_target_version (e.g. 110000) as a target name (gfx1100)."""
    major, minor, step = version // 10000, (version // 100) % 100, version % 100
    return f"gfx{major}{minor:x}{step:x}"


def gfx_targets(topology: str = TOPOLOGY) -> tuple[str, ...]:
    out = []
    for props in sorted(glob.glob(os.path.join(topology, "*", "properties"))):
        try:
            text = open(props).read()
        except OSError:
            continue
        m = re.search(r"gfx_target_version\s+(\d+)", text)
        if m and int(m.group(1)) != 0:
            out.append(gfx_name(int(m.group(1))))
    return tuple(out)


def _amdgpu_clang() -> str | None:
    names = sorted(
        (
            n
            for d in os.environ.get("PATH", "").split(os.pathsep)
            if os.path.isdir(d)
            for n in os.listdir(d)
            if re.fullmatch(r"clang(-\d+)?", n)
        ),
        reverse=True,
    )
    for name in names:
        try:
            r = subprocess.run([name, "-print-targets"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if "amdgcn" in r.stdout:
            return name
    return None


@dataclass(frozen=True)
class Toolchain:
    """An LLVM toolchain that builds AMDGPU code objects: clang with the amdgcn target and ld.lld."""

    clang: str
    lld: str
    version: str  # clang's first --version line: part of every compile cache key
    processors: frozenset[str]  # the gfx targets this clang knows (gfx1100, gfx942 ...)

    def knows(self, target: str) -> bool:
        return target.split(":")[0] in self.processors


def _lld(clang: str | None = None) -> str | None:
    """ld.lld of the same LLVM as `clang` where there is one (an older lld refuses newer code objects), else any."""
    if clang is not None and (path := shutil.which(clang)):
        beside = os.path.join(os.path.dirname(os.path.realpath(path)), "ld.lld")
        if os.access(beside, os.X_OK):
            return beside
        suffix = re.fullmatch(r"clang(-\d+)?", os.path.basename(clang))
        if suffix and suffix.group(1) and shutil.which(f"ld.lld{suffix.group(1)}"):
            return f"ld.lld{suffix.group(1)}"
    return next((n for n in ("ld.lld", "ld.lld-19", "ld.lld-18", "ld.lld-17") if shutil.which(n)), None)


@functools.cache
def find_toolchain() -> Toolchain | None:
    """The toolchain the AMD compilers use, or None where clang with the amdgcn target or ld.lld is missing."""
    clang = _amdgpu_clang()
    lld = _lld(clang)
    if clang is None or lld is None:
        return None
    version = subprocess.run([clang, "--version"], capture_output=True, text=True, timeout=30).stdout
    cpus = subprocess.run(
        [clang, "-nogpulib", "--target=amdgcn-amd-amdhsa", "-print-supported-cpus"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    processors = frozenset(re.findall(r"\b(gfx[0-9a-f]+)\b", cpus.stdout + cpus.stderr))
    return Toolchain(clang, lld, version.splitlines()[0] if version else clang, processors)


def find_stack() -> AmdStack:
    kfd = os.path.exists(KFD) and os.access(KFD, os.R_OK | os.W_OK)
    targets = gfx_targets() if kfd else ()
    toolchain = find_toolchain()
    clang, lld = (toolchain.clang, toolchain.lld) if toolchain else (_amdgpu_clang(), _lld())
    problem = None
    if not kfd:
        problem = f"no AMD kernel driver: {KFD} is missing or not accessible"
    elif not targets:
        problem = "the AMD kernel driver lists no GPU"
    elif clang is None or lld is None:
        problem = "no LLVM toolchain with the AMDGPU target (apt install clang lld)"
    return AmdStack(kfd, targets, clang, lld, problem)
