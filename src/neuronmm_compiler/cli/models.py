"""Commands over model weights: ``nmmc compress`` (``nmmc tune --model`` is in :mod:`.compile`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from .options import progress_option, show_progress, target_option
from .tp import tp_compress
from .views import compress_lines, echo_lines


def _stage_bar(enabled: bool):
    """(update(stage, done, total), close) of a tqdm bar on stderr whose label is the current stage."""
    if not enabled:
        return None, lambda: None
    import sys

    from tqdm import tqdm

    bar = tqdm(total=0, desc="compress", unit="step", file=sys.stderr, leave=False)

    def update(stage: str, done: int, total: int) -> None:
        bar.set_description_str(stage, refresh=False)
        bar.total, bar.n = total, done
        bar.refresh()

    return update, bar.close


@click.command()
@click.argument("model_dir", type=click.Path(file_okay=False))
@click.option("--keep-ratio", type=float, required=True,
              help="Fraction of each MLP weight's parameters kept (the uniform NeuronMM ranks; with --choose-ranks, "
                   "the accuracy budget).")
@click.option("--align", default=128, show_default=True, type=click.IntRange(min=1),
              help="Ranks are multiples of this (the tile size).")
@click.option("--rank-gate", type=click.IntRange(min=1), default=None, help="Override the gate projection's rank.")
@click.option("--rank-up", type=click.IntRange(min=1), default=None, help="Override the up projection's rank.")
@click.option("--rank-down", type=click.IntRange(min=1), default=None, help="Override the down projection's rank.")
@click.option("--factor-dtype", default="float32", show_default=True,
              help="dtype of the stored factors: float32, bfloat16, float16, or model (the model's torch_dtype).")
@click.option("--calibration", multiple=True, metavar="FILE",
              help="Calibration data for activation-aware (whitened) truncation and healing: UTF-8 text (tokenized "
                   "with the model's tokenizer.json; needs nmmc[models]), token ids as .npy, or pre-captured "
                   "activations as .safetensors (model.layers.{i}.mlp.input [tokens, hidden], optionally "
                   "model.layers.{i}.mlp.down_proj.input). Repeat it to mix sources of different kinds (each "
                   "gets an equal share of --calibration-tokens); one source alone draws a warning.")
@click.option("--calibration-tokens", default=16384, show_default=True, type=click.IntRange(min=2),
              help="Use at most this many calibration tokens from the files (split evenly between them).")
@click.option("--calibration-samples", default=0, show_default=True, type=click.IntRange(min=0), metavar="N",
              help="Add N tokens of text sampled from the original model itself to the calibration set.")
@click.option("--eval", "eval_path", multiple=True, metavar="FILE",
              help="Held-out text (or .npy token ids): measure perplexity and top-1 agreement of the original and "
                   "the compressed model, and each layer's MLP output error; recorded in the manifest. Repeat it "
                   "for several domains: each file is reported, and all of them together.")
@click.option("--eval-tokens", default=8192, show_default=True, type=click.IntRange(min=2),
              help="Use at most this many evaluation tokens of each --eval file.")
@click.option("--max-ppl-increase", default=0.10, show_default=True, type=float,
              help="Perplexity budget: a fraction (0.1) or, above 1, a percentage (10). --eval warns above it; "
                   "--choose-ranks without --tokens chooses per-layer ranks within it.")
@click.option("--heal", default="none", show_default=True, type=click.Choice(["none", "closed-form", "finetune"]),
              help="Heal the factors after truncation (needs --calibration): closed-form re-solves each projection, "
                   "layer by layer, against the original layer's output on the inputs the compressed model really "
                   "produces; finetune then distils the original model into the factors (needs torch: "
                   "pip install 'nmmc[torch]'). Ranks and the file format are unchanged.")
@click.option("--heal-damping", default=1e-4, show_default=True, type=float,
              help="Ridge of the closed-form refit, relative to the mean diagonal of its inputs' Gram matrix.")
@click.option("--heal-prior", default=1.0, show_default=True, type=click.FloatRange(min=0),
              help="Weight of whitened SVD's own objective (output error on the original model's activations) "
                   "added to the closed-form refit's: a prior that keeps the refit from fitting few calibration "
                   "tokens alone.")
@click.option("--heal-target", default="layer", show_default=True, type=click.Choice(["layer", "stream"]),
              help="Closed-form targets: the original layer on the compressed model's inputs (layer), or the "
                   "original model's own activations (stream, also undoes earlier layers' drift).")
@click.option("--heal-metric", default="mlp-output", show_default=True,
              type=click.Choice(["mlp-output", "fisher", "projection"]),
              help="What the closed form refits gate and up to: the error they cause in the MLP's output, through "
                   "silu and down (mlp-output); the same with the MLP output's error (and down's) weighed by the "
                   "model's Fisher information of the residual stream, estimated from backward passes over 8,192 "
                   "calibration tokens (fisher, needs PyTorch; docs/compression.md); or their own output's error "
                   "(projection).")
@click.option("--finetune-steps", default=None, type=click.IntRange(min=1),
              help="Fine-tuning steps of one 256-token sequence (default 200).")
@click.option("--finetune-lr", default=None, type=float,
              help="Fine-tuning peak learning rate (AdamW, warm-up then cosine; default 1e-5).")
@click.option("--finetune-samples", default=None, type=click.IntRange(min=0), metavar="N",
              help="Tokens sampled from the original model added to the fine-tuning data (default 16384).")
@click.option("--finetune-label-weight", default=None, type=click.FloatRange(min=0), metavar="W",
              help="Weight of the cross-entropy of the fine-tuning data's own next tokens, added to the KL "
                   "divergence from the original model (default 0.3; 0: distillation alone). It fits the "
                   "compressed model to the calibration text as well as to the original model's predictions "
                   "(benchmarks/results/compression-runs.md, 'Twelfth run').")
@click.option("--finetune-dtype", default=None, type=click.Choice(["auto", "bfloat16", "float32"]),
              help="Fine-tuning matmuls (default auto: a step's forward and backward pass is timed in each first, "
                   "and bfloat16 is taken when at least 10% faster). Measured: bfloat16 took half float32's CPU time "
                   "on one 2-core host and 1.5-2x float32's wall time on another (AVX-512 BF16, no AMX); perplexities "
                   "within 0.5% (benchmarks/results/compression-runs.md).")
@click.option("--threads", default=None, type=click.IntRange(min=1), metavar="N",
              help="CPU threads for the NumPy stages (BLAS) and fine-tuning (torch). Default: every core this "
                   "process may use. On a machine shared with other jobs, 1 is faster (threads that wait for each "
                   "other spin; docs/compression.md, 'Time and memory').")
@click.option("--sequence-length", default=512, show_default=True, type=click.IntRange(min=2),
              help="Tokens per sequence of the calibration and evaluation forward passes.")
@click.option("--damping", default=1e-4, show_default=True, type=float,
              help="Whitening damping, relative to the mean diagonal of X^T X.")
@click.option("--choose-ranks", is_flag=True,
              help="Choose each layer's ranks (or keep it dense). Without --tokens: greedily, least sensitive layer "
                   "first, each step kept only if the measured perplexity increase on calibration tokens stays "
                   "within --max-ppl-increase (the front is printed and plotted to OUT/choice_front.png). With "
                   "--dtype fp8 (or mxfp8/mxfp4 with --target trn3, or a list: bf16,fp8,mxfp8,mxfp4): each layer "
                   "among {dense, ranks} x {bf16 and those formats}, the same measured greedy over weight bytes, or "
                   "with --tokens over the predicted MLP latency at those buckets. With --tokens (bf16): "
                   "the best predicted accuracy within the predicted MLP latency of uniform ranks at --keep-ratio. "
                   "Needs --calibration.")
@click.option("--eval-check/--no-eval-check", default=True, show_default=True,
              help="--choose-ranks (measured: without --tokens, or with --dtype fp8), with --eval: build the chosen "
                   "model (healed, FP8 where chosen), "
                   "measure it on every --eval file, and back off along the front until every file and all of them "
                   "together measure within --max-ppl-increase (the eval files then decide the choice).")
@click.option("--target-speedup", default=None, type=float, metavar="S",
              help="Instead: the most accurate ranks whose predicted MLP latency is 1/S of the fused dense MLP's "
                   "(needs --calibration and --tokens).")
@click.option("--tokens", "buckets", default=None, metavar="N,N,...",
              help="Token buckets you serve, e.g. 1,128,512: the rank choice minimizes their summed predicted "
                   "latency.")
@target_option
@progress_option
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("-o", "--output", required=True, metavar="OUT_DIR", help="Directory for the factors and manifest.json.")
@tp_compress
def compress(model_dir: str, keep_ratio: float, align: int, rank_gate: int | None, rank_up: int | None,
             rank_down: int | None, output: str, tp: int = 1, **options: Any) -> None:
    """Compress every MLP projection (gate, up, down) of the model in MODEL_DIR (config.json and
    safetensors weights) into block-aligned low-rank factors: one safetensors file per layer and a
    manifest with ranks, parameter counts and errors. With --calibration, the truncation is
    activation-aware (SVD-LLM whitening), which keeps a real model working where plain SVD breaks
    it; --heal refits the factors after truncation; --eval measures the result on each file;
    --choose-ranks picks per-layer ranks from measured perplexity (or, with --tokens, for accuracy and
    predicted speed together). Layer by layer, resumable: an interrupted run continues where it stopped."""
    from ..compression.manifest import MANIFEST_FILE
    from ..compression.workflow import run_compress
    from ..io import check_output_dir

    check_output_dir(output)
    ranks = {k: v for k, v in (("gate", rank_gate), ("up", rank_up), ("down", rank_down)) if v is not None}
    bars = show_progress(options["progress"], options["as_json"])
    request = _request(model_dir, output, keep_ratio, align, ranks, tp, bars, options)
    update, close = _stage_bar(bars)
    try:  # the note: what the keep ratio becomes when it is not what was asked, once the inputs are checked
        result = run_compress(request, progress=update, note=lambda text: click.echo(f"nmmc: note: {text}", err=True))
    finally:
        close()
    for warning in result.warnings:
        click.echo(f"nmmc: warning: {warning}", err=True)
    if tp != 1:
        index = json.loads((Path(output) / f"tp{tp}" / "shards.json").read_text())["factor_shard"]
        click.echo(f"wrote the factor shards for --tp {tp} to {Path(output) / f'tp{tp}'} (shards.json maps every "
                   f"layout; the factor-shard blocks keep {index['kept_fraction']:.3f} of the MLP parameters, the "
                   f"unsharded factors {result.manifest.kept_fraction:.3f})", err=options["as_json"])
    if options["as_json"]:
        echo_lines([(Path(output) / MANIFEST_FILE).read_text()])
        return
    echo_lines(compress_lines(result.manifest, output) + _extra_lines(result, output))


def _request(model_dir: str, output: str, keep_ratio: float, align: int, ranks: dict[str, int], tp: int,
             bars: bool, o: dict[str, Any]):
    """The CompressRequest of ``nmmc compress``'s options ``o``."""
    from dataclasses import replace

    from ..compression.finetune import FinetuneSettings
    from ..compression.workflow import CompressRequest
    from ..model_tuning.pipeline import parse_buckets
    from .options import resolve_target

    fields = {"finetune_samples": "samples", "finetune_steps": "steps", "finetune_lr": "learning_rate",
              "finetune_dtype": "dtype", "finetune_label_weight": "label_weight"}
    given = {field: o[option] for option, field in fields.items() if o[option] is not None}
    finetune = replace(FinetuneSettings(), **given) if given else None
    joint = o["target_speedup"] is not None or (o["choose_ranks"] and bool(o["buckets"]))
    return CompressRequest(
        model_dir=model_dir, out_dir=output, keep_ratio=keep_ratio, align=align, ranks=ranks or None,
        dtype=o["factor_dtype"], calibration=o["calibration"] or None, calibration_tokens=o["calibration_tokens"],
        calibration_samples=o["calibration_samples"], eval=o["eval_path"] or None, eval_tokens=o["eval_tokens"],
        sequence_length=o["sequence_length"], damping=o["damping"], choose_ranks=o["choose_ranks"],
        target_speedup=o["target_speedup"], buckets=tuple(parse_buckets(o["buckets"])) if o["buckets"] else None,
        target=resolve_target(o["target"], None) if joint or o["choose_ranks"] else None,
        max_ppl_increase=o["max_ppl_increase"],
        heal=o["heal"], heal_damping=o["heal_damping"], heal_target=o["heal_target"], heal_prior=o["heal_prior"],
        heal_metric=o["heal_metric"], threads=o["threads"], finetune=finetune, progress_bars=bars, tp=tp,
        eval_check=o["eval_check"], act_scale=str(o.get("act_scale") or "static").lower())


def _tuned_note(heal: dict | None, key: str) -> str:
    """``; fine-tuned N steps in DTYPE (S s this run; the timed dtypes), KL a -> b`` of the heal record's fine-tuning
    run ``key`` ("" without)."""
    run = (heal or {}).get(key)
    if not run:
        return ""
    probe = run.get("dtype_probe_seconds")
    timed = f"; a step {probe['float32']:.2f} s in float32, {probe['bfloat16']:.2f} in bfloat16" if probe else ""
    dtype = f" in {run['dtype']}" if run.get("dtype") else ""
    return (f"; fine-tuned {heal['finetune']['steps']} steps{dtype} ({run['seconds']:.0f} s this run{timed}), KL "
            f"{run['kl_first']:.4f} -> {run['kl_last_10']:.4f}")


#: The heal record's stages (``seconds``), in the order they run, as the time line names them.
_HEAL_STAGES = (("whitened_svd", "whitened SVD"), ("fisher", "Fisher"), ("closed_form", "closed form"),
                ("finetune_sampling", "sampling the fine-tuning data"), ("finetune", "fine-tuning"))


def _clock(seconds: float) -> str:
    """``M:SS`` from a minute on, ``N s`` below (to the nearest second)."""
    whole = int(seconds + 0.5)
    return f"{whole // 60}:{whole % 60:02d}" if whole >= 60 else f"{whole} s"


def _heal_time_line(heal: dict) -> str | None:
    """``healing took T on N threads: stage t, ...`` from the heal record's wall seconds (None without them); the
    ``--tp`` blocks' fine-tuning is named apart (it runs after the factors are written)."""
    seconds = heal.get("seconds")
    if not seconds:
        return None
    stages = [(name, seconds[key]) for key, name in _HEAL_STAGES if key in seconds]
    run = heal.get("finetune_run") or {}
    resumed = (f"; fine-tuning resumed at step {run['resumed_at_step']}, the stages before it timed in the run that "
               "wrote the checkpoint") if run.get("resumed_at_step") else ""
    blocks = f"; the --tp blocks' fine-tuning {_clock(seconds['finetune_tp'])} more" if "finetune_tp" in seconds else ""
    threads = f" on {heal['threads']} thread{'s' if heal['threads'] != 1 else ''}" if heal.get("threads") else ""
    return (f"  healing took {_clock(sum(t for _, t in stages))}{threads} (wall time): "
            + ", ".join(f"{name} {_clock(t)}" for name, t in stages) + resumed + blocks)


def _file_line(q: dict) -> str:
    """One eval file's measurement, indented under its model's."""
    from ..compression.quality import spread_note

    return (f"    {q['source']}: {q['tokens']} tokens, perplexity {q['perplexity_original']:.2f} -> "
            f"{q['perplexity_compressed']:.2f} ({q['perplexity_increase']:+.1%}{spread_note(q)}), top-1 "
            f"agreement {q['top1_agreement']:.3f}")


def _extra_lines(result, output: str) -> list[str]:
    """Healing, per-file evaluation and the measured rank choice's front."""
    from ..compression.quality import spread_note

    lines = []
    heal = result.manifest.heal
    if heal:
        cf = heal.get("closed_form_error", {})
        tuned = _tuned_note(heal, "finetune_run")
        own = "; gate and up are fitted to the MLP output's error, so their own may rise" \
            if heal.get("metric") in ("mlp-output", "fisher") else ""
        lines.append(f"  healed ({heal['method']}): closed-form refit residual of each projection's output on "
                     f"calibration tokens {cf.get('mean_before', float('nan')):.4f} -> "
                     f"{cf.get('mean_after', float('nan')):.4f} (mean relative{own}){tuned}")
        timing = _heal_time_line(heal)
        lines += [timing] if timing else []
    quality = result.manifest.quality
    lines += [_file_line(q) for q in (quality or {}).get("per_file", [])]
    sharded = (quality or {}).get("tensor_parallel")
    if sharded:
        kept = f"kept {sharded['kept_fraction']:.3f} of the MLP parameters; " if "kept_fraction" in sharded else ""
        lines.append(f"  --tp {sharded['tp']} factor-shard blocks ({kept}{sharded['method']}"
                     f"{_tuned_note(heal, 'finetune_tp_run')}): perplexity {sharded['perplexity_original']:.2f} -> "
                     f"{sharded['perplexity_compressed']:.2f} ({sharded['perplexity_increase']:+.1%}"
                     f"{spread_note(sharded)}), top-1 agreement {sharded['top1_agreement']:.3f}")
        lines += [_file_line(q) for q in sharded.get("per_file", [])]
    if result.measured_choice is not None:
        from ..compression.measured_choice import front_lines

        lines += front_lines(result.measured_choice)
        lines.append(f"  front plotted to {Path(output) / 'choice_front.png'}")
    return lines
