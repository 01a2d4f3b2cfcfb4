"""``--tp N`` (N > 1) of ``nmmc tune``, ``emit``, ``cost`` and ``explain``: plan the sharded MLP, write its
kernels and plan, print the strategies. ``--tp 1`` never comes here (the commands run as they always did)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..cost_model.collectives import UNVALIDATED
from ..cost_model.trust import trust_note, typical_range
from ..driver import Compiled
from ..errors import InputError
from ..frontends.shapes import Fp8Weights
from ..frontends.workloads import Workload
from ..jobs import Job, SearchSettings
from ..targets import Target
from ..tuning.speedups import context_note, launch_dict, speedup_text
from .planner import KEPT_TOLERANCE, KernelFn, TpResult, alternative_label, plan_tp

Echo = Callable[..., None]


def default_kernels(target: Target, dialect: str | None, sdk: str | None = None) -> KernelFn:
    """Compile each per-rank workload under its entry's default schedule (``emit``, ``cost``, ``explain``), for Neuron
    SDK release ``sdk`` (None: the newest of the dialect on the target)."""
    from ..driver import compile_workload

    memo: dict[Workload, Compiled] = {}

    def compile_one(workload: Workload) -> Compiled:
        if workload not in memo:
            memo[workload] = compile_workload(workload, target=target, dialect=dialect, sdk=sdk)
        return memo[workload]

    return compile_one


class TunedKernels:
    """Tune each per-rank workload (answered from the result cache when tuned before); the searches are stored in
    the cache only by :meth:`commit`, which a command calls once all its files are written, so an interrupted or
    failing command leaves no cache entry."""

    def __init__(self, target: Target, dialect: str, settings: SearchSettings, *, cache_dir: str | None,
                 use_cache: bool, sdk: str | None = None) -> None:
        from pathlib import Path

        from ..artifacts.cache import ResultCache

        self.target, self.dialect, self.settings, self.sdk = target, dialect, settings, sdk
        self.cache = ResultCache(Path(cache_dir) if cache_dir else None) if use_cache else None
        self.memo: dict[Workload, Compiled] = {}
        self.pending: list[tuple[Job, Any]] = []

    def __call__(self, workload: Workload) -> Compiled:
        from ..driver import tune_cached
        from ..jobs import resolve

        if workload not in self.memo:
            job = resolve(workload, self.target, self.dialect, self.sdk)
            tuned, from_cache = tune_cached(job, self.settings, self.cache, store=False)
            if not from_cache:
                self.pending.append((job, tuned))
            self.memo[workload] = tuned.compiled
        return self.memo[workload]

    def commit(self) -> None:
        """Store every search run so far in the result cache."""
        from ..driver import store_tuned

        if self.cache is not None:
            for job, tuned in self.pending:
                store_tuned(job, tuned, self.settings, self.cache)
        self.pending.clear()


def tuned_kernels(target: Target, dialect: str, *, trials: int, seed: int, method: str | None,
                  exhaustive_threshold: int | None, cache_dir: str | None, use_cache: bool,
                  sdk: str | None = None) -> TunedKernels:
    """Tune each per-rank workload (see :class:`TunedKernels`; call its ``commit`` once the outputs are written), for
    Neuron SDK release ``sdk`` (None: the newest of the dialect on the target)."""
    from ..workers.cores import available_cores

    # every core this process may use for each search's polish (search/prefetch.py; the same result with one)
    settings = SearchSettings(trials=trials, seed=seed, method=method, exhaustive_threshold=exhaustive_threshold,
                              processes=available_cores())
    return TunedKernels(target, dialect, settings, cache_dir=cache_dir, use_cache=use_cache, sdk=sdk)


def result_lines(result: TpResult) -> list[str]:
    """The strategies' per-rank kernel, communication and total times, the choice and the alternatives."""
    width = max(46, *(len(label) for label in result.alternatives))
    lines = [f"tensor parallel: {result.workload.describe()}", f"  over {result.tp} ranks of {result.target.label} "
             f"(intermediate shards {min(result.chosen.sharded.sizes)}..{max(result.chosen.sharded.sizes)})"
             if result.chosen.sharded else "",
             f"  {'strategy':<{width}} {'kernel us':>10} {'comm us':>9} {'total us':>9} {'comm KiB/rank':>14} "
             f"{'kept':>5}"]
    for r in result.results:
        if r.error is not None:
            lines.append(f"  {r.strategy.name:<{width}} does not apply: {r.error}")
            continue
        mark = "  <- chosen" if r is result.chosen else ""
        lines.append(f"  {r.strategy.name:<{width}} {r.kernel_us:>10.2f} {r.comm_us:>9.2f} {r.total_us:>9.2f} "
                     f"{r.comm_bytes / 1024:>14.1f} {r.kept:>5.3f}{mark}")
    for label, alt in result.alternatives.items():
        text = ("not modelled, or cannot run in this launch context (nki-library's where it asserts or vLLM Neuron "
                "does not call it; AWS's LNC=1 kernels in an LNC=2 graph; nmmc tune --json says why)") if alt is None \
            else \
            f"{alt['kernel_us']:>10.2f} {alt['comm_us']:>9.2f} {alt['total_us']:>9.2f}"
        lines.append(f"  {label:<{width}} {text}")
    chosen = result.chosen
    for label, alt in result.alternatives.items():
        if alt is not None:
            speedup = alt["total_us"] / chosen.total_us
            lines.append(f"  {chosen.strategy.name} vs {label} ({result.target.launch}): {speedup_text(speedup)}"
                         + (" (the dense MLP is predicted faster at this shape)" if speedup < 1 else ""))
    lines.extend(accuracy_lines(result))
    lines.append(f"  {context_note(result.target)}")
    for step in chosen.collectives:
        lines.append(f"  chosen collective: {step.op} of {step.tensor_bytes} bytes over {step.ranks} ranks, "
                     f"{step.bytes_sent_per_rank:.0f} bytes sent per rank")
    band = typical_range(chosen.kernel_us, result.target)
    if band is not None:
        lines.append(f"  chosen kernel time typically {band[0]:.1f}-{band[1]:.1f} us (model error's typical factor)")
    lines.append(f"  kernel latencies are the cost model's; model error: {trust_note(result.target, fused=True)}")
    lines.append(f"  {UNVALIDATED}")
    return [line for line in lines if line]


def accuracy_lines(result: TpResult) -> list[str]:
    """What the latency-only choice gives up, when the strategies differ in the parameters they keep (the ``kept``
    column): whether the chosen keeps the most, else that it is less accurate, and the fastest one that is not."""
    chosen, best = result.chosen, result.most_accurate
    if all(abs(r.kept - best.kept) < KEPT_TOLERANCE for r in result.applicable):
        return []
    lines = ["  kept: the fraction of the dense MLP's parameters a strategy's weights hold (factor-shard factorises "
             "each shard on its own, at the 128-aligned rank nearest the unsharded factors' fraction); the choice is "
             "by predicted time only"]
    if result.more_accurate is not None:
        lines.append(f"  ACCURACY: {chosen.strategy.name} keeps {chosen.kept:.3f} of the parameters against "
                     f"{best.kept:.3f}: expect it less accurate than {best.strategy.name} (predicted "
                     f"{best.total_us:.2f} us; the chosen is {speedup_text(best.total_us / chosen.total_us)} faster). "
                     f"'nmmc compress --tp {result.tp} --eval' measures both; '--tp-strategy {best.strategy.name}' "
                     "takes it")
    return lines


def result_json(result: TpResult, dialect: str, output: str | None) -> dict[str, Any]:
    from .plan import plan_dict

    return {**plan_dict(result, dialect), "written_to": output}


def run_tp(workload: Workload, tp: int, target: Target, dialect: str, kernel_fn: KernelFn, *, strategy: str | None,
           output: str | None, as_json: bool, echo: Echo) -> TpResult:
    """Plan, write the kernels and plan into ``output`` (a directory; None: write nothing), print."""
    from .plan import write_plan

    if output == "-":
        raise InputError("--tp writes a directory (one kernel file per rank role and plan.json); give -o DIR")
    if output is not None:
        from ..io import check_output_dir

        check_output_dir(output)
    result = plan_tp(workload, tp, target, dialect, kernel_fn, only=strategy)
    written = write_plan(result, dialect, output) if output is not None else []
    if as_json:
        echo(json.dumps(result_json(result, dialect, output), indent=2))
        return result
    for line in result_lines(result):
        echo(line)
    for path in written:
        echo(f"wrote {path}")
    return result


def explain_tp(workload: Workload, tp: int, target: Target, dialect: str, kernel_fn: KernelFn,
               strategy: str | None, echo: Echo) -> None:
    """``explain --tp``: the strategies, then each kernel of the chosen one as ``explain`` shows it."""
    from ..tuning.report import explain_lines

    result = plan_tp(workload, tp, target, dialect, kernel_fn, only=strategy)
    for line in result_lines(result):
        echo(line)
    for key, compiled in sorted(result.chosen.kernels.items()):
        echo(f"\n=== kernel {key} (ranks with this shape run it) ===")
        for line in explain_lines(compiled):
            echo(line)


def run_model_tp(model: str, options: dict[str, Any], tp: int, target: Target, dialect: str, kernel_fn: KernelFn, *,
                 strategy: str | None, output: str, verify: bool, as_json: bool, echo: Echo) -> bool:
    """``tune --model M --tokens B --tp N``: one sharded plan per token bucket in ``output/t<tokens>/`` and an
    ``index.json``; False when --verify found a wrong plan."""
    from pathlib import Path

    from ..frontends.workloads import mlp_workload
    from ..io import check_output_dir, write_text_atomic
    from ..model_tuning.pipeline import parse_buckets, resolve_model
    from .plan import write_plan

    given = [k for k, v in options.items() if k not in ("tokens", "keep_ratio", "dense", "dtype", "a_layout")
             and v not in (None, False, ())]
    if given:
        raise InputError("--model takes --tokens (buckets) and --keep-ratio or --dense; drop " +
                         ", ".join("--" + k.replace("_", "-") for k in given))
    if options.get("tokens") is None:
        raise InputError("--model needs --tokens with the token buckets, e.g. --tokens 1,32,128,512,2048")
    check_output_dir(output)
    fp8 = _one_weight_format(options.get("dtype"))
    source = resolve_model(model, options.get("keep_ratio"), dense=bool(options.get("dense")))
    if source.groups:
        raise InputError(f"{model}: its layers differ in ranks or format ('nmmc compress --choose-ranks'); tune "
                         "--model --tp plans one MLP for every layer: 'nmmc export --tp N' plans one per layer group, "
                         "or drop --tp to tune each group on one core")
    config = source.config
    entries, failures = [], []
    for tokens in parse_buckets(str(options["tokens"])):
        workload = mlp_workload(tokens, config.hidden_size, config.intermediate_size, ranks=source.ranks,
                                dense=source.ranks is None, fp8=fp8)
        result = plan_tp(workload, tp, target, dialect, kernel_fn, only=strategy)
        write_plan(result, dialect, Path(output) / f"t{tokens}")
        chosen = result.chosen
        entry = {"tokens": tokens, "plan": f"t{tokens}/plan.json", "strategy": chosen.strategy.name,
                 "kernel_us": chosen.kernel_us, "comm_us": chosen.comm_us, "total_us": chosen.total_us,
                 "kept_fraction": chosen.kept, "alternatives": result.alternatives}
        best = result.more_accurate
        if best is not None:
            entry["more_accurate"] = {"strategy": best.strategy.name, "total_us": best.total_us,
                                      "kept_fraction": best.kept}
        if verify:
            from .verify import verify_plan

            report = verify_plan(Path(output) / entry["plan"])
            entry["verified"] = report.ok
            if not report.ok:
                failures.append(f"{entry['plan']}: {report.error}")
        entries.append(entry)
    index = {"model": {"name": config.name, "hidden_size": config.hidden_size,
                       "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_hidden_layers},
             "ranks": None if source.ranks is None else dict(zip(("gate", "up", "down"), source.ranks, strict=True)),
             "keep_ratio": source.keep_ratio,
             **({} if fp8 is None else {"fp8": {"format": fp8.format, "scales": fp8.scales}}),
             "tp": tp, "target": target.spec, "launch": launch_dict(target), "dialect": dialect, "buckets": entries,
             "model_error": trust_note(target, fused=True), "collectives": UNVALIDATED}
    write_text_atomic(Path(output) / "index.json", json.dumps(index, indent=2) + "\n")
    if as_json:
        echo(json.dumps(index, indent=2))
    else:
        what = "dense" if source.ranks is None else f"ranks {'/'.join(map(str, source.ranks))}"
        what += "" if fp8 is None else f", {fp8.format} weights ({fp8.scales} scales)"
        echo(f"{config.name} MLP at tp {tp} on {target.label}, {what}:")
        for e in entries:
            versus = ""
            kinds = (("nkilib-mlp", "nki-library MLP"), ("nmmc-dense", "dense nmmc MLP")) if fp8 is None else (
                ("nkilib-mlp", "nki-library FP8 MLP"), ("nmmc-dense", "dense FP8 nmmc MLP"),
                ("nmmc-dense-unquantized", "dense bf16 nmmc MLP"))
            for kind, name in kinds:
                dense = e["alternatives"].get(alternative_label(kind, workload)) or {}
                versus += (f", {name} + all-reduce {dense['total_us']:.1f} us "
                           f"({speedup_text(dense['total_us'] / e['total_us'])})" if dense else "")
            echo(f"  {e['tokens']:>6} tokens: {e['strategy']:<28} kernel {e['kernel_us']:.1f} us + comm "
                 f"{e['comm_us']:.1f} us = {e['total_us']:.1f} us, kept {e['kept_fraction']:.3f}{versus}")
            if "more_accurate" in e:
                best = e["more_accurate"]
                echo(f"          ACCURACY: keeps fewer parameters than {best['strategy']} (kept "
                     f"{best['kept_fraction']:.3f}, {best['total_us']:.1f} us): expect it less accurate; 'nmmc "
                     f"compress --tp {tp} --eval' measures both, --tp-strategy chooses")
        echo(f"  {context_note(target)}")
        echo(f"  model error: {trust_note(target, fused=True)}; {UNVALIDATED}")
        echo(f"wrote {Path(output) / 'index.json'}")
    for failure in failures:
        echo(f"VERIFICATION FAILED: {failure}", err=True)
    return not failures


def _one_weight_format(dtype: object) -> Fp8Weights | None:
    """``--dtype`` of ``tune --model --tp``: one weight format, bf16 (None) or an FP8 one; the choice among several
    (``bf16,fp8``, ``model_formats.py``) is not made per sharded plan yet, and is refused rather than dropped."""
    from ..ir import canonical_dtype
    from ..ir.fp8 import is_fp8

    text = "bf16" if dtype is None else str(dtype)
    if "," in text:
        raise InputError(f"--dtype {text} with --tp: tune --model chooses among weight formats on one core only; "
                         "give one format (bf16, fp8 or fp8_e5m2) with --tp")
    canonical = canonical_dtype(text)
    if is_fp8(canonical):
        return Fp8Weights(canonical)
    if canonical != "bfloat16":
        raise InputError(f"--dtype {text} with --model --tp: the MLP's weights are bf16 or FP8 (fp8, fp8_e5m2)")
    return None
