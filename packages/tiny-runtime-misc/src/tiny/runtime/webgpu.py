"""The WEBGPU device: WGSL compute shaders run through wgpu-native (the `wgpu` package) on the adapter it finds:
a GPU through Vulkan, Metal or D3D12, or a software Vulkan driver such as Mesa's lavapipe. Adapters through OpenGL
are refused (UNTRUSTED_BACKENDS: some integer ops give wrong answers there), with the reason.

Buffers are storage buffers (their sizes rounded up to whole 4-byte words, as WebGPU copies and WGSL's packed
narrow dtypes need). A program is a compute pipeline with an explicit bind group layout: one storage binding
per buffer argument, read-only where the shader only reads it, and one more for the integer variables.
"""

from __future__ import annotations

import functools
import os
import re
import struct
import tempfile
import time
from typing import Any

from tiny.ir.device import (
    AllocatorCaps,
    Compiled,
    CompileError,
    Compiler,
    DeviceUnavailable,
    LRUAllocator,
    Program,
    fold_grid,
)

_BINDING = re.compile(r"@group\(0\) @binding\((\d+)\) var<storage, (read|read_write)>")


def _round_up(n: int) -> int:
    return max(4, (n + 3) // 4 * 4)


@functools.cache
def _wgpu() -> Any:
    """The wgpu module; DeviceUnavailable when it is not installed."""
    if not os.environ.get("XDG_RUNTIME_DIR"):  # wgpu-native's Vulkan loader complains on stderr without one
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="tiny-xdg-")
    try:
        import wgpu
    except ImportError as e:
        raise DeviceUnavailable(
            f"the WEBGPU device needs wgpu-py: pip install 'tiny-runtime-misc[webgpu]' ({e})"
        ) from e
    return wgpu


# adapters tiny does not run on, by wgpu's backend_type, and why: their answers are wrong for some ops
UNTRUSTED_BACKENDS = {
    "OpenGL": "integer % and / of negative values are wrong there (Mesa's llvmpipe through OpenGL: [-7, 7, -7, 3] % "
    "[2, -2, -2, 2] gave [1, 5, -7, 1])",
}
_PREFERENCE = ("DiscreteGPU", "IntegratedGPU", "VirtualGPU", "CPU")  # adapter_type, most wanted first


def choose_adapter(adapters: list[Any]) -> Any:
    """The adapter tiny runs on: the most capable kind (a discrete GPU first, a CPU driver last) among those on a
    backend it trusts; DeviceUnavailable naming each refused adapter and why, where no trusted one is left."""
    trusted = [a for a in adapters if a.info.get("backend_type") not in UNTRUSTED_BACKENDS]
    if not trusted:
        if not adapters:
            raise DeviceUnavailable(
                "wgpu found no adapter (no Vulkan, Metal or D3D12 driver; apt install mesa-vulkan-drivers)"
            )
        refused = "; ".join(
            f"{a.info.get('device', '?')} through {a.info['backend_type']}: "
            f"{UNTRUSTED_BACKENDS[a.info['backend_type']]}"
            for a in adapters
        )
        raise DeviceUnavailable(
            f"wgpu offers only adapters tiny refuses ({refused}); a Vulkan driver gives a trusted one (apt install "
            "mesa-vulkan-drivers)"
        )
    kinds = {kind: i for i, kind in enumerate(_PREFERENCE)}
    return min(trusted, key=lambda a: kinds.get(a.info.get("adapter_type"), len(kinds)))


@functools.cache
def _gpu_device() -> Any:
    """The one wgpu device of the process, on choose_adapter's adapter: its largest limits, shader-f16 and timestamps
    when offered."""
    wgpu = _wgpu()
    try:
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as e:  # noqa: BLE001  (wgpu raises a variety of errors when no driver is present)
        raise DeviceUnavailable(f"wgpu found no adapter: {type(e).__name__}: {e}") from e
    adapter = choose_adapter(adapters)
    features = [f for f in ("shader-f16", "timestamp-query") if f in adapter.features]
    limits = {k: v for k, v in adapter.limits.items() if _requestable(k)}
    try:
        return adapter.request_device_sync(required_features=features, required_limits=limits)
    except Exception as e:  # noqa: BLE001
        raise DeviceUnavailable(f"wgpu could not open adapter {adapter.info.get('device', '?')}: {e}") from e


def _requestable(limit: str) -> bool:
    """The standard WebGPU limits a device request takes (wgpu-native lists some native ones besides)."""
    return limit.startswith("max-") or limit.startswith("min-")


class WebGPUCompiler(Compiler):
    """Checks the WGSL by building a shader module (wgpu validates it with naga); the binary is the source."""

    def __init__(self, device: Any) -> None:
        super().__init__(cachekey=None)
        self.device = device

    def compile(self, src: str) -> bytes:
        bindings, limit = len(_BINDING.findall(src)), self.device.limits["max-storage-buffers-per-shader-stage"]
        if bindings > limit:
            raise CompileError(
                f"the kernel binds {bindings} storage buffers (its buffers and variables); this adapter allows {limit}"
                " per shader (the scheduler splits kernels at the renderer's max_buffers; this one got past it)"
            )
        try:
            self.device.create_shader_module(code=src)
        except Exception as e:  # noqa: BLE001  (wgpu raises GPUValidationError and others)
            raise CompileError(f"wgpu refused the generated WGSL:\n{e}\n--- source ---\n{src}") from None
        return src.encode()


class WebGPUAllocator(LRUAllocator):
    caps = AllocatorCaps(aligned=4)

    def __init__(self, device: Any) -> None:
        super().__init__()
        self.device = device
        self.max_size = min(device.limits["max-buffer-size"], device.limits["max-storage-buffer-binding-size"])

    def _alloc(self, size: int) -> Any:
        if size > self.max_size:
            raise MemoryError(f"a WebGPU buffer of {size} bytes is over the adapter's limit of {self.max_size} bytes")
        usage = _wgpu().BufferUsage
        return self.device.create_buffer(size=_round_up(size), usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST)

    def _free(self, opaque: Any, size: int) -> None:
        opaque.destroy()

    def copyin(self, dest: Any, src: memoryview) -> None:
        data = bytes(src)
        self.device.queue.write_buffer(dest, 0, data + b"\0" * (_round_up(len(data)) - len(data)))

    def copyout(self, dest: memoryview, src: Any) -> None:
        n = dest.nbytes
        dest[:] = self.device.queue.read_buffer(src, 0, _round_up(n)).cast("B")[:n]

    def transfer(self, dest: Any, src: Any, size: int, src_device: Compiled, dest_device: Compiled) -> None:
        raise NotImplementedError("one process has one WebGPU device: there is nothing to transfer between")


class WebGPUProgram(Program):
    """A compute pipeline; a launch binds the buffers (and the variables), dispatches and submits."""

    def __init__(self, device: Compiled, name: str, binary: bytes) -> None:
        super().__init__(device, name, binary)
        assert isinstance(device, WebGPUDevice)
        gpu, wgpu, src = device.gpu, _wgpu(), binary.decode()
        self.bindings = sorted((int(b), access == "read_write") for b, access in _BINDING.findall(src))
        kinds = {True: wgpu.BufferBindingType.storage, False: wgpu.BufferBindingType.read_only_storage}
        entries = [
            {"binding": b, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kinds[writable]}}
            for b, writable in self.bindings
        ]
        try:
            module = gpu.create_shader_module(code=src)
            self.layout = gpu.create_bind_group_layout(entries=entries)
            pipeline_layout = gpu.create_pipeline_layout(bind_group_layouts=[self.layout])
            self.pipeline = gpu.create_compute_pipeline(
                layout=pipeline_layout, compute={"module": module, "entry_point": name}
            )
        except Exception as e:  # noqa: BLE001
            raise CompileError(
                f"wgpu could not make a pipeline of kernel {name}:\n{e}\n--- source ---\n{src}"
            ) from None

    def __call__(
        self,
        *bufs: Any,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        assert isinstance(self.device, WebGPUDevice)
        gpu = self.device.gpu
        resources = list(bufs)
        if vals:
            usage = _wgpu().BufferUsage.STORAGE
            resources.append(gpu.create_buffer_with_data(data=struct.pack(f"<{len(vals)}i", *vals), usage=usage))
        if len(resources) != len(self.bindings):
            raise ValueError(f"kernel {self.name} takes {len(self.bindings)} bindings, got {len(resources)}")
        entries = [{"binding": b, "resource": {"buffer": r}} for (b, _), r in zip(self.bindings, resources)]
        group = gpu.create_bind_group(layout=self.layout, entries=entries)
        dispatch = fold_grid(tuple(global_size), self.device.max_workgroups)
        encoder = gpu.create_command_encoder()
        timer = self.device.timer if wait else None
        compute = encoder.begin_compute_pass(timestamp_writes=timer.writes if timer is not None else None)
        compute.set_pipeline(self.pipeline)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(*dispatch)
        compute.end()
        if timer is not None:
            timer.resolve(encoder)
        start = time.perf_counter()
        gpu.queue.submit([encoder.finish()])
        if not wait:
            return None
        if timer is not None:
            return timer.read()
        self.device.synchronize()
        return time.perf_counter() - start


class _Timer:
    """Two timestamps around a compute pass, resolved into a buffer that is read back after the pass."""

    def __init__(self, gpu: Any) -> None:
        wgpu = _wgpu()
        self.gpu = gpu
        self.queries = gpu.create_query_set(type=wgpu.QueryType.timestamp, count=2)
        self.resolved = gpu.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self.writes = {"query_set": self.queries, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}

    def resolve(self, encoder: Any) -> None:
        encoder.resolve_query_set(self.queries, 0, 2, self.resolved, 0)

    def read(self) -> float:
        """Seconds between the two timestamps (nanoseconds, as WebGPU defines them)."""
        begin, end = struct.unpack("<2Q", self.gpu.queue.read_buffer(self.resolved))
        return max(end - begin, 0) * 1e-9


# Mesa's llvmpipe (under lavapipe) ends a shader after 65535 iterations of its loops, all loops counted together,
# and keeps what it had computed: measured here with Mesa 22.3, a loop of 10**6 additions returns 65535.
LLVMPIPE_LOOP_LIMIT = 65535


class WebGPUDevice(Compiled):
    """WebGPU through wgpu-native: WGSL kernels on the first adapter wgpu finds. Never the default over CPU."""

    priority = 0
    renderers = ("WGSL",)

    def __init__(self, name: str, renderer: str = "WGSL") -> None:
        self.gpu = _gpu_device()
        limits = self.gpu.limits
        self.max_workgroups = int(limits["max-compute-workgroups-per-dimension"])
        self.has_f16 = "shader-f16" in self.gpu.features
        info = self.gpu.adapter.info
        self.software = "llvmpipe" in f"{info.get('vendor', '')} {info.get('device', '')}".lower()  # lavapipe
        self.timer = _Timer(self.gpu) if "timestamp-query" in self.gpu.features else None
        usage = _wgpu().BufferUsage
        self.fence = self.gpu.create_buffer(size=4, usage=usage.COPY_SRC | usage.COPY_DST)
        super().__init__(name, WebGPUAllocator(self.gpu), WebGPUProgram, renderer)

    def compiler(self) -> Compiler:
        return WebGPUCompiler(self.gpu)

    def renderer_target(self) -> str:
        lim = self.gpu.limits
        local = ",".join(str(lim[f"max-compute-workgroup-size-{d}"]) for d in "xyz")
        parts = [
            *(["f16"] if self.has_f16 else []),
            f"max_workgroups={self.max_workgroups}",
            f"local={local}",
            f"local_total={lim['max-compute-invocations-per-workgroup']}",
            f"shared={lim['max-compute-workgroup-storage-size']}",
            f"buffers={lim['max-storage-buffers-per-shader-stage']}",
            *([f"loops={LLVMPIPE_LOOP_LIMIT}"] if self.software else []),
        ]
        return ";".join(parts)

    def synchronize(self) -> None:
        """Wait for all submitted work: reading a buffer back waits for the queue (wgpu-py's
        on_submitted_work_done_sync does not work with every wgpu-native it ships with)."""
        self.gpu.queue.read_buffer(self.fence)
