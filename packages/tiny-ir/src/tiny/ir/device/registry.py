"""The devices present: names (`CUDA:1`, `CPU:LLVM`), the entry points of the installed runtimes and renderers, the
registry `Device[name]` that opens each once, the default device, and the listing of `python -m tiny.ir.device`."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field

from tiny.ir.config import DEBUG, DEVICE
from tiny.ir.device.collective import RING, Collective
from tiny.ir.device.interface import (
    LIST_HINT,
    Compiled,
    DeviceUnavailable,
    RendererCaps,
    UnknownDevice,
    device_entry_points,
)
from tiny.ir.dtypes import DType
from tiny.ir.tensorcore import TensorCore  # noqa: F401  (re-exported: renderers declare theirs)


@dataclass(frozen=True)
class DeviceName:
    """A parsed device string: 'cuda:1' -> CUDA index 1; 'CPU:LLVM' -> CPU with the LLVM renderer."""

    base: str
    index: int = 0
    renderer: str | None = None

    def __str__(self) -> str:
        return self.base + (f":{self.index}" if self.index else "") + (f":{self.renderer}" if self.renderer else "")

    @staticmethod
    def parse(name: str) -> DeviceName:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(:[A-Za-z0-9_]+){0,2}", name):
            raise UnknownDevice(f"device must be a string like 'CPU', 'cuda:1' or 'CPU:LLVM', got {name!r}")
        base, *rest = name.split(":")
        indices = [int(p) for p in rest if p.isdigit()]
        renderers = [p.upper() for p in rest if not p.isdigit()]
        if len(indices) > 1 or len(renderers) > 1:
            raise UnknownDevice(
                f"device {name!r} names more than one index or renderer; expected NAME[:INDEX][:RENDERER]"
            )
        return DeviceName(base.upper(), indices[0] if indices else 0, renderers[0] if renderers else None)


class _Registry:
    """`Device["CPU"]` opens (once) and returns a device; `Device.DEFAULT` is the default device's name."""

    def __init__(self) -> None:
        self._open: dict[str, Compiled] = {}
        self._default: str | None = None

    def canonicalize(self, name: str) -> str:
        """'cuda:1' -> 'CUDA:1'; a device's default renderer is left out ('CPU:C' -> 'CPU'); a file-backed
        device's path is made absolute ('disk:w.bin' -> 'DISK:/home/me/w.bin')."""
        if isinstance(name, str) and name in self._open:  # an opened device's name is canonical (each op asks again)
            return name
        if isinstance(name, (tuple, list)):  # several devices (of a tensor on several)
            return self.canonicalize_many(name)  # type: ignore[return-value]
        if (path := _file_path(name)) is not None:
            return path
        parsed = DeviceName.parse(name)
        if parsed.base not in device_entry_points():
            known = ", ".join(sorted(device_entry_points())) or "none (is a tiny runtime package installed?)"
            raise UnknownDevice(f"unknown device {name!r}; known devices: {known}")
        if parsed.renderer is not None:
            cls = device_entry_points()[parsed.base].load()
            if cls.renderers and parsed.renderer == cls.default_renderer():
                parsed = DeviceName(parsed.base, parsed.index)
        return str(parsed)

    def __getitem__(self, name: str) -> Compiled:
        if (opened := self._open.get(name)) is not None:  # a canonical name, as buffers and tensors hold
            return opened
        canon = self.canonicalize(name)
        if canon not in self._open:
            if _file_path(canon) is not None:
                self._open[canon] = device_entry_points()[canon.split(":", 1)[0]].load()(canon, "")
                return self._open[canon]
            parsed = DeviceName.parse(canon)
            cls = device_entry_points()[parsed.base].load()
            renderer = parsed.renderer or cls.default_renderer()
            if cls.renderers and renderer not in cls.renderers:
                raise UnknownDevice(f"device {parsed.base} takes the renderers {list(cls.renderers)}, not {renderer!r}")
            try:
                dev = cls(canon, renderer)
            except DeviceUnavailable as e:
                # (raised as made, never a local: an exception held by a frame its traceback holds is a reference
                # cycle, and it kept the frames of the callers, and their arrays, until the cycle collector ran: the
                # first tensor of a model's file, 36 MB, while the rest was read)
                raise _unavailable(canon, e) from None
            if DEBUG >= 1:
                print(f"opened device {canon} with renderer {renderer}" + (f" ({d})" if (d := dev.describe()) else ""))
            self._open[canon] = dev
        return self._open[canon]

    @property
    def DEFAULT(self) -> str:  # noqa: N802
        if DEVICE.value:
            return self.canonicalize(DEVICE.value)
        if self._default is None:
            self._default = _fastest_present()
        return self._default

    def set_default(self, name: str | None) -> None:
        self._default = None if name is None else self.canonicalize(name)

    def canonicalize_many(self, names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        """Several devices for one tensor ('CPU:0', 'CPU:1' -> 'CPU', 'CPU:1'): each canonical, each once, each one
        that starts here (a missing one says why, as Device[name] does)."""
        if not isinstance(names, (tuple, list)) or not names or not all(isinstance(n, str) for n in names):
            raise TypeError(f"devices must be a tuple of device names such as ('CPU:0', 'CPU:1'), got {names!r}")
        canon = tuple(self.canonicalize(n) for n in names)
        if len(set(canon)) != len(canon):
            raise ValueError(f"devices must differ, got {names!r} (canonically {canon})")
        for name in canon:
            self[name]  # (opened now: a device that cannot start fails here, named)
        return canon


Device = _Registry()


def _file_path(name: str) -> str | None:
    """'disk:w.bin' -> 'DISK:/abs/w.bin' when the base names a file-backed device; None for every other name."""
    if not isinstance(name, str) or ":" not in name:
        return None
    base, path = name.split(":", 1)
    ep = device_entry_points().get(base.upper())
    if ep is None or not getattr(ep.load(), "file_backed", False):
        return None
    if not path:
        raise UnknownDevice(f"device {name!r} needs a file path after the colon, e.g. 'DISK:/data/model.safetensors'")
    return f"{base.upper()}:{os.path.abspath(os.path.expanduser(path))}"


@functools.cache
def device_computes(name: str) -> bool:
    """Whether kernels run on the device (False for DISK, which only holds data); a name no runtime provides
    is taken to compute (the scheduler plans for devices it cannot open)."""
    if type(name) is tuple:
        return all(map(device_computes, name))
    return _class_computes(name.split(":", 1)[0].upper())


def opened_caps(name: str) -> RendererCaps | None:
    """The renderer caps of an opened device that computes (its limits: buffers per kernel, loop iterations ...);
    None for a device not opened: the scheduler plans for devices it has not opened as unlimited."""
    opened = Device._open.get(name)
    return opened.renderer.caps if isinstance(opened, Compiled) and opened.computes else None


@functools.cache
def _class_computes(base: str) -> bool:
    ep = device_entry_points().get(base)
    return ep is None or bool(getattr(ep.load(), "computes", True))


def _unavailable(canon: str, why: DeviceUnavailable) -> DeviceUnavailable:
    """The error a device that cannot start raises: its name, why, and where to see all of them."""
    out = DeviceUnavailable(f"{canon}: {why}{LIST_HINT}")
    out.reason = str(why)  # what the listing shows
    return out


def _fastest_present() -> str:
    order = sorted(device_entry_points(), key=lambda n: -_priority(n))
    for name in order:
        try:
            Device[name]
            return name
        except Exception:  # noqa: BLE001  (any failure to start means "not this one")
            continue
    raise DeviceUnavailable(f"no device could start; tried {order}. See `python -m tiny.ir.device`")


def _priority(name: str) -> int:
    try:
        return int(device_entry_points()[name].load().priority)
    except Exception:  # noqa: BLE001
        return -1


@dataclass(frozen=True)
class DeviceStatus:
    name: str
    ok: bool
    reason: str  # why it is absent, or what it is when present
    renderers: tuple[str, ...] = field(default=())
    renderer: str = ""  # the one it opened with


def available() -> list[DeviceStatus]:
    """Every known device (installed runtime), whether it starts here, and why not when it does not."""
    out = []
    for name, ep in sorted(device_entry_points().items()):
        try:
            cls = ep.load()
            if cls.file_backed:
                out.append(DeviceStatus(name, True, f"{cls.__name__}, one device per file: {name}:/path/to/file"))
                continue
            dev = Device[name]
            what = f"{type(dev).__name__}, renderer {dev.renderer_name}" + (f" ({d})" if (d := dev.describe()) else "")
            out.append(DeviceStatus(name, True, what, cls.renderers, dev.renderer_name))
        except Exception as e:  # noqa: BLE001
            why = getattr(e, "reason", "") or str(e)
            out.append(DeviceStatus(name, False, f"{type(e).__name__}: {why}"))
    return out


def collective_for(devices: tuple[str, ...]) -> Collective:
    """The collective that combines tensors on these devices: their class's own where they are all of one class that
    brings one, else copies around a ring."""
    classes = {type(Device[d]) for d in devices}
    own = classes.pop().collective if len(classes) == 1 else None
    return own if own is not None else RING


def device_supports(device: str | tuple[str, ...], dtype: DType) -> bool:
    if type(device) is tuple:
        return all(device_supports(d, dtype) for d in device)
    dev = Device[device]
    return not dev.computes or dtype.scalar in dev.renderer.caps.dtypes  # memory of a data-only device holds any
