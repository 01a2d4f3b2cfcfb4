"""``nmmc compress --tp N``: the factor shards of a compressed model in the layouts the plan reads.

Next to the unsharded factors (``layer_XXX.safetensors``, docs/compression.md), ``OUT/tp<N>/`` holds

* ``shards.json``: the intermediate columns of every rank, and for each projection how the *unsharded*
  factors map to the slice-based strategies (``replicate-u``: ``U`` whole, ``V`` columns; ``reduce-*``:
  ``U`` rows, ``V`` whole), so those strategies need no extra file;
* ``layer_XXX.rank<i>.safetensors``: rank i's own factors of the ``factor-shard`` strategies, every
  projection's block of W (gate/up: its columns, down: its rows) factorised on its own with a 128-aligned
  rank keeping the fraction of parameters the unsharded factors keep (docs/tensor-parallel.md, "Per-shard
  ranks"). Names ``model.layers.{i}.mlp.{proj}_proj.u`` / ``.v`` as in the unsharded files, [in, out].
  ``shards.json`` records their ranks and the fraction of the MLP parameters they keep, which the whole-tile
  rounding can move either way from the unsharded factors'.

Without ``--calibration`` the shard factors are a plain SVD of each block; with it, ``nmmc compress`` computes
them with the same whitening and ``--heal closed-form`` refit as the unsharded factors
(:func:`neuronmm_compiler.compression.heal_shards.whitened_shards`, ``closed_form_heal(shards=...)``) and passes them in
(``--heal finetune`` then fine-tunes the blocks too, :func:`neuronmm_compiler.compression.finetune.finetune_heal`
with ``shards``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoints.config import mlp_weight_names, projection_shape
from ..checkpoints.weights import WeightReader, write_tensor_file
from ..compression import svd
from ..compression.compress import OUTPUT_DTYPES
from ..compression.manifest import factor_names, layer_file, read_manifest
from ..io import write_text_atomic
from .sharding import check_tp, kept_fraction, shard_rank, shard_sizes


def check_model_tp(model_dir: str | Path, tp: int) -> None:
    """InputError when the model's intermediate size cannot be split ``tp`` ways (before the compression runs)."""
    from ..checkpoints.config import read_config

    check_tp(tp, read_config(model_dir).intermediate_size)


def shard_spans(intermediate: int, tp: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` intermediate columns of each rank."""
    sizes = shard_sizes(intermediate, tp)
    starts = [sum(sizes[:i]) for i in range(tp)]
    return [(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def block_rank(rows: int, cols: int, full: int, hidden: int, intermediate: int) -> int | None:
    """A factor-shard block's own rank for a projection of unsharded rank ``full`` (None: not factored)."""
    return shard_rank(rows, cols, kept_fraction(hidden, intermediate, full))


def write_shards(model_dir: str | Path, out_dir: str | Path, tp: int, blocks: Any = None,
                 method: str = "plain SVD per block") -> Path:
    """Write ``out_dir/tp<tp>/`` (see the module docstring) for the compression in ``out_dir``; its path.

    ``blocks[layer][proj]``: each rank's ``(u, v)`` computed by the caller (whitened or healed,
    :mod:`neuronmm_compiler.compression.heal`), None where the blocks are not factored; ``method`` names
    how. Without it, every block is factored by plain SVD."""
    manifest = read_manifest(out_dir)
    config = manifest.model
    spans = shard_spans(config.intermediate_size, tp)
    directory = Path(out_dir) / f"tp{tp}"
    directory.mkdir(parents=True, exist_ok=True)
    reader = WeightReader(model_dir)
    dtype = OUTPUT_DTYPES[manifest.dtype][0]
    layers = []
    held = dense = 0  # parameters of the blocks as written, and of the dense MLP
    for entry in manifest.layers:
        per_rank: list[dict[str, np.ndarray]] = [{} for _ in range(tp)]
        own: dict[str, Any] = {}
        for proj, name in mlp_weight_names(config, entry.layer).items():
            k, n = projection_shape(config, proj)
            full = entry.projections[proj].rank
            dense += k * n
            if entry.projections[proj].method == "dense":
                own[proj] = None
                held += k * n
                continue
            w = reader.read(name, shape=(n, k)).T
            ranks, blocks_held = [], 0
            for rank, (start, stop) in enumerate(spans):
                block = w[:, start:stop] if proj != "down" else w[start:stop, :]
                shard = shard_rank(block.shape[0], block.shape[1], kept_fraction(k, n, full))
                if shard is None:
                    ranks = None
                    break
                given = None if blocks is None else (blocks.get(entry.layer) or {}).get(proj)
                if given is not None:
                    u, v = given[rank]
                else:
                    factors = svd.truncated_svd(block, shard)
                    u, v = factors.u, factors.v
                u_name, v_name = factor_names(entry.layer, proj)
                stored = np.float32 if entry.mx else dtype  # MX: float32, quantized when read, as unsharded
                per_rank[rank][u_name] = np.ascontiguousarray(np.asarray(u).astype(stored))
                per_rank[rank][v_name] = np.ascontiguousarray(np.asarray(v).astype(stored))
                ranks.append(shard)
                blocks_held += shard * sum(block.shape)
            own[proj] = ranks
            held += k * n if ranks is None else blocks_held
        for rank in range(tp):
            if per_rank[rank]:
                stem = layer_file(entry.layer).removesuffix(".safetensors")
                write_tensor_file(directory / f"{stem}.rank{rank}.safetensors", per_rank[rank],
                                  {"nmmc_tp": str(tp), "nmmc_rank": str(rank)})
        layers.append({"layer": entry.layer, "factor_shard_ranks": own})
    slices = {"gate": {"replicate-u": {"u": "whole", "v": "columns [start, stop) of the rank"}},
              "up": {"replicate-u": {"u": "whole", "v": "columns [start, stop) of the rank"}},
              "down": {"reduce-output/reduce-rank": {"u": "rows [start, stop) of the rank", "v": "whole"}}}
    index = {"tp": tp, "model": config.name, "intermediate_shards":
             [{"rank": i, "start": a, "stop": b} for i, (a, b) in enumerate(spans)],
             "unsharded_factors": "the layer_XXX.safetensors files of this compression", "slices": slices,
             "factor_shard": {"files": f"tp{tp}/layer_XXX.rank<i>.safetensors", "method": method,
                              "kept_fraction": held / dense, "layers": layers}}
    write_text_atomic(directory / "shards.json", json.dumps(index, indent=2) + "\n")
    return directory


