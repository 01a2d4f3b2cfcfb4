"""The graph IR: typed op nodes in a networkx DiGraph, its text form, verifier and NumPy evaluator."""

from .evaluate import evaluate
from .frontends import A_LAYOUTS, block_aligned_rank, gemm_graph, mlp_graph, parse_shape, svd_chain_graph
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
    "A_LAYOUTS",
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
    "block_aligned_rank",
    "canonical_dtype",
    "evaluate",
    "format_node",
    "format_shape",
    "gemm_graph",
    "mlp_graph",
    "parse_shape",
    "parse_text",
    "svd_chain_graph",
    "to_table",
    "to_text",
    "verify",
]
