"""``nmmc report OUT_DIR`` for an ``nmmc compress`` output: the rank choice's Pareto front as a plot and
a Markdown summary (method, ranks, measured quality, predicted latencies).

Latencies are nmmc's cost-model predictions; the front's accuracy axis is the proxy the choice
minimizes (the predicted log-perplexity increase from measured layer sensitivities, or the whitened
loss without calibration tokens); perplexity is the one measured by ``--eval`` for the chosen ranks.
"""

from __future__ import annotations

from pathlib import Path

from ..cost_model.trust import trust_note
from ..targets import get_target
from .manifest import Manifest
from .quality import spread_note

__all__ = ["write_compression_report"]


def _summary(manifest: Manifest) -> list[str]:
    lines = [f"# Compression of {manifest.model.describe()}", "",
             f"- method: {'whitened (activation-aware) SVD' if manifest.method == 'whitened' else 'plain SVD'}",
             f"- MLP parameters kept: {manifest.kept_fraction:.3f} (requested keep ratio {manifest.keep_ratio})"]
    if manifest.calibration:
        lines.append(f"- calibration: {manifest.calibration['source']}")
    q = manifest.quality
    if q:
        lines.append(f"- measured on {q['tokens']} held-out tokens ({q['source']}): perplexity "
                     f"{q['perplexity_original']:.3f} -> {q['perplexity_compressed']:.3f} "
                     f"({q['perplexity_increase']:+.1%}{spread_note(q)}), top-1 agreement {q['top1_agreement']:.3f}")
    lines += ["", "| layer | gate | up | down |", "|---|---|---|---|"]
    for layer, ranks in enumerate(manifest.layer_ranks()):
        lines.append(f"| {layer} | " + " | ".join("dense" if r is None else str(r) for r in ranks.values()) + " |")
    rc = manifest.rank_choice
    if rc and "steps" in rc and rc.get("formats") is not None:  # the measured format choice (.format_choice)
        cost = rc.get("cost") or {"unit": "weight bytes"}
        spent = "weight bytes" if cost["unit"] == "weight bytes" else "predicted latency"
        lines += ["", f"## Format choice: {rc['mode']}, budget {rc['budget_ppl_increase']:+.1%}", "",
                  f"Cost per layer: {cost['unit']}" + (f"; cost model: {cost['trust']}" if "trust" in cost else "")
                  + ".", "", f"| step | layer | rank | format | {spent}, fraction of bf16 dense | measured ppl "
                  "increase | accepted |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {i} | {s['layer']} | {'dense' if s['rank'] is None else s['rank']} | {s['format']} | "
                  f"{s.get('cost', s['bytes']):.3f} | {s['ppl_increase']:+.2%} | {'yes' if s['accepted'] else 'no'} |"
                  for i, s in enumerate(rc["steps"], 1)]
        lines += _chosen(rc, cost, spent)
    elif rc and "steps" in rc:  # the measured greedy choice (--choose-ranks without --tokens)
        lines += ["", f"## Rank choice: {rc['mode']}, budget {rc['budget_ppl_increase']:+.1%}", "",
                  "| step | layer | rank | kept | measured ppl increase | accepted |", "|---|---|---|---|---|---|"]
        lines += [f"| {i} | {s['layer']} | {s['rank']} | {s['kept']:.3f} | {s['ppl_increase']:+.2%} | "
                  f"{'yes' if s['accepted'] else 'no'} |" for i, s in enumerate(rc["steps"], 1)]
    elif rc:
        buckets = ",".join(str(b) for b in rc["latency"]["buckets"])
        lines += ["", f"## Rank choice: {rc['objective']}", "",
                  f"Predicted MLP latency of all layers summed over token buckets {buckets} on "
                  f"{rc['latency']['target']} (cost-model prediction, not a measurement; "
                  f"{trust_note(get_target(rc['latency']['target']), fused=True)}). Accuracy proxy: "
                  f"{rc['accuracy_proxy']}.", "",
                  "| point | predicted us | accuracy proxy | dense layers |", "|---|---|---|---|"]
        lines.append(f"| fused dense | {rc['dense']['predicted_us']:.1f} | 0 | all |")
        if rc.get("uniform"):
            lines.append(f"| uniform ranks {rc['uniform']['ranks']} | {rc['uniform']['predicted_us']:.1f} | "
                         f"{rc['uniform']['loss']:.5f} | 0 |")
        lines.append(f"| chosen | {rc['chosen']['predicted_us']:.1f} | {rc['chosen']['loss']:.5f} | |")
        lines += [f"| front | {p['predicted_us']:.1f} | {p['loss']:.5f} | {p['dense_layers']} |" for p in rc["front"]]
    return lines


def _chosen(rc: dict, cost: dict, spent: str) -> list[str]:
    """The format choice's result per layer: its rank, format and what it saves against dense bf16."""
    by = {(c["rank"], c["format"]): c["cost"] for c in cost.get("candidates", [])}
    if (None, "bfloat16") not in by:
        return []
    unit = "us" if spent != "weight bytes" else "bytes"
    lines = ["", f"Chosen per layer ({spent} saved against dense bf16"
             + (f", cost-model predictions on {cost['target']}, not measurements" if unit == "us" else "") + "):", "",
             f"| layer | chosen | {spent} saved ({unit}) |", "|---|---|---|"]
    lines += [f"| {i} | {'dense' if r is None else 'rank ' + str(r)} {f} | {by[(None, 'bfloat16')] - by[(r, f)]:.1f} |"
              for i, (r, f) in enumerate(zip(rc["choice"], rc["formats"], strict=True))]
    if cost.get("unsupported"):
        lines += ["", "Dropped before measuring (nmmc's MX kernel does not take their shapes): " + ", ".join(
            f"{'dense' if u['rank'] is None else 'rank ' + str(u['rank'])} {u['format']}" for u in cost["unsupported"])]
    return lines


def write_compression_report(manifest: Manifest, out_dir: str | Path) -> list[Path]:
    """Write ``summary.md`` and, when ranks were chosen jointly, ``pareto.png`` into ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    rc = manifest.rank_choice
    if rc and "latency" in rc:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        front = rc["front"]
        ax.plot([p["predicted_us"] for p in front], [p["loss"] for p in front], "o-", ms=3, label="Pareto front")
        ax.plot(rc["dense"]["predicted_us"], 0.0, "s", label="fused dense MLP")
        if rc.get("uniform"):
            ax.plot(rc["uniform"]["predicted_us"], rc["uniform"]["loss"], "^", ms=8, label="uniform ranks")
        label = "chosen"
        if manifest.quality:
            label += f" (measured perplexity {manifest.quality['perplexity_compressed']:.2f})"
        ax.plot(rc["chosen"]["predicted_us"], rc["chosen"]["loss"], "*", ms=12, label=label)
        ax.set_xlabel("predicted MLP latency, all layers (us, cost-model prediction)")
        ax.set_ylabel("accuracy proxy (predicted log-ppl increase)")
        ax.set_title(f"{manifest.model.name}: ranks for accuracy and speed", fontsize=7)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / "pareto.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    paths.append(out / "summary.md")
    paths[-1].write_text("\n".join(_summary(manifest)) + "\n", encoding="utf-8")
    return paths
