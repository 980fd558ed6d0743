"""`python -m tiny.ir.device`: every known device, whether it starts here, and why not."""

from tiny.ir.device import INTERFACE_VERSION, Device, available
from tiny.ir.device.interface import renderer_entry_points


def main() -> None:
    print(f"tiny device interface {INTERFACE_VERSION[0]}.{INTERFACE_VERSION[1]}")
    statuses = available()
    if not statuses:
        print("no runtime package is installed (pip install tiny-runtime-misc)")
    width = max((len(s.name) for s in statuses), default=4)
    for s in statuses:
        others = [f"{s.name}:{r}" for r in s.renderers if r != s.renderer] if s.ok else []
        also = f"; also {', '.join(others)}" if others else ""
        print(f"  {s.name:<{width}}  {'yes' if s.ok else 'no '}  {s.reason}{also}")
    for line in unavailable_renderers():
        print(line)
    try:
        print(f"default device: {Device.DEFAULT}")
    except Exception as e:  # noqa: BLE001
        print(f"default device: none ({e})")


def unavailable_renderers() -> list[str]:
    """A line for each installed renderer that cannot be used here, saying why."""
    lines = []
    for name, ep in sorted(renderer_entry_points().items()):
        try:
            reason = ep.load().unavailable()
        except Exception as e:  # noqa: BLE001  (a renderer whose module does not import says so)
            reason = f"{type(e).__name__}: {e}"
        if reason is not None:
            lines.append(f"  renderer {name}: no, {reason}")
    return lines


if __name__ == "__main__":
    main()
