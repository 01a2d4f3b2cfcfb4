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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import __version__
from ..checkpoints.config import ModelConfig, read_config
from ..compression import read_manifest
from ..compression.layer_groups import LayerGroup, manifest_groups
from ..compression.manifest import MANIFEST_FILE
from ..driver import Tuned, tune
from ..errors import InputError
from ..frontends.shapes import block_aligned_rank
from ..frontends.workloads import Workload
from ..io import write_text_atomic
from ..ir.fp8 import is_fp8
from ..search import DEFAULT_TRIALS
from ..targets import Target
from ..tuning.speedups import launch_dict
from .entries import BucketResult, bucket_entry, dense_bucket_entry
from .formats import FormatRequest, MlpFormat, choose
from .groups import group_formats, group_index

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
    # others), when some layer is FP8: tune --model then tunes that format instead of choosing one
    # (docs/quantization.md)
    layer_formats: tuple[str, ...] | None = None
    # the layer groups of a compress output whose layers differ in ranks or format (ranks is then None): tune
    # --model tunes one kernel set per group (model_groups.py); None for every other source
    groups: tuple[LayerGroup, ...] | None = None
    # how the FP8 layers of a compress output scale their activations (manifest fp8.act_scale): static, or row (per
    # token, computed in the kernel), which every FP8 kernel tune --model builds for it then takes
    act_scale: str = "static"


def model_path(path: str | Path) -> Path:
    """``path`` itself when it exists, else the config shipped in the package under that name (``llama-3.2-1b``,
    ``meta-llama/Llama-3.2-1B``; :func:`~.models.known_config`); InputError naming both when neither is."""
    from ..checkpoints.config import KNOWN_MODELS, known_config
    from ..errors import UnknownNameError

    p = Path(path)
    if p.exists():
        return p
    try:
        return known_config(str(path))
    except UnknownNameError:
        raise InputError(f"model not found: {p} (give a model directory, its config.json, an 'nmmc compress' output "
                         f"directory, or a shipped model name: {', '.join(KNOWN_MODELS)})") from None


def activation_scales(model: str | Path, dense: bool, weights: Sequence[str], act_scale: str | None,
                      command: str = "the export") -> str:
    """How FP8 kernels built for ``model`` scale their activations: ``static`` (per tensor, stored or calibrated) or
    ``row`` (per token, computed by the kernel: nothing to calibrate). An ``nmmc compress`` output's FP8 layers follow
    its manifest (``fp8.act_scale``; an ``act_scale`` that contradicts it is refused, ``command`` saying who follows
    it); else ``act_scale`` (default static), ``row`` only when one of the ``weights`` formats asked for is FP8."""
    path = model_path(model)
    if path.is_dir() and (path / MANIFEST_FILE).is_file() and not dense:
        manifest = read_manifest(path / MANIFEST_FILE)
        recorded = manifest.act_scale if any(layer.fp8 for layer in manifest.layers) else None
        if act_scale is not None and act_scale != (recorded or "static"):
            raise InputError(f"{path} records " + (f"FP8 layers with {recorded} activation scales (manifest "
                             f"fp8.act_scale), which {command} follows" if recorded else "no FP8 layers") +
                             f": drop --act-scale {act_scale}")
        return recorded or "static"
    if act_scale == "row" and not any(is_fp8(w) for w in weights):
        raise InputError("--act-scale row scales the activations of FP8 kernels per token: it goes with --dtype fp8 "
                         "(MX kernels quantize their activations per block with quantize_mx)")
    return act_scale or "static"


def resolve_model(path: str | Path, keep_ratio: float | None, align: int = 128, *, dense: bool = False) -> ModelSource:
    """Shapes from config.json (or a compression manifest), ranks from the manifest if there is
    one, else from the block-aligned rank formula at ``keep_ratio``; with ``dense``, no ranks (the
    uncompressed MLP, whatever the source holds). ``path`` may name a shipped config. A manifest whose layers
    differ in ranks or format gives its layer groups (``ModelSource.groups``) instead of one rank set."""
    if dense and keep_ratio is not None:
        raise InputError("--dense compiles the uncompressed MLP: drop --keep-ratio")
    p = model_path(path)
    manifest_path = p / MANIFEST_FILE if p.is_dir() else None
    if manifest_path is not None and manifest_path.is_file():
        manifest = read_manifest(manifest_path)
        if dense:
            return ModelSource(manifest.model, None, None, "dense")
        if keep_ratio is not None and abs(keep_ratio - manifest.keep_ratio) > 1e-12:
            raise InputError(f"{p} was compressed at keep ratio {manifest.keep_ratio}; drop --keep-ratio or pass "
                             f"{manifest.keep_ratio}")
        quality = dict(manifest.quality) if manifest.quality else None
        recorded = tuple(layer.fp8 or layer.mx or "bfloat16" for layer in manifest.layers)
        if not manifest.uniform or len(set(recorded)) > 1:  # chosen per layer: one kernel set per layer group
            return ModelSource(manifest.model, None, manifest.keep_ratio, "manifest", quality, recorded,
                               tuple(manifest_groups(manifest, p)), act_scale=manifest.act_scale)
        r = manifest.ranks
        return ModelSource(manifest.model, (r["gate"], r["up"], r["down"]), manifest.keep_ratio, "manifest", quality,
                           recorded if any(layer.fp8 or layer.mx for layer in manifest.layers) else None,
                           act_scale=manifest.act_scale)
    config = read_config(p)
    if dense:
        return ModelSource(config, None, None, "dense")
    if keep_ratio is None:
        raise InputError("--keep-ratio is needed when the model has no compression manifest (or --dense for the "
                         "uncompressed MLP)")
    h, i = config.hidden_size, config.intermediate_size
    gate_up = block_aligned_rank(h, i, keep_ratio, align)
    return ModelSource(config, (gate_up, gate_up, block_aligned_rank(i, h, keep_ratio, align)), keep_ratio, "formula")


#: The largest token bucket a model command takes. A bucket is the token count of one MLP call; serving stacks
#: bound it by their largest prefill chunk (vLLM's ``max_num_batched_tokens``, NxD Inference's context buckets), far
#: below this, and an exported module runs a call of more tokens than its largest bucket as chunks of that bucket,
#: so a larger bucket buys nothing. The bound keeps a typo (``--tokens 10000000``) from exporting a kernel whose
#: verification cannot fit a machine's memory (nmmc's policy, not a hardware limit).
MAX_BUCKET_TOKENS = 65536


def parse_buckets(text: str) -> list[int]:
    """``1,32,128`` -> [1, 32, 128] (positive, at most :data:`MAX_BUCKET_TOKENS`, duplicates dropped, order
    kept)."""
    buckets: list[int] = []
    for item in text.split(","):
        try:
            value = int(item)
        except ValueError:
            raise InputError(f"token buckets are positive integers separated by commas, e.g. 1,32,128; "
                             f"got {text!r}") from None
        if value <= 0:
            raise InputError(f"token buckets must be positive; got {value}")
        if value > MAX_BUCKET_TOKENS:
            raise InputError(f"token bucket {value} is above nmmc's limit of {MAX_BUCKET_TOKENS} tokens per MLP call; "
                             "a call of more tokens runs as chunks of the largest bucket, so export the largest "
                             "chunk your serving stack runs (e.g. vLLM's --max-num-batched-tokens)")
        if value not in buckets:
            buckets.append(value)
    return buckets


def write_index(out_dir: str | Path, index: Mapping[str, Any]) -> None:
    """``out_dir``/index.json, written atomically."""
    write_text_atomic(Path(out_dir) / INDEX_FILE, json.dumps(index, indent=2) + "\n")


def tune_model(source: ModelSource, buckets: list[int], out_dir: str | Path, *, target: Target, dialect: str,
               trials: int = DEFAULT_TRIALS, seed: int = 0, sdk: str | None = None,
               tune_bucket: Callable[[Workload, int], Tuned] | None = None, jobs: int = 1,
               progress: Callable[[int, int, float], None] | None = None,
               on_written: Callable[[list[tuple[Workload, Tuned]]], None] | None = None,
               formats: FormatRequest | None = None) -> dict[str, Any]:
    """Tune and emit one fused MLP per bucket into ``out_dir``; write and return the index.
    ``tune_bucket(workload, bucket_index)`` runs one search with the caller's settings (``nmmc tune
    --model``: cache, timeout, method, progress); by default :func:`driver.tune` with ``trials`` and
    ``seed`` (for Neuron SDK release ``sdk``, None: the newest; ``tune_bucket`` carries its own). Each bucket needs
    two independent searches (the compressed MLP and the fused dense
    one): with ``jobs`` > 1 they run in that many worker processes (``tune_bucket`` must then be
    picklable: a module-level function or a partial of one), each search deterministic, so the
    files and the index are those of ``jobs=1``. ``progress(buckets_done, buckets, inf)`` is
    called as buckets complete; ``on_written(searches)`` once every file is written, with each search's
    workload and result (``nmmc tune --model`` stores them in the result cache then, so that an interrupted
    command leaves no cache entry). A source without ranks (``--dense``) tunes the dense MLP alone. ``formats``: the
    weight formats allowed (default bf16 alone); each bucket tunes every allowed format (:mod:`.formats`). A
    source whose layers record their format (``source.layer_formats``, an ``nmmc compress --dtype fp8`` output) has
    it chosen in every bucket, the other allowed formats tuned for comparison (:func:`recorded_format`). A source of
    layer groups (``source.groups``: a compress output whose layers differ in ranks or format) has each group tuned
    so, its files in ``<group>/``, an equal workload searched once, and nmmc's fused dense bf16 MLP tuned in every
    bucket as the baseline of the model's total (:mod:`.model_groups`)."""
    if tune_bucket is None:
        tune_bucket = functools.partial(_tune_default, target=target, dialect=dialect, trials=trials, seed=seed,
                                        sdk=sdk)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    c = source.config
    plans = _plans(source, formats or FormatRequest())
    # before any search: every format to tune (allowed or recorded) must compile here (MX: trn3 only) and take the
    # model's shapes (an MX matmul contracts multiples of 512: an SVD rank of 1280 does not)
    FormatRequest(tuple(dict.fromkeys(f.weights for p in plans for f in p.candidates))).check_target(target, dialect)
    for plan in plans:
        for fmt in plan.candidates:
            try:
                fmt.workload(buckets[0], c.hidden_size, c.intermediate_size, plan.ranks).graph()
            except InputError as err:
                raise InputError(f"format {fmt.name} at this model's shapes: {err}") from None
    searches: list[tuple[int, Workload]] = []
    slots: dict[str, int] = {}

    def search(bucket: int, fmt: MlpFormat, ranks: tuple[int, int, int] | None) -> int:
        """The position of a search in ``searches``, added unless an equal workload is there (layer groups share
        their dense MLPs)."""
        workload = fmt.workload(buckets[bucket], c.hidden_size, c.intermediate_size, ranks)
        key = json.dumps(workload.to_dict(), sort_keys=True)
        if key not in slots:
            slots[key] = len(searches)
            searches.append((bucket, workload))
        return slots[key]

    # positions[b][p]: bucket b's searches of plan p, one per candidate format
    positions = [[[search(b, f, plan.ranks) for f in plan.candidates] for plan in plans] for b in range(len(buckets))]
    # a grouped output's totals are compared with nmmc's fused dense bf16 MLP in every layer (model_groups.py)
    baseline = [search(b, MlpFormat(False), None) for b in range(len(buckets))] if source.groups else []
    tuned_all = _run_searches(tune_bucket, searches, jobs, progress, len(buckets))
    out.mkdir(parents=True, exist_ok=True)  # only once every search succeeded: a failed one leaves nothing
    results = [[_write_bucket(out, plan, tokens, [tuned_all[i] for i in positions[b][p]],
                              searches[positions[b][p][0]][1]) for b, tokens in enumerate(buckets)]
               for p, plan in enumerate(plans)]
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
        "sdk": sdk_range(dialect, target, sdk),
        "dtype": results[0][0].workload.dtype if buckets else None,
        # the formats each bucket chose among, {dense, SVD} x the allowed weight formats (model_formats.py)
        "formats_allowed": [f.name for f in plans[0].candidates],
        # "manifest": each bucket's chosen format is the one the compress output records for its layers (not the
        # fastest predicted); "latency": the fastest predicted of the allowed formats
        "formats_from": "manifest" if plans[0].recorded is not None else "latency",
        "layer_formats": None if source.layer_formats is None else list(source.layer_formats),
    }
    if source.groups:  # per group its layers and buckets; per bucket the model's total (model_groups.py)
        index.update(group_index(source.groups, results, [tuned_all[i] for i in baseline]))
    else:
        index["buckets"] = [bucket_entry(r) if source.ranks is not None else dense_bucket_entry(r)
                            for r in results[0]]
        for entry in index["buckets"]:
            entry["chosen_by"] = index["formats_from"]
    write_index(out, index)
    if on_written is not None:
        on_written([(workload, tuned) for (_, workload), tuned in zip(searches, tuned_all, strict=True)])
    return index


@dataclass(frozen=True)
class _Plan:
    """One kernel set ``tune_model`` tunes: the model's (every layer alike) or one layer group's (files under
    ``prefix``); ``recorded``: the format the compress output records for its layers (None: chosen by latency)."""

    ranks: tuple[int, int, int] | None
    candidates: tuple[MlpFormat, ...]
    recorded: MlpFormat | None
    prefix: str = ""


def _plans(source: ModelSource, formats: FormatRequest) -> list[_Plan]:
    """What ``tune_model`` tunes: an SVD MLP with nmmc's fused dense MLP (its honest alternative), per allowed weight
    format; a dense source the dense MLPs alone; a grouped source each group so, in the format it records."""
    if source.act_scale != "static":  # a compress output's FP8 layers: their recorded scales
        formats = replace(formats, act_scale=source.act_scale)
    if source.groups:
        return [_Plan(g.ranks, *group_formats(g, formats), prefix=f"{g.name}/") for g in source.groups]
    recorded = recorded_format(source, formats)
    if recorded is not None and formats.weights == FormatRequest().weights:
        formats = FormatRequest((recorded.weights,), formats.act_scale)
    return [_Plan(source.ranks, formats.candidates(source.ranks is not None), recorded)]


def _write_bucket(out: Path, plan: _Plan, tokens: int, tuned: list[Tuned], workload: Workload) -> BucketResult:
    """Write a bucket's primary kernel (the first candidate's) and, when another format is chosen, that one."""
    by_format = dict(zip(plan.candidates, tuned, strict=True))
    primary = plan.candidates[0]
    chosen = plan.recorded or choose({f: t.compiled.cost.latency_us for f, t in by_format.items()}, plan.candidates)
    (out / plan.prefix).mkdir(exist_ok=True)
    name = primary.file(tokens, primary)
    write_text_atomic(out / plan.prefix / name, by_format[primary].compiled.kernel.source)
    if chosen != primary:  # the bucket's recommended kernel is another format's: write it too
        write_text_atomic(out / plan.prefix / chosen.file(tokens, primary), by_format[chosen].compiled.kernel.source)
    return BucketResult(tokens, plan.prefix + name, workload, by_format[primary],
                        by_format[MlpFormat(False, primary.weights, primary.act_scale)], by_format, chosen, plan.prefix)


def recorded_format(source: ModelSource, formats: FormatRequest) -> MlpFormat | None:
    """The format an ``nmmc compress`` output records for its layers (``layers[i].fp8`` or ``.mx``), which ``tune
    --model`` tunes and chooses in every bucket; None when it records none. Its layers agree (a source whose layers
    differ has its layer groups, each with its own recorded format: :func:`.model_groups.group_formats`), and
    ``--dtype``, when given, must allow it (the other formats it lists are tuned for comparison: the front shows
    what the recorded choice costs)."""
    if source.layer_formats is None or source.ranks is None:
        return None
    distinct = sorted(set(source.layer_formats))
    if len(distinct) > 1:  # resolve_model gives such a source its layer groups, which _plans tunes one by one
        raise ValueError(f"a source whose layers differ in format ({', '.join(distinct)}) needs its layer groups "
                         "(ModelSource.groups, as resolve_model gives them)")
    recorded = MlpFormat(True, distinct[0], formats.format_scale(distinct[0]))
    if formats.weights != FormatRequest().weights and recorded.weights not in formats.weights:
        raise InputError(f"the compress output's layers are {recorded.weights} (manifest layers[i].fp8), which "
                         f"tune --model uses: add it to --dtype or drop --dtype")
    return recorded


def sdk_range(dialect: str, target: Target, sdk: str | None = None) -> dict[str, str] | None:
    """The Neuron SDK releases whose NKI rules the kernels emitted for release ``sdk`` (None: the newest) were checked
    against for ``dialect`` on ``target`` (support.py's matrix; None where no release documents the pairing). On a
    logical core of two programs any kernel may exchange values, whose spelling holds on part of the dialect's range
    only (:func:`~.support.kernel_range`): the range is then that part, conservatively, for every kernel."""
    from ..support import kernel_range, newest_sdk
    from ..vocab import Dialect

    concrete = Dialect(dialect)
    span = kernel_range(concrete, target.name, sdk or newest_sdk(concrete, target.name), target.lnc > 1)
    return None if span is None else {"min": span[0], "max": span[1]}


def _tune_default(workload: Workload, bucket: int, *, target: Target, dialect: str, trials: int, seed: int,
                  sdk: str | None = None) -> Tuned:
    return tune(workload, target=target, dialect=dialect, sdk=sdk, trials=trials, seed=seed)


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
