"""Printing the graph IR: the text form (:func:`to_text`, which :func:`.text.parse_text` reads back
exactly; see :mod:`.text` for the grammar) and a torch.fx style table (:func:`to_table`). Kept apart
from the parser so that :class:`~.graph.Graph` can print itself without an import cycle."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..vocab import Layout, NodeKind
from .node import Node, format_annotations, format_shape

if TYPE_CHECKING:
    from .graph import Graph

__all__ = ["format_line", "format_node", "to_table", "to_text"]


def format_line(
    node_id: str,
    kind: Any,
    operands: Iterable[str],
    shape: Iterable[Any] | None,
    dtype: Any,
    attrs: Mapping[str, Any],
    annotations: Mapping[str, Any] | None = None,
) -> str:
    """One statement of the text form (no indentation); tolerant of missing fields (prints ``?``)."""
    values = ", ".join(f"%{operand}" for operand in operands)
    shape_text = format_shape(shape) if shape is not None else "?"
    if kind == NodeKind.INPUT:
        return (
            f'%{node_id} = input "{attrs.get("name", "?")}" {shape_text} {dtype} '
            f"layout={attrs.get('layout', '?')}"
        )
    if kind == NodeKind.OUTPUT:
        layout = attrs.get("layout", Layout.ROW_MAJOR)
        suffix = "" if layout == Layout.ROW_MAJOR else f" layout={layout}"
        return f'%{node_id} = output "{attrs.get("name", "?")}" {values}{suffix}'
    head = f"elementwise {attrs.get('op', '?')}" if kind == NodeKind.ELEMENTWISE else str(kind)
    if kind == NodeKind.NORM:
        head = f"norm {attrs.get('norm', '?')}"
        values = f"{values} eps={attrs.get('eps', '?')}"
    if kind == NodeKind.ELEMENTWISE and attrs.get("op") == "row_scale":  # the FP8 format it scales into
        values = f"{values} format={attrs.get('dtype', '?')}"
    if kind == NodeKind.MATMUL and attrs:  # an FP8-weight matmul's act_scale, w_scale (docs/quantization.md)
        values = " ".join([values, *(f"{key}={attrs[key]}" for key in sorted(attrs))])
    suffix = f" {format_annotations(annotations)}" if annotations else ""
    return f"%{node_id} = {head} {values} : {shape_text} {dtype}{suffix}"


def format_node(node: Node) -> str:
    """The text-form statement of ``node``."""
    return format_line(node.id, node.kind, node.operands, node.shape, node.dtype, node.attrs, node.annotations)


def to_text(graph: Graph) -> str:
    """The readable text form of ``graph``; :func:`parse_text` gives back an equal graph."""
    lines = [f"graph {graph.name} {{"]
    lines.extend(f"  {format_node(node)}" for node in graph.nodes())
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_table(graph: Graph) -> str:
    """A torch.fx style table: one row per node (id, kind, operands, shape, dtype, attrs, annotations)."""
    header = ("id", "kind", "operands", "shape", "dtype", "attrs", "annotations")
    rows = [
        (
            f"%{node.id}",
            node.kind,
            ", ".join(f"%{operand}" for operand in node.operands),
            format_shape(node.shape),
            node.dtype,
            " ".join(f"{key}={value}" for key, value in sorted(node.attrs.items())),
            " ".join(f"{key}={value}" for key, value in sorted(node.annotations.items())),
        )
        for node in graph.nodes()
    ]
    widths = [max(len(row[col]) for row in [header, *rows]) for col in range(len(header))]

    def render(row: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([render(header), rule, *(render(row) for row in rows)]) + "\n"
