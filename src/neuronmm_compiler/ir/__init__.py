"""The graph IR: typed op nodes in a networkx DiGraph, its text form, verifier and NumPy evaluator."""

from .evaluate import evaluate
from .graph import (
    COMPUTE_KINDS,
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
from .node import ANNOTATION_VALUES, ORIENTS, PLACES
from .text import format_node, parse_text, to_table, to_text
from .verify import verify

__all__ = [
    "ANNOTATION_VALUES",
    "COMPUTE_KINDS",
    "DTYPES",
    "DTYPE_ALIASES",
    "ELEMENTWISE_ARITY",
    "KINDS",
    "LAYOUTS",
    "ORIENTS",
    "PLACES",
    "Graph",
    "Node",
    "canonical_dtype",
    "evaluate",
    "format_node",
    "format_shape",
    "parse_text",
    "to_table",
    "to_text",
    "verify",
]
