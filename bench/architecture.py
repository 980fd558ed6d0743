"""The figures of how the code is shaped (issue 32), for one checkout or several side by side:

    python -m bench.architecture                          # this checkout
    python -m bench.architecture --root /tmp/old --root .  # two checkouts, a column each (before, after)
    python -m bench.architecture --json out.json          # also the figures as JSON

How each figure is counted:

- **lines per package**: the Python files under `packages/<dist>/src`; *code lines* are the lines that hold a Python
  token other than a comment (docstrings count as code), so blank and comment-only lines are left out; the files'
  physical lines beside them. Other files (VIZ's JavaScript, data) are not counted.
- **longest functions** in tiny.codegen and tiny.ir (each module under `tiny/codegen/` and `tiny/ir/`): every `def`
  found by `ast` (methods and nested functions too), from its `def` line to its last line, decorators excluded; the
  median function is given with them.
- **bare `src[`**: subscripts of a `.src` attribute (`x.src[0]`, `store.src[1:]`, found by `ast`) in each package's
  sources, tiny/ir/uop.py (the file that defines the ops) left out; the text count of `src[` is given beside it.
- **renderers**: each `tiny.renderers` entry point of the checkout's pyproject files: its module's lines (physical and
  code) and the length of the `render` method its class has, or the class it inherits it from; and the lines of the
  renderer folder (`tiny/codegen/renderer/`) where there is one.
- **call path of `(a + b).numpy()`** on the CPU device, cold: a fresh Python (the checkout's sources first on its
  path, its entry points from its own pyproject files, a new empty compile cache) makes two realized float32
  tensors of 4 elements, then runs `(a + b).numpy()` under `sys.setprofile` (and `threading.setprofile`, for
  compile threads). Every call of a function in the checkout's `tiny` sources is an event, in the order the calls
  start; calls into other code (the standard library, NumPy) are not events, the tiny functions they call back are.
  *Functions run*: distinct code objects called, `def`s and lambdas; comprehensions and generator expressions, code
  objects of their own, are given apart, and *code objects run* counts both (the earlier measure of 442 at cc0eab7).
  *Calls* counts every event (a generator resumed is a call again). *Switches*: consecutive events in different
  places, at three granularities: the **package** (the distribution: tiny-tensor, tiny-ir, ...), the **stage** (the
  module path two levels below `tiny`: tiny.ir.uop, tiny.ir.schedule, tiny.codegen.renderer, tiny.runtime.cpu) and
  the **module** (the full module path: tiny.ir.schedule.scheduler). A call that returns and the next call from its
  caller are consecutive events: the count is of the places a reader reads the calls in, in order.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import tokenize
import tomllib
from pathlib import Path
from typing import Any

from bench.checkout import environment, source_folders

HERE = Path(__file__).resolve().parents[1]
TOP_FUNCTIONS = 10
NO_CODE_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
NO_CODE_TOKENS |= {tokenize.ENCODING, tokenize.ENDMARKER}
COMPREHENSIONS = {"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}


# ---------------------------------------------------------------- the sources


def sources(root: Path) -> dict[str, list[Path]]:
    """Each package's Python files: distribution folder name -> files under its src/."""
    return {
        src.parent.name: sorted(src.rglob("*.py")) for src in sorted((root / "packages").glob("*/src")) if src.is_dir()
    }


def module_name(path: Path) -> str:
    """tiny.ir.uop for .../src/tiny/ir/uop.py, tiny.ir.device for .../src/tiny/ir/device/__init__.py."""
    parts = path.with_suffix("").parts
    parts = parts[len(parts) - 1 - parts[::-1].index("src") + 1 :]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def code_lines(text: str) -> int:
    """Lines holding a token other than a comment: blank and comment-only lines left out, docstrings counted."""
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in NO_CODE_TOKENS:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines)


def lines_per_package(root: Path) -> dict[str, dict[str, int]]:
    out = {}
    for dist, files in sources(root).items():
        texts = [f.read_text() for f in files]
        out[dist] = {
            "files": len(files),
            "lines": sum(len(t.splitlines()) for t in texts),
            "code_lines": sum(code_lines(t) for t in texts),
        }
    return out


def functions(path: Path) -> list[tuple[str, int]]:
    """Every def in a file as (qualified name, lines from the def line to the last)."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                found.append((name, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return found


def longest_functions(root: Path, package: str) -> dict[str, Any]:
    """The TOP_FUNCTIONS longest defs of tiny.<package> (e.g. codegen), and the median of all of them."""
    every = [
        (f"{module_name(f)}:{name}", length)
        for files in sources(root).values()
        for f in files
        if module_name(f) == f"tiny.{package}" or module_name(f).startswith(f"tiny.{package}.")
        for name, length in functions(f)
    ]
    every.sort(key=lambda fn: (-fn[1], fn[0]))
    median = statistics.median(length for _, length in every) if every else 0
    return {"count": len(every), "median": median, "longest": every[:TOP_FUNCTIONS]}


def bare_src(root: Path) -> dict[str, dict[str, int]]:
    """Per package: subscripts of a .src attribute (ast) and the text count of `src[`, tiny/ir/uop.py left out."""
    out = {}
    for dist, files in sources(root).items():
        subscripts = text = 0
        for f in files:
            if module_name(f) == "tiny.ir.uop":
                continue
            source = f.read_text()
            text += source.count("src[")
            subscripts += sum(
                isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and n.value.attr == "src"
                for n in ast.walk(ast.parse(source, str(f)))
            )
        out[dist] = {"attribute_subscripts": subscripts, "text": text}
    return out


def entry_points(root: Path) -> dict[str, dict[str, str]]:
    """The entry points the checkout's packages declare: group -> name -> 'module:attr'."""
    groups: dict[str, dict[str, str]] = {}
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        for group, points in project.get("entry-points", {}).items():
            groups.setdefault(group, {}).update(points)
    return groups


def module_file(root: Path, module: str) -> Path | None:
    rel = Path(*module.split("."))
    for src in sorted((root / "packages").glob("*/src")):
        for candidate in (src / rel.with_suffix(".py"), src / rel / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _render_method(root: Path, module: str, cls: str, seen: int = 0) -> tuple[int, str] | None:
    """The lines of the render method of class `cls` of `module` and where it is defined, following base classes
    named in the module or imported into it from tiny; None where none is found."""
    path = module_file(root, module)
    if path is None or seen > 8:
        return None
    tree = ast.parse(path.read_text(), str(path))
    imported = {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tiny.")
        for alias in node.names
    }
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "render":
                    return item.end_lineno - item.lineno + 1, f"{module}:{cls}"
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else None
                if name is None:
                    continue
                found = _render_method(root, imported.get(name, module), name, seen + 1)
                if found is not None:
                    return found
    return None


def renderers(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"entry_points": {}}
    for name, target in sorted(entry_points(root).get("tiny.renderers", {}).items()):
        module, cls = target.split(":")
        path = module_file(root, module)
        if path is None:
            out["entry_points"][name] = {"module": module, "missing": True}
            continue
        text = path.read_text()
        render = _render_method(root, module, cls)
        out["entry_points"][name] = {
            "module": module,
            "lines": len(text.splitlines()),
            "code_lines": code_lines(text),
            "render_lines": render[0] if render else None,
            "render_in": render[1] if render else None,
        }
    folder = [p for src in (root / "packages").glob("*/src") for p in (src / "tiny/codegen/renderer").glob("*.py")]
    if folder:
        texts = [p.read_text() for p in folder]
        out["folder"] = {
            "files": len(folder),
            "lines": sum(len(t.splitlines()) for t in texts),
            "code_lines": sum(code_lines(t) for t in texts),
        }
    return out


# ---------------------------------------------------------------- the call path of (a + b).numpy()

# run in a fresh Python with the checkout's sources first on sys.path; prints one JSON line
CALL_PATH_CHILD = r"""
import json, sys, threading
from pathlib import Path
roots = [str(Path(p).resolve()) for p in sys.argv[1:]]
from tiny.tensor import Tensor
from tiny.ir.device import Device
a = Tensor([1.0, 2.0, 3.0, 4.0], device="CPU").realize()
b = Tensor([10.0, 20.0, 30.0, 40.0], device="CPU").realize()
events, lock = [], threading.Lock()
def hook(frame, event, arg):
    if event == "call":
        code = frame.f_code
        if code.co_filename.startswith(tuple(roots)):
            with lock:
                events.append((code.co_filename, code.co_qualname, code.co_firstlineno))
threading.setprofile(hook)
sys.setprofile(hook)
out = (a + b).numpy()
sys.setprofile(None)
threading.setprofile(None)
assert out.tolist() == [11.0, 22.0, 33.0, 44.0], out
for name, module in list(sys.modules.items()):
    where = getattr(module, "__file__", None)
    if name.startswith("tiny.") and where and not str(Path(where).resolve()).startswith(tuple(roots)):
        raise SystemExit(f"{name} was imported from {where}, not from the checkout's sources {roots}")
print(json.dumps({"events": events, "renderer": type(Device["CPU"].renderer).__name__}))
"""


def call_path(root: Path) -> dict[str, Any]:
    srcs = source_folders(root)
    with tempfile.TemporaryDirectory(prefix="tiny-architecture-") as tmp:
        env = environment(root, Path(tmp)) | {"CACHEDB": str(Path(tmp) / "cache.db"), "DEVICE": "CPU"}
        done = subprocess.run(
            [sys.executable, "-c", CALL_PATH_CHILD, *srcs], env=env, cwd=tmp, capture_output=True, text=True
        )
    if done.returncode != 0:
        raise RuntimeError(f"the call path's process failed in {root}:\n{done.stderr[-3000:]}")
    child = json.loads(done.stdout.strip().splitlines()[-1])
    return summarize_events([tuple(e) for e in child["events"]], srcs) | {"renderer": child["renderer"]}


def summarize_events(events: list[tuple[str, str, int]], srcs: list[str]) -> dict[str, Any]:
    """Functions run and switches, from (file, qualified name, first line) call events in the order they started."""

    def place(filename: str) -> tuple[str, str, str]:
        src = next(s for s in srcs if filename.startswith(s + os.sep))
        module = module_name(Path(filename))
        return Path(src).parent.name, ".".join(module.split(".")[:3]), module

    places = [place(f) for f, _, _ in events]
    code = set(events)
    functions_run = {e for e in code if e[1].rsplit(".", 1)[-1] not in COMPREHENSIONS}
    out: dict[str, Any] = {
        "calls": len(events),
        "functions": len(functions_run),
        "comprehensions": len(code) - len(functions_run),
        "code_objects": len(code),
    }
    for level, key in enumerate(("package", "stage", "module")):
        sequence = [p[level] for p in places]
        out[f"{key}_switches"] = sum(x != y for x, y in zip(sequence, sequence[1:], strict=False))
        out[f"{key}s"] = len(set(sequence))
    return out


# ---------------------------------------------------------------- the report


def measure(root: Path) -> dict[str, Any]:
    root = root.resolve()
    if not (root / "packages").is_dir():
        raise SystemExit(f"error: {root} is not a checkout of tiny (no packages/ folder)")
    return {
        "root": str(root),
        "commit": _commit(root),
        "lines": lines_per_package(root),
        "functions": {p: longest_functions(root, p) for p in ("codegen", "ir")},
        "bare_src": bare_src(root),
        "renderers": renderers(root),
        "call_path": call_path(root),
    }


def _commit(root: Path) -> str:
    """The checkout's short commit, + where tracked files have changes; the folder's name where git cannot say."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True)  # fmt: skip
    except OSError:  # (no git here)
        return root.name
    if head.returncode != 0:
        return root.name
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def _table(title: str, rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([title, line(header), *(line(r) for r in rows)])


def text(figures: list[dict[str, Any]]) -> str:
    cols = [f["commit"] for f in figures]
    dists = sorted({d for f in figures for d in f["lines"]})
    parts = []
    cell = lambda f, d, k: str(f["lines"].get(d, {}).get(k, "-"))  # noqa: E731
    rows = [[d, *(f"{cell(f, d, 'code_lines')} ({cell(f, d, 'lines')})" for f in figures)] for d in dists]
    total = lambda f, k: sum(v[k] for v in f["lines"].values())  # noqa: E731
    rows.append(["all", *(f"{total(f, 'code_lines')} ({total(f, 'lines')})" for f in figures)])
    parts.append(_table("lines per package: code lines (physical lines) of src/", rows, ["package", *cols]))
    rows = [[d, *(str(f["bare_src"].get(d, {}).get("attribute_subscripts", "-")) + " (" +
                  str(f["bare_src"].get(d, {}).get("text", "-")) + ")" for f in figures)] for d in dists]  # fmt: skip
    parts.append(_table("bare src[: .src subscripts (text 'src[') outside tiny/ir/uop.py", rows, ["package", *cols]))
    names = sorted({n for f in figures for n in f["renderers"]["entry_points"]})

    def renderer_cell(f: dict[str, Any], n: str) -> str:
        r = f["renderers"]["entry_points"].get(n)
        if r is None or r.get("missing"):
            return "-"
        render = "render -" if r["render_lines"] is None else f"render {r['render_lines']}"
        if r["render_in"] and not r["render_in"].startswith(r["module"] + ":"):
            render += f" in {r['render_in'].removeprefix('tiny.')}"
        return f"{r['module'].rsplit('.', 1)[-1]}.py {r['lines']} ({r['code_lines']}), {render}"

    rows = [[n, *(renderer_cell(f, n) for f in figures)] for n in names]
    folder = lambda f: f["renderers"].get("folder")  # noqa: E731
    rows.append(["renderer/", *(f"{folder(f)['files']} files {folder(f)['lines']} ({folder(f)['code_lines']})"
                               if folder(f) else "-" for f in figures)])  # fmt: skip
    parts.append(_table("renderers: module lines (code lines), render method lines", rows, ["renderer", *cols]))
    for package in ("codegen", "ir"):
        rows = [[f"#{i + 1}", *(_nth(f["functions"][package]["longest"], i) for f in figures)]
                for i in range(TOP_FUNCTIONS)]  # fmt: skip
        rows.append(["median", *(f"{f['functions'][package]['median']:g}" for f in figures)])
        rows.append(["defs", *(str(f["functions"][package]["count"]) for f in figures)])
        parts.append(_table(f"longest functions in tiny.{package} (lines)", rows, ["", *cols]))
    keys = [
        ("functions run", "functions"),
        ("comprehensions run", "comprehensions"),
        ("code objects run", "code_objects"),
        ("calls", "calls"),
        ("package switches", "package_switches"),
        ("stage switches", "stage_switches"),
        ("module switches", "module_switches"),
        ("packages / stages / modules", None),
    ]

    def path_cell(f: dict[str, Any], key: str | None) -> str:
        c = f["call_path"]
        return str(c[key]) if key else f"{c['packages']} / {c['stages']} / {c['modules']}"

    rows = [[label, *(path_cell(f, k) for f in figures)] for label, k in keys]
    rows.append(["CPU renderer", *(f["call_path"]["renderer"] for f in figures)])
    parts.append(_table("cold call path of (a + b).numpy() on CPU", rows, ["", *cols]))
    return "\n\n".join(parts)


def _nth(longest: list[tuple[str, int]], i: int) -> str:
    if i >= len(longest):
        return "-"
    name, length = longest[i]
    return f"{length} {name.removeprefix('tiny.')}"


def main(argv: list[str] | None = None) -> int:
    about = "the figures of how the code is shaped (issue 32), for one checkout or several side by side"
    p = argparse.ArgumentParser(prog="python -m bench.architecture", description=about)
    p.add_argument("--root", type=Path, action="append", help="a checkout (repeat for columns; default: this one)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON")
    args = p.parse_args(argv)
    figures = [measure(root) for root in args.root or [HERE]]
    print(text(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
