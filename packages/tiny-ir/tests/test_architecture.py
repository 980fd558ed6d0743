"""ARCHITECTURE.md stays true where a file can show it: its table of packages is the packages and their tiny
dependencies, every path it names exists, and the passes it lists are the ones the scheduler and the code generator
record (the names VIZ shows)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TEXT = (ROOT / "ARCHITECTURE.md").read_text()
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())


def _table() -> dict[str, str]:
    rows = re.findall(r"^\| `(tiny-[a-z-]+)` \| .* \| (.*) \|$", TEXT, re.M)
    return dict(rows)


def test_the_table_lists_each_package_with_its_tiny_dependencies() -> None:
    table = _table()
    assert sorted(table) == PACKAGES
    for name in PACKAGES:
        project = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())["project"]
        deps = {re.split(r"[\[<>=]", d)[0] for d in project.get("dependencies", [])}
        tiny = {d for d in deps if d.startswith("tiny-")}
        assert set(re.findall(r"`(tiny-[a-z-]+)`", table[name])) == tiny, name
        assert ("NumPy" in table[name] and "not even" not in table[name]) == ("numpy" in deps), name


def test_every_path_it_names_exists() -> None:
    paths = set(re.findall(r"`((?:tiny|packages)/[\w/.-]+)`", TEXT))
    assert len(paths) > 10
    for path in paths:
        found = (ROOT / path).exists() or any((p / "src" / path).exists() for p in (ROOT / "packages").iterdir())
        assert found, f"ARCHITECTURE.md names {path}, which is not in the repository"


def test_the_passes_it_lists_are_the_ones_recorded() -> None:
    schedule = (ROOT / "packages/tiny-ir/src/tiny/ir/schedule/scheduler.py").read_text()
    program = (ROOT / "packages/tiny-codegen/src/tiny/codegen/program.py").read_text()
    for name in ("prepare", "lift reshapes", "read copies", "kernels"):
        assert f"`{name}`" in TEXT and (f'name="{name}"' in schedule or f'viz.step("{name}"' in schedule), name
    for name in ("symbolic", "vectorize"):
        assert f"`{name}`" in TEXT and f'name="{name}"' in program, name
    for name in ("narrow loops", "linearize"):  # (passes that are not rewrite rules name their step themselves)
        assert f"`{name}`" in TEXT and f'viz.step("{name}"' in program, name
    lower = (ROOT / "packages/tiny-codegen/src/tiny/codegen/lower.py").read_text()
    assert "`index memory`" in TEXT and 'name="index memory"' in lower
    assert "`lower`" in TEXT and 'viz.step(f"lower {plan.applied}"' in program


def test_the_entry_point_groups_it_names_are_the_ones_packages_use() -> None:
    groups = set()
    for name in PACKAGES:
        project = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())["project"]
        groups |= set(project.get("entry-points", {}))
    assert groups == {"tiny.devices", "tiny.renderers"}
    assert all(f"`{g}`" in TEXT for g in groups)


def test_cached_properties_are_set_by_their_owners_alone() -> None:
    """A node's or a device's cached property (a `__dict__["name"]` entry) is written only in the module that defines
    it (UOp.take_shape_of, UOp.set_shape, Compiled.use_renderer, a Flag's parsed value), never reached into from
    another module."""
    owners = {
        "tiny/ir/uop.py": {"shape", "device"},
        "tiny/ir/device/interface.py": {"renderer"},
        "tiny/ir/config.py": {"value"},
    }
    for path in sorted(ROOT.glob("packages/*/src/tiny/**/*.py")):
        where = "/".join(path.relative_to(ROOT).parts[3:])  # (packages/<dist>/src/ dropped)
        for name in re.findall(r"""__dict__\[["'](\w+)["']\]""", path.read_text()):
            assert name in owners.get(where, set()), f"{where} writes the cached property {name!r} of another module"
