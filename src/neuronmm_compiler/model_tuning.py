"""From a model to tuned kernels: the MLP of a Hugging Face style model, compressed with
block-aligned SVD, tuned for every token bucket the user serves.

``tune_model`` takes a model directory (config.json), a config.json, or the output directory of
``nmmc compress`` (its manifest.json gives the ranks actually used; otherwise they follow from the
keep ratio), tunes one fused MLP per distinct bucket, and writes the kernel files plus an index
(JSON) mapping each bucket to its file, schedule, predicted latency and speedups. The first speedup
is over the best dense alternative nmmc itself produces, the fused dense gated MLP tuned the same
way; the others are over AWS's per-matmul kernels (dense, and the SVD factors unfused). With several weight
formats allowed (``--dtype bf16,fp8``, :mod:`.model_formats`), every bucket tunes each of {dense, SVD} x those formats,
records the front and chooses the fastest predicted one.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import __version__
from .cost_model import CostReport
from .driver import Tuned, tune
from .errors import InputError
from .frontends.shapes import block_aligned_rank
from .frontends.workloads import MlpWorkload, Workload, mlp_workload
from .io import write_text_atomic
from .lowerings.base import Baseline, ordered_baselines
from .model_formats import FormatRequest, MlpFormat, choose
from .models import ModelConfig, read_config, read_manifest
from .models.manifest import MANIFEST_FILE
from .search import DEFAULT_TRIALS
from .speedups import launch_dict
from .targets import Target

INDEX_FILE = "index.json"


@dataclass(frozen=True)
class ModelSource:
    """The model's shapes and the MLP ranks to compile for."""

    config: ModelConfig
    ranks: tuple[int, int, int] | None  # None: the dense MLP (tune --model --dense)
    keep_ratio: float | None
    ranks_from: str  # "manifest", "formula" or "dense"
    quality: dict[str, Any] | None = None  # the manifest's measured quality (nmmc compress --eval), if any
    # per layer, the kernel weight format an 'nmmc compress' output records (layers[i].fp8; "bfloat16" for the
    # others), when some layer is FP8: tune --model then tunes that format instead of choosing one (docs/fp8.md)
    layer_formats: tuple[str, ...] | None = None


def model_path(path: str | Path) -> Path:
    """``path`` itself when it exists, else the config shipped in the package under that name (``llama-3.2-1b``,
    ``meta-llama/Llama-3.2-1B``; :func:`~.models.known_config`); InputError naming both when neither is."""
    from .errors import UnknownNameError
    from .models import KNOWN_MODELS, known_config

    p = Path(path)
    if p.exists():
        return p
    try:
        return known_config(str(path))
    except UnknownNameError:
        raise InputError(f"model not found: {p} (give a model directory, its config.json, an 'nmmc compress' output "
                         f"directory, or a shipped model name: {', '.join(KNOWN_MODELS)})") from None


def resolve_model(path: str | Path, keep_ratio: float | None, align: int = 128, *, dense: bool = False) -> ModelSource:
    """Shapes from config.json (or a compression manifest), ranks from the manifest if there is
    one, else from the block-aligned rank formula at ``keep_ratio``; with ``dense``, no ranks (the
    uncompressed MLP, whatever the source holds). ``path`` may name a shipped config."""
    if dense and keep_ratio is not None:
        raise InputError("--dense compiles the uncompressed MLP: drop --keep-ratio")
    p = model_path(path)
    manifest_path = p / MANIFEST_FILE if p.is_dir() else None
    if manifest_path is not None and manifest_path.is_file():
        manifest = read_manifest(manifest_path)
        if dense:
            return ModelSource(manifest.model, None, None, "dense")
        if not manifest.uniform:
            raise InputError(f"{p}: its ranks differ by layer (chosen by 'nmmc compress --choose-ranks'); 'nmmc "
                             "export' groups the layers by ranks and format and exports one kernel set per group, or "
                             "tune each distinct rank set with 'nmmc tune --mlp --ranks G,U,D' (manifest.json lists "
                             "them)")
        r = manifest.ranks
        if keep_ratio is not None and abs(keep_ratio - manifest.keep_ratio) > 1e-12:
            raise InputError(f"{p} was compressed at keep ratio {manifest.keep_ratio}; drop --keep-ratio or pass "
                             f"{manifest.keep_ratio}")
        recorded = tuple(layer.fp8 or "bfloat16" for layer in manifest.layers)
        return ModelSource(manifest.model, (r["gate"], r["up"], r["down"]), manifest.keep_ratio, "manifest",
                           dict(manifest.quality) if manifest.quality else None,
                           recorded if any(layer.fp8 for layer in manifest.layers) else None)
    config = read_config(p)
    if dense:
        return ModelSource(config, None, None, "dense")
    if keep_ratio is None:
        raise InputError("--keep-ratio is needed when the model has no compression manifest (or --dense for the "
                         "uncompressed MLP)")
    h, i = config.hidden_size, config.intermediate_size
    gate_up = block_aligned_rank(h, i, keep_ratio, align)
    return ModelSource(config, (gate_up, gate_up, block_aligned_rank(i, h, keep_ratio, align)), keep_ratio, "formula")


def parse_buckets(text: str) -> list[int]:
    """``1,32,128`` -> [1, 32, 128] (positive, duplicates dropped, order kept)."""
    buckets: list[int] = []
    for item in text.split(","):
        try:
            value = int(item)
        except ValueError:
            raise InputError(f"token buckets are positive integers separated by commas, e.g. 1,32,128; "
                             f"got {text!r}") from None
        if value <= 0:
            raise InputError(f"token buckets must be positive; got {value}")
        if value not in buckets:
            buckets.append(value)
    return buckets


@dataclass
class BucketResult:
    tokens: int
    file: str
    workload: Workload
    tuned: Tuned
    dense: Tuned  # nmmc's own best dense alternative: the fused dense gated MLP, tuned the same way
    formats: dict[MlpFormat, Tuned]  # every allowed format's search (the primary and its dense MLP among them)
    chosen: MlpFormat  # the fastest predicted (model_formats.choose)


def tune_model(source: ModelSource, buckets: list[int], out_dir: str | Path, *, target: Target, dialect: str,
               trials: int = DEFAULT_TRIALS, seed: int = 0,
               tune_bucket: Callable[[Workload, int], Tuned] | None = None, jobs: int = 1,
               progress: Callable[[int, int, float], None] | None = None,
               on_written: Callable[[list[tuple[Workload, Tuned]]], None] | None = None,
               formats: FormatRequest | None = None) -> dict[str, Any]:
    """Tune and emit one fused MLP per bucket into ``out_dir``; write and return the index.
    ``tune_bucket(workload, bucket_index)`` runs one search with the caller's settings (``nmmc tune
    --model``: cache, timeout, method, progress); by default :func:`driver.tune` with ``trials`` and
    ``seed``. Each bucket needs two independent searches (the compressed MLP and the fused dense
    one): with ``jobs`` > 1 they run in that many worker processes (``tune_bucket`` must then be
    picklable: a module-level function or a partial of one), each search deterministic, so the
    files and the index are those of ``jobs=1``. ``progress(buckets_done, buckets, inf)`` is
    called as buckets complete; ``on_written(searches)`` once every file is written, with each search's
    workload and result (``nmmc tune --model`` stores them in the result cache then, so that an interrupted
    command leaves no cache entry). A source without ranks (``--dense``) tunes the dense MLP alone. ``formats``: the
    weight formats allowed (default bf16 alone); each bucket tunes every allowed format (:mod:`.model_formats`). A
    source whose layers record their format (``source.layer_formats``, an ``nmmc compress --dtype fp8`` output) has
    it chosen in every bucket, the other allowed formats tuned for comparison (:func:`recorded_format`)."""
    if tune_bucket is None:
        tune_bucket = functools.partial(_tune_default, target=target, dialect=dialect, trials=trials, seed=seed)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    c = source.config
    formats = formats or FormatRequest()
    # an SVD MLP is searched with nmmc's fused dense MLP (its honest alternative), per allowed weight format; a dense
    # source has the dense MLPs alone
    recorded = recorded_format(source, formats)
    if recorded is not None and formats.weights == FormatRequest().weights:
        formats = FormatRequest((recorded.weights,))
    candidates = formats.candidates(source.ranks is not None)
    primary = candidates[0]
    searches = [(bucket, f.workload(tokens, c.hidden_size, c.intermediate_size, source.ranks))
                for bucket, tokens in enumerate(buckets) for f in candidates]
    tuned_all = _run_searches(tune_bucket, searches, jobs, progress, len(buckets))
    out.mkdir(parents=True, exist_ok=True)  # only once every search succeeded: a failed one leaves nothing
    results: list[BucketResult] = []
    step = len(candidates)
    for bucket, tokens in enumerate(buckets):
        by_format = dict(zip(candidates, tuned_all[step * bucket:step * (bucket + 1)], strict=True))
        chosen = recorded or choose({f: t.compiled.cost.latency_us for f, t in by_format.items()}, candidates)
        name = primary.file(tokens, primary)
        write_text_atomic(out / name, by_format[primary].compiled.kernel.source)
        if chosen != primary:  # the bucket's recommended kernel is another format's: write it too
            write_text_atomic(out / chosen.file(tokens, primary), by_format[chosen].compiled.kernel.source)
        results.append(BucketResult(tokens, name, searches[step * bucket][1], by_format[primary],
                                    by_format[MlpFormat(False, primary.weights)], by_format, chosen))
    index = {
        "nmmc_version": __version__,
        "model": {"name": c.name, "architecture": c.architecture, "hidden_size": c.hidden_size,
                  "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers},
        "keep_ratio": source.keep_ratio,
        "ranks": None if source.ranks is None else dict(zip(("gate", "up", "down"), source.ranks, strict=True)),
        "ranks_from": source.ranks_from,
        "quality": source.quality,  # measured by nmmc compress --eval (None: the SVD's effect was not measured)
        "target": target.name,
        "target_spec": target.spec,  # the target, logical-core degree and launch context in one string
        "lnc": target.lnc,
        "launch": launch_dict(target),  # the launch context every latency and speedup below was predicted in
        "dialect": dialect,
        "sdk": sdk_range(dialect, target),
        "dtype": results[0].workload.dtype if results else None,
        # the formats each bucket chose among, {dense, SVD} x the allowed weight formats (model_formats.py)
        "formats_allowed": [f.name for f in candidates],
        # "manifest": each bucket's chosen format is the one the compress output records for its layers (not the
        # fastest predicted); "latency": the fastest predicted of the allowed formats
        "formats_from": "manifest" if recorded is not None else "latency",
        "layer_formats": None if source.layer_formats is None else list(source.layer_formats),
        "buckets": [_bucket_entry(r) if source.ranks is not None else _dense_bucket_entry(r) for r in results],
    }
    for entry in index["buckets"]:
        entry["chosen_by"] = index["formats_from"]
    write_text_atomic(out / INDEX_FILE, json.dumps(index, indent=2) + "\n")
    if on_written is not None:
        on_written([(workload, tuned) for (_, workload), tuned in zip(searches, tuned_all, strict=True)])
    return index


def recorded_format(source: ModelSource, formats: FormatRequest) -> MlpFormat | None:
    """The format an ``nmmc compress`` output records for its layers (``layers[i].fp8``), which ``tune --model``
    tunes and chooses in every bucket; None when it records none. Its layers must agree (else ``nmmc export``,
    which groups them), and ``--dtype``, when given, must allow it (the other formats it lists are tuned for
    comparison: the front shows what the recorded choice costs)."""
    if source.layer_formats is None or source.ranks is None:
        return None
    distinct = sorted(set(source.layer_formats))
    if len(distinct) > 1:
        raise InputError(f"the compress output's layers have different kernel formats ({', '.join(distinct)}; "
                         "manifest layers[i].fp8): 'nmmc export' groups the layers by format and exports one kernel "
                         "set per group; tune --model tunes one format for every layer")
    recorded = MlpFormat(True, distinct[0])
    if formats.weights != FormatRequest().weights and recorded.weights not in formats.weights:
        raise InputError(f"the compress output's layers are {recorded.weights} (manifest layers[i].fp8), which "
                         f"tune --model uses: add it to --dtype or drop --dtype")
    return recorded


def sdk_range(dialect: str, target: Target) -> dict[str, str] | None:
    """The Neuron SDK releases whose NKI rules the kernels were checked against for ``dialect`` on ``target``
    (support.py's matrix; None where no release documents the pairing)."""
    from .support import SUPPORT

    for entry in SUPPORT:
        if entry.dialect == dialect and target.name in entry.targets:
            return {"min": entry.sdk_min, "max": entry.sdk_max}
    return None


def kernel_entries(tuned: Tuned) -> list[dict[str, Any]]:
    """Each kernel of a compiled workload in call order: its name, its arguments and results by name (``inputs``,
    ``outputs``) and with their shapes, dtypes and HBM layout (``arguments``, ``results``)."""
    def described(buffers: Any) -> list[dict[str, Any]]:
        return [{"name": b.name, "shape": list(b.shape), "dtype": b.dtype, "layout": "row_major"} for b in buffers]

    return [{"name": p.name, "inputs": [b.name for b in p.params], "outputs": [b.name for b in p.outputs],
             "arguments": described(p.params), "results": described(p.outputs)} for p in tuned.compiled.programs]


#: The name of nmmc's own fused dense MLP among a tuned SVD MLP's baselines (lowerings/base.py, BASELINE_ORDER).
NMMC_DENSE = "nmmc-dense"


def dense_counterpart(workload: Workload) -> Workload | None:
    """What nmmc's own dense baseline tunes (None for anything else): the dense MLP an SVD-compressed MLP replaces,
    in the same weight format; for an FP8 dense MLP, the unquantized dense MLP it quantizes (what the user runs
    without FP8)."""
    if not isinstance(workload, MlpWorkload) or not (workload.svd or workload.fp8):
        return None
    return mlp_workload(workload.tokens, workload.hidden, workload.intermediate, dense=True, dtype=workload.dtype,
                        fp8=workload.fp8 if workload.svd else None)


def with_dense_baseline(tuned: Tuned, dense: Tuned, *, unquantized: bool = False) -> Tuned:
    """``tuned`` with nmmc's own fused dense MLP (``dense``, tuned the same way, on the same target and launch
    context) among its baselines, in the order a user meets them (:func:`~.lowerings.base.ordered_baselines`);
    ``unquantized``: ``dense`` is the bf16 MLP an FP8 one quantizes, and its label says so."""
    if unquantized:
        label = "dense MLP without FP8 (nmmc's fused kernel, tuned)"
        name = ("nmmc's fused dense MLP without FP8 (FP8's accuracy cost: nmmc verify, nmmc compress --eval, "
                "docs/fp8.md)")
    else:
        label, name = "dense MLP (nmmc's fused kernel, tuned)", "nmmc's fused dense MLP"
    baseline = Baseline(label, name, dense.compiled.cost, one_core=False)
    return replace(tuned, baselines=ordered_baselines({**tuned.baselines, NMMC_DENSE: baseline}))


def _tune_default(workload: Workload, bucket: int, *, target: Target, dialect: str, trials: int, seed: int) -> Tuned:
    return tune(workload, target=target, dialect=dialect, trials=trials, seed=seed)


def _run_searches(tune_bucket: Callable[[Workload, int], Tuned], searches: list[tuple[int, Workload]], jobs: int,
                  progress: Callable[[int, int, float], None] | None, buckets: int) -> list[Tuned]:
    """The result of every (bucket index, workload) search, in order, run in ``jobs`` processes
    (spawned, as the stored-study workers are) or in this one."""
    results: list[Tuned | None] = [None] * len(searches)

    def record(position: int, tuned: Tuned) -> None:
        results[position] = tuned
        if progress:
            done = sum(all(results[p] is not None for p, (b, _) in enumerate(searches) if b == bucket)
                       for bucket in range(buckets))
            progress(done, buckets, float("inf"))

    if jobs <= 1 or len(searches) <= 1:
        for position, (bucket, workload) in enumerate(searches):
            record(position, tune_bucket(workload, bucket))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(searches)), mp_context=context) as pool:
            futures = {pool.submit(tune_bucket, workload, bucket): position
                       for position, (bucket, workload) in enumerate(searches)}
            for future in as_completed(futures):
                record(futures[future], future.result())
    return [tuned for tuned in results if tuned is not None]


def _latency(cost: CostReport | None) -> float | None:
    return None if cost is None else cost.latency_us


def _dense_bucket_entry(result: BucketResult) -> dict[str, Any]:
    """A bucket of ``tune --model --dense``: nmmc's fused dense MLP against AWS's kernel per matmul."""
    compiled = result.tuned.compiled
    speedups = result.tuned.speedups()
    nkilib = result.tuned.baselines.get("nkilib-mlp")
    nkilib_us = _latency(nkilib.cost) if nkilib is not None and nkilib.cost is not None and nkilib.cost.feasible \
        else None
    # nki-library's MLP where it beats nmmc's dense kernel: keep what NxD Inference runs
    best = result.formats[result.chosen].compiled.cost.latency_us
    recommended = "nkilib" if nkilib_us is not None and nkilib_us < best else "dense"
    return {"tokens": result.tokens, "file": result.file, "kernels": kernel_entries(result.tuned),
            "schedule": compiled.schedule.as_dict(), "predicted_us": compiled.cost.latency_us,
            "nkilib_us": nkilib_us, "speedup_vs_nkilib": speedups.get("nkilib-mlp"),
            "baseline_us": _latency(result.tuned.baselines["dense"].cost), "speedup_vs_baseline": speedups["dense"],
            "baselines": [{"name": name, "computation": b.label, "latency_us": _latency(b.cost),
                           "speedup": speedups[name]} for name, b in result.tuned.baselines.items()],
            "recommended": recommended, "recommended_file": None if recommended == "nkilib" else _chosen_file(result),
            **_format_fields(result)}


def _bucket_entry(result: BucketResult) -> dict[str, Any]:
    compiled = result.tuned.compiled
    tuned = with_dense_baseline(result.tuned, result.dense)
    speedups = tuned.speedups()
    fused_dense = result.dense.compiled.cost.latency_us
    nkilib = _latency(result.tuned.baselines["nkilib-mlp"].cost) if "nkilib-mlp" in result.tuned.baselines else None
    best_nmmc = result.formats[result.chosen].compiled.cost.latency_us
    # nki-library's MLP where it beats every kernel nmmc wrote for the bucket: keep what NxD Inference runs
    nkilib_best = nkilib is not None and result.tuned.baselines["nkilib-mlp"].cost.feasible and nkilib < best_nmmc
    recommended = "nkilib" if nkilib_best else "svd" if result.chosen.svd else "dense"
    return {
        "tokens": result.tokens,
        "file": result.file,
        "kernels": kernel_entries(result.tuned),
        "schedule": compiled.schedule.as_dict(),
        "predicted_us": compiled.cost.latency_us,
        # the honest comparison: the best dense MLP nmmc itself emits (one fused kernel), tuned alike
        "fused_dense_us": fused_dense,
        "speedup_vs_fused_dense": fused_dense / compiled.cost.latency_us,
        # what NxD Inference runs today: nki-library's fused MLP (None where it does not run this shape)
        "nkilib_us": nkilib,
        "speedup_vs_nkilib": speedups.get("nkilib-mlp"),
        "baseline_us": _latency(result.tuned.baselines["dense"].cost),
        "unfused_baseline_us": _latency(result.tuned.baselines["unfused"].cost),
        "speedup_vs_baseline": speedups["dense"],
        "speedup_vs_unfused": speedups["unfused"],
        # every baseline in the order a user meets them (lowerings/base.py, BASELINE_ORDER)
        "baselines": [{"name": name, "computation": b.label, "latency_us": _latency(b.cost),
                       "speedup": speedups[name]} for name, b in tuned.baselines.items()],
        "recommended": recommended,
        "recommended_file": None if recommended == "nkilib" else _chosen_file(result),
        **_format_fields(result),
    }


def _chosen_file(result: BucketResult) -> str:
    primary = next(iter(result.formats))
    return result.chosen.file(result.tokens, primary)


def _format_fields(result: BucketResult) -> dict[str, Any]:
    """A bucket's format choice: the primary kernel's format, the chosen one, and the front (every allowed format's
    predicted latency, its workload and, where written, its file)."""
    primary = next(iter(result.formats))
    written = {primary, result.chosen}
    return {"format": primary.name, "chosen_format": result.chosen.name,
            "formats": [{"name": f.name, "structure": "svd" if f.svd else "dense", "weights": f.weights,
                         "predicted_us": t.compiled.cost.latency_us, "workload": t.compiled.workload.to_dict(),
                         "file": f.file(result.tokens, primary) if f in written else None,
                         "chosen": f == result.chosen} for f, t in result.formats.items()]}
