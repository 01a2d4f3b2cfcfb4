"""The graph IR: a ``networkx.DiGraph`` of typed op nodes with shapes, dtypes, layouts and annotations.

Storage, which :mod:`.verify` checks and every other module reads through :class:`Graph`:

- a node is keyed by its id (a readable string: ``a``, ``mm0``, ``t0``, ``silu0``) and holds
  ``kind``, ``shape`` (tuple of ints, the *logical* shape), ``dtype`` (canonical string),
  ``attrs`` (dict of strings), ``annotations`` (dict of strings, set by passes on compute nodes;
  see :mod:`.node`) and ``order`` (insertion counter, used to break ties in :meth:`Graph.nodes`);
- an edge ``operand -> user`` holds ``operand_indices``: the operand positions at which the user
  reads that value. It is a tuple, not one int, because ``multiply(x, x)`` reads the same value
  twice and a DiGraph has no parallel edges.

Kinds: ``input`` (attrs ``name``, ``layout``), ``matmul`` ([M, K] @ [K, N] -> [M, N]), ``transpose``
(2-D), ``elementwise`` (attr ``op``: ``silu``, ``multiply``, ``add``), ``output`` (attrs ``name``,
``layout``), ``norm`` (attrs ``norm``: ``rmsnorm`` or ``layernorm``, ``eps``; operands the value and its
optional gamma and beta). A ``transposed`` input or output is stored in HBM as the transpose of its logical
value (storage shape reversed).

The module is a little longer than the project's 400-line guideline because it is one class: the
methods of :class:`Graph` are the IR's whole construction and mutation API, and splitting them
would scatter the invariants they keep (node storage, ids, edges) over several files.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..errors import InputError, IRError, UnknownNameError
from ..vocab import ElementwiseOp, Layout, NodeKind, NormOp
from .node import (
    COMPUTE_KINDS,
    DTYPE_ALIASES,
    DTYPES,
    ELEMENTWISE_ARITY,
    KINDS,
    LAYOUTS,
    OPERAND_INDICES,
    Node,
    canonical_dtype,
    check_annotation,
    check_identifier,
    check_layout,
    check_shape,
    format_shape,
    infer_result,
    is_identifier,
    operand_arity,
)
from .printing import to_text

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "COMPUTE_KINDS",
    "DTYPES",
    "DTYPE_ALIASES",
    "ELEMENTWISE_ARITY",
    "KINDS",
    "LAYOUTS",
    "OPERAND_INDICES",
    "Graph",
    "Node",
    "canonical_dtype",
    "format_shape",
    "infer_result",
    "is_identifier",
    "operand_arity",
]

class Graph:
    """A matmul graph: typed op nodes in a ``networkx.DiGraph``, checked as they are added."""

    def __init__(self, name: str = "graph") -> None:
        """Create an empty graph; ``name`` must be an identifier (it names the kernel)."""
        import networkx  # on first use: importing the IR (as ``nmmc --help`` does) does not pay for it

        self._name = check_identifier(name, "graph name")
        self._g: nx.DiGraph = networkx.DiGraph()
        self._changed()
        self._next_order = 0
        #: Inputs that are views of another HBM array (input id -> that array's name); set by
        #: split_kernels for transposes read across kernels, not part of the IR's text form.
        self.hbm_aliases: dict[str, str] = {}

    # ----------------------------------------------------------------- construction

    @property
    def name(self) -> str:
        """The graph's name (``graph NAME {`` in the text form)."""
        return self._name

    @property
    def nx_graph(self) -> nx.DiGraph:
        """The underlying DiGraph (mutating it directly bypasses all checks; run :func:`verify`)."""
        self._changed()  # the caller may mutate it
        return self._g

    def _changed(self) -> None:
        """Forget the topological order and the Node objects built from the storage. They are
        built once per state (a search lowers the same kernel graphs thousands of times); every
        mutation, and every hand-out of the DiGraph itself, calls this."""
        self._order_cache: list[str] | None = None
        self._node_cache: dict[str, Node] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the caches (a Node's mappings are read-only proxies, which do not pickle)."""
        return {key: value for key, value in self.__dict__.items() if key not in ("_order_cache", "_node_cache")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._changed()

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
        check_identifier(node_id, "node id")
        if node_id in self._g:
            raise IRError(f"node id %{node_id} is already used in graph {self._name}")
        return node_id

    def _check_boundary_name(self, name: str, what: str) -> None:
        check_identifier(name, f"{what} name")
        for node_id, data in self._g.nodes(data=True):
            if data.get("kind") in (NodeKind.INPUT, NodeKind.OUTPUT) and data.get("attrs", {}).get("name") == name:
                raise InputError(
                    f"{what} name {name!r} is already used by {data['kind']} %{node_id}; "
                    "input and output names must be unique (they become kernel argument names)"
                )

    def _add(
        self,
        node_id: str,
        kind: NodeKind,
        operands: Sequence[str],
        shape: tuple[int, ...],
        dtype: str,
        attrs: dict[str, str],
    ) -> str:
        self._changed()
        self._g.add_node(
            node_id, kind=kind, shape=shape, dtype=dtype, attrs=attrs, annotations={}, order=self._next_order
        )
        self._next_order += 1
        for index, operand in enumerate(operands):
            if self._g.has_edge(operand, node_id):
                edge = self._g.edges[operand, node_id]
                edge[OPERAND_INDICES] = (*edge[OPERAND_INDICES], index)
            else:
                self._g.add_edge(operand, node_id, **{OPERAND_INDICES: (index,)})
        return node_id

    def _add_computed(
        self, kind: NodeKind, operands: Sequence[str], attrs: dict[str, str], node_id: str | None, base: str
    ) -> str:
        operand_nodes = [self.node(operand) for operand in operands]
        new_id = self._claim_id(node_id, base, numbered=True)
        shape, dtype = infer_result(new_id, kind, attrs, operand_nodes)
        return self._add(new_id, kind, operands, shape, dtype, attrs)

    def add_input(
        self, name: str, shape: Sequence[int], dtype: str, layout: str = Layout.ROW_MAJOR, *, id: str | None = None
    ) -> str:
        """Declare an input with its logical ``shape``; return its id (``name`` unless taken).

        ``layout="transposed"`` (2-D only) means HBM holds the transpose of the logical value, so
        its storage shape is the reversed ``shape``. Bad name/shape/dtype/layout -> InputError.
        """
        self._check_boundary_name(name, "input")
        dims = check_shape(shape, f"input {name!r}")
        canonical = canonical_dtype(dtype)
        checked = check_layout(layout, dims, f"input {name!r}")
        new_id = self._claim_id(id, name, numbered=False)
        return self._add(new_id, NodeKind.INPUT, (), dims, canonical, {"name": name, "layout": checked})

    def add_matmul(self, lhs: str, rhs: str, id: str | None = None, *, act_scale: str | None = None,
                   w_scale: str | None = None) -> str:
        """Add ``lhs [M, K] @ rhs [K, N] -> [M, N]`` (dtype of the operands); return its id. With ``act_scale`` and
        ``w_scale`` an FP8-weight matmul: ``rhs`` an FP8 input, ``lhs`` bf16/fp32, quantized by the ``quantize-fp8``
        pass (docs/quantization.md)."""
        attrs = {key: value for key, value in (("act_scale", act_scale), ("w_scale", w_scale)) if value is not None}
        return self._add_computed(NodeKind.MATMUL, (lhs, rhs), attrs, id, "mm")

    def add_transpose(self, x: str, id: str | None = None) -> str:
        """Add the transpose of a 2-D value; return its id."""
        return self._add_computed(NodeKind.TRANSPOSE, (x,), {}, id, "t")

    def add_elementwise(self, op: str, *operands: str, id: str | None = None, dtype: str | None = None) -> str:
        """Add ``silu(x)``, ``multiply(x, y)`` or ``add(x, y)`` (binary ops need equal shapes), or an FP8 op:
        ``quantize(x, scale)`` / ``dequantize(acc, x_scale, w_scale)`` with its result ``dtype``
        (docs/quantization.md), or
        ``quantize_mx(x)`` with its packed MX ``dtype`` (docs/mx.md)."""
        checked = ElementwiseOp.lookup(op)
        if checked is None:
            raise UnknownNameError(f"unknown elementwise op {op!r}; known: {', '.join(ElementwiseOp)}")
        attrs = {"op": checked}
        if checked.fp8:
            attrs["dtype"] = canonical_dtype(dtype) if dtype is not None else ""
        elif dtype is not None:
            raise IRError(f"elementwise {checked}: only quantize, dequantize, row_scale and quantize_mx take a dtype")
        return self._add_computed(NodeKind.ELEMENTWISE, operands, attrs, id, checked.info.id_prefix)

    def add_norm(self, op: str, x: str, *params: str, eps: float = 1e-6, id: str | None = None) -> str:
        """Add ``rmsnorm`` or ``layernorm`` of the rows of the 2-D ``x`` over its last dim, with the optional 1-D
        ``gamma`` (scale) and, for layernorm, ``beta`` (shift) as ``params``; return its id (see
        :class:`~neuronmm_compiler.vocab.NormOp`)."""
        checked = NormOp.lookup(op)
        if checked is None:
            raise UnknownNameError(f"unknown normalization {op!r}; known: {', '.join(NormOp)}")
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0.0 < float(eps) < 1.0:
            raise InputError(f"{checked}: eps must be a number in (0, 1); got {eps!r}")
        attrs = {"norm": checked, "eps": repr(float(eps))}
        return self._add_computed(NodeKind.NORM, (x, *params), attrs, id, checked.value)

    def add_output(self, name: str, value: str, *, layout: str = Layout.ROW_MAJOR, id: str | None = None) -> str:
        """Mark ``value`` as the output ``name``; return the output node's id (``name`` unless taken).

        ``layout="transposed"`` (2-D only) means the kernel writes the transpose of ``value`` to
        HBM: the output's logical shape is ``value``'s, its storage shape the reverse.
        """
        self._check_boundary_name(name, "output")
        operand = self.node(value)
        checked = check_layout(layout, operand.shape, f"output {name!r}")
        new_id = self._claim_id(id, name, numbered=False)
        attrs = {"name": name, "layout": checked}
        shape, dtype = infer_result(new_id, NodeKind.OUTPUT, attrs, [operand])
        return self._add(new_id, NodeKind.OUTPUT, (value,), shape, dtype, attrs)

    # ----------------------------------------------------------------- queries

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._g

    def __len__(self) -> int:
        return self._g.number_of_nodes()

    def node(self, id: str) -> Node:
        """The node ``id`` as a frozen :class:`Node` (IRError if there is none)."""
        cached = self._node_cache.get(id)
        if cached is not None:
            return cached
        if id not in self._g:
            raise IRError(f"graph {self._name} has no node %{id}")
        data = self._g.nodes[id]
        positions: list[tuple[int, str]] = []
        for operand, _, edge in self._g.in_edges(id, data=True):
            positions.extend((index, operand) for index in edge.get(OPERAND_INDICES, ()))
        node = self._node_cache[id] = Node(
            id=id,
            kind=data["kind"],
            operands=tuple(operand for _, operand in sorted(positions)),
            shape=tuple(data["shape"]),
            dtype=data["dtype"],
            attrs=MappingProxyType(dict(data["attrs"])),
            annotations=MappingProxyType(dict(data.get("annotations") or {})),
        )
        return node

    def _order_key(self, node_id: str) -> int:
        return self._g.nodes[node_id].get("order", 1 << 62)

    def node_ids(self) -> list[str]:
        """Node ids in topological order, ties broken by insertion order (IRError on a cycle)."""
        if self._order_cache is None:
            import networkx as nx

            try:
                self._order_cache = list(nx.lexicographical_topological_sort(self._g, key=self._order_key))
            except nx.NetworkXUnfeasible:
                cycle = " -> ".join(f"%{u}" for u, _ in nx.find_cycle(self._g))
                raise IRError(f"graph {self._name} has a cycle: {cycle}") from None
        return list(self._order_cache)

    def nodes(self) -> list[Node]:
        """All nodes in deterministic topological order (ties broken by insertion order)."""
        return [self.node(node_id) for node_id in self.node_ids()]

    def inputs(self) -> list[Node]:
        """Input nodes in topological order (which keeps their declaration order)."""
        return [node for node in self.nodes() if node.kind == NodeKind.INPUT]

    def outputs(self) -> list[Node]:
        """Output nodes in topological order."""
        return [node for node in self.nodes() if node.kind == NodeKind.OUTPUT]

    def users(self, id: str) -> list[str]:
        """Ids of the nodes that read ``id``, in insertion order (each user listed once)."""
        if id not in self._g:
            raise IRError(f"graph {self._name} has no node %{id}")
        return sorted(self._g.successors(id), key=self._order_key)

    def compute_nodes(self) -> list[Node]:
        """The matmul, transpose and elementwise nodes, in topological order."""
        return [node for node in self.nodes() if node.kind in COMPUTE_KINDS]

    # ----------------------------------------------------------------- annotations

    def _compute_data(self, node_id: str, what: str) -> dict[str, Any]:
        if node_id not in self._g:
            raise IRError(f"graph {self._name} has no node %{node_id}")
        data = self._g.nodes[node_id]
        if data["kind"] not in COMPUTE_KINDS:
            raise IRError(
                f"cannot {what} %{node_id}: it is an {data['kind']}; only compute nodes "
                f"({', '.join(COMPUTE_KINDS)}) carry annotations"
            )
        return data

    def annotate(self, node_id: str, **values: str) -> bool:
        """Set annotations on the compute node ``node_id``; return True if any value changed.

        Known keys: ``orient`` (normal, transposed), ``kernel`` (an identifier), ``place`` (sbuf,
        hbm); an existing value is overwritten. Unknown key -> UnknownNameError, bad value ->
        InputError, missing or non-compute node -> IRError. Nothing is set unless all are valid.
        """
        data = self._compute_data(node_id, "annotate")
        for key, value in values.items():
            try:
                check_annotation(key, value)
            except InputError as err:
                raise type(err)(f"%{node_id}: {err}") from None
        current = data.setdefault("annotations", {})
        changed = any(current.get(key) != value for key, value in values.items())
        self._changed()
        current.update(values)
        return changed

    def annotations(self, node_id: str) -> dict[str, str]:
        """A copy of the annotations of ``node_id`` (empty for inputs and outputs)."""
        if node_id not in self._g:
            raise IRError(f"graph {self._name} has no node %{node_id}")
        return dict(self._g.nodes[node_id].get("annotations") or {})

    def clear_annotations(self, node_id: str, *keys: str) -> bool:
        """Remove the annotations ``keys`` (all when none given) of a compute node; True if any went."""
        data = self._compute_data(node_id, "clear annotations of")
        current = data.setdefault("annotations", {})
        doomed = [key for key in (keys or tuple(current)) if key in current]
        self._changed()
        for key in doomed:
            del current[key]
        return bool(doomed)

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
        import networkx as nx

        if nx.has_path(self._g, old, new):
            raise IRError(f"cannot replace %{old} with %{new}: %{new} depends on %{old} (would make a cycle)")
        moved = 0
        self._changed()
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
        self._changed()
        self._g.remove_node(id)

    def redeclare_input(self, id: str, shape: Sequence[int], layout: str) -> None:
        """Change an input's logical ``shape`` and ``layout`` in place (id, name, dtype kept).

        Users are not re-checked: the caller makes them consistent again (the pipeline driver's
        verify catches a pass that does not).
        """
        node = self.node(id)
        if node.kind != NodeKind.INPUT:
            raise IRError(f"redeclare_input: %{id} is a {node.kind}, not an input")
        dims = check_shape(shape, f"input {node.name!r}")
        checked = check_layout(layout, dims, f"input {node.name!r}")
        self._changed()
        data = self._g.nodes[id]
        data["shape"] = dims
        data["attrs"] = {**data["attrs"], "layout": checked}

    def redirect_output(self, id: str, value: str) -> None:
        """Make output ``id`` return ``value``, the operand of the transpose it returned, in the
        flipped layout: the same array in HBM, so its storage shape is kept."""
        node = self.node(id)
        if node.kind != NodeKind.OUTPUT:
            raise IRError(f"redirect_output: %{id} is a {node.kind}, not an output")
        operand = self.node(node.operands[0])
        if operand.kind != NodeKind.TRANSPOSE or operand.operands[0] != value:
            raise IRError(f"redirect_output: output %{id} does not return a transpose of %{value}")
        self._changed()
        data = self._g.nodes[id]
        data["attrs"] = {**data["attrs"], "layout": Layout(node.layout or Layout.ROW_MAJOR).flipped}
        data["shape"] = tuple(reversed(node.shape))
        self._g.remove_edge(operand.id, id)
        self._g.add_edge(value, id, **{OPERAND_INDICES: (0,)})

    def copy(self, name: str | None = None) -> Graph:
        """An independent deep copy (same ids, attrs, annotations and insertion order).

        ``name`` renames the copy (it must be an identifier); by default it keeps this name.
        """
        duplicate = Graph.__new__(Graph)
        duplicate._name = self._name if name is None else check_identifier(name, "graph name")
        duplicate._g = copy.deepcopy(self._g)
        duplicate._next_order = self._next_order
        duplicate._changed()
        return duplicate

    def replace_contents(self, other: Graph) -> None:
        """Make this graph a copy of ``other`` (nodes, edges, insertion order; the name is kept): how a pass that
        rebuilds a graph in a new order (``quantize-fp8``) mutates it in place."""
        self._changed()
        self._g = copy.deepcopy(other._g)
        self._next_order = other._next_order

    # ----------------------------------------------------------------- identity

    def _canonical(self) -> dict[str, Any]:
        nodes = [self.node(node_id) for node_id in sorted(self._g.nodes)]
        return {
            "name": self._name,
            "inputs": [node.id for node in self.inputs()],
            "outputs": [node.id for node in self.outputs()],
            "nodes": [
                (n.id, n.kind, n.operands, n.shape, n.dtype, sorted(n.attrs.items()), sorted(n.annotations.items()))
                for n in nodes
            ],
        }

    def __eq__(self, other: object) -> bool:
        """Structural equality: same name, nodes (ids, kinds, ordered operands, shapes, dtypes,
        attrs, annotations) and the same order of inputs and of outputs (the kernel's argument order).
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
        return to_text(self)
