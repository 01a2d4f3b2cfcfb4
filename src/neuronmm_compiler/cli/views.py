"""Views of the commands that have no place in :mod:`neuronmm_compiler.tuning.report`: the text and JSON
of ``nmmc verify``, ``compress``, ``schedules --json``, ``targets``, ``cache list`` and ``regress
--update``. Nothing here computes; the commands pass in what they got."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from ..targets import Target, get_target

if TYPE_CHECKING:
    from ..frontends.workloads import Workload


def trust_note(target: Target, fused: bool = False) -> str:
    """:func:`neuronmm_compiler.cost_model.trust.trust_note`, imported on first use (the views are
    imported by every command, ``--help`` included; the cost model is not)."""
    from ..cost_model.trust import trust_note as note

    return note(target, fused)


def echo_lines(lines: Iterable[str]) -> None:
    """Print each line on stdout."""
    for line in lines:
        click.echo(line)


def parameter_rows(specs: Sequence[Any]) -> list[dict[str, Any]]:
    """The parameters ``--param`` can set (schedule ParamSpecs) as ``nmmc schedules`` shows them."""
    return [{"name": p.name, "type": p.kind.__name__, "choices": list(p.choices) if p.choices else None,
             "searched": list(p.candidates), "polish_only": list(p.refine), "help": p.help} for p in specs]


def schedules_json(workload: Workload, target: Target, rows: list[dict[str, Any]],
                   space: list[dict[str, Any]]) -> dict[str, Any]:
    """``nmmc schedules --json``."""
    return {"workload": workload.describe(), "target": target.name, "presets": rows, "parameters": space}


def verify_lines(report: Any, file: str, backend: str) -> list[str]:
    """``nmmc verify``: the verdict, the static rule pass (the SDK checked, each violation with its rule id, kernel
    line and doc citation), the error against the reference and the interpreter's counters."""
    status = "OK" if report.ok else "FAILED"
    where = "" if backend == "interpreter" else f", {backend}"
    lines = [f"{status}: {file} ({report.kernel}, {report.dialect}, {report.target}, seed {report.seed}{where})"]
    if report.lnc > 1 and report.ok:
        lines.append(f"  LNC={report.lnc}: all {report.lnc} programs ran against one HBM: no overlapping write, no "
                     "unsynchronised read, every exchange matched (counters summed over the programs, peaks per core)")
    if report.sdk is not None:
        count = len(report.violations)
        lines.append(f"  NKI rules of Neuron SDK {report.sdk}: " + (
            f"{count} violation{'s' if count > 1 else ''}" if count else "no violation"))
        lines += [f"  {v}" for v in report.violations]  # line N: RULE-ID: message [citation]
    if report.rel_error is not None:
        scale = "" if report.max_abs_reference is None else f" (reference values up to {report.max_abs_reference:.3e})"
        against = " against the quantized graph" if report.unquantized_rel_error is not None else ""
        lines.append(f"  relative error {report.rel_error:.3e}{against} (tolerance {report.tolerance:.0e}), "
                     f"max abs error {report.max_abs_error:.3e}{scale}")
    if report.unquantized_rel_error is not None:
        lines.append(f"  relative error {report.unquantized_rel_error:.3e} against the unquantized graph (bf16 "
                     "weights, no quantization; reported, not checked: docs/quantization.md)")
    if report.error:
        lines.append(f"  {report.error}")
    c = report.counters
    if c:
        reads = {k: v for k, v in c["hbm_bytes_read"].items() if v}
        writes = {k: v for k, v in c["hbm_bytes_written"].items() if v}
        lines += [f"  HBM read {c['total_hbm_bytes_read']} B {reads}, written {c['total_hbm_bytes_written']} B "
                  f"{writes}",
                  f"  DMA transfers {c['dma_transfers']} (transposing {c['dma_transposes']}), "
                  f"matmuls {c['matmul_instructions']}"
                  + (f" (double_row {c['double_row_matmuls']})" if c.get("double_row_matmuls") else "")
                  + f", TensorE transposes {c['transposes']}",
                  f"  peak SBUF {c['sbuf_peak_bytes']} B/partition, PSUM {c['psum_peak_banks']} banks"]
    return lines


def compress_lines(manifest: Any, output: str) -> list[str]:
    """``nmmc compress``: the model, ranks, parameter counts, errors, measured quality, and the rank
    choice's predicted latencies (cost-model predictions) and Pareto front."""
    worst = max(p.relative_error for layer in manifest.layers for p in layer.projections.values())
    if manifest.uniform:
        ranks = f"ranks gate/up/down {'/'.join(str(r) for r in manifest.ranks.values())}"
    else:
        per_layer = ["dense" if r["gate"] is None else f"{r['gate']}/{r['down']}" for r in manifest.layer_ranks()]
        ranks = f"per-layer ranks gate=up/down: {' '.join(per_layer)}"
    method = ("whitened (activation-aware) SVD" if manifest.method == "whitened" else "plain SVD")
    lines = [f"{manifest.model.describe()}",
             f"  {method}, {ranks}",
             f"  MLP parameters {manifest.params_before} -> {manifest.params_after} "
             f"(kept {manifest.kept_fraction:.3f}, compression {manifest.compression_ratio:.2f}x)",
             f"  worst relative weight reconstruction error {worst:.4f}"]
    fp8 = [layer.layer for layer in manifest.layers if layer.fp8]
    if fp8:
        which = "every layer" if len(fp8) == len(manifest.layers) else f"layers {' '.join(map(str, fp8))}"
        others = "" if len(fp8) == len(manifest.layers) else f"; the other layers {manifest.dtype}"
        lines.append(f"  FP8 ({manifest.layers[fp8[0]].fp8}) kernels in {which}: weights with per-output-channel "
                     f"scales, activations with static scales from the calibration tokens{others}")
    if manifest.calibration:
        c = manifest.calibration
        outputs = [p.output_error for layer in manifest.layers for p in layer.projections.values()
                   if p.output_error is not None]
        lines.append(f"  calibration: {c['source']}; worst projection output error on it {max(outputs):.4f}")
    if manifest.quality:
        from ..compression.quality import spread_note

        q = manifest.quality
        errors = q["mlp_output_error"]
        lines.append(f"  measured on {q['tokens']} held-out tokens ({q['source']}): perplexity "
                     f"{q['perplexity_original']:.2f} -> {q['perplexity_compressed']:.2f} "
                     f"({q['perplexity_increase']:+.1%}{spread_note(q)}), top-1 agreement {q['top1_agreement']:.3f}, "
                     f"MLP output error mean {sum(errors) / len(errors):.3f} worst {max(errors):.3f}")
    if manifest.rank_choice and "latency" in manifest.rank_choice:  # the measured choice prints its own front
        lines += rank_choice_lines(manifest.rank_choice)
    lines.append(f"wrote {len(manifest.layers)} layer files and manifest.json to {output}")
    return lines


def rank_choice_lines(record: Mapping[str, Any]) -> list[str]:
    """The joint rank choice: objective, predicted latencies, the Pareto front (cost-model predictions)."""
    buckets = ",".join(str(b) for b in record["latency"]["buckets"])
    lines = [f"  rank choice: {record['objective']}",
             f"  predicted MLP latency, all layers, summed over token buckets {buckets} on "
             f"{record['latency']['target']} (cost-model prediction, not a measurement; "
             f"{trust_note(get_target(record['latency']['target']), fused=True)}):",
             f"    fused dense {record['dense']['predicted_us']:.1f} us"
             + (f", uniform ranks {record['uniform']['predicted_us']:.1f} us (proxy {record['uniform']['loss']:.4f})"
                if record.get("uniform") else "")
             + f", chosen {record['chosen']['predicted_us']:.1f} us (proxy {record['chosen']['loss']:.4f})",
             f"    accuracy proxy: {record['accuracy_proxy']}",
             "    Pareto front (predicted us / accuracy proxy / dense layers): "
             + "  ".join(f"{p['predicted_us']:.1f}/{p['loss']:.4f}/{p['dense_layers']}" for p in record["front"])]
    return lines


def targets_lines(targets: Mapping[str, Target]) -> list[str]:
    """``nmmc targets``: each target's description, hardware rows, where its estimated parameters come from
    and how far the cost model is from published measurements on it."""
    from ..cost_model.trust import PROVENANCE

    lines = []
    for name, tgt in targets.items():
        lines.append(f"{name}: {tgt.description}")
        lines += [f"  {key:<22} {value}" for key, value in tgt.summary_rows()]
        if not tgt.calibrated and name in PROVENANCE:
            lines.append(f"  {'parameters':<22} {PROVENANCE[name]}")
        lines.append(f"  {'model error':<22} {trust_note(tgt)}")
    return lines


def cache_lines(records: Sequence[Any], tune_dir: Any) -> list[str]:
    """``nmmc cache list``: one row per cached decision."""
    return [f"{len(records)} entries in {tune_dir}",
            *(f"  {r.key[:12]}  {r.target:<5} {r.dialect:<9} {r.latency_us:10.2f} us  {r.workload}" for r in records)]


def lock_updated_line(lockfile: str, stuck: int) -> str:
    """``nmmc regress --update``: the lockfile rewritten, and how many entries could not be repaired."""
    return f"updated {lockfile}" + (f"; {stuck} entr{'y' if stuck == 1 else 'ies'} could not be repaired"
                                    if stuck else "")
