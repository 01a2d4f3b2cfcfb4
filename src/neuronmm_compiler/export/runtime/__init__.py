"""nmmc's MLP kernels for one model, packaged by ``nmmc export``: ``manifest.json`` says which kernels exist (per
token bucket, per tensor-parallel rank), how to launch them and which weights they take.

    import my_export as pkg
    pkg.patch(model, "/path/to/checkpoint")         # replace every gated MLP, weights converted on the way
    mlp = pkg.mlp("/path/to/checkpoint", layer=0)    # or one module, to place yourself
    pkg.weights.rank_state_dict(pkg.manifest(), "/path/to/checkpoint", rank=1)   # a rank's converted tensors
    pkg.ops.run_rank(group, tokens, rank, x, weights)   # one rank's partial output, for a serving router

Every kernel is a PyTorch custom operator (``torch.ops.nmmc.*``, :mod:`.ops`), so a patched model compiles with
``torch.compile(fullgraph=True)``, each kernel one node of the graph. On a Neuron device (TorchNeuron) the kernels run
through ``nki.jit`` (AWS's ``nki`` package), launched on the manifest's logical-core degree; on the CPU through
nmmc's interpreter (``pip install nmmc``). docs/integration.md in nmmc's repository is the guide.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from . import backend, fp8, module, mx, ops, weights
from . import patch as _patch
from .module import AllReduce, NeuronNmmcMLP, NmmcMLP

ROOT = Path(__file__).resolve().parent

__all__ = ["ROOT", "NeuronNmmcMLP", "NmmcMLP", "backend", "fp8", "manifest", "mlp", "module", "mx", "ops", "patch",
           "runner", "weights"]


@functools.cache
def manifest() -> dict[str, Any]:
    """This package's manifest.json."""
    return json.loads((ROOT / "manifest.json").read_text(encoding="utf-8"))


@functools.cache
def runner() -> backend.KernelRunner:
    """The kernel runner of this package (one per process: it caches the loaded kernel files)."""
    return backend.KernelRunner(ROOT, manifest())


def mlp(weights_dir: str | Path, layer: int, *, rank: int = 0, all_reduce: AllReduce | None = None,
        backend: str = "auto", neuron_signature: bool = False,
        activation_scales: dict[int, dict[str, float]] | None = None) -> NmmcMLP:
    """The MLP module of decoder layer ``layer`` (its group's kernels) for tensor-parallel rank ``rank``, its
    weights read from ``weights_dir`` (NxD Inference's forward signature with ``neuron_signature``: legacy;
    ``activation_scales``: FP8 kernels' static scales when the weights come from a checkpoint,
    :func:`.fp8.calibrate`)."""
    cls = NeuronNmmcMLP if neuron_signature else NmmcMLP
    made = cls(manifest(), runner(), rank=rank, all_reduce=all_reduce, backend=backend,
               group=weights.layer_group(manifest(), layer))
    made.load(weights.layer_arguments(manifest(), weights_dir, layer, rank, activation_scales))
    return made


def patch(model: Any, weights_dir: str | Path, *, rank: int | None = None, all_reduce: AllReduce | None = None,
          backend: str = "auto", emulate_tp: bool = False, activation_scales: Any = None,
          calibration: Any = None) -> list[int]:
    """Replace the gated MLPs of ``model`` (Hugging Face Llama/Qwen3, or NxD Inference's: legacy) by this package's
    kernels;
    the layers patched. See :func:`.patch.patch_model` (FP8 from a checkpoint: ``calibration`` token ids or
    ``activation_scales``)."""
    return _patch.patch_model(model, weights_dir, manifest=manifest(), root=ROOT, rank=rank, all_reduce=all_reduce,
                              backend=backend, emulate_tp=emulate_tp, activation_scales=activation_scales,
                              calibration=calibration)
