"""tiny.runtime.amd: AMD driver stacks (KFD, HIP) and code objects for RDNA and CDNA."""

from tiny.runtime.amd.discovery import AmdStack, find_stack

__all__ = ["AmdStack", "find_stack"]
