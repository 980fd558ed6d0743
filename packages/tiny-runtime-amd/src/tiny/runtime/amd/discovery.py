"""Finding AMD's pieces: the kernel driver (/dev/kfd and its topology) and an LLVM toolchain with the
AMDGPU target. Everything here only looks; the AMD device uses it to say why it cannot start."""

from __future__ import annotations

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


def find_stack() -> AmdStack:
    kfd = os.path.exists(KFD) and os.access(KFD, os.R_OK | os.W_OK)
    targets = gfx_targets() if kfd else ()
    clang = _amdgpu_clang()
    lld = next((n for n in ("ld.lld", "ld.lld-19", "ld.lld-18", "ld.lld-17") if shutil.which(n)), None)
    problem = None
    if not kfd:
        problem = f"no AMD kernel driver: {KFD} is missing or not accessible"
    elif not targets:
        problem = "the AMD kernel driver lists no GPU"
    elif clang is None or lld is None:
        problem = "no LLVM toolchain with the AMDGPU target (apt install clang lld)"
    return AmdStack(kfd, targets, clang, lld, problem)
