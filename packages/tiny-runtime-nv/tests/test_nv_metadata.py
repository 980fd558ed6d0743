"""The installed tiny-runtime-nv distribution matches its pyproject.toml and registers its devices with tiny."""

import importlib.metadata
import tomllib
from pathlib import Path

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]


def test_installed_version_is_this_checkouts():
    # a stale install (an older wheel, another checkout) shows up here as a different version
    assert importlib.metadata.version("tiny-runtime-nv") == PYPROJECT["version"]


def test_registers_its_devices_in_the_tiny_devices_group():
    installed = importlib.metadata.distribution("tiny-runtime-nv").entry_points
    eps = {ep.name: ep.value for ep in installed.select(group="tiny.devices")}
    assert "CUDA" in eps, f"tiny-runtime-nv registers no CUDA device: {eps}"
    assert all(value.startswith("tiny.runtime.nv.") for value in eps.values()), eps
    assert eps == PYPROJECT["entry-points"]["tiny.devices"]


def test_depends_on_tiny_ir_alone():
    requires = importlib.metadata.requires("tiny-runtime-nv") or []
    tiny = [r for r in requires if r.startswith("tiny-")]
    assert len(tiny) == 1 and tiny[0].startswith("tiny-ir"), requires
