"""Commands over model weights: ``nmmc compress`` (``nmmc tune --model`` is in :mod:`.compile`)."""

from __future__ import annotations

from pathlib import Path

import click

from .options import progress_option, show_progress
from .views import compress_lines, echo_lines


@click.command()
@click.argument("model_dir", type=click.Path(file_okay=False))
@click.option("--keep-ratio", type=float, required=True, help="Fraction of each MLP weight's parameters kept.")
@click.option("--align", default=128, show_default=True, type=click.IntRange(min=1),
              help="Ranks are multiples of this (the tile size).")
@click.option("--rank-gate", type=click.IntRange(min=1), default=None, help="Override the gate projection's rank.")
@click.option("--rank-up", type=click.IntRange(min=1), default=None, help="Override the up projection's rank.")
@click.option("--rank-down", type=click.IntRange(min=1), default=None, help="Override the down projection's rank.")
@click.option("--factor-dtype", default="float32", show_default=True,
              help="dtype of the stored factors: float32, bfloat16, float16, or model (the model's torch_dtype).")
@progress_option
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("-o", "--output", required=True, metavar="OUT_DIR", help="Directory for the factors and manifest.json.")
def compress(model_dir: str, keep_ratio: float, align: int, rank_gate: int | None, rank_up: int | None,
             rank_down: int | None, factor_dtype: str, progress: bool | None, as_json: bool, output: str) -> None:
    """Compress every MLP projection (gate, up, down) of the model in MODEL_DIR (config.json and
    safetensors weights) with block-aligned SVD: one safetensors file of factors per layer, and a
    manifest with ranks, parameter counts and reconstruction errors. Layer by layer, resumable: an
    interrupted run continues where it stopped."""
    from ..io import check_output_dir
    from ..models import compress_model
    from ..models.manifest import MANIFEST_FILE
    from ..report import progress_bar

    check_output_dir(output)
    ranks = {k: v for k, v in (("gate", rank_gate), ("up", rank_up), ("down", rank_down)) if v is not None}
    bar_update, close = progress_bar(show_progress(progress, as_json))
    try:
        manifest = compress_model(model_dir, output, keep_ratio, align=align, ranks=ranks or None,
                                  dtype=factor_dtype,
                                  progress=(lambda done, total: bar_update(done, total, float("inf")))
                                  if bar_update else None)
    finally:
        close()
    if as_json:
        click.echo((Path(output) / MANIFEST_FILE).read_text())
        return
    echo_lines(compress_lines(manifest, output))
