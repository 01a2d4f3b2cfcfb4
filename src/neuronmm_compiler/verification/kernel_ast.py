"""Reading an NKI kernel's source without running it: the small AST helpers of the static rule pass
(:mod:`.static_check`). Each answers only what the source shows (a literal, a name, a slice of constant width)
and None otherwise, so that the checker never guesses."""

from __future__ import annotations

import ast
import json

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "tfloat32": 4, "int32": 4, "uint32": 4, "int16": 2,
               "uint16": 2, "int8": 1, "uint8": 1, "float8_e4m3": 1, "float8_e5m2": 1, "float8_e4m3fn": 1,
               "float8_e8m0fnu": 1, "float8_e4m3fn_x4": 4, "float8_e5m2_x4": 4, "float4_e2m1fn_x4": 2}
METADATA = "# nmmc-metadata:"


def attr_name(node: ast.AST) -> str | None:
    """``nl.psum`` -> ``psum``; ``nisa.nc_matmul`` -> ``nc_matmul``; a bare name -> itself."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def const_int(node: ast.AST) -> int | None:
    """The value of an integer literal or of +, -, * over integer literals; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        left, right = const_int(node.left), const_int(node.right)
        if left is not None and right is not None:
            return left + right if isinstance(node.op, ast.Add) else (
                left - right if isinstance(node.op, ast.Sub) else left * right)
    return None


def base_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def kwarg(call: ast.Call, name: str, position: int | None = None) -> ast.AST | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    if position is not None and position < len(call.args):
        return call.args[position]
    return None


def slice_width(node: ast.AST) -> int | None:
    """Elements a subscript element selects: 1 for an index, ``hi - lo`` for ``lo:hi`` when it is constant or
    of the form ``e:e + n``; None when unknown (a step, an open bound, a symbolic width)."""
    if not isinstance(node, ast.Slice):
        return 1
    if node.step is not None or node.upper is None:
        return None
    lower = node.lower if node.lower is not None else ast.Constant(0)
    lo, hi = const_int(lower), const_int(node.upper)
    if lo is not None and hi is not None:
        return hi - lo
    upper = node.upper
    if isinstance(upper, ast.BinOp) and isinstance(upper.op, ast.Add) and ast.dump(upper.left) == ast.dump(lower):
        return const_int(upper.right)
    return None


def metadata_dtypes(source: str) -> dict[str, str]:
    """Kernel argument dtypes from an nmmc kernel file's metadata line (empty when there is none)."""
    for line in source.splitlines():
        if line.startswith(METADATA):
            try:
                data = json.loads(line[len(METADATA):])
            except ValueError:
                return {}
            entries = list(data.get("inputs", []))
            for kernel in data.get("kernels", []):
                entries += kernel.get("inputs", [])
            return {e["name"]: e["dtype"] for e in entries if isinstance(e, dict) and "name" in e and "dtype" in e}
    return {}


def subscript_elements(node: ast.Subscript) -> list[ast.AST]:
    """The index elements of a subscript (``a[i, 0:128]`` -> ``[i, 0:128]``)."""
    return list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]


def is_scalar_index(node: ast.AST, scalars: set[str]) -> bool:
    """True when an index element is one integer: a constant, a loop variable (``scalars``), or +, -, *, // of
    those. An ``nl.mgrid``/``nl.arange`` index (a name bound otherwise, ``i.p``) or ``...`` is not."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, ast.Name):
        return node.id in scalars
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
        return is_scalar_index(node.left, scalars) and is_scalar_index(node.right, scalars)
    return False


def access_widths(node: ast.AST, scalars: set[str], skip: int = 0) -> tuple[int | None, ...] | None:
    """The shape of a subscript access as the source shows it: the width of each sliced dimension, an integer
    index (:func:`is_scalar_index`) dropping its dimension as in NumPy, a width that is not constant None; the
    first ``skip`` elements (block indices) left out. None when ``node`` is not a subscript of a name or an index
    element is neither a slice nor one integer (an ``nl.mgrid`` index, ``...``): its shape is not guessed."""
    if not isinstance(node, ast.Subscript) or base_name(node) is None:
        return None
    widths: list[int | None] = []
    for element in subscript_elements(node)[skip:]:
        if isinstance(element, ast.Slice):
            widths.append(slice_width(element))
        elif not is_scalar_index(element, scalars):
            return None
    return tuple(widths)



def fold_int_constants(tree: ast.Module) -> ast.Module:
    """``tree`` with every read of a name bound exactly once, to an integer literal (an emitted kernel's named tile
    sizes, ``P = 128``), replaced by that literal, so that the rules read its shapes and slices as the numbers they
    are; a name bound once to something else and bounded by ``assert 1 <= NAME <= c`` (a size read from the
    arguments, ``T = x.shape[0]``) is read as its bound ``c``, the largest size the kernel takes (a size limit that
    holds there holds below). A name bound any other way as well (a loop target, a second assignment) is left
    alone."""
    bindings: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bindings.setdefault(node.id, []).append(node)
    values: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = const_int(node.value)
            if value is not None and len(bindings.get(node.targets[0].id, ())) == 1:
                values[node.targets[0].id] = value
        elif isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 2 \
                and all(isinstance(op, ast.LtE) for op in node.test.ops) and const_int(node.test.left) == 1 \
                and isinstance(node.test.comparators[0], ast.Name):
            bound, name = const_int(node.test.comparators[1]), node.test.comparators[0].id
            if bound is not None and len(bindings.get(name, ())) == 1:
                values[name] = bound

    class _Fold(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if isinstance(node.ctx, ast.Load) and node.id in values:
                return ast.copy_location(ast.Constant(values[node.id]), node)
            return node

    return _Fold().visit(tree) if values else tree
