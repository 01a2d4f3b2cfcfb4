"""Replace the gated-MLP modules of a model by this package's :class:`.module.NmmcMLP`, loading the converted
weights layer by layer.

Which modules: every ``<...>.layers.<i>`` decoder layer whose ``mlp`` is a gated MLP this package was exported
for: Hugging Face transformers' ``LlamaMLP``/``Qwen3MLP``/``Qwen2MLP`` (replaced by :class:`.module.NmmcMLP`,
``forward(x) -> y``; the module for TorchNeuron and CPU checks) and NxD Inference's ``NeuronLlamaMLP``, which its
Llama and Qwen3 decoder layers use (replaced by :class:`.module.NeuronNmmcMLP`, ``forward(x, rmsnorm, residual,
adapter_ids) -> (y, residual)``; legacy: NxD Inference is in maintenance for trn1/inf2 only since Neuron 2.34).
The module is found by its class name and its ``hidden_size``/``intermediate_size``, so neither transformers nor
NxD Inference is imported here.

Tensor parallelism: each rank's process patches its own model (``rank`` defaults to NxD's tensor-parallel rank
when neuronx-distributed is initialized, else torch.distributed's rank; ``all_reduce`` to
:func:`.module.default_all_reduce`). On the CPU, ``emulate_tp=True`` puts all ranks in one process: each layer's
MLP becomes :class:`EmulatedGroup`, which runs every rank's kernels one rank after the other up to each
collective and sums their partial outputs there (no threads, so it traces under ``torch.compile`` too).

Part of a package written by ``nmmc export``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from .backend import KernelRunner
from .layers import HF_MLPS, NXDI_MLPS, mlp_layers
from .module import AllReduce, NeuronNmmcMLP, NmmcMLP
from .weights import TensorSource, layer_arguments, layer_group


def tp_rank() -> int:
    """This process's tensor-parallel rank: NxD's when neuronx-distributed's parallel state is initialized (legacy
    NxD Inference), else torch.distributed's rank when it is initialized, else 0."""
    try:
        from neuronx_distributed.parallel_layers import parallel_state
    except ImportError:
        pass
    else:
        if parallel_state.model_parallel_is_initialized():
            return parallel_state.get_tensor_model_parallel_rank()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


class EmulatedGroup(nn.Module):
    """All tensor-parallel ranks of one MLP in one process (a CPU check): ``forward`` runs every rank's kernels,
    rank after rank, up to each collective, where the partial outputs are summed (in float32, rounded to the
    partials' dtype, as a bf16 all-reduce delivers them) and every rank continues with the sum. The first rank's
    module does the work (its ``peers`` are all ranks); the others hold their weights."""

    def __init__(self, ranks: list[NmmcMLP]) -> None:
        super().__init__()
        self.ranks = nn.ModuleList(ranks)
        ranks[0].peers = tuple(ranks)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.ranks[0](*args, **kwargs)


def check_mlp_form(index: int, mlp: nn.Module) -> None:
    """ValueError when layer ``index``'s MLP is not the one the kernels compute: an activation other than SiLU
    (Hugging Face's ``act_fn``, ``ACT2FN[config.hidden_act]``, a class of transformers' own such as
    ``SiLUActivation``, so compared by its values) or biases on its projections."""
    act = getattr(mlp, "act_fn", None)
    probe = torch.linspace(-4.0, 4.0, 17)
    if act is not None and not torch.allclose(act(probe), torch.nn.functional.silu(probe)):
        raise ValueError(f"layer {index}: the MLP's activation is {type(act).__name__}; the package's kernels "
                         "compute silu(gate) * up (nmmc refuses such a config at export)")
    if any(getattr(getattr(mlp, p, None), "bias", None) is not None for p in ("gate_proj", "up_proj", "down_proj")):
        raise ValueError(f"layer {index}: the MLP's projections have biases; the package's kernels have none")


def patch_model(model: nn.Module, weights: str | Path, *, manifest: dict[str, Any], root: Path,
                rank: int | None = None, all_reduce: AllReduce | None = None, backend: str = "auto",
                emulate_tp: bool = False, activation_scales: Any = None, calibration: Any = None) -> list[int]:
    """Replace every gated MLP of ``model`` (see the module docstring) by the exported kernels, with the weights
    of ``weights`` (a Hugging Face checkpoint directory for a dense export, an ``nmmc compress`` output for an SVD
    or per-layer one) converted for ``rank``, each layer with its group's kernels; the layers patched.
    ``emulate_tp``: all ranks in this process (CPU checks). FP8 kernels whose weights come from a checkpoint need
    static activation scales: ``activation_scales`` (layer -> point -> scale, or a JSON file of
    :func:`.fp8.save_scales`), or ``calibration`` token ids (a tensor or batches of them), run through ``model``
    before it is patched (:func:`.fp8.calibrate`)."""
    layers = mlp_layers(model)
    if not layers:
        raise ValueError(f"no gated MLP of {', '.join(HF_MLPS + NXDI_MLPS)} found under a 'layers.<i>' module")
    for index, _, mlp in layers:
        check_mlp_form(index, mlp)
    if manifest["weights"].get("activation_scales") == "calibration":
        from .fp8 import calibrate, load_scales

        if activation_scales is None and calibration is None:
            raise ValueError("this package's FP8 kernels quantize activations with static scales calibrated on the "
                             "unpatched model: pass calibration= (token ids) or activation_scales=")
        fmt = next(g["weights_dtype"] for g in manifest["groups"].values() if g["weights_dtype"].startswith("float8"))
        activation_scales = load_scales(activation_scales) if activation_scales is not None else \
            calibrate(model, calibration, fmt)
    model_info = manifest["model"]
    tp = manifest["tp"]["degree"]
    source = TensorSource(weights, manifest["weights"]["from"])
    runner = KernelRunner(root, manifest)
    ranks = list(range(tp)) if emulate_tp else [tp_rank() if rank is None else rank]
    for index, layer, mlp in layers:
        sizes = (getattr(mlp, "hidden_size", None), getattr(mlp, "intermediate_size", None))
        if sizes != (model_info["hidden_size"], model_info["intermediate_size"]):
            raise ValueError(f"layer {index}: MLP of hidden/intermediate {sizes}, the package was exported for "
                             f"{model_info['hidden_size']}/{model_info['intermediate_size']}")
        if index >= model_info["num_hidden_layers"]:
            raise ValueError(f"layer {index}: the model the package was exported for has "
                             f"{model_info['num_hidden_layers']} layers")
        cls = NeuronNmmcMLP if type(mlp).__name__ in NXDI_MLPS else NmmcMLP
        modules = []
        for r in ranks:
            module = cls(manifest, runner, rank=r, all_reduce=all_reduce, backend=backend,
                         group=layer_group(manifest, index))
            module.load(layer_arguments(manifest, source, index, r, activation_scales))
            modules.append(module)
        replacement: nn.Module = EmulatedGroup(modules) if emulate_tp and tp > 1 else modules[0]
        device = next((p.device for p in mlp.parameters()), None)
        layer.mlp = replacement.to(device) if device is not None else replacement
    return [index for index, _, _ in layers]
