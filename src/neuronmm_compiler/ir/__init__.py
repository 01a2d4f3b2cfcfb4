"""The graph IR: typed op nodes in a networkx DiGraph, its text form, verifier and NumPy evaluator."""

from .evaluate import evaluate
from .frontends import A_LAYOUTS, gemm_graph, parse_shape
from .graph import (
    DTYPE_ALIASES,
    DTYPES,
    ELEMENTWISE_ARITY,
    KINDS,
    LAYOUTS,
    Graph,
    Node,
    canonical_dtype,
    format_shape,
)
from .text import format_node, parse_text, to_table, to_text
from .verify import verify

__all__ = [
    "A_LAYOUTS",
    "DTYPES",
    "DTYPE_ALIASES",
    "ELEMENTWISE_ARITY",
    "KINDS",
    "LAYOUTS",
    "Graph",
    "Node",
    "canonical_dtype",
    "evaluate",
    "format_node",
    "format_shape",
    "gemm_graph",
    "parse_shape",
    "parse_text",
    "to_table",
    "to_text",
    "verify",
]
