"""``nmmc compress``: a model's MLP weights compressed with block-aligned SVD (and FP8 or dense FP8 layers).

- :func:`compress_model`: factor every MLP weight into ``u @ v`` at the NeuronMM block-aligned rank,
  one safetensors file per layer plus ``manifest.json`` (:class:`Manifest`, :func:`read_manifest`);
- :mod:`.workflow`: the command end to end (calibration, whitening, rank and format choice, healing, fine-tuning,
  measured quality); the checkpoint it reads comes from :mod:`neuronmm_compiler.checkpoints`.

``docs/compression.md`` describes the method and the file format;
``benchmarks/results/compression-runs.md`` holds the measured SVD accuracy.
"""

from .compress import compress_model, plan_ranks
from .manifest import LayerEntry, Manifest, ProjectionEntry, factor_names, layer_file, read_manifest

__all__ = [
    "LayerEntry",
    "Manifest",
    "ProjectionEntry",
    "compress_model",
    "factor_names",
    "layer_file",
    "plan_ranks",
    "read_manifest",
]
