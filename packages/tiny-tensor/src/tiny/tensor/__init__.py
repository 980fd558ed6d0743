"""tiny.tensor: the lazy, PyTorch-like Tensor."""

from tiny.ir.device import Device
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.sint import Variable
from tiny.tensor.jit import TinyJit
from tiny.tensor.realize import GlobalCounters, JitError
from tiny.tensor.tensor import Tensor

__all__ = ["Tensor", "TinyJit", "JitError", "Variable", "dtypes", "DType", "Device", "GlobalCounters"]
