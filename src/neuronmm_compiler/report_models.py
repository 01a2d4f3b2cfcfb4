"""``nmmc tune --model``'s table: one row per token bucket, and each bucket's format choice
(:mod:`.model_formats`)."""

from __future__ import annotations

from typing import Any

from .cost_model.trust import trust_note
from .model_formats import format_lines, written_files
from .report import columns, quality_note
from .speedups import context_note, speedup_text
from .targets import Target

#: The columns of ``nmmc tune --model``'s table: (least width, alignment).
_MODEL_COLUMNS = [(7, ">"), (9, ">"), (10, ">"), (8, ">"), (16, ">"), (8, ">"), (14, ">"), (8, ">"), (12, ">"),
                  (8, ">"), (9, ">"), (0, "<")]


def model_lines(source: Any, index: dict[str, Any], target: Target, output: str) -> list[str]:
    """``nmmc tune --model``: one row per token bucket (cost-model predictions). The first speedup is
    over nki-library's fused MLP (what NxD Inference runs), then nmmc's own fused dense MLP, then AWS's per-matmul
    kernels. A bucket where the SVD MLP does not beat nmmc's dense MLP recommends the dense one, and one where
    nki-library's kernel beats both recommends keeping it; either says so."""
    if index["ranks"] is None:
        return _dense_model_lines(source, index, target, output)
    ranks = "/".join(str(r) for r in index["ranks"].values())
    lines = [f"{source.config.describe()}; ranks gate/up/down {ranks} (from the {source.ranks_from}); {target.label}",
             "  predicted by nmmc's cost model (not measured); 'nkilib' is nki-library's fused MLP (what NxD "
             "Inference runs; modelled, docs/fusion.md), 'nmmc dense' nmmc's own fused dense MLP, 'AWS dense' AWS's "
             "kernel per matmul",
             f"  {context_note(target)}",
             f"  speedups over the dense MLPs: {quality_note(index.get('quality'))}"]
    if index.get("formats_from") == "manifest":
        fmt = index["buckets"][0]["chosen_format"] if index["buckets"] else "?"
        lines.append(f"  format: {fmt} in every bucket, as the compress output records for every layer (manifest "
                     "layers[i].fp8; chosen there under the accuracy budget, not by latency here); other --dtype "
                     "formats are tuned for comparison only")
    rows = [["tokens", "SVD us", "nkilib us", "vs it", "nmmc dense us", "vs it", "AWS dense us", "vs it", "unfused us",
             "vs it", "kernels", "  file"]]
    for e in index["buckets"]:
        check = {True: "  verified", False: "  FAILED"}.get(e.get("verified"), "")
        nkilib = e.get("nkilib_us")
        versus = e.get("speedup_vs_nkilib")
        rows.append([str(e["tokens"]), f"{e['predicted_us']:.1f}", "n/a" if nkilib is None else f"{nkilib:.1f}",
                     speedup_text(versus) if versus else "n/a", f"{e['fused_dense_us']:.1f}",
                     speedup_text(e["speedup_vs_fused_dense"]), f"{e['baseline_us']:.1f}",
                     speedup_text(e["speedup_vs_baseline"]), f"{e['unfused_baseline_us']:.1f}",
                     speedup_text(e["speedup_vs_unfused"]), str(len(e["kernels"])), f"  {e['file']}{check}"])
    table = columns(rows, _MODEL_COLUMNS)
    lines.append(table[0])
    for row, e in zip(table[1:], index["buckets"], strict=True):
        lines.append(row)
        lines += format_lines(e, f"  {'':>7}")
        if e.get("recommended") == "dense" and e.get("chosen_format") == e.get("format", "").replace("svd-", "dense-"):
            lines.append(f"  {'':>7}recommended: nmmc's dense MLP ({e['recommended_file']}): at {e['tokens']} tokens "
                         f"the SVD MLP is predicted no faster ({speedup_text(e['speedup_vs_fused_dense'])}), so "
                         "compression buys no speed there")
        elif e.get("recommended") == "nkilib":
            lines.append(f"  {'':>7}recommended: nki-library's MLP (keep NxD Inference's kernel): at {e['tokens']} "
                         "tokens it is predicted faster than every kernel nmmc wrote for the bucket")
    count = written_files(index)
    lines.append(f"latencies are the cost model's: {trust_note(target, fused=True)}")
    lines.append(f"wrote {count} kernel file{'s' if count != 1 else ''} and index.json to {output}")
    return lines


def _dense_model_lines(source: Any, index: dict[str, Any], target: Target, output: str) -> list[str]:
    """``nmmc tune --model --dense``: nmmc's fused dense MLP per bucket against nki-library's fused MLP (what NxD
    Inference runs) and AWS's kernel per matmul; a bucket where nki-library's kernel is faster says so."""
    lines = [f"{source.config.describe()}; the dense MLP (no compression: exact); {target.label}",
             "  predicted by nmmc's cost model (not measured); 'nkilib' is nki-library's fused MLP (what NxD Inference "
             "runs; modelled, docs/fusion.md), 'AWS dense' AWS's kernel per matmul",
             f"  {context_note(target)}"]
    rows = [["tokens", "nmmc dense us", "nkilib us", "vs it", "AWS dense us", "vs it", "kernels", "  file"]]
    for e in index["buckets"]:
        check = {True: "  verified", False: "  FAILED"}.get(e.get("verified"), "")
        nkilib = "n/a" if e.get("nkilib_us") is None else f"{e['nkilib_us']:.1f}"
        versus_nkilib = speedup_text(e["speedup_vs_nkilib"]) if e.get("speedup_vs_nkilib") else "n/a"
        aws = "n/a" if e["baseline_us"] is None else f"{e['baseline_us']:.1f}"
        versus = "n/a" if e["speedup_vs_baseline"] is None else speedup_text(e["speedup_vs_baseline"])
        rows.append([str(e["tokens"]), f"{e['predicted_us']:.1f}", nkilib, versus_nkilib, aws, versus,
                     str(len(e["kernels"])), f"  {e['file']}{check}"])
    table = columns(rows, [(7, ">"), (15, ">"), (10, ">"), (15, ">"), (14, ">"), (8, ">"), (9, ">"), (0, "<")])
    lines.append(table[0])
    for row, e in zip(table[1:], index["buckets"], strict=True):
        lines.append(row)
        lines += format_lines(e, f"  {'':>7}")
        if e.get("recommended") == "nkilib":
            lines.append(f"  {'':>7}recommended: nki-library's MLP (keep NxD Inference's kernel): at {e['tokens']} "
                         "tokens it is predicted faster than nmmc's dense MLP")
    lines.append(f"latencies are the cost model's: {trust_note(target, fused=True)}")
    count = written_files(index)
    lines.append(f"wrote {count} kernel file{'s' if count != 1 else ''} and index.json to {output}")
    return lines
