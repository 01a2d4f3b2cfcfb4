"""Model checkpoints as nmmc reads them: a Hugging Face ``config.json`` (:mod:`.config`: llama, qwen2, qwen3; the
shipped configs of the models nmmc is measured on, ``configs/*.json``) and its safetensors weights (:mod:`.weights`:
one tensor at a time, checked against the config; factor files written atomically).

Everything model-level (compression, ``tune --model``, export, tensor parallelism) reads checkpoints through here;
this package imports only the package root.
"""

from .config import (
    KNOWN_MODELS,
    PROJECTIONS,
    ModelConfig,
    known_config,
    mlp_weight_names,
    projection_shape,
    read_config,
)

__all__ = ["KNOWN_MODELS", "PROJECTIONS", "ModelConfig", "known_config", "mlp_weight_names", "projection_shape",
           "read_config"]
