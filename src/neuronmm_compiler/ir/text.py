"""The text form of the graph IR (prints and parses back exactly) and a torch.fx style table.

Grammar (``#`` starts a comment that runs to the end of the line; whitespace and newlines between
tokens are free; values must be defined above their first use)::

    graph       := "graph" IDENT "{" statement* "}"
    statement   := VALUE "=" op
    op          := "input" STRING shape DTYPE [ "layout" "=" LAYOUT ]
                 | "matmul" VALUE "," VALUE [ "act_scale" "=" IDENT "w_scale" "=" IDENT ] ":" shape DTYPE
                   [ annotations ]                              (act_scale, w_scale: an FP8-weight matmul)
                 | "transpose" VALUE ":" shape DTYPE [ annotations ]
                 | "elementwise" ELEMENTWISE_OP VALUE ( "," VALUE )* [ "format" "=" DTYPE ] ":" shape DTYPE
                   [ annotations ]                              (format: row_scale's FP8 format)
                 | "norm" NORM_OP VALUE ( "," VALUE )* "eps" "=" FLOAT ":" shape DTYPE [ annotations ]
                 | "output" STRING VALUE [ "layout" "=" LAYOUT ]
    annotations := "{" IDENT "=" IDENT ( "," IDENT "=" IDENT )* "}"      (keys: kernel, orient, place, group, acc)
    shape       := "[" INT ( "," INT )* "]"
    VALUE       := "%" IDENT          STRING := '"' IDENT '"'
    DTYPE       := bfloat16 | float32 | bf16 | fp32        LAYOUT := row_major | transposed
    NORM_OP     := rmsnorm | layernorm                   FLOAT  := Python's repr of a float (1e-06, 0.001)

:func:`to_text` prints one statement per line, indented two spaces, in :meth:`Graph.nodes` order,
with canonical dtypes and a trailing newline. Inputs always print ``layout=``; outputs print
``layout=transposed`` only when transposed (row_major is the default), and compute nodes print
their annotations, keys sorted, only when they have any, e.g.
``%mm0 = matmul %x, %u : [128, 1280] bfloat16 {kernel=k0, orient=transposed, place=sbuf}``.
The ``: shape dtype`` of a computed node is checked against what its operands give.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import NmmcError, ParseError
from ..vocab import ElementwiseOp, Layout, NodeKind, NormOp
from .graph import COMPUTE_KINDS, LAYOUTS, Graph, canonical_dtype, format_shape
from .node import ANNOTATION_VALUES
from .printing import format_line, format_node, to_table, to_text

__all__ = ["format_line", "format_node", "parse_text", "to_table", "to_text"]


# --------------------------------------------------------------------------- parser

_TOKEN = re.compile(
    r"""(?P<space>[ \t\r]+)
      | (?P<comment>\#[^\n]*)
      | (?P<newline>\n)
      | (?P<value>%[A-Za-z_][A-Za-z0-9_]*)
      | (?P<string>"[^"\n]*")
      | (?P<float>-?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+|-?[0-9]+\.[0-9]*)
      | (?P<int>-?[0-9]+)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<punct>[\[\],:={}])""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class _Token:
    kind: str  # value, string, int, ident, punct, end
    text: str
    line: int
    column: int


def _describe(token: _Token) -> str:
    return "end of input" if token.kind == "end" else repr(token.text)


class _Parser:
    def __init__(self, text: str) -> None:
        self.source_lines = text.split("\n")
        self.tokens = self._tokenize(text)
        self.position = 0

    def error(self, token: _Token, message: str) -> ParseError:
        source = self.source_lines[token.line - 1] if token.line <= len(self.source_lines) else ""
        caret = " " * (token.column - 1) + "^"
        return ParseError(f"line {token.line}, column {token.column}: {message}\n    {source}\n    {caret}")

    def _tokenize(self, text: str) -> list[_Token]:
        tokens: list[_Token] = []
        line, line_start, offset = 1, 0, 0
        while offset < len(text):
            match = _TOKEN.match(text, offset)
            if match is None:
                bad = _Token("char", text[offset], line, offset - line_start + 1)
                raise self.error(bad, f"unexpected character {text[offset]!r}")
            kind = match.lastgroup or ""
            if kind == "newline":
                line, line_start = line + 1, match.end()
            elif kind not in ("space", "comment"):
                tokens.append(_Token(kind, match.group(), line, offset - line_start + 1))
            offset = match.end()
        tokens.append(_Token("end", "", line, offset - line_start + 1))
        return tokens

    def peek(self) -> _Token:
        return self.tokens[self.position]

    def take(self, kind: str, what: str, text: str | None = None) -> _Token:
        token = self.peek()
        if token.kind != kind or (text is not None and token.text != text):
            raise self.error(token, f"expected {what}, found {_describe(token)}")
        self.position += 1
        return token

    def punct(self, symbol: str, context: str) -> None:
        self.take("punct", f"'{symbol}' {context}", symbol)

    def shape(self, context: str) -> tuple[int, ...]:
        self.punct("[", f"to open the shape {context}")
        dims = []
        while True:
            token = self.take("int", f"a dimension (positive integer) in the shape {context}")
            if int(token.text) <= 0:
                raise self.error(
                    token, f"expected a positive dimension in the shape {context}, found {token.text}"
                )
            dims.append(int(token.text))
            if self.peek().text == "]":
                self.position += 1
                return tuple(dims)
            self.punct(",", f"or ']' in the shape {context}")

    def dtype(self, context: str) -> str:
        token = self.take("ident", f"a dtype (bfloat16, float32) {context}")
        try:
            return canonical_dtype(token.text)
        except NmmcError as err:
            raise self.error(token, f"expected a dtype {context}: {err}") from None

    def value(self, defined: Mapping[str, int], context: str) -> str:
        token = self.take("value", f"a value (%name) {context}")
        node_id = token.text[1:]
        if node_id not in defined:
            raise self.error(token, f"{token.text} is not defined (values must be defined above their use)")
        return node_id

    def string(self, context: str) -> str:
        return self.take("string", f'a quoted name ("...") {context}').text[1:-1]

    def parse(self) -> Graph:
        self.take("ident", "'graph' to start the graph", "graph")
        name_token = self.take("ident", "the graph's name after 'graph'")
        try:
            graph = Graph(name_token.text)
        except NmmcError as err:
            raise self.error(name_token, str(err)) from None
        self.punct("{", "after the graph's name")
        defined: dict[str, int] = {}
        while not (self.peek().kind == "punct" and self.peek().text == "}"):
            self.statement(graph, defined)
        self.position += 1
        self.take("end", "end of input after the closing '}'")
        return graph

    def statement(self, graph: Graph, defined: dict[str, int]) -> None:
        target = self.take("value", "a statement '%name = ...' or the closing '}'")
        node_id = target.text[1:]
        if node_id in defined:
            raise self.error(target, f"{target.text} is defined twice (first on line {defined[node_id]})")
        self.punct("=", f"after {target.text}")
        kinds = ", ".join(NodeKind)
        kind_token = self.take("ident", f"an op ({kinds})")
        kind = NodeKind.lookup(kind_token.text)
        if kind is None:
            raise self.error(kind_token, f"expected an op ({kinds}), found {kind_token.text!r}")
        context = f"of {kind} {target.text}"
        if kind == NodeKind.INPUT:
            self.input_statement(graph, node_id, context, kind_token)
        elif kind == NodeKind.OUTPUT:
            name = self.string(context)
            operand = self.value(defined, context)
            layout = self.layout(context)
            self.build(kind_token, lambda: graph.add_output(name, operand, layout=layout, id=node_id))
        else:
            self.computed_statement(graph, node_id, kind, kind_token, defined)
        if not kind.is_compute and self.peek().text == "{" and self.peek().kind == "punct":
            raise self.error(
                self.peek(), f"{kind} {target.text} cannot carry annotations; only compute nodes "
                f"({', '.join(COMPUTE_KINDS)}) do",
            )
        defined[node_id] = target.line

    def build(self, token: _Token, action: Callable[[], object]) -> None:
        try:
            action()
        except NmmcError as err:
            raise self.error(token, str(err)) from None

    def input_statement(self, graph: Graph, node_id: str, context: str, kind_token: _Token) -> None:
        name = self.string(context)
        shape = self.shape(context)
        dtype = self.dtype(context)
        layout = self.layout(context)
        self.build(kind_token, lambda: graph.add_input(name, shape, dtype, layout, id=node_id))

    def layout(self, context: str) -> str:
        """An optional ``layout=LAYOUT`` (row_major when absent; the graph checks the value)."""
        if not (self.peek().kind == "ident" and self.peek().text == "layout"):
            return Layout.ROW_MAJOR
        self.position += 1
        self.punct("=", "after 'layout'")
        return self.take("ident", f"a layout ({', '.join(LAYOUTS)}) {context}").text

    def annotations(self, context: str) -> dict[str, tuple[str, _Token]]:
        """An optional ``{key=value, ...}``: each key with its value and the value's token."""
        found: dict[str, tuple[str, _Token]] = {}
        if not (self.peek().kind == "punct" and self.peek().text == "{"):
            return found
        self.position += 1
        keys = ", ".join(ANNOTATION_VALUES)
        while True:
            key_token = self.take("ident", f"an annotation key ({keys}) {context}")
            if key_token.text not in ANNOTATION_VALUES:
                raise self.error(key_token, f"expected an annotation key ({keys}), found {key_token.text!r}")
            if key_token.text in found:
                raise self.error(key_token, f"annotation {key_token.text!r} is given twice {context}")
            self.punct("=", f"after the annotation key {key_token.text!r}")
            value_token = self.take("ident", f"a value (an identifier) for annotation {key_token.text!r}")
            found[key_token.text] = (value_token.text, value_token)
            if self.peek().text == "}" and self.peek().kind == "punct":
                self.position += 1
                return found
            self.punct(",", f"or '}}' in the annotations {context}")

    def computed_statement(
        self, graph: Graph, node_id: str, kind: NodeKind, kind_token: _Token, defined: Mapping[str, int]
    ) -> None:
        op: ElementwiseOp | NormOp | None = None
        if kind == NodeKind.ELEMENTWISE:
            known = ", ".join(ElementwiseOp)
            op_token = self.take("ident", f"an elementwise op ({known})")
            op = ElementwiseOp.lookup(op_token.text)
            if op is None:
                raise self.error(op_token, f"expected an elementwise op ({known}), found {op_token.text!r}")
        elif kind == NodeKind.NORM:
            known = ", ".join(NormOp)
            op_token = self.take("ident", f"a normalization ({known})")
            op = NormOp.lookup(op_token.text)
            if op is None:
                raise self.error(op_token, f"expected a normalization ({known}), found {op_token.text!r}")
        head = f"{kind} {op}" if op else str(kind)
        context = f"of {head} %{node_id}"
        operands = [self.value(defined, context)]
        while self.peek().text == ",":
            self.position += 1
            operands.append(self.value(defined, context))
        eps = 0.0
        if isinstance(op, NormOp):
            if len(operands) > op.max_operands:
                raise self.error(kind_token, f"expected 1 to {op.max_operands} operand(s) for {head} (the value, "
                                             f"then gamma{', beta' if op.max_operands == 3 else ''}), found "
                                             f"{len(operands)}")
            self.take("ident", f"'eps=' {context}", "eps")
            self.punct("=", "after 'eps'")
            eps_token = self.take("float", f"a float (e.g. 1e-06) for eps {context}")
            eps = float(eps_token.text)
        else:
            arity = op.arity if op else kind.arity
            if len(operands) != arity:
                raise self.error(kind_token, f"expected {arity} operand(s) for {head}, found {len(operands)}")
        fp8_attrs: dict[str, str] = {}
        row_format = None
        if op == ElementwiseOp.ROW_SCALE:
            self.take("ident", f"'format=' {context}", "format")
            self.punct("=", "after 'format'")
            row_format = self.dtype(context)
        if kind == NodeKind.MATMUL and self.peek().text == "act_scale":
            for key in ("act_scale", "w_scale"):
                self.take("ident", f"'{key}=' {context}", key)
                self.punct("=", f"after '{key}'")
                fp8_attrs[key] = self.take("ident", f"a value of {key} {context}").text
        self.punct(":", f"before the result type {context}")
        shape = self.shape(context)
        dtype = self.dtype(context)
        annotations = self.annotations(context)
        if kind == NodeKind.MATMUL:
            self.build(kind_token, lambda: graph.add_matmul(*operands, id=node_id, **fp8_attrs))
        elif kind == NodeKind.TRANSPOSE:
            self.build(kind_token, lambda: graph.add_transpose(*operands, id=node_id))
        elif isinstance(op, NormOp):
            self.build(kind_token, lambda: graph.add_norm(op, *operands, eps=eps, id=node_id))
        else:
            named = isinstance(op, ElementwiseOp) and (op.scaled or op == ElementwiseOp.QUANTIZE_MX)  # its format
            result = row_format or (dtype if named else None)
            self.build(kind_token, lambda: graph.add_elementwise(op, *operands, id=node_id, dtype=result))
        node = graph.node(node_id)
        if (node.shape, node.dtype) != (shape, dtype):
            raise self.error(
                kind_token,
                f"%{node_id} is annotated {format_shape(shape)} {dtype} but its operands give "
                f"{format_shape(node.shape)} {node.dtype}",
            )
        for key, (value, token) in annotations.items():
            self.build(token, lambda key=key, value=value: graph.annotate(node_id, **{key: value}))


def parse_text(text: str) -> Graph:
    """Parse the text form back into a :class:`Graph`; ParseError says the line and what was expected."""
    return _Parser(text).parse()
