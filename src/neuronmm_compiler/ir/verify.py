"""The IR verifier: checks the invariants every pass must preserve.

It reads the raw ``networkx`` storage (see :mod:`.graph`), so it also catches damage done by code
that edits ``Graph.nx_graph`` directly. An error names the failing node and prints the text form
around it with the failing line marked ``>>``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import InputError, IRError
from ..vocab import Layout, NodeKind
from .graph import (
    COMPUTE_KINDS,
    DTYPES,
    KINDS,
    LAYOUTS,
    OPERAND_INDICES,
    Graph,
    format_shape,
    infer_result,
    is_identifier,
    operand_arity,
)
from .node import check_annotation
from .text import format_line

__all__ = ["verify"]

#: Lines of context printed on each side of the failing node.
CONTEXT_LINES = 3
_REQUIRED_ATTRS = {NodeKind.INPUT: ("name", "layout"), NodeKind.OUTPUT: ("name", "layout"),
                   NodeKind.ELEMENTWISE: ("op",), NodeKind.NORM: ("norm", "eps")}


def _raw_operands(graph: Graph, node_id: str) -> list[str]:
    positions: list[tuple[Any, str]] = []
    for operand, _, edge in graph.nx_graph.in_edges(node_id, data=True):
        positions.extend((index, operand) for index in edge.get(OPERAND_INDICES, ("?",)))
    return [operand for _, operand in sorted(positions, key=lambda pair: str(pair[0]))]


def _raw_line(graph: Graph, node_id: str) -> str:
    data = graph.nx_graph.nodes[node_id]
    if "kind" not in data:
        return f"%{node_id} = <undefined>"
    try:
        return format_line(
            node_id,
            data["kind"],
            _raw_operands(graph, node_id),
            data.get("shape"),
            data.get("dtype", "?"),
            data.get("attrs") or {},
            data.get("annotations") if isinstance(data.get("annotations"), dict) else None,
        )
    except Exception:  # a damaged node must not hide the real error
        return f"%{node_id} = <unprintable {data.get('kind')!r}>"


def _display_order(graph: Graph) -> list[str]:
    import networkx as nx

    g = graph.nx_graph
    try:
        return list(nx.lexicographical_topological_sort(g, key=lambda n: g.nodes[n].get("order", 1 << 62)))
    except nx.NetworkXUnfeasible:
        return sorted(g.nodes, key=lambda n: g.nodes[n].get("order", 1 << 62))


def _context(graph: Graph, node_id: str | None) -> str:
    order = _display_order(graph)
    lines = [f"  {_raw_line(graph, n)}" for n in order]
    marked = [f"    {line}" for line in lines]
    if node_id in order:
        at = order.index(node_id)
        marked[at] = f"  >>{lines[at]}"
        low, high = max(0, at - CONTEXT_LINES), min(len(lines), at + CONTEXT_LINES + 1)
    else:
        low, high = 0, min(len(lines), 2 * CONTEXT_LINES + 1)
    shown = marked[low:high]
    if low > 0:
        shown.insert(0, "      ...")
    if high < len(lines):
        shown.append("      ...")
    return "\n".join([f"    graph {graph.name} {{", *shown, "    }"])


def _fail(graph: Graph, node_id: str | None, message: str) -> IRError:
    where = f"%{node_id}: " if node_id is not None else ""
    return IRError(f"invalid IR in graph {graph.name}: {where}{message}\n{_context(graph, node_id)}")


def _ids(ids: Iterable[str]) -> str:
    return ", ".join(f"%{node_id}" for node_id in ids)


def _check_fields(graph: Graph, node_id: str, data: dict[str, Any]) -> None:
    g = graph.nx_graph
    if "kind" not in data:
        users = sorted(g.successors(node_id))
        culprit = users[0] if users else None
        raise _fail(graph, culprit, f"uses %{node_id}, which is not defined (dangling reference)")
    kind = data["kind"]
    if kind not in KINDS:
        raise _fail(graph, node_id, f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    shape = data.get("shape")
    if (
        not isinstance(shape, tuple)
        or not shape
        or not all(isinstance(dim, int) and not isinstance(dim, bool) and dim > 0 for dim in shape)
    ):
        raise _fail(graph, node_id, f"shape must be a non-empty tuple of positive ints, got {shape!r}")
    if data.get("dtype") not in DTYPES:
        raise _fail(graph, node_id, f"dtype {data.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    attrs = data.get("attrs")
    if not isinstance(attrs, dict):
        raise _fail(graph, node_id, f"attrs must be a dict, got {attrs!r}")
    missing = [key for key in _REQUIRED_ATTRS.get(kind, ()) if key not in attrs]
    if missing:
        raise _fail(graph, node_id, f"{kind} lacks attribute(s) {', '.join(missing)}")
    _check_annotations(graph, node_id, kind, data.get("annotations", {}))


def _check_annotations(graph: Graph, node_id: str, kind: str, annotations: Any) -> None:
    if not isinstance(annotations, dict):
        raise _fail(graph, node_id, f"annotations must be a dict, got {annotations!r}")
    if annotations and kind not in COMPUTE_KINDS:
        raise _fail(
            graph,
            node_id,
            f"{kind} carries annotations ({', '.join(sorted(map(str, annotations)))}); only compute nodes "
            f"({', '.join(COMPUTE_KINDS)}) do",
        )
    for key, value in sorted(annotations.items(), key=lambda item: str(item[0])):
        try:
            check_annotation(key, value)
        except InputError as err:
            raise _fail(graph, node_id, str(err)) from None


def _check_operands(graph: Graph, node_id: str, data: dict[str, Any]) -> None:
    kind = data["kind"]
    in_edges = list(graph.nx_graph.in_edges(node_id, data=True))
    if kind == NodeKind.INPUT:
        if in_edges:
            raise _fail(
                graph, node_id, f"input has operands ({_ids(u for u, _, _ in in_edges)}); inputs take none"
            )
        return
    indices: list[Any] = []
    for operand, _, edge in in_edges:
        if OPERAND_INDICES not in edge:
            raise _fail(graph, node_id, f"edge from %{operand} has no {OPERAND_INDICES}")
        indices.extend(edge[OPERAND_INDICES])
    try:
        arity = operand_arity(node_id, kind, data["attrs"], len(indices))
    except IRError as err:
        raise _fail(graph, node_id, str(err)) from None
    if not all(isinstance(index, int) for index in indices) or sorted(indices) != list(range(arity)):
        raise _fail(
            graph,
            node_id,
            f"{kind} takes {arity} operand(s) at positions {list(range(arity))}; "
            f"its edges give positions {sorted(indices, key=str)}",
        )


def _check_boundary(graph: Graph, node_id: str, data: dict[str, Any], seen: dict[str, str]) -> None:
    kind, attrs = data["kind"], data["attrs"]
    if kind in (NodeKind.INPUT, NodeKind.OUTPUT):
        if attrs["layout"] not in LAYOUTS:
            raise _fail(graph, node_id, f"layout {attrs['layout']!r} is not one of {', '.join(LAYOUTS)}")
        if attrs["layout"] == Layout.TRANSPOSED and len(data["shape"]) != 2:
            raise _fail(
                graph, node_id, f"layout 'transposed' needs a 2-D shape, got {format_shape(data['shape'])}"
            )
    if kind == NodeKind.OUTPUT and graph.nx_graph.out_degree(node_id):
        raise _fail(graph, node_id, f"output is used by {_ids(graph.users(node_id))}; outputs have no users")
    if kind in (NodeKind.INPUT, NodeKind.OUTPUT):
        name = attrs["name"]
        if not is_identifier(name):
            raise _fail(graph, node_id, f"{kind} name {name!r} is not a Python identifier (or is a keyword)")
        if name in seen:
            raise _fail(
                graph, node_id, f"{kind} name {name!r} is also used by %{seen[name]}; names must be unique"
            )
        seen[name] = node_id


def verify(graph: Graph) -> None:
    """Check ``graph``; raise IRError naming the failing node, with the IR text around it.

    Rules: every referenced node is defined (no dangling references); kinds, shapes, dtypes and
    required attrs are well formed; each node has exactly the operands its kind takes (inputs none);
    the graph is acyclic; each node's shape and dtype match what its operands give; input and
    output layouts are valid; input/output names are unique identifiers; outputs have no users;
    there is at least one output (and so every output is reachable from an input). Annotations sit
    on compute nodes only, with known keys and valid values, and when any node has a ``kernel``
    annotation every compute node has one.
    """
    g = graph.nx_graph
    ordered = sorted(g.nodes(data=True), key=lambda item: item[1].get("order", 1 << 62))
    for node_id, data in ordered:
        _check_fields(graph, node_id, data)
    for node_id, data in ordered:
        _check_operands(graph, node_id, data)
    import networkx as nx

    if not nx.is_directed_acyclic_graph(g):
        cycle = [u for u, _ in nx.find_cycle(g)]
        raise _fail(
            graph, cycle[0], f"the graph has a cycle: {' -> '.join(f'%{n}' for n in [*cycle, cycle[0]])}"
        )
    seen_names: dict[str, str] = {}
    for node in graph.nodes():
        _check_boundary(graph, node.id, g.nodes[node.id], seen_names)
        if node.kind == NodeKind.INPUT:
            continue
        operands = [graph.node(operand) for operand in node.operands]
        try:
            shape, dtype = infer_result(node.id, node.kind, node.attrs, operands)
        except IRError as err:
            raise _fail(graph, node.id, str(err)) from None
        if (shape, dtype) != (node.shape, node.dtype):
            raise _fail(
                graph,
                node.id,
                f"{node.kind} is recorded as {format_shape(node.shape)} {node.dtype} but its operands give "
                f"{format_shape(shape)} {dtype}",
            )
    # Every output is reachable from an input once each non-input node has its operands and the
    # graph is acyclic (follow operands back: the walk must end at a node without any), so what
    # remains to check is that there is an output at all.
    if not graph.outputs():
        raise _fail(graph, None, "the graph has no outputs; add one with add_output")
    compute = graph.compute_nodes()
    fused = [node.id for node in compute if "kernel" in node.annotations]
    if fused:
        unfused = [node.id for node in compute if "kernel" not in node.annotations]
        if unfused:
            raise _fail(
                graph,
                unfused[0],
                f"has no kernel annotation but %{fused[0]} has one; once any node is assigned to a kernel, "
                f"every compute node must be (missing on {_ids(unfused)})",
            )
