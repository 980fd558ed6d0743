"""Running another checkout's tiny from this environment: its packages' sources first on PYTHONPATH, and its own
entry points (devices, renderers) ahead of the installed ones, whose editable installs may name another checkout's
modules (tiny.codegen.cstyle moved to tiny.codegen.renderer.cstyle, for one). bench.architecture and bench.compare
run a checkout this way."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

# flags that would change what a measured process does (a kernel's source, the compile cache, debug output)
CLEARED_FLAGS = ("DEBUG", "BEAM", "NOOPT", "VIZ", "PROFILE", "REPLAY_RECORD", "CACHEDB", "CACHELEVEL")


def source_folders(root: Path) -> list[str]:
    """Each package's src/ folder of the checkout at `root`."""
    folders = [str(p.resolve()) for p in sorted((root / "packages").glob("*/src")) if p.is_dir()]
    if not folders:
        raise ValueError(f"{root} is not a checkout of tiny: no packages/*/src folders there")
    return folders


def write_entry_points(root: Path, folder: Path) -> None:
    """A dist-info folder per package of the checkout (its name, version, requirements and entry points) into
    `folder`; first on sys.path, they are the distributions importlib.metadata finds."""
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        name, version = project["name"], project["version"]
        info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
        for extra, deps in project.get("optional-dependencies", {}).items():
            lines += [f"Provides-Extra: {extra}", *(f"Requires-Dist: {d} ; extra == '{extra}'" for d in deps)]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
        groups = project.get("entry-points", {})
        text = "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()) for g, points in groups.items())
        (info / "entry_points.txt").write_text(text)


def environment(root: Path, scratch: Path) -> dict[str, str]:
    """os.environ for a process that runs the checkout at `root` (its entry points written under `scratch`), the
    flags of CLEARED_FLAGS unset, and the checkout's Python bytecode kept under `scratch` (the processes it starts
    too: an older checkout's bench.run times a fresh process's first result with its sources compiled in every
    process where the environment says PYTHONDONTWRITEBYTECODE, a newer one reads bytecode, as installed packages
    do: each side reads bytecode here)."""
    meta = scratch / "entry-points"
    write_entry_points(root, meta)
    env = {k: v for k, v in os.environ.items() if k not in (*CLEARED_FLAGS, "PYTHONDONTWRITEBYTECODE")}
    path = os.pathsep.join([str(meta), *source_folders(root)])
    return env | {"PYTHONPATH": path, "PYTHONPYCACHEPREFIX": str(scratch / "bytecode")}
