"""The static check of ``nisa.dma_transpose`` shapes (rule NKI-DMA-TRANSPOSE-SHAPE of
:mod:`~neuronmm_compiler.verification.rules`), for :mod:`.static_check`: the DGE mode on a static access pattern, the
source's last dimension, the hardware DGE's row counts, and ``dst`` being the source transposed, where the source
shows constant widths."""

from __future__ import annotations

import ast
from typing import Any

from .kernel_ast import attr_name, kwarg
from .rules import DMA_TRANSPOSE_MAX_LAST, DMA_TRANSPOSE_STATIC_MODES, HWDGE_ROWS, HWDGE_ROWS_ND


def check_dma_transpose_shape(checker: Any, node: ast.Call) -> None:
    """Report NKI-DMA-TRANSPOSE-SHAPE on a ``dma_transpose`` call through ``checker`` (the static checker: its
    ``report`` and ``_operand_widths``); see the rule's note."""
    src_node, mode_node = kwarg(node, "src", 1), kwarg(node, "dge_mode")
    if isinstance(src_node, ast.Call):  # src.ap(...): an access pattern, possibly indirect; not checked
        return
    mode = attr_name(mode_node) if mode_node is not None else "unknown"
    if mode not in DMA_TRANSPOSE_STATIC_MODES:
        checker.report("NKI-DMA-TRANSPOSE-SHAPE", node, f"dge_mode {mode} on a static access pattern (allowed: "
                       f"{', '.join(DMA_TRANSPOSE_STATIC_MODES)})")
    src = checker._operand_widths(src_node)
    if not src:
        return
    first, last = src[0], src[-1]
    if last is not None and last > DMA_TRANSPOSE_MAX_LAST:
        checker.report("NKI-DMA-TRANSPOSE-SHAPE", node, f"dma_transpose source last dimension {last} > "
                       f"{DMA_TRANSPOSE_MAX_LAST}")
    if mode == "hwdge":
        rows_ok = first == HWDGE_ROWS if len(src) == 2 else first in HWDGE_ROWS_ND and (
            src[-2] is None or first * src[-2] % HWDGE_ROWS == 0)  # type: ignore[operator]
        if first is not None and not rows_ok:
            checker.report("NKI-DMA-TRANSPOSE-SHAPE", node, f"hardware-DGE dma_transpose of a {len(src)}-D source "
                           f"with src.shape[0] == {first}" + (f" (must be {HWDGE_ROWS})" if len(src) == 2 else ""))
        if last is not None and last % DMA_TRANSPOSE_MAX_LAST:
            checker.report("NKI-DMA-TRANSPOSE-SHAPE", node, f"hardware-DGE dma_transpose source last dimension "
                           f"{last} is not a multiple of {DMA_TRANSPOSE_MAX_LAST}")
    dst = checker._operand_widths(kwarg(node, "dst", 0))
    if dst is not None and len(src) == len(dst) == 2 and None not in src + dst and dst != src[::-1]:
        checker.report("NKI-DMA-TRANSPOSE-SHAPE", node, f"dma_transpose dst shape {list(dst)} is not the source "
                       f"shape {list(src)} transposed")
