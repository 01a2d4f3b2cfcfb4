"""``nmmc tune --model``'s table: one row per token bucket, and each bucket's format choice
(:mod:`.model_formats`); of a compress output whose layers differ, one table per layer group and the model's total
per bucket (:mod:`.model_groups`)."""

from __future__ import annotations

from typing import Any

from ..cost_model.trust import trust_note
from ..ir.fp8 import is_fp8
from ..targets import Target
from ..tuning.report import columns, quality_note, wrap_note
from ..tuning.speedups import context_note, speedup_text
from .entries import runnable
from .formats import format_lines, written_files

#: The columns of ``nmmc tune --model``'s table: (least width, alignment).
_MODEL_COLUMNS = [(7, ">"), (9, ">"), (10, ">"), (8, ">"), (16, ">"), (8, ">"), (14, ">"), (8, ">"), (12, ">"),
                  (8, ">"), (9, ">"), (0, "<")]


def model_lines(source: Any, index: dict[str, Any], target: Target, output: str) -> list[str]:
    """``nmmc tune --model``: one row per token bucket (cost-model predictions). The first speedup is
    over nki-library's fused MLP (what vLLM Neuron runs), then nmmc's own fused dense MLP, then AWS's per-matmul
    kernels. A bucket where the SVD MLP does not beat nmmc's dense MLP recommends the dense one, and one where
    nki-library's kernel beats both recommends keeping it; either says so."""
    if index.get("groups"):
        return _grouped_lines(source, index, target, output)
    if index["ranks"] is None:
        return _dense_model_lines(source, index, target, output)
    ranks = "/".join(str(r) for r in index["ranks"].values())
    lines = [f"{source.config.describe()}; ranks gate/up/down {ranks} (from the {source.ranks_from}); {target.label}",
             "  predicted by nmmc's cost model (not measured); 'nkilib' is nki-library's fused MLP (what vLLM Neuron "
             "calls, NxD Inference before Neuron 2.34; modelled, docs/fusion.md), 'nmmc dense' nmmc's own fused dense "
             "MLP, 'AWS dense' AWS's kernel per matmul",
             f"  {context_note(target)}",
             f"  speedups over the dense MLPs: {_approximations(index)}"]
    if index.get("formats_from") == "manifest":
        fmt = index["buckets"][0]["chosen_format"] if index["buckets"] else "?"
        lines.append(f"  format: {fmt} in every bucket, as the compress output records for every layer (manifest "
                     "layers[i].fp8, bf16 where absent; chosen there under the accuracy budget, not by latency here); "
                     "other --dtype formats are tuned for comparison only")
    lines += _svd_table(index["buckets"])
    count = written_files(index)
    lines.append(f"latencies are the cost model's: {trust_note(target, fused=True)}")
    lines.append(f"wrote {count} kernel file{'s' if count != 1 else ''} and index.json to {output}")
    return lines


def _dense_model_lines(source: Any, index: dict[str, Any], target: Target, output: str) -> list[str]:
    """``nmmc tune --model --dense``: nmmc's fused dense MLP per bucket against nki-library's fused MLP (what vLLM
    Neuron runs) and AWS's kernel per matmul; a bucket where nki-library's kernel is faster says so."""
    lines = [f"{source.config.describe()}; the dense MLP ({_dense_formats(index)}); {target.label}",
             "  predicted by nmmc's cost model (not measured); 'nkilib' is nki-library's fused MLP (what vLLM Neuron "
             "calls, NxD Inference before Neuron 2.34; modelled, docs/fusion.md), 'AWS dense' AWS's kernel per matmul",
             f"  {context_note(target)}"]
    lines += _dense_table(index["buckets"])
    lines.append(f"latencies are the cost model's: {trust_note(target, fused=True)}")
    count = written_files(index)
    lines.append(f"wrote {count} kernel file{'s' if count != 1 else ''} and index.json to {output}")
    return lines


def _us(entry: dict[str, Any], key: str, name: str) -> str:
    """A baseline's latency cell: ``n/a`` where it has none, ``ref`` before it where it cannot run in the launch
    context (a reference, compared with nothing)."""
    us = entry.get(key)
    if us is None:
        return "n/a"
    return f"{us:.1f}" if runnable(entry, name) else f"ref {us:.1f}"


def _vs(entry: dict[str, Any], key: str, name: str) -> str:
    """The speedup over a baseline: ``-`` over one that cannot run in the launch context, ``n/a`` where there is
    none."""
    if not runnable(entry, name):
        return "-"
    return speedup_text(entry[key]) if entry.get(key) else "n/a"


def _reference_notes(buckets: list[dict[str, Any]], indent: str = "  ") -> list[str]:
    """Why the 'ref' baselines of a table cannot run in the launch context (each reason once)."""
    reasons = dict.fromkeys(f"{b['computation']}: {b['not_runnable']}" for e in buckets
                            for b in e.get("baselines", []) if not b.get("runnable", True))
    if not reasons:
        return []
    lines = wrap_note("'ref': cannot run in this launch context, a reference only, no speedup over it:", indent)
    for reason in reasons:
        lines += wrap_note(reason, indent + "  ", indent + "    ")
    return lines


def _svd_table(buckets: list[dict[str, Any]], indent: str = "  ") -> list[str]:
    """The rows of an SVD MLP's buckets: its latency against nki-library's fused MLP, nmmc's fused dense MLP and
    AWS's per-matmul kernels, each bucket's format choice and recommendation under it."""
    rows = [["tokens", "SVD us", "nkilib us", "vs it", "nmmc dense us", "vs it", "AWS dense us", "vs it", "unfused us",
             "vs it", "kernels", "  file"]]
    for e in buckets:
        check = {True: "  verified", False: "  FAILED"}.get(e.get("verified"), "")
        rows.append([str(e["tokens"]), f"{e['predicted_us']:.1f}", _us(e, "nkilib_us", "nkilib-mlp"),
                     _vs(e, "speedup_vs_nkilib", "nkilib-mlp"), f"{e['fused_dense_us']:.1f}",
                     speedup_text(e["speedup_vs_fused_dense"]), _us(e, "baseline_us", "dense"),
                     _vs(e, "speedup_vs_baseline", "dense"), _us(e, "unfused_baseline_us", "unfused"),
                     _vs(e, "speedup_vs_unfused", "unfused"), str(len(e["kernels"])), f"  {e['file']}{check}"])
    table = columns(rows, _MODEL_COLUMNS, indent)
    lines, under = [table[0]], indent + " " * 7
    for row, e in zip(table[1:], buckets, strict=True):
        lines.append(row)
        lines += format_lines(e, under)
        if e.get("recommended") == "dense" and e.get("chosen_format") == e.get("format", "").replace("svd-", "dense-"):
            lines.append(f"{under}recommended: nmmc's dense MLP ({e['recommended_file']}): at {e['tokens']} tokens "
                         f"the SVD MLP is predicted no faster ({speedup_text(e['speedup_vs_fused_dense'])}), so "
                         "compression buys no speed there")
        elif e.get("recommended") == "nkilib":
            lines.append(f"{under}recommended: nki-library's MLP (keep the serving stack's kernel): at {e['tokens']} "
                         "tokens it is predicted faster than every kernel nmmc wrote for the bucket")
    return lines + _reference_notes(buckets, indent)


def _dense_table(buckets: list[dict[str, Any]], indent: str = "  ") -> list[str]:
    """The rows of a dense MLP's buckets: nmmc's fused dense MLP against nki-library's and AWS's kernels."""
    rows = [["tokens", "nmmc dense us", "nkilib us", "vs it", "AWS dense us", "vs it", "kernels", "  file"]]
    for e in buckets:
        check = {True: "  verified", False: "  FAILED"}.get(e.get("verified"), "")
        rows.append([str(e["tokens"]), f"{e['predicted_us']:.1f}", _us(e, "nkilib_us", "nkilib-mlp"),
                     _vs(e, "speedup_vs_nkilib", "nkilib-mlp"), _us(e, "baseline_us", "dense"),
                     _vs(e, "speedup_vs_baseline", "dense"), str(len(e["kernels"])), f"  {e['file']}{check}"])
    table = columns(rows, [(7, ">"), (15, ">"), (10, ">"), (15, ">"), (14, ">"), (8, ">"), (9, ">"), (0, "<")], indent)
    lines, under = [table[0]], indent + " " * 7
    for row, e in zip(table[1:], buckets, strict=True):
        lines.append(row)
        lines += format_lines(e, under)
        if e.get("recommended") == "nkilib":
            lines.append(f"{under}recommended: nki-library's MLP (keep the serving stack's kernel): at {e['tokens']} "
                         "tokens it is predicted faster than nmmc's dense MLP")
    return lines + _reference_notes(buckets, indent)


def _dense_formats(index: dict[str, Any]) -> str:
    """What the dense MLP's kernels compute: exact with bf16 weights alone, else the quantized formats allowed
    (``formats_allowed``, e.g. ``dense-fp8-row``), which are not exact."""
    allowed = [name for name in index.get("formats_allowed") or [] if name != "dense-bf16"]
    if not allowed:
        return "no compression: exact"
    return (f"no SVD; weights {', '.join(index.get('formats_allowed') or [])}: quantized formats are approximations, "
            "nmmc compress --eval measures their accuracy")


def _approximations(index: dict[str, Any]) -> str:
    """What the speedups over the dense MLPs compare with exact kernels: "the SVD", "FP8" or "the SVD and FP8" (the
    tuned kernels' formats), or that nothing is approximated."""
    if index.get("groups"):
        svd = any(g["ranks"] is not None for g in index["groups"])
        fp8 = any(is_fp8(g["weights"]) for g in index["groups"])
    else:
        svd = index["ranks"] is not None
        fp8 = any(is_fp8(f["weights"]) for b in index["buckets"] for f in b.get("formats", [])
                  if f["name"] == b.get("format"))  # the primary kernel's, whose speedups are printed
    what = " and ".join(["the SVD"] * svd + ["FP8"] * fp8)
    return quality_note(index.get("quality"), what) if what else "exact (every layer dense, bf16 weights)"


def _grouped_lines(source: Any, index: dict[str, Any], target: Target, output: str) -> list[str]:
    """``nmmc tune --model`` on a compress output whose layers differ in ranks or format: each layer group's table
    (its kernel in the format its layers record), then the model's total per bucket (model_groups.py) against nmmc's
    fused dense MLP in bf16 for every layer and nki-library's fused MLP in every layer."""
    groups = index["groups"]
    count = f"{len(groups)} layer group{'s' if len(groups) > 1 else ''}"
    lines = [f"{source.config.describe()}; ranks and formats per layer (from the manifest): {count}; {target.label}",
             "  predicted by nmmc's cost model (not measured); 'nkilib' is nki-library's fused MLP (what vLLM Neuron "
             "calls, NxD Inference before Neuron 2.34; modelled, docs/fusion.md), 'nmmc dense' nmmc's own fused dense "
             "MLP, 'AWS dense' AWS's kernel per matmul",
             f"  {context_note(target)}",
             f"  speedups over the dense MLPs: {_approximations(index)}",
             "  format: each group's kernel is in the format the compress output records for its layers (manifest "
             "layers[i] ranks and fp8; chosen there under the accuracy budget, not by latency here); other --dtype "
             "formats are tuned for comparison only"]
    for group in groups:
        layers = ",".join(str(i) for i in group["layers"])
        mlp = ("dense MLP" if group["ranks"] is None else
               "SVD ranks gate/up/down " + "/".join(str(r) for r in group["ranks"].values()))
        lines.append(f"group {group['name']}: layer{'s' if len(group['layers']) > 1 else ''} {layers}; {mlp}, "
                     f"{group['weights']} weights")
        table = _dense_table if group["ranks"] is None else _svd_table
        lines += table(group["buckets"], "    ")
    layers = index["model"]["num_hidden_layers"]
    lines.append(f"model MLP per bucket: the sum over its {layers} layers of their group's kernel, against "
                 "nmmc's fused dense MLP in bf16 for every layer (the uncompressed, unquantized model) and "
                 "nki-library's fused MLP in bf16 for every layer (what vLLM Neuron runs)")
    rows = [["tokens", "model MLP us", "nmmc dense bf16 us", "vs it", "nkilib us", "vs it", "  layers x group us"]]
    for e in index["buckets"]:
        nkilib, runs = e.get("nkilib_us"), e.get("nkilib_runnable", True)
        parts = ", ".join(f"{p['layers']} x {p['group']} {p['predicted_us']:.1f}" for p in e["groups"])
        rows.append([str(e["tokens"]), f"{e['predicted_us']:.1f}", f"{e['dense_bf16_us']:.1f}",
                     speedup_text(e["speedup_vs_dense_bf16"]),
                     "n/a" if nkilib is None else f"{nkilib:.1f}" if runs else f"ref {nkilib:.1f}",
                     "-" if not runs else "n/a" if nkilib is None else speedup_text(e["speedup_vs_nkilib"]),
                     f"  {parts}"])
    lines += columns(rows, [(7, ">"), (14, ">"), (20, ">"), (8, ">"), (11, ">"), (8, ">"), (0, "<")])
    reasons = dict.fromkeys(e["nkilib_not_runnable"] for e in index["buckets"] if e.get("nkilib_not_runnable"))
    if reasons:
        lines += wrap_note("'ref' nkilib: cannot run in this launch context, a reference only, no speedup over it:")
        for reason in reasons:
            lines += wrap_note(reason, "    ", "      ")
    count = written_files(index)
    lines.append(f"latencies are the cost model's: {trust_note(target, fused=True)}")
    lines.append(f"wrote {count} kernel file{'s' if count != 1 else ''} and index.json to {output}")
    return lines
