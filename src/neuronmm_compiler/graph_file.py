"""User-described matmul graphs: the graph file format (YAML or JSON), read as untrusted input.

A graph file names its inputs (shape, dtype, layout), its ops (``matmul``, ``transpose``, ``add``,
``multiply``, ``silu``) and its outputs; shapes may use named dimensions bound on the command line
(``--dim tokens=128``). docs/graph-format.md is the user's guide and
``schemas/graph.schema.json`` (shipped in the package) the JSON Schema; this module is what nmmc
actually enforces, and is stricter than the schema where a schema cannot say it (references,
cycles, shapes, reserved names).

Everything in a file is untrusted: its names become identifiers in emitted Python (kernel
arguments, buffer and function names), so a name must be a plain ASCII identifier of at most 64
characters that is not a keyword, not a builtin, not a name the emitted code itself uses (``nl``,
``nki``, loop variables, ...) and not shaped like a name nmmc derives from another one (``x_strip``,
``mm_psum``, ...). Any violation, and any malformed file (bad YAML, duplicate keys, YAML aliases,
cycles, dangling references, shape mismatches, unsupported ops, sizes beyond the target's HBM),
is one :class:`InputError` line naming the file and the offending entry.
"""

from __future__ import annotations

import builtins
import json
import keyword
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import InputError, NmmcError, ParseError
from .ir import Graph, canonical_dtype
from .ir.graph import LAYOUTS, is_identifier

#: The format version a file declares as ``nmmc_graph: 1``.
FORMAT_VERSION = 1
#: Ops a graph file may use, and their operand counts.
OPS: Mapping[str, int] = {"matmul": 2, "transpose": 1, "add": 2, "multiply": 2, "silu": 1}
MAX_NAME_LENGTH = 64
MAX_FILE_BYTES = 1 << 20
MAX_NODES = 4096
TOP_KEYS = ("nmmc_graph", "name", "description", "dtype", "dims", "inputs", "ops", "outputs")
INPUT_KEYS = ("shape", "dtype", "layout")
OP_KEYS = ("op", "args")
OUTPUT_KEYS = ("value", "layout")

#: Names the emitted kernel file uses itself (imports, loop variables, helpers).
RESERVED_NAMES = frozenset({
    "np", "nki", "nl", "nisa", "numpy", "neuronxcc", "reference", "ml_dtypes",
    "m_blk", "kt", "tt", "ft", "f_blk", "o_blk", "bn", "nt", "wt", "k_blk", "r_tile", "c_tile",
    "m_tile", "n_tile", "k_tile", "i", "j", "k", "self", "cls",
})
#: Suffixes nmmc appends to a name to name its buffers; a user name may not end with one.
_DERIVED = re.compile(r".*_(strip|psum|block|rows|resident|tile|f32|f64|t_psum|operand_f32|k\d+)\Z|v\d+\Z")


def check_user_name(name: Any, what: str) -> str:
    """Return ``name`` if it is safe as an identifier in emitted code, else raise InputError."""
    shown = repr(name) if not isinstance(name, str) else repr(name[:80])
    if not isinstance(name, str):
        raise InputError(f"{what} {shown}: names must be strings")
    if not is_identifier(name):
        raise InputError(f"{what} {shown} is not a valid name: use ASCII letters, digits and underscores, "
                         "not starting with a digit, and not a Python keyword")
    if len(name) > MAX_NAME_LENGTH:
        raise InputError(f"{what} {shown} is longer than {MAX_NAME_LENGTH} characters")
    if name.startswith("_"):
        raise InputError(f"{what} {shown}: names may not start with an underscore")
    if keyword.issoftkeyword(name) or hasattr(builtins, name) or name in RESERVED_NAMES:
        raise InputError(f"{what} {shown} is reserved (a Python builtin or a name the emitted kernel uses)")
    if _DERIVED.match(name):
        raise InputError(f"{what} {shown} is reserved: nmmc derives names of that form (e.g. x_strip, mm_psum, "
                         "v3) for its own buffers")
    return name


# ----------------------------------------------------------------------------- reading


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader without aliases (no expansion bombs) and without duplicate keys."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None, None, "YAML aliases (*name) are not accepted in graph files", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # type: ignore[override]
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            if isinstance(key, (str, int, float, bool)):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ParseError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def parse_document(text: str, source: str) -> Any:
    """The parsed document (JSON for ``*.json``, YAML otherwise); ParseError in one line."""
    if source.endswith(".json"):
        try:
            return json.loads(text, object_pairs_hook=_no_duplicates)
        except json.JSONDecodeError as exc:
            raise ParseError(f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
        except ParseError as exc:
            raise ParseError(f"{source}: invalid JSON: {exc}") from None
        except RecursionError:
            raise ParseError(f"{source}: invalid JSON: nested too deeply") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ParseError(f"{source}: invalid YAML{where}: {_one_line(exc.problem or exc.context or '')}") from None
    except yaml.YAMLError as exc:
        raise ParseError(f"{source}: invalid YAML: {_one_line(str(exc))}") from None
    except RecursionError:
        raise ParseError(f"{source}: invalid YAML: nested too deeply") from None


def read_document(path: str | Path) -> tuple[Any, str]:
    """(parsed document, source label) of a graph file; InputError if it cannot be read."""
    p = Path(path)
    source = str(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise InputError(f"cannot read graph file {source!r}: {exc.strerror or exc}") from None
    if not p.is_file():
        raise InputError(f"graph file {source!r} is not a regular file")
    if size > MAX_FILE_BYTES:
        raise InputError(f"{source}: graph file of {size} bytes is larger than the {MAX_FILE_BYTES} accepted")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{source}: graph files must be UTF-8 text") from None
    except OSError as exc:
        raise InputError(f"cannot read graph file {source!r}: {exc.strerror or exc}") from None
    return parse_document(text, source), source


# ----------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int | str, ...]
    dtype: str
    layout: str


@dataclass(frozen=True)
class OpSpec:
    name: str
    op: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class OutputSpec:
    name: str
    value: str
    layout: str


@dataclass(frozen=True)
class GraphSpec:
    """A validated graph file, dimensions not yet bound. ``ops`` are in dependency order."""

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
        unknown = sorted(set(bindings) - set(self.dims))
        if unknown:
            known = ", ".join(self.dims) or "none"
            raise InputError(f"{self.source}: --dim {unknown[0]}: the graph has no dimension {unknown[0]!r} "
                             f"(its dimensions: {known})")
        values: dict[str, int] = {}
        for name, default in self.dims.items():
            value = bindings.get(name, default)
            if value is None:
                raise InputError(f"{self.source}: dimension {name!r} has no value; pass --dim {name}=N")
            values[name] = value
        return values

    def graph(self, bindings: Mapping[str, int] | None = None) -> Graph:
        """The IR graph with every dimension bound; shape errors become one InputError line."""
        values = self.bind(bindings)
        graph = Graph(self.name)
        ids: dict[str, str] = {}
        try:
            for inp in self.inputs:
                shape = tuple(values[d] if isinstance(d, str) else d for d in inp.shape)
                ids[inp.name] = graph.add_input(inp.name, shape, inp.dtype, inp.layout, id=inp.name)
            for spec in self.ops:
                args = [ids[a] for a in spec.args]
                if spec.op == "matmul":
                    ids[spec.name] = graph.add_matmul(*args, id=spec.name)
                elif spec.op == "transpose":
                    ids[spec.name] = graph.add_transpose(*args, id=spec.name)
                else:
                    ids[spec.name] = graph.add_elementwise(spec.op, *args, id=spec.name)
            for out in self.outputs:
                graph.add_output(out.name, ids[out.value], layout=out.layout)
        except NmmcError as exc:
            raise InputError(f"{self.source}: {_one_line(str(exc))}") from None
        return graph


def _mapping(value: Any, where: str, source: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(f"{source}: {where} must be a mapping (name: ...); got {type(value).__name__}")
    return value


def _keys(value: Mapping[str, Any], allowed: tuple[str, ...], where: str, source: str) -> None:
    for key in value:
        if key not in allowed:
            raise InputError(f"{source}: {where}: unknown key {str(key)[:80]!r}; accepted: {', '.join(allowed)}")


def _positive(value: Any, where: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{source}: {where} must be a positive integer; got {str(value)[:80]!r}")
    return value


def _name(value: Any, what: str, source: str) -> str:
    try:
        return check_user_name(value, what)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None


def spec_from_document(doc: Any, source: str) -> GraphSpec:
    """Validate a parsed graph document into a :class:`GraphSpec` (InputError, one line, on any fault)."""
    doc = _mapping(doc, "the document", source)
    _keys(doc, TOP_KEYS, "top level", source)
    version = doc.get("nmmc_graph")
    if version != FORMAT_VERSION:
        raise InputError(f"{source}: 'nmmc_graph: {FORMAT_VERSION}' (the format version) is required; "
                         f"got {str(version)[:40]!r}")
    name = _name(doc.get("name"), "graph name", source)
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise InputError(f"{source}: description must be a string")
    try:
        default_dtype = canonical_dtype(doc.get("dtype", "bfloat16"))
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    dims: dict[str, int | None] = {}
    for dim, value in _mapping(doc.get("dims", {}), "dims", source).items():
        dims[_name(dim, "dimension", source)] = None if value is None else _positive(value, f"dims.{dim}", source)
    names: dict[str, str] = {}

    def claim(entry: str, what: str) -> str:
        checked = _name(entry, what, source)
        if checked in names:
            raise InputError(f"{source}: {what} {checked!r} is already used by {names[checked]}")
        if checked in dims:
            raise InputError(f"{source}: {what} {checked!r} is already used by a dimension")
        names[checked] = what
        return checked

    inputs = []
    raw_inputs = _mapping(doc.get("inputs"), "inputs", source)
    if not raw_inputs:
        raise InputError(f"{source}: a graph needs at least one input")
    for key, entry in raw_inputs.items():
        inp = claim(key, "input")
        entry = _mapping(entry, f"input {inp}", source)
        _keys(entry, INPUT_KEYS, f"input {inp}", source)
        shape = entry.get("shape")
        if not isinstance(shape, list) or not 1 <= len(shape) <= 2:
            raise InputError(f"{source}: input {inp}: shape must be a list of one or two dimensions "
                             f"(integers or dimension names); got {str(shape)[:80]!r}")
        dims_of: list[int | str] = []
        for index, dim in enumerate(shape):
            if isinstance(dim, str):
                if dim not in dims:
                    raise InputError(f"{source}: input {inp}: shape uses dimension {dim[:80]!r}, which is not "
                                     "declared under dims")
                dims_of.append(dim)
            else:
                dims_of.append(_positive(dim, f"input {inp}: shape[{index}]", source))
        try:
            dtype = canonical_dtype(entry.get("dtype", default_dtype))
        except InputError as exc:
            raise InputError(f"{source}: input {inp}: {exc}") from None
        layout = entry.get("layout", "row_major")
        if layout not in LAYOUTS:
            raise InputError(f"{source}: input {inp}: unknown layout {str(layout)[:40]!r}; "
                             f"accepted: {', '.join(LAYOUTS)}")
        inputs.append(InputSpec(inp, tuple(dims_of), dtype, layout))
    raw_ops = _mapping(doc.get("ops", {}), "ops", source)
    ops: dict[str, OpSpec] = {}
    for key, entry in raw_ops.items():
        op_name = claim(key, "op")
        entry = _mapping(entry, f"op {op_name}", source)
        _keys(entry, OP_KEYS, f"op {op_name}", source)
        kind = entry.get("op")
        if kind not in OPS:
            raise InputError(f"{source}: op {op_name}: unsupported op {str(kind)[:40]!r}; supported: {', '.join(OPS)}")
        args = entry.get("args")
        if not isinstance(args, list) or len(args) != OPS[kind]:
            raise InputError(f"{source}: op {op_name}: {kind} takes a list of {OPS[kind]} argument name(s) as "
                             f"args; got {str(args)[:80]!r}")
        for arg in args:
            if not isinstance(arg, str) or (arg not in raw_inputs and arg not in raw_ops):
                raise InputError(f"{source}: op {op_name}: argument {str(arg)[:80]!r} is not an input or op of "
                                 "the graph")
        ops[op_name] = OpSpec(op_name, kind, tuple(args))
    if len(inputs) + len(ops) > MAX_NODES:
        raise InputError(f"{source}: more than {MAX_NODES} inputs and ops")
    outputs = []
    raw_outputs = _mapping(doc.get("outputs"), "outputs", source)
    if not raw_outputs:
        raise InputError(f"{source}: a graph needs at least one output")
    returned: dict[str, str] = {}
    for key, entry in raw_outputs.items():
        out = claim(key, "output")
        if isinstance(entry, str):
            entry = {"value": entry}
        entry = _mapping(entry, f"output {out}", source)
        _keys(entry, OUTPUT_KEYS, f"output {out}", source)
        value = entry.get("value")
        if not isinstance(value, str) or value not in ops:
            what = "an input: outputs must be computed" if value in raw_inputs else "not an op of the graph"
            raise InputError(f"{source}: output {out}: value {str(value)[:80]!r} is {what}")
        if value in returned:
            raise InputError(f"{source}: outputs {returned[value]} and {out} both return op {value}; "
                             "return each value once")
        returned[value] = out
        layout = entry.get("layout", "row_major")
        if layout not in LAYOUTS:
            raise InputError(f"{source}: output {out}: unknown layout {str(layout)[:40]!r}; "
                             f"accepted: {', '.join(LAYOUTS)}")
        outputs.append(OutputSpec(out, value, layout))
    return GraphSpec(source, name, description, dims, tuple(inputs), _dependency_order(ops, source),
                     tuple(outputs))


def _dependency_order(ops: Mapping[str, OpSpec], source: str) -> tuple[OpSpec, ...]:
    """Ops with every op after the ops it reads (file order where free); InputError on a cycle."""
    order: list[OpSpec] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: placed
    for start in ops:
        if start in state:
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        state[start] = 1
        while stack:
            name, index = stack[-1]
            deps = [a for a in ops[name].args if a in ops]
            if index < len(deps):
                stack[-1] = (name, index + 1)
                dep = deps[index]
                if state.get(dep) == 1:
                    path = [n for n, _ in stack]
                    cycle = [*path[path.index(dep):], dep]
                    raise InputError(f"{source}: the ops form a cycle: {' -> '.join(cycle)}")
                if dep not in state:
                    state[dep] = 1
                    stack.append((dep, 0))
            else:
                stack.pop()
                state[name] = 2
                order.append(ops[name])
    return tuple(order)


def load_graph_spec(path: str | Path) -> GraphSpec:
    """Read and validate a graph file."""
    doc, source = read_document(path)
    return spec_from_document(doc, source)


def parse_dim_bindings(values: tuple[str, ...] | list[str]) -> dict[str, int]:
    """``--dim NAME=N`` values as a dict; InputError on a malformed or repeated binding."""
    out: dict[str, int] = {}
    for item in values:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise InputError(f"--dim takes NAME=N (e.g. tokens=128); got {item!r}")
        if name in out:
            raise InputError(f"--dim {name} is given twice")
        try:
            number = int(value)
        except ValueError:
            raise InputError(f"--dim {name}: {value!r} is not an integer") from None
        if number <= 0:
            raise InputError(f"--dim {name}: dimensions must be positive; got {number}")
        out[name] = number
    return out


def boundary_bytes(graph: Graph) -> int:
    """Bytes of every graph input and output in HBM."""
    itemsize = {"bfloat16": 2, "float32": 4}
    return sum(math.prod(n.shape) * itemsize[n.dtype] for n in graph.nodes() if n.kind in ("input", "output"))


def check_fits_hbm(graph: Graph, hbm_bytes: int, target_name: str, source: str) -> None:
    """InputError when the graph's inputs and outputs alone exceed the target's HBM per core."""
    needed = boundary_bytes(graph)
    if needed > hbm_bytes:
        raise InputError(f"{source}: the graph's inputs and outputs need {needed / 2**30:.1f} GiB of HBM; "
                         f"a {target_name} NeuronCore has {hbm_bytes / 2**30:.1f} GiB")
