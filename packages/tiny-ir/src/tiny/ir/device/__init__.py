"""tiny.ir.device: the device contract and the devices present, in four files.

- `interface`: the contract a runtime implements and a renderer provides (versioned by INTERFACE_VERSION): Renderer
  and RendererCaps, Compiler, Program, Allocator, Compiled, CompiledProgram, and the entry-point groups
  (`tiny.devices`, `tiny.renderers`) through which they are found.
- `registry`: device names, `Device[name]` (each device opened once), the default device, the listing of
  `python -m tiny.ir.device`.
- `buffer`: Buffer (memory on a device) and the BUFFER nodes of the graph that stand for buffers.
- `collective`: all-reduce and all-gather of a tensor on several devices, as copies and ops in the graph (Collective,
  and RingCollective, the default a device class may replace with its own; SharedMemoryCollective, for devices whose
  kernels read each other's memory).

Everything is imported from here (`from tiny.ir.device import Compiled, Device, Buffer`).
"""

from tiny.ir.device.buffer import Buffer, buffer_of, device_node, new_buffer, new_buffer_view, new_foreign_buffer
from tiny.ir.device.collective import Collective, RingCollective, SharedMemoryCollective
from tiny.ir.device.interface import (
    INTERFACE_VERSION,
    LAUNCHERS,
    LIST_HINT,
    VECTOR_DTYPES,
    Allocator,
    AllocatorCaps,
    Compiled,
    CompiledProgram,
    CompileError,
    Compiler,
    DeviceUnavailable,
    GraphLaunch,
    GraphReplay,
    LRUAllocator,
    Program,
    Renderer,
    RendererCaps,
    TensorCore,
    UnknownDevice,
    device_entry_points,
    fold_grid,
    host_memory,
    launchers_changed,
    load_renderer,
    out_of_memory,
    renderer_entry_points,
    usable_cores,
)
from tiny.ir.device.registry import (
    Device,
    DeviceName,
    DeviceStatus,
    available,
    collective_for,
    device_computes,
    device_supports,
    opened_caps,
)

__all__ = [
    "INTERFACE_VERSION",
    "LAUNCHERS",
    "LIST_HINT",
    "Allocator",
    "AllocatorCaps",
    "Buffer",
    "Collective",
    "Compiled",
    "CompiledProgram",
    "CompileError",
    "Compiler",
    "Device",
    "DeviceName",
    "DeviceStatus",
    "DeviceUnavailable",
    "GraphLaunch",
    "GraphReplay",
    "LRUAllocator",
    "Program",
    "Renderer",
    "RendererCaps",
    "RingCollective",
    "SharedMemoryCollective",
    "TensorCore",
    "UnknownDevice",
    "VECTOR_DTYPES",
    "available",
    "buffer_of",
    "collective_for",
    "device_computes",
    "device_entry_points",
    "device_node",
    "device_supports",
    "fold_grid",
    "host_memory",
    "launchers_changed",
    "load_renderer",
    "new_buffer",
    "new_buffer_view",
    "new_foreign_buffer",
    "opened_caps",
    "out_of_memory",
    "renderer_entry_points",
    "usable_cores",
]
