"""The graph IR: a ``networkx.DiGraph`` of typed op nodes with shapes, dtypes and layouts.

Storage, which :mod:`.verify` checks and every other module reads through :class:`Graph`:

- a node is keyed by its id (a readable string: ``a``, ``mm0``, ``t0``, ``silu0``) and holds
  ``kind``, ``shape`` (tuple of ints, the *logical* shape), ``dtype`` (canonical string),
  ``attrs`` (dict of strings) and ``order`` (insertion counter, used to break ties in
  :meth:`Graph.nodes`);
- an edge ``operand -> user`` holds ``operand_indices``: the operand positions at which the user
  reads that value. It is a tuple, not one int, because ``multiply(x, x)`` reads the same value
  twice and a DiGraph has no parallel edges.

Kinds: ``input`` (attrs ``name``, ``layout``), ``matmul`` ([M, K] @ [K, N] -> [M, N]), ``transpose``
(2-D), ``elementwise`` (attr ``op``: ``silu``, ``multiply``, ``add``), ``output`` (attr ``name``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import keyword
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import networkx as nx
import numpy as np

from ..errors import InputError, IRError, UnknownNameError

#: Canonical dtype names.
DTYPES: tuple[str, ...] = ("bfloat16", "float32")
#: Accepted spellings (lower case) and the canonical dtype each one means.
DTYPE_ALIASES: Mapping[str, str] = MappingProxyType(
    {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32", "float32": "float32"}
)
#: How an input is stored in HBM: as its logical shape, or as the transpose of it (2-D only).
LAYOUTS: tuple[str, ...] = ("row_major", "transposed")
KINDS: tuple[str, ...] = ("input", "matmul", "transpose", "elementwise", "output")
#: Elementwise ops and their operand counts.
ELEMENTWISE_ARITY: Mapping[str, int] = MappingProxyType({"silu": 1, "multiply": 2, "add": 2})
#: Edge attribute holding the operand positions of the source in the target.
OPERAND_INDICES = "operand_indices"

_ID_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ELEMENTWISE_ID_PREFIX: Mapping[str, str] = MappingProxyType(
    {"silu": "silu", "multiply": "mul", "add": "add"}
)


def canonical_dtype(dtype: Any) -> str:
    """Return the canonical dtype string ("bfloat16" or "float32") for an alias or NumPy dtype.

    Accepts "bf16", "bfloat16", "fp32", "float32" (any case) and NumPy / ml_dtypes dtypes of those.
    Anything else raises :class:`InputError` listing what is accepted.
    """
    if isinstance(dtype, str):
        key = dtype.strip().lower()
    else:
        try:
            key = np.dtype(dtype).name
        except TypeError:
            key = repr(dtype)
    if key in DTYPE_ALIASES:
        return DTYPE_ALIASES[key]
    accepted = ", ".join(DTYPE_ALIASES)
    raise InputError(f"unknown dtype {dtype!r}; accepted: {accepted}")


def format_shape(shape: Iterable[Any]) -> str:
    """Format a shape as in the text form: ``[1024, 512]``."""
    return "[" + ", ".join(str(dim) for dim in shape) + "]"


def is_identifier(text: Any) -> bool:
    """True when ``text`` is a Python identifier (ASCII) that is not a keyword."""
    return isinstance(text, str) and bool(_ID_PATTERN.match(text)) and not keyword.iskeyword(text)


def _check_identifier(text: Any, what: str) -> str:
    if not is_identifier(text):
        raise InputError(
            f"{what} must be a Python identifier that is not a keyword "
            f"(letters, digits, underscores; not starting with a digit); got {text!r}"
        )
    return text


def _check_shape(shape: Any, what: str) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        dims = None
    ok = bool(dims) and all(
        isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) and dim > 0 for dim in dims
    )
    if not ok:
        raise InputError(f"{what}: shape must be a non-empty list of positive integers; got {shape!r}")
    return tuple(int(dim) for dim in dims)


def _check_layout(layout: Any, shape: tuple[int, ...], what: str) -> str:
    if layout not in LAYOUTS:
        raise InputError(f"{what}: unknown layout {layout!r}; accepted: {', '.join(LAYOUTS)}")
    if layout == "transposed" and len(shape) != 2:
        raise InputError(f"{what}: layout 'transposed' needs a 2-D shape; got {format_shape(shape)}")
    return layout


@dataclass(frozen=True)
class Node:
    """A read-only view of one node: its id, kind, ordered operand ids, logical shape, dtype, attrs."""

    id: str
    kind: str
    operands: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    attrs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def name(self) -> str | None:
        """The user-visible name of an input or output (its kernel argument name), else None."""
        return self.attrs.get("name")

    @property
    def storage_shape(self) -> tuple[int, ...]:
        """The shape as stored in HBM: the reversed shape for a ``transposed`` input, else ``shape``."""
        if self.kind == "input" and self.attrs.get("layout") == "transposed":
            return tuple(reversed(self.shape))
        return self.shape


def operand_arity(node_id: str, kind: str, attrs: Mapping[str, str]) -> int:
    """The number of operands a node of ``kind`` with ``attrs`` takes (IRError if unknown)."""
    if kind == "elementwise":
        op = attrs.get("op")
        if op not in ELEMENTWISE_ARITY:
            raise IRError(f"elementwise %{node_id}: unknown op {op!r}; known: {', '.join(ELEMENTWISE_ARITY)}")
        return ELEMENTWISE_ARITY[op]
    arity = {"input": 0, "matmul": 2, "transpose": 1, "output": 1}
    if kind not in arity:
        raise IRError(f"%{node_id}: unknown node kind {kind!r}; known: {', '.join(KINDS)}")
    return arity[kind]


def infer_result(
    node_id: str, kind: str, attrs: Mapping[str, str], operands: Sequence[Node]
) -> tuple[tuple[int, ...], str]:
    """Compute the (shape, dtype) a non-input node produces from its operands; IRError on mismatch."""
    where = f"{kind} %{node_id}" if kind != "elementwise" else f"elementwise {attrs.get('op')} %{node_id}"
    expected = operand_arity(node_id, kind, attrs)
    if kind == "input":
        raise IRError(f"{where}: inputs are declared, their shape is not inferred")
    if len(operands) != expected:
        raise IRError(f"{where} takes {expected} operand(s), got {len(operands)}")
    for operand in operands:
        if operand.kind == "output":
            raise IRError(f"{where} uses output %{operand.id} as an operand; outputs have no users")
    described = [f"%{op.id} {format_shape(op.shape)} {op.dtype}" for op in operands]
    if kind in ("matmul", "transpose"):
        for operand in operands:
            if len(operand.shape) != 2:
                raise IRError(f"{where} needs 2-D operands; got {', '.join(described)}")
    if len({op.dtype for op in operands}) > 1:
        raise IRError(f"{where}: operand dtypes differ: {', '.join(described)}")
    first = operands[0]
    if kind == "matmul":
        lhs, rhs = operands
        if lhs.shape[1] != rhs.shape[0]:
            raise IRError(
                f"{where}: contraction sizes differ: lhs %{lhs.id} [M, K] = {format_shape(lhs.shape)}, "
                f"rhs %{rhs.id} [K, N] = {format_shape(rhs.shape)}"
            )
        return (lhs.shape[0], rhs.shape[1]), lhs.dtype
    if kind == "transpose":
        return (first.shape[1], first.shape[0]), first.dtype
    if kind == "elementwise" and len({op.shape for op in operands}) > 1:
        raise IRError(f"{where}: operand shapes differ: {', '.join(described)}")
    return first.shape, first.dtype


class Graph:
    """A matmul graph: typed op nodes in a ``networkx.DiGraph``, checked as they are added."""

    def __init__(self, name: str = "graph") -> None:
        """Create an empty graph; ``name`` must be an identifier (it names the kernel)."""
        self._name = _check_identifier(name, "graph name")
        self._g: nx.DiGraph = nx.DiGraph()
        self._next_order = 0

    # ----------------------------------------------------------------- construction

    @property
    def name(self) -> str:
        """The graph's name (``graph NAME {`` in the text form)."""
        return self._name

    @property
    def nx_graph(self) -> nx.DiGraph:
        """The underlying DiGraph (mutating it directly bypasses all checks; run :func:`verify`)."""
        return self._g

    def _fresh_id(self, base: str, numbered: bool) -> str:
        if not numbered and base not in self._g:
            return base
        stem = base if numbered else f"{base}_"
        counter = 0
        while f"{stem}{counter}" in self._g:
            counter += 1
        return f"{stem}{counter}"

    def _claim_id(self, node_id: str | None, base: str, numbered: bool) -> str:
        if node_id is None:
            return self._fresh_id(base, numbered)
        _check_identifier(node_id, "node id")
        if node_id in self._g:
            raise IRError(f"node id %{node_id} is already used in graph {self._name}")
        return node_id

    def _check_boundary_name(self, name: str, what: str) -> None:
        _check_identifier(name, f"{what} name")
        for node_id, data in self._g.nodes(data=True):
            if data.get("kind") in ("input", "output") and data.get("attrs", {}).get("name") == name:
                raise InputError(
                    f"{what} name {name!r} is already used by {data['kind']} %{node_id}; "
                    "input and output names must be unique (they become kernel argument names)"
                )

    def _add(
        self,
        node_id: str,
        kind: str,
        operands: Sequence[str],
        shape: tuple[int, ...],
        dtype: str,
        attrs: dict[str, str],
    ) -> str:
        self._g.add_node(node_id, kind=kind, shape=shape, dtype=dtype, attrs=attrs, order=self._next_order)
        self._next_order += 1
        for index, operand in enumerate(operands):
            if self._g.has_edge(operand, node_id):
                edge = self._g.edges[operand, node_id]
                edge[OPERAND_INDICES] = (*edge[OPERAND_INDICES], index)
            else:
                self._g.add_edge(operand, node_id, **{OPERAND_INDICES: (index,)})
        return node_id

    def _add_computed(
        self, kind: str, operands: Sequence[str], attrs: dict[str, str], node_id: str | None, base: str
    ) -> str:
        operand_nodes = [self.node(operand) for operand in operands]
        new_id = self._claim_id(node_id, base, numbered=True)
        shape, dtype = infer_result(new_id, kind, attrs, operand_nodes)
        return self._add(new_id, kind, operands, shape, dtype, attrs)

    def add_input(
        self, name: str, shape: Sequence[int], dtype: str, layout: str = "row_major", *, id: str | None = None
    ) -> str:
        """Declare an input with its logical ``shape``; return its id (``name`` unless taken).

        ``layout="transposed"`` (2-D only) means HBM holds the transpose of the logical value, so
        its storage shape is the reversed ``shape``. Bad name/shape/dtype/layout -> InputError.
        """
        self._check_boundary_name(name, "input")
        dims = _check_shape(shape, f"input {name!r}")
        canonical = canonical_dtype(dtype)
        _check_layout(layout, dims, f"input {name!r}")
        new_id = self._claim_id(id, name, numbered=False)
        return self._add(new_id, "input", (), dims, canonical, {"name": name, "layout": layout})

    def add_matmul(self, lhs: str, rhs: str, id: str | None = None) -> str:
        """Add ``lhs [M, K] @ rhs [K, N] -> [M, N]`` (dtype of the operands); return its id."""
        return self._add_computed("matmul", (lhs, rhs), {}, id, "mm")

    def add_transpose(self, x: str, id: str | None = None) -> str:
        """Add the transpose of a 2-D value; return its id."""
        return self._add_computed("transpose", (x,), {}, id, "t")

    def add_elementwise(self, op: str, *operands: str, id: str | None = None) -> str:
        """Add ``silu(x)``, ``multiply(x, y)`` or ``add(x, y)`` (binary ops need equal shapes)."""
        if op not in ELEMENTWISE_ARITY:
            raise UnknownNameError(f"unknown elementwise op {op!r}; known: {', '.join(ELEMENTWISE_ARITY)}")
        return self._add_computed("elementwise", operands, {"op": op}, id, _ELEMENTWISE_ID_PREFIX[op])

    def add_output(self, name: str, value: str, *, id: str | None = None) -> str:
        """Mark ``value`` as the output ``name``; return the output node's id (``name`` unless taken)."""
        self._check_boundary_name(name, "output")
        operand = self.node(value)
        new_id = self._claim_id(id, name, numbered=False)
        attrs = {"name": name}
        shape, dtype = infer_result(new_id, "output", attrs, [operand])
        return self._add(new_id, "output", (value,), shape, dtype, attrs)

    # ----------------------------------------------------------------- queries

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._g

    def __len__(self) -> int:
        return self._g.number_of_nodes()

    def node(self, id: str) -> Node:
        """The node ``id`` as a frozen :class:`Node` (IRError if there is none)."""
        if id not in self._g:
            raise IRError(f"graph {self._name} has no node %{id}")
        data = self._g.nodes[id]
        positions: list[tuple[int, str]] = []
        for operand, _, edge in self._g.in_edges(id, data=True):
            positions.extend((index, operand) for index in edge.get(OPERAND_INDICES, ()))
        return Node(
            id=id,
            kind=data["kind"],
            operands=tuple(operand for _, operand in sorted(positions)),
            shape=tuple(data["shape"]),
            dtype=data["dtype"],
            attrs=MappingProxyType(dict(data["attrs"])),
        )

    def _order_key(self, node_id: str) -> int:
        return self._g.nodes[node_id].get("order", 1 << 62)

    def node_ids(self) -> list[str]:
        """Node ids in topological order, ties broken by insertion order (IRError on a cycle)."""
        try:
            return list(nx.lexicographical_topological_sort(self._g, key=self._order_key))
        except nx.NetworkXUnfeasible:
            cycle = " -> ".join(f"%{u}" for u, _ in nx.find_cycle(self._g))
            raise IRError(f"graph {self._name} has a cycle: {cycle}") from None

    def nodes(self) -> list[Node]:
        """All nodes in deterministic topological order (ties broken by insertion order)."""
        return [self.node(node_id) for node_id in self.node_ids()]

    def inputs(self) -> list[Node]:
        """Input nodes in topological order (which keeps their declaration order)."""
        return [node for node in self.nodes() if node.kind == "input"]

    def outputs(self) -> list[Node]:
        """Output nodes in topological order."""
        return [node for node in self.nodes() if node.kind == "output"]

    def users(self, id: str) -> list[str]:
        """Ids of the nodes that read ``id``, in insertion order (each user listed once)."""
        if id not in self._g:
            raise IRError(f"graph {self._name} has no node %{id}")
        return sorted(self._g.successors(id), key=self._order_key)

    # ----------------------------------------------------------------- mutation

    def replace_all_uses(self, old: str, new: str) -> int:
        """Make every user of ``old`` read ``new`` instead (same positions); return the uses moved.

        ``new`` must have the same shape and dtype as ``old`` and must not depend on ``old``.
        """
        old_node, new_node = self.node(old), self.node(new)
        if old == new:
            return 0
        if (old_node.shape, old_node.dtype) != (new_node.shape, new_node.dtype):
            raise IRError(
                f"cannot replace %{old} {format_shape(old_node.shape)} {old_node.dtype} with "
                f"%{new} {format_shape(new_node.shape)} {new_node.dtype}: shape or dtype differs"
            )
        if nx.has_path(self._g, old, new):
            raise IRError(f"cannot replace %{old} with %{new}: %{new} depends on %{old} (would make a cycle)")
        moved = 0
        for user in self.users(old):
            indices = self._g.edges[old, user][OPERAND_INDICES]
            self._g.remove_edge(old, user)
            if self._g.has_edge(new, user):
                edge = self._g.edges[new, user]
                edge[OPERAND_INDICES] = tuple(sorted((*edge[OPERAND_INDICES], *indices)))
            else:
                self._g.add_edge(new, user, **{OPERAND_INDICES: indices})
            moved += len(indices)
        return moved

    def remove_node(self, id: str) -> None:
        """Remove ``id``; it must have no users (IRError naming them otherwise)."""
        users = self.users(id)
        if users:
            listed = ", ".join(f"%{user}" for user in users)
            raise IRError(f"cannot remove %{id}: it is still used by {listed}")
        self._g.remove_node(id)

    def redeclare_input(self, id: str, shape: Sequence[int], layout: str) -> None:
        """Change an input's logical ``shape`` and ``layout`` in place (id, name, dtype kept).

        Users are not re-checked: the caller makes them consistent again (the pipeline driver's
        verify catches a pass that does not).
        """
        node = self.node(id)
        if node.kind != "input":
            raise IRError(f"redeclare_input: %{id} is a {node.kind}, not an input")
        dims = _check_shape(shape, f"input {node.name!r}")
        _check_layout(layout, dims, f"input {node.name!r}")
        data = self._g.nodes[id]
        data["shape"] = dims
        data["attrs"] = {**data["attrs"], "layout": layout}

    def copy(self) -> Graph:
        """An independent deep copy (same ids, attrs and insertion order)."""
        duplicate = Graph.__new__(Graph)
        duplicate._name = self._name
        duplicate._g = copy.deepcopy(self._g)
        duplicate._next_order = self._next_order
        return duplicate

    # ----------------------------------------------------------------- identity

    def _canonical(self) -> dict[str, Any]:
        nodes = [self.node(node_id) for node_id in sorted(self._g.nodes)]
        return {
            "name": self._name,
            "inputs": [node.id for node in self.inputs()],
            "outputs": [node.id for node in self.outputs()],
            "nodes": [
                [n.id, n.kind, list(n.operands), list(n.shape), n.dtype, sorted(n.attrs.items())]
                for n in nodes
            ],
        }

    def __eq__(self, other: object) -> bool:
        """Structural equality: same name, nodes (ids, kinds, ordered operands, shapes, dtypes,
        attrs) and the same order of inputs and of outputs (the kernel's argument order).
        The insertion order of other nodes does not matter."""
        if not isinstance(other, Graph):
            return NotImplemented
        return self._canonical() == other._canonical()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def signature(self) -> str:
        """A stable SHA-256 hex digest of the structure: equal graphs (``==``) give equal strings."""
        text = json.dumps(self._canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"<Graph {self._name}: {len(self)} nodes>"

    def __str__(self) -> str:
        from .text import to_text

        return to_text(self)
