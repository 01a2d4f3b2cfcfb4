"""``nmmc export``: a model's MLP kernels as an importable Python package (:mod:`neuronmm_compiler.export`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from .options import (
    EXIT_FAILED,
    chosen_dialect,
    dialect_option,
    lowercase_name,
    progress_option,
    resolve_target,
    show_progress,
    target_option,
)
from .views import echo_lines

SERVING = "vllm-neuron"  # the stack --serving takes (export/serving.py SERVING; not imported: the CLI loads lazily)

EPILOG = """\b
The package (OUT/):
  kernels/<group>/t<T>/   the kernel of bucket T for a layer group (dense-bf16, svd-fp8-r..., ...;
                          layers of different formats/ranks: one group each; with --tp: one
                          file per rank role, and plan.json)
  manifest.json           layer -> group, per group its buckets, kernels, every argument's
                          shape/dtype/layout and source, activation dtype, SDK range, LNC,
                          target, TP plan, predicted latencies with their error band and launch
                          context (manifest.schema.json is its JSON Schema)
  weights.py, fp8.py      checkpoint (dense; FP8: quantized per output channel) or factor files
                          (SVD, FP8 layers with their scales) -> a rank's kernel arguments
  module.py               NmmcMLP / NeuronNmmcMLP: the MLP module (pad to bucket, launch, all-reduce)
  patch.py                replace the MLPs of a Hugging Face Llama/Qwen3 model (or of an NxD Inference
                          one: legacy, retired on trn2/trn3 by Neuron 2.34)
  backend.py, llama.py    nki.jit on a Neuron device / nmmc's interpreter on the CPU; a torch Llama
                          with Hugging Face's module names for CPU accuracy checks
  vllm_plugin.py, pyproject.toml, serving.json, SERVING.md
                          with --serving vllm-neuron: a vLLM general plugin (pip install OUT) that
                          routes vLLM Neuron's MLP calls of the exported shapes to the kernels

\b
Then: nmmc verify OUT   (every kernel and plan in the interpreter); docs/integration.md.
Exit codes: 0 written (and verified with --verify), 1 a kernel failed --verify, 2 a user error."""


@click.command(epilog=EPILOG)
@click.argument("model")
@click.option("--tokens", "buckets", default=None, metavar="N,N,...",
              help="Token buckets (batch x sequence rows one MLP call processes), e.g. 1,128: one kernel each; a "
                   "call is padded to the smallest bucket that holds it (more tokens than the largest: chunks of "
                   "it). Match them to your serving buckets (vLLM Neuron: --serving derives them; NxD Inference, "
                   "before Neuron 2.34 retired it on trn2/trn3: the token-generation batch size and the "
                   "context-encoding buckets). Required unless --serving derives them.")
@click.option("--serving", type=click.Choice([SERVING], case_sensitive=False), default=None,
              help="Derive the buckets and per-rank shapes a vLLM Neuron server compiles from its flags "
                   "(--tp = --tensor-parallel-size, --max-num-seqs, --max-num-batched-tokens, --max-model-len), "
                   "export exactly those, and make the package a vLLM plugin (pip install OUT) that routes vLLM "
                   "Neuron's MLP calls of those shapes to the kernels. Dense bf16 MLPs only: vLLM passes each layer's "
                   "dense weight slices with no layer index, so SVD factors or FP8 scales could not be matched to a "
                   "layer. See OUT/SERVING.md and docs/integration.md, 'vLLM Neuron'.")
@click.option("--max-num-seqs", type=int, default=None, metavar="S",
              help="With --serving: vllm serve --max-num-seqs (the decode buckets: powers of two up to S).")
@click.option("--max-num-batched-tokens", type=int, default=None, metavar="B",
              help="With --serving: vllm serve --max-num-batched-tokens (the prefill buckets).")
@click.option("--max-model-len", type=int, default=None, metavar="L",
              help="With --serving: vllm serve --max-model-len (B below L is chunked prefill, which vLLM Neuron runs "
                   "in segments of B tokens; B >= L prefills in one shot with powers of two from 128).")
@click.option("--tp", default=1, show_default=True, type=click.IntRange(min=1), metavar="N",
              help="Tensor-parallel degree (vLLM Neuron's --tensor-parallel-size; NxD Inference's tp_degree): "
                   "per-rank kernels of the best slice-based sharding (Megatron for a dense MLP; replicate-u with "
                   "reduce-output or reduce-rank for an SVD one) and the all-reduce between them. With FP8 each rank "
                   "gets its weight and scale slices; FP8 SVD layers shard with replicate-u/reduce-rank "
                   "(reduce-output would need per-rank scales compress does not calibrate).")
@click.option("--keep-ratio", type=float, default=None,
              help="Export the SVD-compressed MLP at this keep ratio (its weights then come from an 'nmmc compress' "
                   "output at the same ranks). Default: the ranks of MODEL when it is an 'nmmc compress' output, "
                   "else the dense MLP.")
@click.option("--dense", is_flag=True, help="Export the dense (exact) MLP even from an 'nmmc compress' output.")
@click.option("--dtype", default=None, callback=lowercase_name,
              help="Weights of the kernels: bf16, fp32 (activations too) or fp8 (fp8_e4m3, fp8_e5m2: FP8 weights "
                   "with per-output-channel scales, bf16 activations quantized on chip with static scales; from a "
                   "checkpoint the weights are quantized on the fly and the scales calibrated when patching), or on "
                   "trn3 an OCP MX format (mxfp8_e4m3, mxfp8_e5m2, mxfp4: weights quantized into E8M0-scaled blocks "
                   "of 32 when patching, activations by quantize_mx in the kernel; tp 1). Default: an 'nmmc "
                   "compress' output's recorded per-layer formats (its --dtype fp8 / mxfp8 / mxfp4 layers), else "
                   "bf16.")
@click.option("--act-scale", type=click.Choice(["static", "row"], case_sensitive=False), default=None,
              help="FP8 activation scales: static (one per tensor, calibrated when patching a checkpoint) or row "
                   "(one per token, computed by the kernel: nothing to calibrate; tp 1). Default: an 'nmmc compress' "
                   "output's recorded fp8.act_scale, else static.")
@target_option
@dialect_option
@click.option("--trials", default=150, show_default=True, type=click.IntRange(min=1),
              help="Optuna trials of each kernel's search.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the searches.")
@click.option("--no-cache", is_flag=True, help="Search even if the result cache has an answer (and store none).")
@click.option("--cache-dir", default=None, metavar="DIR",
              help="Result cache directory [default: $NMMC_CACHE_DIR, else $XDG_CACHE_HOME/nmmc, else ~/.cache/nmmc].")
@click.option("--verify", "run_verify", is_flag=True,
              help="Also run every kernel (every rank's plan) in nmmc's interpreter, as 'nmmc verify OUT' does.")
@progress_option
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("-o", "--output", required=True, metavar="DIR",
              help="Package directory to write (created; an importable Python package when its name is an "
                   "identifier and its parent is on sys.path).")
def export(model: str, buckets: str | None, serving: str | None, max_num_seqs: int | None,
           max_num_batched_tokens: int | None, max_model_len: int | None, tp: int, keep_ratio: float | None,
           dense: bool, dtype: str, act_scale: str | None, target: str, dialect: str, sdk: str | None, trials: int,
           seed: int,
           no_cache: bool, cache_dir: str | None, run_verify: bool, progress: bool | None, as_json: bool,
           output: str) -> None:
    """Write MODEL's MLP kernels as a Python package that drops them into a PyTorch model or a vLLM Neuron server.

    MODEL is a shipped model name (llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, qwen3-1.7b, qwen3-4b), a model
    directory or its config.json, or an 'nmmc compress' output directory (its ranks: the SVD MLP).
    """
    from ..errors import InputError
    from ..export import ExportRequest
    from ..ir import canonical_dtype
    from ..ir.mx import mx_format

    if dense and keep_ratio is not None:
        raise InputError("--dense exports the uncompressed MLP: drop --keep-ratio")
    tgt = export_target(target, dialect, sdk)  # inside a model's graph: in-graph unless --launch says otherwise
    flags = {"--max-num-seqs": max_num_seqs, "--max-num-batched-tokens": max_num_batched_tokens,
             "--max-model-len": max_model_len}
    mx = None if dtype is None else mx_format(dtype)
    weights = None if dtype is None else mx.name if mx is not None else canonical_dtype(dtype)
    act_scale = None if act_scale is None else act_scale.lower()
    token_buckets, plugin = _buckets(model, output, buckets, serving, flags, tp=tp, keep_ratio=keep_ratio,
                                     dense=dense, dtype=weights, act_scale=act_scale, target=tgt, dialect=dialect)
    request = ExportRequest(model=model, buckets=token_buckets, target=tgt,
                            dialect=chosen_dialect(dialect, sdk, tgt), tp=tp, keep_ratio=keep_ratio, dense=dense,
                            dtype=weights, trials=trials, seed=seed, cache_dir=cache_dir,
                            use_cache=not no_cache, sdk=sdk, act_scale=act_scale)
    ok = run_export(request, output, verify=run_verify, as_json=as_json,
                    progress=show_progress(progress, as_json), echo=click.echo, plugin=plugin)
    if not ok:
        sys.exit(EXIT_FAILED)


@dataclass(frozen=True)
class ServingExport:
    """An export for a serving stack: its plan, the extra files of the package and the lines printed after."""

    plan: Any
    files: dict[str, str]
    lines: list[str]


def serving_export(model: str, output: str, *, buckets: str | None, tp: int, keep_ratio: float | None, dense: bool,
                   dtype: str | None, target: Any, dialect: str, flags: dict[str, int | None],
                   act_scale: str | None = None) -> ServingExport:
    """Check what --serving vllm-neuron cannot match (one line each, before any work) and derive its plan."""
    from pathlib import Path

    from ..errors import InputError
    from ..export.groups import export_groups
    from ..export.serving import LNC, check_package_name, guide_lines, plan_serving, serving_files

    why = f"--serving {SERVING}"
    if buckets is not None:
        raise InputError(f"{why} derives the token buckets from the server flags: drop --tokens")
    missing = [flag for flag, value in flags.items() if value is None and flag != "--max-model-len"]
    if missing:
        raise InputError(f"{why} needs {', '.join(missing)}: the buckets vLLM Neuron compiles depend on them (give "
                         "the values you pass to vllm serve)")
    if keep_ratio is not None or (dtype is not None and dtype != "bfloat16") or act_scale is not None:
        raise InputError(f"{why} exports the dense bf16 MLP only: vLLM Neuron passes each layer's dense bf16 weight "
                         "slices to vllm_neuron.functional.mlp with no layer index, so SVD factors, FP8 weights and "
                         "scales (static or per-token) or MX weights and their E8M0 scales could not be matched to a "
                         "layer; drop --keep-ratio/--dtype/--act-scale")
    if target.lnc != LNC:
        raise InputError(f"{why}: vLLM Neuron runs its graphs on LNC={LNC} (it launches its MLP kernel as "
                         f"kernel[{LNC}]); drop --lnc {target.lnc}")
    if dialect not in ("auto", "nki"):
        raise InputError(f"{why}: vLLM Neuron's kernels are NKI 0.3+ (import nki); drop --dialect {dialect}")
    package = check_package_name(output)
    source, _, groups = export_groups(model, None, dense, None, "bfloat16")
    if any(g.ranks is not None for g in groups):
        raise InputError(f"{why}: {model} is an 'nmmc compress' output (SVD factors); vLLM Neuron passes each layer's "
                         "dense weight slices with no layer index, so the factors could not be matched to a layer; add "
                         "--dense to export the dense MLP")
    formats = sorted({g.weights for g in groups} - {"bfloat16"})
    if formats:
        raise InputError(f"{why}: {model} records {', '.join(formats)} layers (FP8 or MX weights with their scales), "
                         "which vLLM Neuron's dense bf16 MLP call cannot carry; --serving exports dense bf16 kernels "
                         "only: add --dense")
    if source.config.torch_dtype != "bfloat16":
        raise InputError(f"{why} exports bf16 kernels, and vLLM Neuron keeps the checkpoint's dtype "
                         f"({source.config.torch_dtype}) for the MLP weights: no call would match")
    c = source.config
    if flags["--max-model-len"] is None:  # vllm serve's default: the model config's max_position_embeddings
        flags = {**flags, "--max-model-len": _max_position_embeddings(model, why)}
    plan = plan_serving(c.architecture, c.hidden_size, c.intermediate_size, tp=tp,
                        max_num_seqs=flags["--max-num-seqs"], max_num_batched_tokens=flags["--max-num-batched-tokens"],
                        max_model_len=flags["--max-model-len"])
    package_dir = Path(output).resolve()
    return ServingExport(plan, serving_files(plan, package, package_dir, c.name or model),
                         guide_lines(plan, package, package_dir))


def run_export(request: Any, output: str, *, verify: bool, as_json: bool, progress: bool,
               echo: Callable[..., None], plugin: ServingExport | None = None) -> bool:
    """Export, optionally verify, print the summary (or the manifest as JSON); False when --verify failed."""
    from ..export import export_model

    update, close = _bar(progress, len(request.buckets))
    try:
        manifest = export_model(request, output, progress=update,
                                extra_files=None if plugin is None else plugin.files)
    finally:
        close()
    ok = True
    lines = _summary(manifest, output) + ([] if plugin is None else plugin.lines)
    if verify:
        from ..export.verify import verify_export

        report = verify_export(output)
        ok = report.ok
        lines += report.lines(output)
    if as_json:
        echo(json.dumps(manifest, indent=2))
    else:
        echo_lines(lines)
    return ok


def _bar(enabled: bool, total: int):
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=total, desc="exporting buckets", unit="bucket", file=sys.stderr, leave=False)

    def update(done: int, _total: int) -> None:
        bar.n = done
        bar.refresh()

    return update, bar.close


def _summary(manifest: dict, output: str) -> list[str]:
    from ..tuning.report import wrap_note

    m = manifest["model"]
    lines = [f"{m['name']}: {manifest['target']} ({manifest['dialect']}, LNC={manifest['lnc']}, launch "
             f"{manifest['launch']['call']}), tp {manifest['tp']['degree']}, activations "
             f"{manifest['activation_dtype']}"]
    for name, group in manifest["groups"].items():
        what = "dense MLP" if group["ranks"] is None else "SVD MLP, ranks " + "/".join(
            str(r) for r in group["ranks"].values())
        layers = group["layers"]
        span = f"layers {layers[0]}-{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1)) else \
            "layers " + ",".join(map(str, layers))
        lines.append(f"  {name}: {what}, {group['weights_dtype']} weights, {span}")
        for bucket in group["buckets"]:
            p = bucket["predicted"]
            band = "" if p["band_us"] is None else f" (typically {p['band_us'][0]:.1f}-{p['band_us'][1]:.1f})"
            strategy = f", {bucket['strategy']}" if bucket["strategy"] else ""
            comm = f" incl. {p['comm_us']:.1f} us all-reduce" if p["comm_us"] else ""
            lines.append(f"    {bucket['tokens']:>6} tokens: {p['total_us']:.1f} us predicted{band}{comm}{strategy}; "
                         f"{len(bucket['kernels'])} kernel file(s)")
    notes = [b["predicted"]["model_error"] for g in manifest["groups"].values() for b in g["buckets"]]
    if notes:  # the figures above are predictions: how far to trust them (on trn3: not validated at all)
        lines += wrap_note(f"latencies are the cost model's, not measured: {notes[0]}")
    lines.append(f"  weights: {manifest['weights']['expects']}")
    if manifest["weights"].get("activation_scales") == "calibration":
        lines.append("  FP8 activation scales: calibrated on the unpatched model when patching (patch(..., "
                     "calibration=token ids); docs/integration.md)")
    elif manifest["weights"].get("activation_scales") == "row":
        lines.append("  FP8 activation scales: per token, computed by the kernels (nothing to calibrate)")
    if any(g["weights_dtype"].startswith("mx") for g in manifest["groups"].values()):
        lines.append("  MX weights: quantized into packed elements and E8M0 scales when patching (runtime mx.py), "
                     "activations by quantize_mx in the kernels")
    lines.append(f"wrote the package to {output} (manifest.json; nmmc verify {output})")
    return lines


def _buckets(model: str, output: str, buckets: str | None, serving: str | None, flags: dict[str, int | None],
             **settings: Any) -> tuple[tuple[int, ...], ServingExport | None]:
    """The token buckets of an export and, with ``--serving``, its vLLM Neuron plugin (which derives them from the
    server's ``flags``); InputError for server flags without ``--serving`` or no buckets at all."""
    from ..errors import InputError
    from ..model_tuning.pipeline import parse_buckets

    if serving is None:
        given = [flag for flag, value in flags.items() if value is not None]
        if given:
            raise InputError(f"{', '.join(given)} describe a vLLM Neuron server: add --serving {SERVING}")
        if buckets is None:
            raise InputError("--tokens is required (or --serving vllm-neuron, which derives the buckets)")
        return tuple(parse_buckets(buckets)), None
    plugin = serving_export(model, output, buckets=buckets, flags=flags, **settings)
    return plugin.plan.tokens, plugin


def _max_position_embeddings(model: str, why: str) -> int:
    """The model config's ``max_position_embeddings``: the ``--max-model-len`` vLLM takes when none is given (it
    derives the model length from the model's config); InputError asking for the flag when the config has none."""
    import json

    from ..errors import InputError
    from ..model_tuning.pipeline import model_path

    path = model_path(model)
    path = path / "config.json" if path.is_dir() else path
    value = json.loads(path.read_text(encoding="utf-8")).get("max_position_embeddings")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{why} needs --max-model-len: {path} has no max_position_embeddings, which vLLM would take "
                         "as the default (give the value you pass to vllm serve)")
    return value


def export_target(target_spec: str, dialect: str, sdk: str | None) -> Any:
    """The target of an export (in-graph unless --launch says otherwise); ``--sdk`` is checked against the dialect
    (:func:`~..support.resolve_dialect`) and the kernels are emitted for that release (``ExportRequest.sdk``)."""
    from ..support import resolve_dialect

    target = resolve_target(target_spec, None)
    resolve_dialect(dialect, target.name, sdk)
    return target
