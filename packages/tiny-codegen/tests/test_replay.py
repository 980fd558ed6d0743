"""Process replay (tiny.replay): a recording of a test run's kernels renders the same on an unchanged tree, a change
planted in a renderer or in the rules is found and shown as a diff, and recordings of another format are refused."""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tiny.codegen import program
from tiny.codegen.opt import heuristic
from tiny.codegen.renderer import cstyle
from tiny.codegen.renderer.cstyle import CRenderer
from tiny.ir.dtypes import dtypes
from tiny.ir.uop import Ops, UOp
from tiny.replay import FORMAT, PREFIX, RecordingError, check, current_ast, load, renderer_class
from tiny.replay.__main__ import main

TESTS = Path(__file__).resolve().parent

# the test run recorded: C, CUDA C and PTX kernels, with the rules' actions, given actions, and a flag that changes
# the source (LDMATRIX=0: the staged tensor-core product reads shared memory one element at a time)
RECORDED_TESTS = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from test_tc_action import matmul
from tiny.codegen.renderer.cstyle import CRenderer
from tiny.codegen.renderer.cuda import CUDARenderer
from tiny.codegen.opt import Opt, OptOps
from tiny.codegen.program import render_for
from tiny.codegen.renderer.ptx import PTXRenderer
from tiny.ir.config import Context
from tiny.ir.dtypes import dtypes

def test_c_rules():
    render_for(matmul(32, 48, 16, dtypes.float32), CRenderer(), None)

def test_c_given():
    render_for(matmul(32, 48, 16, dtypes.float32), CRenderer(), [Opt(OptOps.UPCAST, 0, 4)])

def test_ptx_rules():
    render_for(matmul(64, 64, 64), PTXRenderer("arch=sm_80"), None)

def test_cuda_staged_without_ldmatrix():
    with Context(LDMATRIX=0):
        render_for(matmul(256, 128, 256), CUDARenderer("arch=sm_90"), None)
"""


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("replay")
    (root / "test_recorded.py").write_text(RECORDED_TESTS)
    out = root / "recording"
    cmd = [sys.executable, "-m", "tiny.replay", "record", str(out), "--", "-q", "-p", "no:cacheprovider",
           str(root / "test_recorded.py")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=os.environ | {"DEBUG": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout and "kernels recorded in" in done.stdout
    return out


def test_the_recording_holds_each_kernel_with_its_renderer_actions_and_flags(recording: Path) -> None:
    records = load(recording)
    assert len(records) == 4
    by_test = {r.test.rsplit("::", 1)[-1]: r for r in records}
    assert set(by_test) == {"test_c_rules", "test_c_given", "test_ptx_rules", "test_cuda_staged_without_ldmatrix"}
    assert by_test["test_c_rules"].renderer[:2] == ("tiny.codegen.renderer.cstyle", "CRenderer")
    assert by_test["test_c_rules"].opts is None and by_test["test_c_rules"].chosen  # the rules chose some actions
    assert by_test["test_c_given"].opts == by_test["test_c_given"].chosen == (("UPCAST", 0, 4),)
    assert by_test["test_ptx_rules"].renderer[1:] == ("PTXRenderer", "arch=sm_80")
    staged = by_test["test_cuda_staged_without_ldmatrix"]
    assert ("LDMATRIX", 0) in staged.flags and "ldmatrix" not in staged.src


def test_an_unchanged_tree_renders_every_kernel_the_same(recording: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tiny.replay", "compare", str(recording)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 the same, 0 changed, 0 failed" in done.stdout


def test_a_renderer_moved_since_the_recording_is_found_by_its_class_name(recording: Path) -> None:
    record = next(r for r in load(recording) if r.renderer[1] == "CRenderer")
    moved = dataclasses.replace(record, renderer=("tiny.codegen.moved_away", *record.renderer[1:]))
    assert renderer_class("tiny.codegen.moved_away", "CRenderer") is CRenderer
    assert check(moved).status == "same"
    gone = dataclasses.replace(record, renderer=("tiny.codegen.moved_away", "NoSuchRenderer", ""))
    assert check(gone).status == "error" and "ModuleNotFoundError" in check(gone).detail


def _older_form(ast: UOp) -> UOp:
    """A kernel AST as tiny made it before READ and WRITE: LOAD(DEFINE_GLOBAL, VIEW), STORE(DEFINE_GLOBAL, VIEW, v)."""
    done: dict[UOp, UOp] = {}
    for u in ast.toposort:
        op = {Ops.READ: Ops.LOAD, Ops.WRITE: Ops.STORE}.get(u.op, u.op)
        done[u] = u.replace(op=op, src=tuple(done[s] for s in u.src))
    return done[ast]


def test_a_kernel_recorded_in_the_older_form_of_the_ast_renders_the_same(recording: Path) -> None:
    for record in load(recording):
        ast = pickle.loads(record.ast)
        old = _older_form(ast)
        assert {u.op for u in old.toposort} & {Ops.READ, Ops.WRITE} == set()
        assert current_ast(old) is ast and current_ast(ast) is ast
        assert check(dataclasses.replace(record, ast=pickle.dumps(old))).status == "same"


def test_the_older_form_is_told_from_a_lowered_kernel_by_its_first_source() -> None:
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(4), (), 0)
    at = UOp(Ops.INDEX, buf.dtype, (buf, UOp.const(dtypes.int32, 1)))
    lowered = UOp(Ops.SINK, src=(UOp(Ops.STORE, src=(at, UOp(Ops.LOAD, dtypes.float32, (at,)))),))
    assert current_ast(lowered) is lowered


def test_a_change_planted_in_a_renderer_is_found_with_its_diff(
    recording: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    render = cstyle.CRenderer.render

    def planted(self: cstyle.CRenderer, name: str, uops: list) -> str:
        return render(self, name, uops).replace("ridx0++", "ridx0 += 1")

    monkeypatch.setattr(cstyle.CRenderer, "render", planted)
    assert main(["compare", str(recording), "-j", "1"]) == 1
    out = capsys.readouterr().out
    assert "2 the same, 2 changed, 0 failed" in out  # the two C kernels; PTX and CUDA C untouched
    assert re.search(r"^-  for \(int ridx0 = 0; ridx0 < \d+; ridx0\+\+\) \{$", out, re.M)
    assert re.search(r"^\+  for \(int ridx0 = 0; ridx0 < \d+; ridx0 \+= 1\) \{$", out, re.M)
    assert "test_recorded.py::test_c_rules" in out and "test_recorded.py::test_c_given" in out


def test_a_change_planted_in_the_rules_changes_only_the_kernels_they_planned(
    recording: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(program, "hand_opts", lambda kernel, max_lanes=None: [])
    assert heuristic.hand_opts is not program.hand_opts
    assert main(["compare", str(recording), "-j", "1"]) == 1
    out = capsys.readouterr().out
    assert "1 the same, 3 changed, 0 failed" in out  # the kernel given its actions is the same
    assert "changed: r_32_16_48 (CRenderer" in out and "actions the rules'" in out


def test_a_flag_the_kernel_was_rendered_under_is_set_again(
    recording: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Were LDMATRIX not set back to 0 for the staged kernel, its source would read fragments with ldmatrix."""
    from tiny.replay import render_again

    staged = next(r for r in load(recording) if r.test.endswith("without_ldmatrix"))
    assert render_again(staged) == staged.src
    assert "ldmatrix" in render_again(staged.__class__(**{**staged.__dict__, "flags": ()}))


def test_recordings_of_another_format_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with open(tmp_path / f"{PREFIX}1.pkl", "wb") as f:
        pickle.dump({"format": FORMAT + 1}, f)
    with pytest.raises(RecordingError, match=f"recording format {FORMAT + 1}, this tiny reads format {FORMAT}"):
        load(tmp_path)
    assert main(["compare", str(tmp_path)]) == 2
    assert f"format {FORMAT + 1}" in capsys.readouterr().err


def test_a_folder_without_a_recording_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["compare", str(tmp_path / "nothing")]) == 2
    assert "no recording here" in capsys.readouterr().err


def test_record_will_not_overwrite_a_recording_unasked(recording: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["record", str(recording), "--", "--version"]) == 2
    assert "already holds a recording" in capsys.readouterr().err
