"""Which modules of a model this package replaces: every ``<...>.layers.<i>`` decoder layer whose ``mlp`` is a gated
MLP of Hugging Face transformers (``LlamaMLP``, ``Qwen3MLP``, ...) or NxD Inference (``NeuronLlamaMLP``), found by
class name so that neither library is imported here.

Part of a package written by ``nmmc export``.
"""

from __future__ import annotations

import re

from torch import nn

#: MLP classes this package replaces: Hugging Face transformers' and NxD Inference's gated MLPs.
HF_MLPS = ("LlamaMLP", "Qwen3MLP", "Qwen2MLP", "MistralMLP")
NXDI_MLPS = ("NeuronLlamaMLP",)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)$")


def mlp_layers(model: nn.Module) -> list[tuple[int, nn.Module, nn.Module]]:
    """(layer index, decoder layer, its MLP) of every decoder layer with a gated MLP this package replaces."""
    found = []
    for name, module in model.named_modules():
        match = _LAYER.search(name)
        mlp = getattr(module, "mlp", None)
        if match and mlp is not None and type(mlp).__name__ in (*HF_MLPS, *NXDI_MLPS):
            found.append((int(match.group(1)), module, mlp))
    return found
