"""bench.architecture, the figures of issue 32 (lines, longest functions, bare src[, renderers, the call path of
a + b): its counting rules on small made-up sources, and one run over this checkout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def arch(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(ROOT))
    import bench.architecture

    return bench.architecture


SAMPLE = '''"""A docstring
over two lines."""

# a comment


def f(x):  # a comment after code counts
    return [y for y in x]


class K:
    def g(self):
        def inner():
            return 1

        return (
            inner()
        )
'''


def test_code_lines_leave_out_blank_and_comment_lines(arch) -> None:
    # the docstring's 2 lines, def f, its return, class K, def g, def inner, its return, and the 3 lines of return (...)
    assert arch.code_lines(SAMPLE) == 11
    assert arch.code_lines("# only a comment\n\n") == 0


def test_functions_are_every_def_with_its_lines(arch, tmp_path: Path) -> None:
    path = tmp_path / "sample.py"
    path.write_text(SAMPLE)
    assert sorted(arch.functions(path)) == [("K.g", 7), ("K.g.inner", 2), ("f", 2)]


def test_module_names_start_below_src(arch) -> None:
    assert arch.module_name(Path("/x/packages/tiny-ir/src/tiny/ir/uop.py")) == "tiny.ir.uop"
    assert arch.module_name(Path("/x/packages/tiny-ir/src/tiny/ir/device/__init__.py")) == "tiny.ir.device"


def test_switches_are_counted_between_consecutive_calls_at_each_level(arch) -> None:
    src = ["/r/packages/tiny-tensor/src", "/r/packages/tiny-ir/src"]
    t, s = "/r/packages/tiny-tensor/src/tiny/tensor/tensor.py", "/r/packages/tiny-ir/src/tiny/ir/schedule"
    events = [
        (t, "Tensor.__add__", 1),
        (t, "Tensor.__add__.<locals>.<genexpr>", 2),
        ("/r/packages/tiny-ir/src/tiny/ir/uop.py", "UOp.__new__", 3),
        (f"{s}/scheduler.py", "create_schedule", 4),
        (f"{s}/cache.py", "lookup", 5),
        (t, "Tensor.numpy", 6),
        (t, "Tensor.numpy", 6),
    ]
    out = arch.summarize_events(events, src)
    assert (out["calls"], out["functions"], out["comprehensions"], out["code_objects"]) == (7, 5, 1, 6)
    assert (out["package_switches"], out["stage_switches"], out["module_switches"]) == (2, 3, 4)
    assert (out["packages"], out["stages"], out["modules"]) == (2, 3, 4)


def test_bare_src_counts_src_subscripts_outside_the_ops_file(arch, tmp_path: Path) -> None:
    ir = tmp_path / "packages/tiny-ir/src/tiny/ir"
    ir.mkdir(parents=True)
    (ir / "uop.py").write_text("a = u.src[0]\n")
    (ir / "spec.py").write_text("a = u.src[0]\nb, c = store.src[1:]\nsrc = [1]\nd = src[0]  # src[ in text\n")
    assert arch.bare_src(tmp_path) == {"tiny-ir": {"attribute_subscripts": 2, "text": 4}}


def test_the_figures_of_this_checkout(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    cmd = [sys.executable, "-m", "bench.architecture", "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "cold call path of (a + b).numpy() on CPU" in done.stdout
    (figures,) = json.loads(out.read_text())
    assert {"tiny-ir", "tiny-codegen", "tiny-tensor", "tiny-runtime-misc"} <= set(figures["lines"])
    for counts in figures["lines"].values():
        assert 0 < counts["code_lines"] < counts["lines"]
    for package in ("codegen", "ir"):
        longest = [length for _, length in figures["functions"][package]["longest"]]
        assert len(longest) == 10 and longest == sorted(longest, reverse=True)
        assert longest[-1] >= figures["functions"][package]["median"]
    assert all(name.startswith(f"tiny.{package}") for package in ("codegen", "ir")
               for name, _ in figures["functions"][package]["longest"])  # fmt: skip
    c = figures["renderers"]["entry_points"]["C"]
    assert c["module"].endswith("cstyle") and c["render_lines"] > 0 and c["code_lines"] > 100
    path = figures["call_path"]
    # tensor, ir, codegen and the CPU runtime: each package of the path is entered, and left, at least once
    assert path["packages"] == 4 and path["package_switches"] >= 3
    assert path["functions"] > 50 and path["stage_switches"] >= path["package_switches"]
    assert path["module_switches"] >= path["stage_switches"]
