"""User-described matmul graphs: the graph file format (YAML or JSON), read as untrusted input.

A graph file names its inputs (shape, dtype, layout), its ops (``matmul``, ``transpose``, ``add``,
``multiply``, ``silu``) and its outputs; shapes may use named dimensions bound on the command line
(``--dim tokens=128``). docs/graph-format.md is the user's guide and
``frontends/schemas/graph.schema.json`` (shipped in the package, see :func:`schema_path`) the JSON Schema;
this module is what nmmc actually enforces, and is stricter than the schema where a schema cannot
say it (references, cycles, shapes, Python keywords and builtins).

Everything in a file is untrusted, and so is its path (see :mod:`.untrusted` for what that means).
The names and the strict reading are in :mod:`.untrusted`; this module builds the spec and the
graph. Any violation, and any malformed file (bad YAML, duplicate keys, cycles, dangling references,
shape mismatches, unsupported ops, ops no output uses, sizes beyond the target's HBM), is one
:class:`InputError` line naming the file and the offending entry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import InputError, NmmcError
from ..ir import Graph
from ..ir.graph import LAYOUTS
from ..ir.node import DTYPE_ALIASES as INPUT_DTYPE_ALIASES
from ..ir.node import PLAIN_DTYPE_ALIASES as DTYPE_ALIASES
from ..kernel_ir.program import DTYPE_BYTES
from ..targets import Target
from ..vocab import ElementwiseOp, Layout, NodeKind, NormOp
from .graph_fp8 import check_fp8_reads, input_scale
from .shapes import MAX_DIMENSION
from .untrusted import (
    check_user_name,
    one_line,
    parse_dim_bindings,  # noqa: F401 (its callers import it from here)
    plain_name,
    read_document,
    show_value,
)

#: The format version a file declares as ``nmmc_graph: 1``.
FORMAT_VERSION = 1
#: Ops a graph file may use (in the order messages and the schema list them): the node kinds it
#: spells as ops, then the elementwise ops, then the norms; each with its (largest) operand count. A norm takes
#: the value, then optionally gamma and (layernorm) beta, and an optional ``eps``.
OPS: Mapping[NodeKind | ElementwiseOp | NormOp, int] = MappingProxyType({
    **{op: op.arity for op in (NodeKind.MATMUL, NodeKind.TRANSPOSE, ElementwiseOp.ADD, ElementwiseOp.MULTIPLY,
                               ElementwiseOp.SILU)},
    **{op: op.max_operands for op in NormOp}})
#: A norm's ``eps`` when the op does not give one (AWS nki-library's mlp default).
DEFAULT_EPS = 1e-6
MAX_DESCRIPTION_LENGTH = 1000
#: Inputs plus ops. Real graphs (an MLP, a LoRA projection) have tens; the lowering recurses over
#: chains of ops, so thousands would only exhaust the stack.
MAX_NODES = 256
TOP_KEYS = ("nmmc_graph", "name", "description", "dtype", "dims", "inputs", "ops", "outputs")
INPUT_KEYS = ("shape", "dtype", "layout", "scale")
OP_KEYS = ("op", "args", "eps")
OUTPUT_KEYS = ("value", "layout")

def schema_path() -> Path:
    """The JSON Schema of the graph file format, as shipped in the package."""
    return Path(str(resources.files("neuronmm_compiler.frontends") / "schemas" / "graph.schema.json"))


# ----------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int | str, ...]
    dtype: str
    layout: Layout
    #: an FP8 weight's scales, ``row`` or ``tensor`` (:mod:`.graph_fp8`); None for a bf16/fp32 input
    scale: str | None = None


@dataclass(frozen=True)
class OpSpec:
    name: str
    op: NodeKind | ElementwiseOp | NormOp
    args: tuple[str, ...]
    eps: float | None = None


@dataclass(frozen=True)
class OutputSpec:
    name: str
    value: str
    layout: Layout


@dataclass(frozen=True)
class GraphSpec:
    """A validated graph file, dimensions not yet bound. ``ops`` are in dependency order;
    ``description`` is one line of printable text."""

    source: str
    name: str
    description: str
    dims: Mapping[str, int | None]
    inputs: tuple[InputSpec, ...]
    ops: tuple[OpSpec, ...]
    outputs: tuple[OutputSpec, ...]

    def bind(self, bindings: Mapping[str, int] | None = None) -> dict[str, int]:
        """The value of every named dimension: the file's default, overridden by ``bindings``."""
        bindings = dict(bindings or {})
        unknown = sorted(set(bindings) - set(self.dims), key=str)
        if unknown:
            known = ", ".join(self.dims) or "none"
            raise InputError(f"{self.source}: --dim {show_value(unknown[0])}: the graph has no such dimension "
                             f"(its dimensions: {known})")
        values: dict[str, int] = {}
        for name, default in self.dims.items():
            value = bindings.get(name, default)
            if value is None:
                raise InputError(f"{self.source}: dimension {name!r} has no value; pass --dim {name}=N")
            values[name] = _positive(value, f"--dim {name}", self.source)
        return values

    def graph(self, bindings: Mapping[str, int] | None = None) -> Graph:
        """The IR graph with every dimension bound; shape errors become one InputError line."""
        values = self.bind(bindings)
        graph = Graph(self.name)
        ids: dict[str, str] = {}
        # an FP8 weight's matmuls are marked as the MLP frontend marks them; the quantize-fp8 pass places the
        # quantization (graph_fp8.check_fp8_reads: bf16 activations, the weight only as a right operand)
        scales = {inp.name: inp.scale for inp in self.inputs if inp.scale is not None}
        try:
            for inp in self.inputs:
                shape = tuple(values[d] if isinstance(d, str) else d for d in inp.shape)
                ids[inp.name] = graph.add_input(inp.name, shape, inp.dtype, inp.layout, id=inp.name)
            for spec in self.ops:
                args = [ids[a] for a in spec.args]
                if spec.op == NodeKind.MATMUL and spec.args[1] in scales:
                    ids[spec.name] = graph.add_matmul(*args, id=spec.name, act_scale="static",
                                                      w_scale=scales[spec.args[1]])
                elif spec.op == NodeKind.MATMUL:
                    ids[spec.name] = graph.add_matmul(*args, id=spec.name)
                elif spec.op == NodeKind.TRANSPOSE:
                    ids[spec.name] = graph.add_transpose(*args, id=spec.name)
                elif isinstance(spec.op, NormOp):
                    eps = DEFAULT_EPS if spec.eps is None else spec.eps
                    ids[spec.name] = graph.add_norm(spec.op, *args, eps=eps, id=spec.name)
                else:
                    ids[spec.name] = graph.add_elementwise(spec.op, *args, id=spec.name)
            for out in self.outputs:
                graph.add_output(out.name, ids[out.value], layout=out.layout)
        except NmmcError as exc:
            raise InputError(f"{self.source}: {one_line(str(exc), 400)}") from None
        return graph


def _mapping(value: Any, where: str, source: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        got = "an empty value" if value is None else f"{_type_name(value)} {show_value(value, 40)}"
        raise InputError(f"{source}: {where} must be a mapping (name: ...); got {got}")
    return value


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    return {str: "a string", int: "an integer", float: "a number", list: "a list"}.get(type(value), "a value")


def _required(doc: Mapping[str, Any], key: str, source: str) -> Any:
    if doc.get(key) is None:
        raise InputError(f"{source}: '{key}' is required (see docs/graph-format.md)")
    return doc[key]


def _keys(value: Mapping[str, Any], allowed: tuple[str, ...], where: str, source: str) -> None:
    for key in value:
        if key not in allowed:
            raise InputError(f"{source}: {where}: unknown key {show_value(key)}; accepted: {', '.join(allowed)}")


def _positive(value: Any, where: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{source}: {where} must be a positive integer; got {show_value(value)}")
    if value > MAX_DIMENSION:
        raise InputError(f"{source}: {where} is {value}; dimensions are at most {MAX_DIMENSION}")
    return value


def _name(value: Any, what: str, source: str, *, emitted: bool = True) -> str:
    try:
        return check_user_name(value, what) if emitted else plain_name(value, what)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None


def _dtype(value: Any, where: str, source: str, aliases: Mapping[str, str] = DTYPE_ALIASES) -> str:
    if not isinstance(value, str) or value not in aliases:
        fp8 = "" if aliases is INPUT_DTYPE_ALIASES else " (FP8 goes on weight inputs; docs/graph-format.md)"
        raise InputError(f"{source}: {where}unknown dtype {show_value(value, 40)}; accepted: {', '.join(aliases)}{fp8}")
    return aliases[value]


def _layout(value: Any, where: str, source: str) -> Layout:
    layout = Layout.lookup(value)
    if layout is None:
        raise InputError(f"{source}: {where}: unknown layout {show_value(value, 40)}; accepted: {', '.join(LAYOUTS)}")
    return layout


def _description(value: Any, source: str) -> str:
    """The description as one line of printable text (whitespace, newlines included, collapsed)."""
    if not isinstance(value, str):
        raise InputError(f"{source}: description must be a string; got {_type_name(value)}")
    if len(value) > MAX_DESCRIPTION_LENGTH:
        raise InputError(f"{source}: description is longer than {MAX_DESCRIPTION_LENGTH} characters")
    line = " ".join(value.split())
    bad = next((c for c in line if not c.isprintable()), None)
    if bad is not None:
        raise InputError(f"{source}: description contains the invisible or control character U+{ord(bad):04X}; "
                         "descriptions are printable text")
    return line


def spec_from_document(doc: Any, source: str) -> GraphSpec:
    """Validate a parsed graph document into a :class:`GraphSpec` (InputError, one line, on any fault)."""
    if doc is None:
        raise InputError(f"{source}: the graph file is empty")
    if not isinstance(doc, Mapping):
        raise InputError(f"{source}: a graph file is a mapping of {', '.join(TOP_KEYS)}; "
                         f"got {_type_name(doc)}")
    _keys(doc, TOP_KEYS, "top level", source)
    version = doc.get("nmmc_graph")
    if type(version) is not int or version != FORMAT_VERSION:
        raise InputError(f"{source}: 'nmmc_graph: {FORMAT_VERSION}' (the format version) is required; "
                         f"got {show_value(version, 40)}")
    name = _name(_required(doc, "name", source), "graph name", source)
    description = _description(doc.get("description", ""), source)
    default_dtype = _dtype(doc.get("dtype", "bfloat16"), "", source)
    raw_dims = _mapping(doc.get("dims", {}), "dims", source)
    raw_inputs = _mapping(_required(doc, "inputs", source), "inputs", source)
    raw_ops = _mapping(doc.get("ops", {}), "ops", source)
    raw_outputs = _mapping(_required(doc, "outputs", source), "outputs", source)
    if len(raw_inputs) + len(raw_ops) > MAX_NODES or len(raw_dims) > MAX_NODES:
        raise InputError(f"{source}: more than {MAX_NODES} inputs and ops (or dims); nmmc compiles graphs of "
                         "at most that many")
    if not raw_inputs:
        raise InputError(f"{source}: a graph needs at least one input")
    if not raw_outputs:
        raise InputError(f"{source}: a graph needs at least one output")

    dims: dict[str, int | None] = {}
    for dim, value in raw_dims.items():
        dims[_name(dim, "dimension", source, emitted=False)] = (
            None if value is None else _positive(value, f"dims.{dim}", source))
    names: dict[str, str] = {}

    def claim(entry: Any, what: str) -> str:
        checked = _name(entry, what, source)
        if checked in names:
            raise InputError(f"{source}: {what} {checked!r} is already used by {names[checked]}")
        if checked in dims:
            raise InputError(f"{source}: {what} {checked!r} is already used by a dimension")
        names[checked] = f"an {what}" if what[0] in "aeiou" else f"a {what}"
        return checked

    inputs = []
    for key, entry in raw_inputs.items():
        inp = claim(key, "input")
        entry = _mapping(entry, f"input {inp}", source)
        _keys(entry, INPUT_KEYS, f"input {inp}", source)
        shape = entry.get("shape")
        if not isinstance(shape, list) or not 1 <= len(shape) <= 2:
            raise InputError(f"{source}: input {inp}: shape must be a list of one or two dimensions "
                             f"(integers or dimension names); got {show_value(shape)}")
        dims_of: list[int | str] = []
        for index, dim in enumerate(shape):
            if isinstance(dim, str):
                if dim not in dims:
                    raise InputError(f"{source}: input {inp}: shape uses dimension {show_value(dim)}, which is not "
                                     "declared under dims")
                dims_of.append(dim)
            else:
                dims_of.append(_positive(dim, f"input {inp}: shape[{index}]", source))
        dtype = _dtype(entry.get("dtype", default_dtype), f"input {inp}: ", source, INPUT_DTYPE_ALIASES)
        layout = _layout(entry.get("layout", Layout.ROW_MAJOR), f"input {inp}", source)
        inputs.append(InputSpec(inp, tuple(dims_of), dtype, layout, input_scale(entry, dtype, layout, inp, source)))
    ops: dict[str, OpSpec] = {}
    for key, entry in raw_ops.items():
        op_name = claim(key, "op")
        entry = _mapping(entry, f"op {op_name}", source)
        _keys(entry, OP_KEYS, f"op {op_name}", source)
        kind = next((op for op in OPS if op == entry.get("op")), None)
        if kind is None:
            raise InputError(f"{source}: op {op_name}: unsupported op {show_value(entry.get('op'), 40)}; "
                             f"supported: {', '.join(OPS)}")
        args = entry.get("args")
        low = 1 if isinstance(kind, NormOp) else OPS[kind]
        if not isinstance(args, list) or not low <= len(args) <= OPS[kind]:
            count = f"{low} to {OPS[kind]}" if low != OPS[kind] else f"{OPS[kind]}"
            raise InputError(f"{source}: op {op_name}: {kind} takes a list of {count} argument name(s) as "
                             f"args; got {show_value(args)}")
        eps = entry.get("eps")
        if eps is not None and not isinstance(kind, NormOp):
            raise InputError(f"{source}: op {op_name}: eps is a parameter of rmsnorm and layernorm, not of {kind}")
        if eps is not None and (isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < 1):
            raise InputError(f"{source}: op {op_name}: eps must be a number in (0, 1); got {show_value(eps)}")
        for arg in args:
            if not isinstance(arg, str) or (arg not in raw_inputs and arg not in raw_ops):
                what = "an output; ops read inputs and ops" if arg in raw_outputs else "not an input or op of the graph"
                raise InputError(f"{source}: op {op_name}: argument {show_value(arg)} is {what}")
        ops[op_name] = OpSpec(op_name, kind, tuple(args), None if eps is None else float(eps))
    outputs = []
    returned: dict[str, str] = {}
    for key, entry in raw_outputs.items():
        out = claim(key, "output")
        if isinstance(entry, str):
            entry = {"value": entry}
        entry = _mapping(entry, f"output {out}", source)
        _keys(entry, OUTPUT_KEYS, f"output {out}", source)
        value = entry.get("value")
        if not isinstance(value, str) or value not in ops:
            computed = not isinstance(value, str) or value not in raw_inputs
            what = "not an op of the graph" if computed else "an input: outputs must be computed"
            raise InputError(f"{source}: output {out}: value {show_value(value)} is {what}")
        if value in returned:
            raise InputError(f"{source}: outputs {returned[value]} and {out} both return op {value}; "
                             "return each value once")
        returned[value] = out
        outputs.append(OutputSpec(out, value, _layout(entry.get("layout", Layout.ROW_MAJOR), f"output {out}", source)))
    ordered = _dependency_order(ops, source)
    _check_all_used(ordered, returned, source)
    fp8 = {i.name: i.scale for i in inputs if i.scale is not None}
    check_fp8_reads(ordered, fp8, {i.dtype for i in inputs if i.name not in fp8}, {*names, *dims}, source)
    return GraphSpec(source, name, description, dims, tuple(inputs), ordered, tuple(outputs))


def _dependency_order(ops: Mapping[str, OpSpec], source: str) -> tuple[OpSpec, ...]:
    """Ops with every op after the ops it reads, in file order where free (a depth-first postorder
    from the ops in file order, arguments in order); InputError naming the first cycle that search meets."""
    import networkx as nx

    reads = nx.DiGraph()
    reads.add_nodes_from(ops)
    reads.add_edges_from((name, arg) for name, spec in ops.items() for arg in spec.args if arg in ops)
    try:
        cycle = nx.find_cycle(reads)
    except nx.NetworkXNoCycle:
        return tuple(ops[name] for name in nx.dfs_postorder_nodes(reads))
    path = [*(reader for reader, _ in cycle), cycle[0][0]]
    raise InputError(f"{source}: the ops form a cycle: {' -> '.join(path)}")


def _check_all_used(ordered: tuple[OpSpec, ...], returned: Mapping[str, str], source: str) -> None:
    """InputError naming the first op no output depends on (nmmc would drop it without a word)."""
    needed = set(returned)
    for spec in reversed(ordered):
        if spec.name in needed:
            needed.update(spec.args)
    for spec in ordered:
        if spec.name not in needed:
            raise InputError(f"{source}: op {spec.name} is computed but no output uses it; return it as an output "
                             "or remove it")


def load_graph_spec(path: str | Path) -> GraphSpec:
    """Read and validate a graph file."""
    doc, source = read_document(path)
    return spec_from_document(doc, source)


def boundary_bytes(graph: Graph) -> int:
    """Bytes of every graph input and output in HBM."""
    return sum(math.prod(n.shape) * DTYPE_BYTES[n.dtype] for n in graph.nodes()
               if n.kind in (NodeKind.INPUT, NodeKind.OUTPUT))


def check_fits_hbm(graph: Graph, target: Target, source: str) -> None:
    """InputError when the graph's inputs and outputs alone exceed the target's HBM per core."""
    needed, hbm_bytes = boundary_bytes(graph), target.hbm_bytes_per_launch
    if needed > hbm_bytes:
        raise InputError(f"{source}: the graph's inputs and outputs need {needed / 2**30:.2f} GiB of HBM; "
                         f"{target.core_label} has {hbm_bytes / 2**30:.2f} GiB")
