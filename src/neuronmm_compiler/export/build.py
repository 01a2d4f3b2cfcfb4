"""Build an export package: one tuned kernel (tensor parallelism: one plan of per-rank kernels) per token bucket,
the manifest that says how to call them, and the runtime modules that do (docs/integration.md).

The package directory::

    __init__.py backend.py layers.py weights.py fp8.py module.py ops.py patch.py llama.py   the runtime (copied)
    kernels/<group>/t<T>/mlp.py                                  --tp 1: the bucket's kernel file
    kernels/<group>/t<T>/<role>.py, kernels/<group>/t<T>/plan.json   --tp N: a kernel file per rank role, the plan
    manifest.json, manifest.schema.json                          written last

Layers of different formats (dense or SVD ranks, bf16 or FP8 weights; an ``nmmc compress --choose-ranks``
output) need different kernels: the layers are grouped by (ranks, format) (:mod:`.groups`), each group has its own
buckets and kernels, and the manifest maps each layer to its group. Every bucket is described the same way whatever
the TP degree: per rank, the steps it runs (a kernel with its arguments bound to tensors, possibly slices of them,
or a collective), so the runtime has one code path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..codegen import read_metadata
from ..driver import Compiled
from ..errors import InputError
from ..frontends.mx import MxWeights
from ..frontends.shapes import Fp8Weights
from ..frontends.workloads import MlpWorkload, mlp_workload
from ..io import check_output_dir, write_dir_atomic
from ..ir.mx import MX_FORMATS, is_mx
from ..model_tuning.pipeline import ModelSource, activation_scales, sdk_range
from ..search import DEFAULT_TRIALS
from ..targets import Target
from ..tuning.speedups import launch_dict
from .groups import ExportGroup, export_groups, mx_tensor_source, tensor_source
from .manifest import FORMAT, MANIFEST_NAME, SCHEMA_FILE, VERSION, is_export, schema_text

#: The runtime modules copied into every package (export/runtime/).
RUNTIME_FILES = ("__init__.py", "backend.py", "layers.py", "weights.py", "fp8.py", "mx.py", "module.py", "ops.py",
                 "patch.py", "llama.py")
#: The tensor-parallel strategies an export takes: those whose every weight is a slice of the unsharded tensors
#: (the factor-shard strategies need per-shard factorisations, which the runtime does not load yet); a strategy whose
#: plan names a tensor of a rank's own (FP8 replicate-u/reduce-output's ``h_ud_scale.r<i>``) is skipped, saying why.
SLICE_STRATEGIES = ("megatron", "replicate-u/reduce-output", "replicate-u/reduce-rank")

KernelFn = Callable[[MlpWorkload], Compiled]


@dataclass(frozen=True)
class ExportRequest:
    """What to export: the model (a shipped name, a model directory or config.json, or an ``nmmc compress``
    output), the token buckets, the target (its spec carries the LNC and launch context), dialect, TP degree,
    compression (``keep_ratio``; a compress output gives its ranks; neither, or ``dense``: the dense MLP), the
    weights' ``dtype`` (None: the source's formats, else bf16; an FP8 format: FP8 kernels), the Neuron SDK release
    the kernels are emitted for (``sdk``; None: the newest of the dialect on the target), the search settings, and
    ``act_scale``: how FP8 kernels scale their activations (None: the source's, else static; ``row``: per token, in
    the kernel). ``dtype`` may name an OCP MX format (``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp4``: trn3 only)."""

    model: str
    buckets: tuple[int, ...]
    target: Target
    dialect: str
    tp: int = 1
    keep_ratio: float | None = None
    dense: bool = False
    dtype: str | None = None
    trials: int = DEFAULT_TRIALS
    seed: int = 0
    method: str | None = None
    cache_dir: str | None = None
    use_cache: bool = True
    sdk: str | None = None
    act_scale: str | None = None


def activation_dtype(request: ExportRequest) -> str:
    """The activations' dtype (x and the output): float32 for an fp32 export, else bfloat16 (FP8 kernels take and
    return bf16 activations and quantize on chip)."""
    return "float32" if request.dtype == "float32" else "bfloat16"


def export_model(request: ExportRequest, out_dir: str | Path, *, kernel_fn: KernelFn | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 extra_files: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Tune every bucket, then write the package into ``out_dir``; the manifest. ``kernel_fn`` compiles one
    workload (default: tuned with the request's search settings, answered from the result cache when it can be);
    ``extra_files`` (relative path -> text) are written with the package (``--serving``: export/serving.py);
    nothing is written before every bucket compiled."""
    out = check_output_dir(out_dir)
    if out.is_dir() and any(out.iterdir()) and not is_export(out):
        raise InputError(f"{str(out_dir)!r} exists and is neither empty nor an nmmc export package; name a new or "
                         "empty directory (an existing package is replaced as a whole)")
    activation = activation_dtype(request)
    act_scale = activation_scales(request.model, request.dense, () if request.dtype is None else (request.dtype,),
                                  request.act_scale)
    source, factors_dir, groups = export_groups(request.model, request.keep_ratio, request.dense, request.dtype,
                                                activation)
    if not request.buckets:
        raise InputError("--tokens needs at least one bucket")
    _check_formats(request, groups, act_scale, source.config.hidden_size, source.config.intermediate_size)
    if request.tp > 1 and source.config.intermediate_size % request.tp:
        raise InputError(f"--tp {request.tp} does not divide the intermediate size {source.config.intermediate_size}: "
                         "the ranks would get unequal slices and so different kernels, which the one graph every "
                         "rank runs (vLLM Neuron, NxD Inference) cannot hold; pick a --tp that divides it")
    if kernel_fn is None:
        from ..tensor_parallel.commands import tuned_kernels

        kernel_fn = tuned_kernels(request.target, request.dialect, trials=request.trials, seed=request.seed,
                                  method=request.method, exhaustive_threshold=None, cache_dir=request.cache_dir,
                                  use_cache=request.use_cache, sdk=request.sdk)
    files: dict[str, str] = {}
    c = source.config
    entries: dict[str, dict[str, Any]] = {}
    from_checkpoint = factors_dir is None and all(g.ranks is None for g in groups)
    steps = len(groups) * len(request.buckets)
    for g, group in enumerate(groups):
        buckets = []
        fp8 = Fp8Weights(group.weights, act_scale=act_scale) if group.fp8 else None
        mx = MxWeights(group.weights) if group.weights in MX_FORMATS else None
        for b, tokens in enumerate(sorted(request.buckets)):
            workload = mlp_workload(tokens, c.hidden_size, c.intermediate_size, ranks=group.ranks,
                                    dense=group.ranks is None, dtype=activation, fp8=fp8, mx=mx)
            directory = f"kernels/{group.name}/t{tokens}"
            if request.tp == 1:
                buckets.append(_one_core_bucket(workload, kernel_fn, request.target, files, directory))
            else:
                buckets.append(_tp_bucket(workload, request, kernel_fn, files, directory))
            if progress:
                progress(g * len(request.buckets) + b + 1, steps)
        entries[group.name] = _group(group, buckets, from_checkpoint, act_scale)
    manifest = _manifest(request, source, factors_dir, groups, entries, activation, act_scale)
    runtime = Path(__file__).parent / "runtime"
    for name in RUNTIME_FILES:
        files[name] = (runtime / name).read_text(encoding="utf-8")
    files[SCHEMA_FILE] = schema_text()
    files.update(extra_files or {})
    files[MANIFEST_NAME] = json.dumps(manifest, indent=2) + "\n"
    write_dir_atomic(out, files)  # a previous package in out is replaced as a whole, none of its files left
    commit = getattr(kernel_fn, "commit", None)
    if commit is not None:  # the searches go into the result cache only now: an interrupted export stores none
        commit()
    return manifest


def _check_formats(request: ExportRequest, groups: list[ExportGroup], act_scale: str, hidden: int,
                   intermediate: int) -> None:
    """Refuse, in one line and before any search, what the export does not build: an MX group on a target without
    nc_matmul_mx (rule NKI-MX-TARGET) or at shapes MX does not tile (contractions in multiples of 512), MX or
    per-token FP8 scales at --tp above 1 (neither is sharded: tensor_parallel/sharding.py builds static-scale FP8 and
    bf16 plans only)."""
    from ..ir.mx import check_mx_on_target

    for group in groups:
        if group.weights in MX_FORMATS:
            check_mx_on_target(MX_FORMATS[group.weights], request.target, request.dialect)
            try:
                mlp_workload(min(request.buckets), hidden, intermediate, ranks=group.ranks, dense=group.ranks is None,
                             mx=MxWeights(group.weights)).graph()
            except InputError as err:
                raise InputError(f"{group.name} (layers {', '.join(map(str, group.layers))}) at this model's "
                                 f"shapes: {err}") from None
    if request.tp > 1:
        if any(g.weights in MX_FORMATS for g in groups):
            raise InputError(f"--tp {request.tp}: MX kernels are exported unsharded (tensor-parallel MX plans are not "
                             "built); export with --tp 1")
        if act_scale == "row" and any(g.fp8 for g in groups):
            raise InputError(f"--tp {request.tp}: FP8 kernels with per-token activation scales (--act-scale row) are "
                             "not sharded by --tp; export with --tp 1, or with static scales")


def _layout(name: str, dtype: str, mx_args: set[str]) -> str:
    """A kernel argument's layout: ``mx_packed`` (an MX weight's packed elements), ``mx_scales`` (its E8M0 scales),
    else ``row_major``."""
    if is_mx(dtype):
        return "mx_packed"
    return "mx_scales" if name.endswith("_scale") and name.removesuffix("_scale") in mx_args else "row_major"


def _functions(source: str) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """(each kernel function of a file in call order with its arguments and results, the file's graph inputs)."""
    meta = read_metadata(source)
    assert meta is not None, "an emitted kernel file has metadata"
    mx_args = {b.name for k in meta.kernels for b in k.inputs if is_mx(b.dtype)}

    def described(buffers: Any) -> list[dict[str, Any]]:
        return [{"name": b.name, "shape": list(b.shape), "dtype": b.dtype, "layout": _layout(b.name, b.dtype, mx_args)}
                for b in buffers]

    functions = [{"name": k.name, "arguments": described(k.inputs), "results": described(k.outputs)}
                 for k in meta.kernels]
    return functions, {b.name: list(b.shape) for b in meta.inputs}


def _predicted(kernel_us: float, comm_us: float, target: Target) -> dict[str, Any]:
    from ..cost_model.collectives import UNVALIDATED
    from ..cost_model.trust import trust_note, typical_range

    total = kernel_us + comm_us
    band = typical_range(total, target)
    out: dict[str, Any] = {"kernel_us": kernel_us, "comm_us": comm_us, "total_us": total,
                           "band_us": None if band is None else list(band),
                           "model_error": trust_note(target, fused=True), "launch": launch_dict(target)}
    if comm_us:
        out["collectives"] = UNVALIDATED
    return out


def _one_core_bucket(workload: MlpWorkload, kernel_fn: KernelFn, target: Target,
                     files: dict[str, str], directory: str) -> dict[str, Any]:
    compiled = kernel_fn(workload)
    file = f"{directory}/mlp.py"
    files[file] = compiled.kernel.source
    functions, inputs = _functions(compiled.kernel.source)
    step = {"kernel": "mlp", "args": {name: {"tensor": name} for name in inputs}, "outputs": {"out": "out"}}
    return {"tokens": workload.tokens, "strategy": None, "plan": None,
            "kernels": {"mlp": {"file": file, "functions": functions, "ranks": [0],
                                "predicted_us": compiled.cost.latency_us, "schedule": compiled.schedule_name}},
            "ranks": [{"rank": 0, "role": 0, "steps": [step]}], "output": "out",
            "tensors": inputs,
            "predicted": _predicted(compiled.cost.latency_us, 0.0, target)}


def _tp_bucket(workload: MlpWorkload, request: ExportRequest, kernel_fn: KernelFn,
               files: dict[str, str], directory: str) -> dict[str, Any]:
    from ..cost_model.collectives import check_group
    from ..tensor_parallel.plan import plan_dict
    from ..tensor_parallel.planner import TpResult, dense_alternatives, evaluate_strategy
    from ..tensor_parallel.sharding import check_tp, strategies

    check_tp(request.tp, workload.intermediate)
    check_group(request.target, request.tp)
    allowed = [s for s in strategies(workload) if s.name in SLICE_STRATEGIES]
    results = [_unsourced(workload, request.tp, s) or evaluate_strategy(workload, request.tp, s, request.target,
                                                                          kernel_fn) for s in allowed]
    if not any(r.error is None for r in results):
        raise InputError(f"no tensor-parallel strategy applies at --tp {request.tp}: "
                         + "; ".join(f"{r.strategy.name}: {r.error}" for r in results))
    result = TpResult(workload, request.tp, request.target, results,
                      dense_alternatives(workload, request.tp, request.target, request.dialect, kernel_fn))
    plan = plan_dict(result, request.dialect)
    kernels = {}
    for key, entry in plan["kernels"].items():
        source = result.chosen.kernels[key].kernel.source
        files[f"{directory}/{entry['file']}"] = source
        functions, _ = _functions(source)
        kernels[key] = {"file": f"{directory}/{entry['file']}", "functions": functions, "ranks": entry["ranks"],
                        "predicted_us": entry["predicted_us"], "schedule": entry["schedule"]}
    files[f"{directory}/plan.json"] = json.dumps(plan, indent=2) + "\n"
    chosen = result.chosen
    return {"tokens": workload.tokens, "strategy": chosen.strategy.name, "plan": f"{directory}/plan.json",
            "kernels": kernels, "ranks": plan["ranks"], "output": plan["output"],
            "tensors": {name: t["shape"] for name, t in plan["tensors"].items()},
            "intermediate_shards": plan["intermediate_shards"],
            "predicted": _predicted(chosen.kernel_us, chosen.comm_us, request.target)}


def _unsourced(workload: MlpWorkload, tp: int, strategy: Any) -> Any:
    """A StrategyResult saying why ``strategy`` is not exported when its plan names a tensor of a rank's own (None
    when every tensor is an unsharded one, which the weight source holds and the runtime slices). The one such
    tensor of a slice strategy: ``replicate-u/reduce-output`` of FP8 weights quantizes each rank's partial product
    ``h_i U_down[rows]`` with a static scale of its own (``h_ud_scale.r<i>``), which no source holds: ``nmmc
    compress --dtype fp8`` calibrates the unsharded layer's ``h_ud_scale`` (the scale ``replicate-u/reduce-rank``
    quantizes the all-reduced sum with), and the runtime calibrates only a dense layer's ``x``/``h``."""
    from ..tensor_parallel.planner import StrategyResult
    from ..tensor_parallel.sharding import shard_mlp

    try:
        own = sorted(name for name in shard_mlp(workload, tp, strategy).factors if "." in name)
    except InputError:
        return None  # evaluate_strategy reports why it does not apply
    if not own:
        return None
    return StrategyResult(strategy, error=f"not exported: its plan reads tensors of each rank's own "
                          f"({', '.join(own)}), static activation scales of values each rank computes for itself, "
                          "which the weight source does not hold ('nmmc compress --dtype fp8' calibrates the "
                          "unsharded layer's scales)")


def _launch(target: Target, dialect: str) -> dict[str, Any]:
    """How a kernel of this package is launched (docs/logical-cores.md, "Launching"; /NCC_EVRF066)."""
    lnc = target.lnc
    if lnc == 1:
        call = "kernel(*args)"
    else:
        call = f"kernel[{lnc}](*args)" if dialect == "nki" else f"kernel[nl.nc({lnc})](*args)"
    return {"lnc": lnc, "call": call, "env": {"NEURON_LOGICAL_NC_CONFIG": str(lnc)}, "neuronx_cc": f"--lnc={lnc}",
            "rule": "the kernel's LNC must equal the model graph's (neuronx-cc --lnc, NxD Inference "
                    "logical_nc_config); a mismatch fails compilation with NCC_EVRF066"}


def _group(group: ExportGroup, buckets: list[dict[str, Any]], from_checkpoint: bool, act_scale: str) -> dict[str, Any]:
    """A group's manifest entry: its layers, MLP, weight format, the weights its kernels take (each with its
    source, shape, dtype and layout as the kernel files state them; an MX weight's two arguments with their ``mx``
    record), how its activations are scaled and its buckets."""
    tensors: dict[str, dict[str, Any]] = {}
    mx = group.weights in MX_FORMATS
    for bucket in buckets:
        dtypes = {a["name"]: a["dtype"] for kernel in bucket["kernels"].values() for f in kernel["functions"]
                  for a in f["arguments"]}
        for name, shape in bucket.pop("tensors").items():
            if name == "x":
                continue
            where = mx_tensor_source(name, shape, group, from_checkpoint) if mx else \
                {"layout": "row_major", **tensor_source(name, group, from_checkpoint)}
            tensors[name] = {"shape": shape, "dtype": dtypes.get(name, group.weights), **where}
    activations = ("quantize_mx" if mx else act_scale if group.fp8 else None)
    return {"layers": list(group.layers), "mlp": "dense" if group.ranks is None else "svd",
            "ranks": None if group.ranks is None else dict(zip(("gate", "up", "down"), group.ranks, strict=True)),
            "weights_dtype": group.weights, "activation_scales": activations, "tensors": dict(sorted(tensors.items())),
            "buckets": buckets}


def _manifest(request: ExportRequest, source: ModelSource, factors_dir: str | None, groups: list[ExportGroup],
              entries: dict[str, dict[str, Any]], activation: str, act_scale: str) -> dict[str, Any]:
    c = source.config
    weights_from = "checkpoint" if factors_dir is None and all(g.ranks is None for g in groups) else "factors"
    mlps = {e["mlp"] for e in entries.values()}
    layer_group = {layer: g.name for g in groups for layer in g.layers}
    fp8 = any(g.fp8 for g in groups)
    calibrated = weights_from == "checkpoint" and fp8 and act_scale == "static"
    return {
        "format": FORMAT, "version": VERSION, "nmmc_version": __version__,
        "model": {"name": c.name, "architecture": c.architecture, "hidden_size": c.hidden_size,
                  "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
                  "torch_dtype": c.torch_dtype},
        "mlp": mlps.pop() if len(mlps) == 1 else "per layer",
        "ranks": None if source.ranks is None else dict(zip(("gate", "up", "down"), source.ranks, strict=True)),
        "keep_ratio": source.keep_ratio, "quality": source.quality,
        "weights": {"from": weights_from, "factors_dir": factors_dir,
                    "expects": "a Hugging Face checkpoint directory (safetensors)" if weights_from == "checkpoint"
                    else "an 'nmmc compress' output directory (layer_XXX.safetensors factors)",
                    "activation_scales": "calibration" if calibrated else "row" if fp8 and act_scale == "row"
                    else None},
        "target": request.target.spec, "target_name": request.target.name, "lnc": request.target.lnc,
        "dialect": str(request.dialect), "sdk": sdk_range(request.dialect, request.target, request.sdk),
        "activation_dtype": activation,
        "weights_dtypes": sorted({g.weights for g in groups}),
        "launch": _launch(request.target, request.dialect),
        "tp": {"degree": request.tp, "collective": "all_reduce" if request.tp > 1 else None,
               "strategies_considered": list(SLICE_STRATEGIES) if request.tp > 1 else []},
        "layers": [layer_group[layer] for layer in range(c.num_hidden_layers)],
        "groups": entries,
    }
