"""Commands over model weights: ``nmmc compress`` (``nmmc tune --model`` is in :mod:`.compile`)."""

from __future__ import annotations

from pathlib import Path

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
@click.option("--calibration", default=None, metavar="FILE",
              help="Calibration data for activation-aware (whitened) truncation: UTF-8 text (tokenized with the "
                   "model's tokenizer.json; needs nmmc[models]), token ids as .npy, or pre-captured activations "
                   "as .safetensors (model.layers.{i}.mlp.input [tokens, hidden], optionally "
                   "model.layers.{i}.mlp.down_proj.input).")
@click.option("--calibration-tokens", default=16384, show_default=True, type=click.IntRange(min=2),
              help="Use at most this many calibration tokens.")
@click.option("--eval", "eval_path", default=None, metavar="FILE",
              help="Held-out text (or .npy token ids): measure perplexity and top-1 agreement of the original and "
                   "the compressed model, and each layer's MLP output error; recorded in the manifest.")
@click.option("--eval-tokens", default=8192, show_default=True, type=click.IntRange(min=2),
              help="Use at most this many evaluation tokens.")
@click.option("--max-ppl-increase", default=0.10, show_default=True, type=float,
              help="Warn when --eval measures a perplexity rise above this fraction.")
@click.option("--sequence-length", default=512, show_default=True, type=click.IntRange(min=2),
              help="Tokens per sequence of the calibration and evaluation forward passes.")
@click.option("--damping", default=1e-4, show_default=True, type=float,
              help="Whitening damping, relative to the mean diagonal of X^T X.")
@click.option("--choose-ranks", is_flag=True,
              help="Choose each layer's ranks (or keep it dense) for the best predicted accuracy (whitened loss "
                   "through each layer's measured sensitivity) within the predicted MLP latency of uniform ranks at "
                   "--keep-ratio (needs --calibration and --tokens).")
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
             rank_down: int | None, factor_dtype: str, calibration: str | None, calibration_tokens: int,
             eval_path: str | None, eval_tokens: int, max_ppl_increase: float, sequence_length: int, damping: float,
             choose_ranks: bool, target_speedup: float | None, buckets: str | None, target: str, progress: bool | None,
             as_json: bool, output: str) -> None:
    """Compress every MLP projection (gate, up, down) of the model in MODEL_DIR (config.json and
    safetensors weights) into block-aligned low-rank factors: one safetensors file per layer and a
    manifest with ranks, parameter counts and errors. With --calibration, the truncation is
    activation-aware (SVD-LLM whitening), which keeps a real model working where plain SVD breaks
    it; --eval measures the result; --choose-ranks picks per-layer ranks for accuracy and predicted
    speed together. Layer by layer, resumable: an interrupted run continues where it stopped."""
    from ..io import check_output_dir
    from ..model_tuning import parse_buckets
    from ..models.manifest import MANIFEST_FILE
    from ..models.workflow import CompressRequest, run_compress
    from ..targets import get_target

    check_output_dir(output)
    ranks = {k: v for k, v in (("gate", rank_gate), ("up", rank_up), ("down", rank_down)) if v is not None}
    joint = choose_ranks or target_speedup is not None
    request = CompressRequest(
        model_dir=model_dir, out_dir=output, keep_ratio=keep_ratio, align=align, ranks=ranks or None,
        dtype=factor_dtype, calibration=calibration, calibration_tokens=calibration_tokens, eval=eval_path,
        eval_tokens=eval_tokens, sequence_length=sequence_length, damping=damping, choose_ranks=choose_ranks,
        target_speedup=target_speedup, buckets=tuple(parse_buckets(buckets)) if buckets else None,
        target=get_target(target) if joint else None, max_ppl_increase=max_ppl_increase)
    update, close = _stage_bar(show_progress(progress, as_json))
    try:
        result = run_compress(request, progress=update)
    finally:
        close()
    for warning in result.warnings:
        click.echo(f"nmmc: warning: {warning}", err=True)
    echo_lines([(Path(output) / MANIFEST_FILE).read_text()] if as_json else compress_lines(result.manifest, output))
