"""Checks on how the repository is cut into distributions and how they install.

The fast tests read files (`ast`, `tomllib`) and import nothing from the other packages: which way imports point,
the PEP 420 namespace, the dependency table, the umbrella, the README's flag table and commands. The slow ones build
a clean virtual environment and install packages from this checkout with no index at all, so a tiny-* name that
would have been looked up on an index (where those names are not ours) fails the install.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tiny.ir.config import FLAGS

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ROOT / "packages"
DISTS = sorted(p.parent.name for p in PACKAGES.glob("*/pyproject.toml"))
RUNTIMES = [d for d in DISTS if d.startswith("tiny-runtime-")]

# Which tiny packages each distribution may depend on (DESIGN.md): dependencies point one way, and every runtime
# depends on tiny-ir alone.
DESIGNED_TINY_DEPS = {
    "tiny-ir": set(),
    "tiny-codegen": {"tiny-ir"},
    "tiny-tensor": {"tiny-ir", "tiny-codegen", "tiny-runtime-misc"},
} | {runtime: {"tiny-ir"} for runtime in RUNTIMES}


def _pyproject(directory: Path) -> dict:
    return tomllib.loads((directory / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    """The normalized distribution name a requirement string starts with."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, f"not a requirement: {requirement!r}"
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def _tiny_deps(dist: str) -> dict[str, str]:
    """The tiny packages `dist` depends on (not counting extras): name -> requirement string."""
    reqs = _pyproject(PACKAGES / dist)["project"].get("dependencies", [])
    return {_name(r): r for r in reqs if _name(r) in DISTS}


def _owned_modules(dist: str) -> set[str]:
    """The top-level modules a distribution ships: tiny.<x>, or tiny.runtime.<x> inside the namespace tiny.runtime."""
    owned = set()
    tiny = PACKAGES / dist / "src" / "tiny"
    for child in tiny.iterdir() if tiny.is_dir() else ():
        if child.name == "runtime" and child.is_dir():
            owned |= {f"tiny.runtime.{c.name.removesuffix('.py')}" for c in child.iterdir() if c.name != "__pycache__"}
        elif child.name != "__pycache__":
            owned.add(f"tiny.{child.name.removesuffix('.py')}")
    return owned


def _module_name(path: Path, src: Path) -> tuple[str, bool]:
    """The dotted name of a source file under `src`, and whether it is a package's __init__."""
    parts = path.relative_to(src).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _tiny_imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every import of a tiny module in `source`, relative imports resolved, type-only included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from tiny import ir` and `from tiny.runtime import cpu` import the submodule by that name
            names = [f"{target}.{a.name}" for a in node.names] if target in ("tiny", "tiny.runtime") else [target]
        else:
            continue
        found += [(node.lineno, name) for name in names if name == "tiny" or name.startswith("tiny.")]
    return found


def _within(name: str, modules: set[str]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


# ---------------------------------------------------------------- the shape of the repository


def test_every_package_directory_is_named_after_its_distribution():
    assert DISTS, f"no packages under {PACKAGES}"
    for dist in DISTS:
        assert _name(_pyproject(PACKAGES / dist)["project"]["name"]) == dist


@pytest.mark.parametrize("dist", DISTS)
def test_tiny_is_a_namespace_package(dist):
    src = PACKAGES / dist / "src"  # git keeps no empty folders: a package with no code yet has no src/
    top = {p.name for p in src.iterdir() if p.name != "__pycache__"} if src.is_dir() else set()
    assert top <= {"tiny"}, f"{src} holds only tiny/, not {sorted(top - {'tiny'})}"
    assert not (src / "tiny" / "__init__.py").exists(), "tiny is a PEP 420 namespace package: no tiny/__init__.py"
    assert not (src / "tiny" / "runtime" / "__init__.py").exists(), "tiny.runtime is a namespace: no __init__.py"
    wheel = _pyproject(PACKAGES / dist)["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["src/tiny"]


@pytest.mark.parametrize("dist", DISTS)
def test_tiny_dependencies_follow_the_design(dist):
    assert dist in DESIGNED_TINY_DEPS, f"{dist} is new: add it to DESIGN.md's table and to DESIGNED_TINY_DEPS"
    deps = _tiny_deps(dist)
    assert set(deps) == DESIGNED_TINY_DEPS[dist]
    for req in deps.values():
        # by name with a version range, so each distribution can be published on its own
        assert "@" not in req and re.search(r"[<>=~]", req), f"{dist}: depend on {req!r} by name and range"


@pytest.mark.parametrize("dist", DISTS)
def test_imports_point_down_the_dependency_graph(dist):
    allowed = _owned_modules(dist).union(*(_owned_modules(dep) for dep in _tiny_deps(dist)))
    wrong = []
    src = PACKAGES / dist / "src"
    for path in sorted(src.rglob("*.py")):
        module, is_package = _module_name(path, src)
        for line, name in _tiny_imports(path.read_text(), module, is_package):
            if not _within(name, allowed):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not wrong, f"{dist} may import only {sorted(allowed)}:\n" + "\n".join(wrong)


def test_import_check_sees_every_form_of_import():
    source = """
import os
import tiny.codegen.renderer.cstyle
from tiny.tensor import Tensor
from tiny import nn, ir
from tiny.runtime import cuda
from ..codegen import lower
from . import dtypes
if TYPE_CHECKING:
    import tiny.runtime.amd.kfd as kfd
"""
    found = {name for _, name in _tiny_imports(source, "tiny.ir.schedule")}
    assert found == {
        "tiny.codegen.renderer.cstyle",
        "tiny.tensor",
        "tiny.nn",
        "tiny.ir",
        "tiny.runtime.cuda",
        "tiny.codegen",
        "tiny.runtime.amd.kfd",
    }
    src = PACKAGES / "tiny-ir" / "src"
    assert _module_name(src / "tiny" / "ir" / "device" / "__init__.py", src) == ("tiny.ir.device", True)
    assert _module_name(src / "tiny" / "ir" / "config.py", src) == ("tiny.ir.config", False)
    assert {n for _, n in _tiny_imports("from .. import config", "tiny.ir.device", True)} == {"tiny.ir"}
    assert not _within("tiny.codegen", {"tiny.ir"}) and not _within("tiny.irx", {"tiny.ir"})


def test_umbrella_depends_on_every_package_by_local_path():
    umbrella = _pyproject(ROOT)
    assert set(umbrella["project"]["dependencies"]) == {f"{d} @ {{root:uri}}/packages/{d}" for d in DISTS}
    assert umbrella["tool"]["hatch"]["metadata"]["allow-direct-references"] is True
    assert umbrella["tool"]["hatch"]["build"]["targets"]["wheel"]["bypass-selection"] is True
    dev = {_name(r): r for r in umbrella["project"]["optional-dependencies"]["dev"]}
    assert {"pytest", "hypothesis", "ruff", "nox", "numpy", "torch"} <= set(dev)
    assert re.fullmatch(r"torch==[\d.]+", dev["torch"]), "an unpinned torch pulls a CUDA build of several GB"


def test_nox_has_a_session_for_every_package():
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    installed: dict[str, set[str]] = {}  # package -> the sessions that install it (a device's session may too)
    for func in tree.body:
        if isinstance(func, ast.FunctionDef) and any("session" in ast.unparse(d) for d in func.decorator_list):
            for call in ast.walk(func):
                if isinstance(call, ast.Call) and ast.unparse(call.func) == "_install_local":
                    installed.setdefault(ast.literal_eval(call.args[1]), set()).add(func.name)
    assert set(installed) == set(DISTS), "each package is tested by its own nox session"
    defaults = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "nox.options.sessions"
    )
    sessions = set().union(*installed.values())
    # process replay against a base commit: a refactor's check, run when one is made; the language models against
    # llama.cpp, which the session builds from source (about 25 minutes)
    on_demand = {"replay", "llm"}
    assert (sessions - on_demand) | {"lint"} == set(defaults), "plain `nox` runs every package session and lint"


# ---------------------------------------------------------------- the README


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def _quick_start_commands() -> list[str]:
    blocks = re.findall(r"^```(?:sh|bash|console)?\n(.*?)^```", _readme_section("Quick start"), re.M | re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def _declared_flags() -> dict[str, str]:
    """Each flag declared with tiny.ir.config.flag in any package's source, and the package."""
    found = {}
    for path in sorted((ROOT / "packages").glob("*/src/**/*.py")):
        for name in re.findall(r'^[A-Z][A-Z0-9_]* = flag\(\s*"([A-Z][A-Z0-9_]*)"', path.read_text(), re.M):
            assert name not in found, f"flag {name} is declared twice"
            found[name] = path.relative_to(ROOT / "packages").parts[0]
    return found


def test_readme_flag_table_is_the_declared_flags():
    rows = re.findall(
        r"^\|\s*`([A-Z][A-Z0-9_]*)`\s*\|\s*`(tiny-[a-z-]+)`\s*\|", _readme_section("Environment flags"), re.M
    )
    assert dict(rows) == _declared_flags(), "README's flag table and the flags the packages declare differ"
    assert set(FLAGS) <= set(_declared_flags())  # (the ones tiny-ir itself declares are found too)


def test_readme_quick_start_is_two_commands_and_ci_runs_the_second():
    commands = _quick_start_commands()
    assert len(commands) == 2, f"the Quick start is exactly two commands, found {commands}"
    demo, tests = commands
    installs = re.findall(r"pip install ((?:(?!&&).)*)", demo)
    assert installs, f"the first command installs the stack: {demo!r}"
    for target in " ".join(installs).split():
        is_local = target == "." or target.startswith(("-", "./packages/"))
        assert is_local, f"the first command installs {target!r}: install tiny from local paths only"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests in ci, f"the README's test command {tests!r} is not a line of .ci/run"


# ---------------------------------------------------------------- installs in a clean virtual environment

# pip with no index, no find-links and no configuration: only the paths named on the command line can be installed
ONLINE = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
OFFLINE = {k: v for k, v in ONLINE.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}


def _run(cmd: list, env: dict[str, str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def _query(python: Path, script: str, *args: str) -> object:
    return json.loads(_run([python, "-c", script, *args], ONLINE, python.parents[1]).stdout)


INSTALLED = "import importlib.metadata as m, json; print(json.dumps([d.metadata['Name'] for d in m.distributions()]))"
FILES = "import importlib.metadata as m, json, sys; print(json.dumps([str(f) for f in m.files(sys.argv[1])]))"
LOAD_ENTRY_POINTS = """
import importlib.metadata as m, json, sys
result = {}
for dist in sys.argv[1:]:
    for ep in m.distribution(dist).entry_points:
        if ep.group in ("tiny.devices", "tiny.renderers"):
            try:
                ep.load()
                result[f"{dist} {ep.group} {ep.name}"] = "ok"
            except Exception as e:
                result[f"{dist} {ep.group} {ep.name}"] = f"{ep.value}: {type(e).__name__}: {e}"
print(json.dumps(result))
"""
WHERE_IS_TINY_IR = "import json, tiny.ir; print(json.dumps(list(tiny.ir.__path__)))"


def _installed(python: Path) -> set[str]:
    return {_name(n) for n in _query(python, INSTALLED)}


class CleanVenv:
    def __init__(self, root: Path):
        self.root = root
        self.python = root / "bin" / "python"

    def pip_offline(self, *targets: Path, check: bool = True) -> subprocess.CompletedProcess:
        # --no-cache-dir: pip before 26.2 reuses a wheel it cached for a `name @ file:///folder` requirement
        # (pypa/pip#14044), which would install old code and hide files added since
        cmd = [self.python, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-cache-dir", *targets]
        return _run(cmd, OFFLINE, self.root, check)

    def tiny_dists(self) -> set[str]:
        return {n for n in _installed(self.python) if n == "tiny" or n.startswith("tiny-")}

    def check_installed(self, dists: list[str]) -> None:
        """Exactly `dists` are installed, each with all its source files, and tiny.ir imports from the venv."""
        assert self.tiny_dists() == set(dists), "pip installed other tiny distributions than asked for"
        for dist in set(dists) & set(DISTS):
            src = PACKAGES / dist / "src"
            shipped = set(_query(self.python, FILES, dist))
            missing = {p.relative_to(src).as_posix() for p in src.rglob("*.py")} - shipped
            assert not missing, f"the {dist} wheel lacks {sorted(missing)}"
        for path in _query(self.python, WHERE_IS_TINY_IR):
            assert Path(path).resolve().is_relative_to(self.root.resolve()), f"tiny.ir imported from {path}"


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> tuple[CleanVenv, set[str]]:
    venv = CleanVenv(tmp_path_factory.mktemp("clean-venv"))
    _run([sys.executable, "-m", "venv", venv.root], ONLINE, venv.root)
    assert "include-system-site-packages = false" in (venv.root / "pyvenv.cfg").read_text()
    # the build backend comes from the index, as in any isolated build; after this, nothing does
    _run([venv.python, "-m", "pip", "install", "--quiet", "hatchling>=1.21"], ONLINE, venv.root)
    return venv, _installed(venv.python)


@pytest.fixture
def venv(base_venv) -> CleanVenv:
    """The module's clean venv, with whatever an earlier test installed removed again."""
    venv, baseline = base_venv
    extra = _installed(venv.python) - baseline
    if extra:
        _run([venv.python, "-m", "pip", "uninstall", "--yes", *sorted(extra)], ONLINE, venv.root)
    return venv


@pytest.mark.slow
def test_tiny_ir_installs_alone(venv):
    venv.pip_offline(PACKAGES / "tiny-ir")
    venv.check_installed(["tiny-ir"])


@pytest.mark.slow
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_runtime_installs_with_tiny_ir_alone(venv, runtime):
    venv.pip_offline(PACKAGES / runtime, PACKAGES / "tiny-ir")
    venv.check_installed([runtime, "tiny-ir"])


def _local_closure(dist: str) -> list[str]:
    return [dist, *(d for dep in _tiny_deps(dist) for d in _local_closure(dep))]


@pytest.mark.slow
@pytest.mark.parametrize("dist", [d for d in DISTS if "entry-points" in _pyproject(PACKAGES / d)["project"]])
def test_entry_points_load_with_the_declared_dependencies_only(venv, dist):
    # a device or renderer that imports what its distribution does not declare fails here, not on a user's machine
    needed = sorted(set(_local_closure(dist)))
    venv.pip_offline(*(PACKAGES / d for d in needed))
    loaded = _query(venv.python, LOAD_ENTRY_POINTS, dist)
    assert loaded, f"{dist} declares entry points but none is installed"
    assert all(v == "ok" for v in loaded.values()), f"entry points that do not load: {loaded}"


@pytest.mark.slow
def test_a_tiny_dependency_missing_from_the_command_fails_the_install(venv):
    # what would have been looked up on an index fails instead: this is what makes the other installs a proof
    proc = venv.pip_offline(PACKAGES / "tiny-codegen", check=False)
    assert proc.returncode != 0
    assert "tiny-ir" in proc.stdout + proc.stderr
    assert venv.tiny_dists() == set()


@pytest.mark.slow
def test_umbrella_installs_every_package_from_this_checkout(venv):
    # tiny-tensor's third-party dependencies (NumPy; llvmlite through tiny-runtime-misc[llvm]) come from the index
    # first; then the umbrella, offline
    _run([venv.python, "-m", "pip", "install", "--quiet", "numpy>=1.24", "llvmlite>=0.44"], ONLINE, venv.root)
    venv.pip_offline(ROOT)
    venv.check_installed(["tiny", *DISTS])
