"""Graph passes and the pipeline driver; importing this package registers every pass."""

from . import canonicalize, fold_transposes, fuse, group_epilogues, implicit_transpose, place, quantize_fp8, quantize_mx
from .base import (
    Pass,
    PipelineResult,
    PipelineStep,
    get_pass,
    parse_pipeline,
    register_pass,
    registered_passes,
    run_pipeline,
)
from .canonicalize import Canonicalize
from .fold_transposes import FoldTransposes
from .fuse import MLP_MODES, Fuse
from .group_epilogues import GroupEpilogues
from .implicit_transpose import ImplicitTranspose
from .place import Place
from .quantize_fp8 import QuantizeFp8
from .quantize_mx import QuantizeMx
from .split import kernel_order, split_kernels

#: The pipeline nmmc runs by default before scheduling.
DEFAULT_PIPELINE = "canonicalize,fold-transposes,canonicalize"
#: The pipeline for fused (multi-matmul) graphs: the activations of FP8- and MX-weight matmuls quantized, the default
#: one, then orientation, kernels, placement, and the groups each kernel evaluates on one PSUM eviction.
DEFAULT_FUSION_PIPELINE = ("quantize-mx,quantize-fp8,canonicalize,fold-transposes,canonicalize,implicit-transpose,fuse,"
                           "place,group-epilogues")

__all__ = [
    "DEFAULT_FUSION_PIPELINE",
    "DEFAULT_PIPELINE",
    "MLP_MODES",
    "Canonicalize",
    "FoldTransposes",
    "Fuse",
    "GroupEpilogues",
    "ImplicitTranspose",
    "Pass",
    "PipelineResult",
    "PipelineStep",
    "Place",
    "QuantizeFp8",
    "QuantizeMx",
    "canonicalize",
    "fold_transposes",
    "fuse",
    "get_pass",
    "group_epilogues",
    "implicit_transpose",
    "kernel_order",
    "parse_pipeline",
    "place",
    "quantize_fp8",
    "quantize_mx",
    "register_pass",
    "registered_passes",
    "run_pipeline",
    "split_kernels",
]
