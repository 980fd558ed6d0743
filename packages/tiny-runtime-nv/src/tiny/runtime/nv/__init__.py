"""tiny.runtime.nv: NVIDIA driver stacks (CUDA: driver API + NVRTC)."""

from tiny.runtime.nv.discovery import NvidiaStack, find_stack

__all__ = ["NvidiaStack", "find_stack"]
