"""Real models: read their shapes (``config.json``) and compress their MLP weights with block-aligned SVD.

- :func:`read_config` / :class:`ModelConfig`: a Hugging Face config (llama, qwen2, qwen3) as nmmc sees it;
  :func:`known_config` is the shipped config of a model nmmc is measured on; :func:`mlp_weight_names`
  names a layer's gate/up/down weights in the model's safetensors.
- :func:`compress_model`: factor every MLP weight into ``u @ v`` at the NeuronMM block-aligned rank,
  one safetensors file per layer plus ``manifest.json`` (:class:`Manifest`, :func:`read_manifest`).

``docs/compression.md`` describes the method and the file format;
``benchmarks/results/compression-runs.md`` holds the measured SVD accuracy.
"""

from .compress import compress_model, plan_ranks
from .config import (
    KNOWN_MODELS,
    PROJECTIONS,
    ModelConfig,
    known_config,
    mlp_weight_names,
    projection_shape,
    read_config,
)
from .manifest import LayerEntry, Manifest, ProjectionEntry, factor_names, layer_file, read_manifest

__all__ = [
    "KNOWN_MODELS",
    "PROJECTIONS",
    "LayerEntry",
    "Manifest",
    "ModelConfig",
    "ProjectionEntry",
    "compress_model",
    "factor_names",
    "known_config",
    "layer_file",
    "mlp_weight_names",
    "plan_ranks",
    "projection_shape",
    "read_config",
    "read_manifest",
]
