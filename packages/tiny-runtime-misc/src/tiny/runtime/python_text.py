"""The text form of a linearized kernel, which the PYTHON renderer writes and its compiler reads back.

The renderer writes a kernel as readable text, one line per UOp, indented inside loops and ifs:

    # kernel E_4
    %0 = DEFINE_GLOBAL ptr<float32,4> arg=0
    %1 = SPECIAL int32 arg=('gidx0', 4)
    %2 = INDEX ptr<float32,4> (%0, %1)
    %3 = LOAD float32 (%2)
    %4 = CONST float32 arg=inf

Dtypes are written by name: a scalar `float32`, a vector `float32x4`, a pointer `ptr<float32,16>` (its size
left out when unknown) or `ptr<float32,256,local>`. Args are Python literals, `inf` and `nan` included. The
compiler parses the text back into the very same UOps and checks them with tiny.ir.spec.validate.
"""

from __future__ import annotations

import ast
import re
import threading
from typing import Any

from tiny.ir.device import CompileError
from tiny.ir.dtypes import DType, PtrDType, dtypes
from tiny.ir.uop import Ops, UOp


def _dtype_text(dt: DType) -> str:
    """float32, float32x4, ptr<float32>, ptr<float32,16>, ptr<float32x4,256,local>."""
    if isinstance(dt, PtrDType):
        pointee = _dtype_text(dtypes.from_name(dt.name).vec(dt.count))
        size = f",{dt.size}" if dt.size != -1 or dt.local else ""
        return f"ptr<{pointee}{size}{',local' if dt.local else ''}>"
    return dt.name if dt.count == 1 else f"{dt.name}x{dt.count}"


_VALUE_DTYPE = re.compile(r"([a-wyz]+[0-9]*)(?:x([0-9]+))?")  # dtype names have no "x"; "x4" is a vector width
_PTR_DTYPE = re.compile(r"ptr<([a-z0-9]+)(?:,(-?[0-9]+))?(,local)?>")


def _parse_dtype(text: str) -> DType:
    if m := _PTR_DTYPE.fullmatch(text):
        return _parse_dtype(m.group(1)).ptr(int(m.group(2) or -1), local=m.group(3) is not None)
    if m := _VALUE_DTYPE.fullmatch(text):
        return dtypes.from_name(m.group(1)).vec(int(m.group(2) or 1))
    raise ValueError(f"bad dtype {text!r}")


def _is_literal(arg: Any) -> bool:
    if isinstance(arg, tuple):
        return all(_is_literal(a) for a in arg)
    return arg is None or isinstance(arg, (bool, int, float, str))


class _FloatNames(ast.NodeTransformer):
    """inf and nan are the only names an arg may hold: repr() writes them so."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id not in ("inf", "nan"):
            raise ValueError(f"unknown name {node.id!r} in an arg")
        return ast.copy_location(ast.Constant(float(node.id)), node)


# CPython 3.11's AST constructor counts its recursion per interpreter, not per thread: a thread switch inside it (a
# finalizer run by the garbage collector lets go of the interpreter lock) that lets another thread parse breaks the
# count and raises SystemError, here and in every parse after it. Kernels are compiled on several threads at once.
_AST_LOCK = threading.Lock()


def _parse_arg(text: str) -> Any:
    with _AST_LOCK:
        return ast.literal_eval(_FloatNames().visit(ast.parse(text, mode="eval")))


def render_text(name: str, uops: list[UOp]) -> str:
    """The kernel as text: a `# kernel` header, then `%i = OP dtype (%sources) arg=literal` per UOp."""
    number = {u: i for i, u in enumerate(uops)}
    if len(number) != len(uops):
        raise ValueError(f"kernel {name}: a UOp appears twice in the list")
    lines, depth = [f"# kernel {name}"], 0
    for i, u in enumerate(uops):
        if u.op in (Ops.ENDRANGE, Ops.ENDIF):
            depth = max(depth - 1, 0)
        line = f"%{i} = {u.op.name} {_dtype_text(u.dtype)}"
        if missing := [s.op.name for s in u.src if s not in number]:
            raise ValueError(f"{u.op.name} at {i} uses {missing} that are not in the kernel")
        if u.src:
            line += " (" + ", ".join(f"%{number[s]}" for s in u.src) + ")"
        if u.arg is not None:
            if not _is_literal(u.arg):
                raise ValueError(f"{u.op.name} at {i}: the PYTHON renderer writes only literal args, got {u.arg!r}")
            line += f" arg={u.arg!r}"
        lines.append("  " * depth + line)
        if u.op in (Ops.RANGE, Ops.IF):
            depth += 1
    return "\n".join(lines) + "\n"


_LINE = re.compile(r"%([0-9]+) = ([A-Z0-9_]+) (\S+)(?: \(([^()]*)\))?(?: arg=(.*))?")


def _parse_line(line: str, by_number: dict[int, UOp]) -> tuple[int, UOp]:
    m = _LINE.fullmatch(line)
    if m is None:
        raise ValueError("expected `%i = OP dtype (%sources) arg=literal`")
    number, op_name, dtype_text, src_text, arg_text = m.groups()
    if int(number) in by_number:
        raise ValueError(f"%{number} is defined twice")
    if op_name not in Ops.__members__:
        raise ValueError(f"unknown op {op_name}")
    src = []
    for ref in src_text.split(", ") if src_text else []:
        if not re.fullmatch(r"%[0-9]+", ref) or int(ref[1:]) not in by_number:
            raise ValueError(f"source {ref!r} is not an earlier %number")
        src.append(by_number[int(ref[1:])])
    arg = None if arg_text is None else _parse_arg(arg_text)
    return int(number), UOp(Ops[op_name], _parse_dtype(dtype_text), tuple(src), arg)


def parse(src: str) -> tuple[str, list[UOp]]:
    """The kernel's name and UOps from its text; raises CompileError naming the line it cannot read."""
    name, uops, by_number = "", [], {}
    for lineno, raw in enumerate(src.splitlines(), 1):
        line = raw.strip()
        if line.startswith("# kernel "):
            name = line.removeprefix("# kernel ")
        if not line or line.startswith("#"):
            continue
        try:
            number, u = _parse_line(line, by_number)
        except (ValueError, SyntaxError, TypeError, RecursionError) as e:
            raise CompileError(f"PYTHON source line {lineno}: {e}: {raw!r}") from None
        by_number[number] = u
        uops.append(u)
    return name, uops
