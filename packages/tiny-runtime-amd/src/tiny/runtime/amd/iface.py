"""Which runtime the `AMD` device is: the KFD device (tiny.runtime.amd.kfd, the default) or, with AMD_IFACE=HIP, the
HIP device (tiny.runtime.amd.hip). The `AMD` entry point names this module's `AMD`, looked up each time the device
is opened, so the flag is read then (a `Context(AMD_IFACE="HIP")` applies to devices opened inside it)."""

from __future__ import annotations

from tiny.ir.config import flag
from tiny.ir.device import Compiled
from tiny.runtime.amd.hip import HIPDevice
from tiny.runtime.amd.kfd import AMDDevice

AMD_IFACE = flag(
    "AMD_IFACE",
    str,
    "KFD",
    "how the AMD device reaches the GPU: KFD (the kernel driver, no ROCm library) or HIP (ROCm's libamdhip64)",
)

INTERFACES: dict[str, type[Compiled]] = {"KFD": AMDDevice, "HIP": HIPDevice}


def amd_device_class(iface: str | None = None) -> type[Compiled]:
    """The device class for an interface name (AMD_IFACE's value when None)."""
    name = (AMD_IFACE.value if iface is None else iface).upper()
    if name not in INTERFACES:
        raise ValueError(f"AMD_IFACE={name!r}: expected one of {', '.join(INTERFACES)}")
    return INTERFACES[name]


def __getattr__(name: str) -> type[Compiled]:
    if name == "AMD":
        return amd_device_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
