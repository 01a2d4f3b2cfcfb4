"""Untrusted text of a graph file: the names it may give (they become identifiers in emitted code)
and the strict YAML/JSON reading of the file itself (:mod:`.graph_file` builds the graph from it).

Everything in a file is untrusted, and so is its path:

- Value names (inputs, ops, outputs) and the graph name become identifiers in emitted Python
  (kernel arguments, buffer and function names), so each must be a plain ASCII identifier of at
  most 64 characters that does not start with an underscore, is not a keyword or builtin, not a
  name the emitted code itself uses (``nl``, ``nki``, loop variables, ...) and not shaped like a
  name nmmc derives from another one (``x_strip``, ``mm_psum``, ``g_k0``, ...). Dimension names
  never reach emitted code; they only need to be plain identifiers.
- The description is never emitted; it is kept as one line of printable text all the same, so
  that it is safe wherever a later change might echo it (a ``#`` comment, a message).
- The path labels every message and the kernel file's header comment, so a path that is not
  printable text (a newline in a file name) is shown escaped, as a Python literal.
- The YAML loader accepts only what a graph file needs: mappings, lists, strings, decimal
  integers, floats, booleans and null. No tags (``!!python/object``), aliases (expansion bombs),
  merge keys, timestamps, duplicate keys, or nesting deeper than :data:`MAX_DEPTH`. Files are at
  most :data:`MAX_FILE_BYTES`, graphs at most :data:`.graph_file.MAX_NODES` inputs and ops, dimensions at most
  :data:`.graph_file.MAX_DIMENSION`: beyond those lie only mistakes and denial of service.

Everything here raises one :class:`InputError` line naming the file and the offending entry.
"""

from __future__ import annotations

import builtins
import json
import keyword
import re
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError, ParseError
from ..ir.graph import is_identifier

MAX_NAME_LENGTH = 64
MAX_FILE_BYTES = 256 * 1024
#: Nesting of YAML/JSON collections; a graph file needs 4 (top level, inputs, an input, its shape).
MAX_DEPTH = 16
#: Integers are written in decimal with at most this many digits (YAML 1.1's octal ``010``, hex,
#: ``1_000`` and sexagesimal ``1:20`` forms are refused; Python caps int parsing at 4300 digits).
MAX_INT_DIGITS = 18

#: Names the emitted kernel file uses itself: modules, the reference function, the loop variables
#: of every lowering (fused and GEMM), and names kept back for them.
RESERVED_NAMES = frozenset({
    "np", "nki", "nl", "nisa", "numpy", "neuronxcc", "math", "ml_dtypes", "reference",
    "m_blk", "n_blk", "k_blk", "f_blk", "o_blk", "bm", "bn", "bk", "kt", "tt", "ft", "nt", "wt", "ct",
    "r_tile", "c_tile", "m_tile", "n_tile", "k_tile", "i", "j", "k", "self", "cls",
    "pid",  # the program id of an LNC=2 kernel (kernel_ir/lnc.py)
    "hv",  # the halves of a stored residual sum under an LNC=2 split (lowerings/fused_prologue.py)
    "bank",  # the loop filling a list of PSUM tiles (kernel_ir/psum_banks.py)
    # named tile sizes (kernel_ir/expr.py, Named; lowerings/limits.py, lower_gemm.py, lower_fused.py)
    "P", "T", "F_TILE", "OUT_TILE", "TOKEN_TILE", "TOKENS_PER_BLOCK", "K_BLOCK",
    "TILE_M", "TILE_N", "TILE_K", "BLOCK_M", "BLOCK_N", "BLOCK_K",
    "T_HALF", "T_MINE",  # the token split's shares of T read from the arguments (lowerings/fused_tokens.py)
})
#: Names nmmc derives from a user's name (``x_strip``, ``mm_psum``, ``w_block``, ``x_f64``, the
#: kernels ``<graph>_k0``, the reference's locals ``v3``): a user name may not have that form, nor
#: contain ``__`` (kept free so that derived names can never collide). The same pattern is in the
#: schema's ``$defs/value_name``; tests/test_graph_file.py checks every name an emitted kernel binds
#: itself against it.
DERIVED_PATTERN = (r"_(strip|psum|tpsum|block|rows|rowtile|resident|tile|tiles|blk|sbuf|spill|f32|f64|kernel"
                   r"|cols|stats|k[0-9]+|BLOCK)$|^v[0-9]+$|__")
_DERIVED = re.compile(DERIVED_PATTERN)
#: Builtins as the interpreter sees them, plus the ones ``site`` adds (not there under ``python -S``).
_BUILTINS = frozenset(dir(builtins)) | {"exit", "quit", "help", "copyright", "credits", "license"}
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


def show_value(value: Any, limit: int = 80) -> str:
    """A value as a message shows it: YAML's spelling of true/false/null, else a truncated repr (one
    line, every non-printable character escaped)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value[:limit] if isinstance(value, str) else value)
    return text if len(text) <= limit + 2 else text[:limit] + "..."


def plain_name(name: Any, what: str) -> str:
    """``name`` if it is a plain ASCII identifier (letters, digits, underscores; a letter first; not a
    keyword; at most 64 characters), else InputError."""
    if not isinstance(name, str):
        hint = ""
        if isinstance(name, (bool, int, float)) or name is None:
            hint = (" (YAML reads unquoted true/false/yes/no/on/off as booleans, null and ~ as null, and "
                    "numbers as numbers: quote the name)")
        raise InputError(f"{what} {show_value(name)}: names must be strings{hint}")
    if not _IDENTIFIER.match(name) or keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise InputError(f"{what} {show_value(name)} is not a valid name: use ASCII letters, digits and underscores, "
                         "starting with a letter, and not a Python keyword")
    if len(name) > MAX_NAME_LENGTH:
        raise InputError(f"{what} {show_value(name)} is longer than {MAX_NAME_LENGTH} characters")
    return name


def check_user_name(name: Any, what: str) -> str:
    """Return ``name`` if it is safe as an identifier in emitted code, else raise InputError."""
    plain_name(name, what)
    if name in _BUILTINS or name in RESERVED_NAMES:
        raise InputError(f"{what} {name!r} is reserved (a Python builtin or a name the emitted kernel uses)")
    if _DERIVED.search(name):
        raise InputError(f"{what} {name!r} is reserved: nmmc derives names of that form (e.g. x_strip, mm_psum, "
                         "w_block, g_k0, v3, or with a double underscore) for its own buffers")
    assert is_identifier(name)
    return name


# ----------------------------------------------------------------------------- reading


def _yaml_error(message: str, node_or_event: Any) -> yaml.constructor.ConstructorError:
    return yaml.constructor.ConstructorError(None, None, message, node_or_event.start_mark)


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader cut down to what a graph file needs (see the module docstring)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _yaml_error("YAML aliases (*name) are not accepted in graph files", event)
        tag = getattr(event, "tag", None)
        if tag is not None:
            shown = "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag
            raise _yaml_error(f"YAML tags ({show_value(shown, 60)}) are not accepted in graph files", event)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _yaml_error(f"nested more than {MAX_DEPTH} levels deep", event)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # type: ignore[override]
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _yaml_error("YAML merge keys (<<) are not accepted in graph files", key_node)
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: SafeConstructor reports it below
                continue
            if duplicate:
                raise _yaml_error(f"duplicate key {show_value(key)}", key_node)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        text = str(self.construct_scalar(node))
        if not re.fullmatch(r"[-+]?(0|[1-9][0-9]*)", text):
            raise _yaml_error(f"integer {show_value(text, 40)}: write integers in plain decimal (no 0x, 0o, 0b, "
                              "leading zeros, underscores or colons)", node)
        if len(text.lstrip("+-")) > MAX_INT_DIGITS:
            raise _yaml_error(f"integer of {len(text.lstrip('+-'))} digits: the limit is {MAX_INT_DIGITS}", node)
        return int(text)

    def construct_refused(self, node: Any) -> Any:
        kind = node.tag.rpartition(":")[2]
        raise _yaml_error(f"a YAML {kind} ({show_value(self.construct_scalar(node), 40)}) is not accepted in graph "
                          "files; quote it to make it a string", node)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", _StrictLoader.construct_refused)
_StrictLoader.add_constructor("tag:yaml.org,2002:value", _StrictLoader.construct_refused)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ParseError(f"duplicate key {show_value(key)}")
        out[key] = value
    return out


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ParseError(f"integer of {len(text.lstrip('-'))} digits: the limit is {MAX_INT_DIGITS}")
    return int(text)


def _json_constant(name: str) -> Any:
    raise ParseError(f"{name} is not a JSON number")


def one_line(text: str, limit: int = 200) -> str:
    """``text`` (a parser's or the IR's message) as one line of printable text, at most ``limit`` long."""
    line = " ".join(str(text).split())
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)
    return line if len(line) <= limit else line[:limit] + "..."


def source_label(path: str | Path) -> str:
    """How messages (and the header of an emitted kernel) name a file: its path, or the path as an
    escaped Python literal when it holds anything but printable text (a newline, a control or
    bidirectional-override character)."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def parse_document(text: str, source: str, *, is_json: bool) -> Any:
    """The parsed document, JSON when ``is_json``, else YAML; ParseError in one line."""
    if is_json:
        try:
            return json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_json_int,
                              parse_constant=_json_constant)
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
        raise ParseError(f"{source}: invalid YAML{where}: {one_line(exc.problem or exc.context or '')}") from None
    except yaml.YAMLError as exc:
        raise ParseError(f"{source}: invalid YAML: {one_line(str(exc))}") from None
    except (ValueError, OverflowError, RecursionError) as exc:  # a scalar PyYAML's constructors choke on
        raise ParseError(f"{source}: invalid YAML: {one_line(str(exc))}") from None


def read_document(path: str | Path) -> tuple[Any, str]:
    """(parsed document, source label) of a graph file; InputError if it cannot be read."""
    p = Path(path)
    source = source_label(path)
    try:
        if not p.is_file():
            what = "does not exist" if not p.exists() else "is not a regular file"
            raise InputError(f"graph file {source} {what}")
        with p.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read graph file {source}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"{source}: graph files are at most {MAX_FILE_BYTES // 1024} KiB; this one is larger")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{source}: graph files must be UTF-8 text") from None
    return parse_document(text, source, is_json=p.suffix.lower() == ".json"), source


def parse_dim_bindings(values: tuple[str, ...] | list[str]) -> dict[str, int]:
    """``--dim NAME=N`` values as a dict; InputError on a malformed or repeated binding."""
    from .shapes import MAX_DIMENSION

    out: dict[str, int] = {}
    for item in values:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise InputError(f"--dim takes NAME=N (e.g. tokens=128); got {show_value(item, 60)}")
        try:
            plain_name(name, "--dim")
        except InputError:
            raise InputError(f"--dim {show_value(name, 60)}: not a dimension name") from None
        if name in out:
            raise InputError(f"--dim {name} is given twice")
        if not (value.isascii() and value.isdigit()):
            raise InputError(f"--dim {name}: {show_value(value, 40)} is not a positive decimal integer")
        if len(value) > MAX_INT_DIGITS or int(value) > MAX_DIMENSION:
            raise InputError(f"--dim {name}: {show_value(value, 40)} is too large; "
                             f"dimensions are at most {MAX_DIMENSION}")
        if int(value) == 0:
            raise InputError(f"--dim {name}: dimensions must be positive; got 0")
        out[name] = int(value)
    return out
