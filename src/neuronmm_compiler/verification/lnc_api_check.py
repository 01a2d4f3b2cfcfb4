"""The static checks of NKI 0.8.0's API moves (Neuron 2.34), for :mod:`.static_check`: ``nki.lnc`` (NKI-LNC-MODULE,
absent before 2.34), the deprecated ``nki.isa`` LNC functions (NKI-ISA-LNC-DEPRECATED) and VirtualRegister API
(NKI-VIRTUAL-REGISTER), and ``local_gather`` without ``num_valid_indices`` (NKI-LOCAL-GATHER-VALID). Each reports
through the checker, which keeps only the rules that apply to the dialect, target and SDK release."""

from __future__ import annotations

import ast
from typing import Any

from .kernel_ast import kwarg
from .rules import ISA_LNC_FUNCTIONS, VIRTUAL_REGISTER_API

#: The spellings of NKI 0.3+'s ISA module in a kernel (its alias, or the full name under ``import nki``).
ISA_MODULES = frozenset(("nisa", "nki.isa"))
#: ``nisa.local_gather``'s positional index of ``num_valid_indices`` (SDK 2.32 API reference, local_gather).
LOCAL_GATHER_VALID_POSITION = 4


def dotted(node: ast.AST | None) -> str | None:
    """``nki.isa`` for the expression ``nki.isa``; None for anything but names and attributes."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def check_import(checker: Any, node: ast.AST, module: str) -> None:
    if module == "nki.lnc":
        checker.report("NKI-LNC-MODULE", node, "'import nki.lnc' on a Neuron SDK before 2.34, which has no nki.lnc")


def check_attribute(checker: Any, node: ast.Attribute) -> None:
    if node.attr == "lnc" and dotted(node.value) == "nki":
        checker.report("NKI-LNC-MODULE", node, "nki.lnc on a Neuron SDK before 2.34, which has no nki.lnc (use "
                       "nisa.sendrecv(..., pipe_id=0))")
    if node.attr in VIRTUAL_REGISTER_API and dotted(node.value) in ISA_MODULES:
        checker.report("NKI-VIRTUAL-REGISTER", node, f"nisa.{node.attr} is deprecated from NKI 0.8.0 (use "
                       "nisa.scalar_load / scalar_store)")


def check_call(checker: Any, node: ast.Call, name: str | None) -> None:
    """A call of the nki dialect: a deprecated nisa LNC function, or local_gather without num_valid_indices."""
    if dotted(getattr(node.func, "value", None)) not in ISA_MODULES:
        return
    if name in ISA_LNC_FUNCTIONS:
        checker.report("NKI-ISA-LNC-DEPRECATED", node, f"nisa.{name} is deprecated from NKI 0.8.0 (SDK 2.34): use "
                       f"nki.lnc.{name}" + (" without pipe_id" if name == "sendrecv" else ""))
    if name == "local_gather":
        valid = kwarg(node, "num_valid_indices", LOCAL_GATHER_VALID_POSITION)
        if valid is None or (isinstance(valid, ast.Constant) and valid.value is None):
            checker.report("NKI-LOCAL-GATHER-VALID", node, "nisa.local_gather without num_valid_indices: undefined "
                           "results from NKI 0.8.0")
