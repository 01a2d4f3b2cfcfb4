"""``nmmc export``: a model's MLP kernels as an importable Python package that drops them into a PyTorch model.

:mod:`.build` tunes one kernel (or one tensor-parallel plan) per token bucket and writes the package: the kernel
files, ``manifest.json`` (:mod:`.manifest`, with its JSON Schema), and the runtime modules of :mod:`.runtime`
copied verbatim (``weights``, ``module``, ``ops``: every kernel a PyTorch custom operator, ``patch``, ``backend``,
``llama``), which read the manifest.
:mod:`.verify` checks an export (or a ``tune --model`` directory) kernel by kernel (``nmmc verify DIR``).
docs/integration.md is the user's guide.
"""

from __future__ import annotations

from .build import ExportRequest, export_model

__all__ = ["ExportRequest", "export_model"]
