"""tiny.tensor: the lazy, PyTorch-like Tensor."""

from tiny.ir.device import Device
from tiny.ir.dtypes import DType, dtypes
from tiny.tensor.realize import GlobalCounters
from tiny.tensor.tensor import Tensor

__all__ = ["Tensor", "dtypes", "DType", "Device", "GlobalCounters"]
