"""Drawing helpers of the search and lockfile reports: figures on an Agg canvas, atomic PNG and
Markdown writes, the roofline's ceilings (the cost model's compute peak and DMA bandwidth of a
target, calibrated efficiencies included), and small table helpers."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..cost_model import CostReport, effective_rates, params_of
from ..io import write_bytes_atomic, write_text_atomic
from ..targets import Target

DPI = 120
#: Log-scale the latency axis when the plotted values span more than this factor.
LOG_RANGE = 20.0


def figure(width: float = 7.5, height: float = 4.6) -> Any:
    """A figure on an Agg canvas (never pyplot: no display, no global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Any, path: Path) -> Path:
    """Save ``fig`` as a PNG atomically (:func:`neuronmm_compiler.io.write_bytes_atomic`)."""
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=DPI)
    write_bytes_atomic(path, png.getvalue())
    return path


def write_md(path: Path, text: str) -> Path:
    write_text_atomic(path, text)
    return path


def tflops(cost: CostReport) -> float:
    """Achieved throughput in TFLOP/s (FLOP per microsecond / 1e6)."""
    return cost.flops / cost.latency_us / 1e6 if cost.latency_us > 0 else 0.0


def plottable(cost: CostReport) -> bool:
    return (cost.feasible and cost.flops > 0 and cost.arithmetic_intensity > 0
            and 0 < cost.latency_us < math.inf)


def peak_tflops(target: Target, dtype: str) -> float:
    """The model's compute ceiling (the peak times a calibrated target's TensorEngine efficiency)."""
    params = params_of(target)
    return target.peak_bf16_tflops * params.tensor_engine_efficiency / (
        params.matmul_fp32_factor if dtype == "float32" else 1)


def bandwidth_tb_s(target: Target) -> float:
    """The model's DMA bandwidth in TB/s (= TFLOP/s per FLOP/B), calibrated efficiency included."""
    return effective_rates(target, params_of(target))[1] / 1e6


def infer_dtype(cost: CostReport, target: Target) -> str | None:
    """The matmul dtype behind a cost report, from the peak its lower bound used (None: unknown,
    e.g. a fused report combining several programs)."""
    peak = cost.values.get("peak_flops_per_us")
    if not peak:
        return None
    return "float32" if peak < peak_tflops(target, "bfloat16") * 1e6 * 0.99 else "bfloat16"


def short_dtype(dtype: str) -> str:
    return {"bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)


def draw_ceilings(ax: Any, target: Target, dtypes: Sequence[str], x_lo: float, x_hi: float,
                   *, style: str = "-", label_target: bool = False) -> None:
    """The roofline of ``target``: the DMA-bandwidth slope and one compute ceiling per dtype."""
    import numpy as np

    bw = bandwidth_tb_s(target)
    xs = np.logspace(math.log10(x_lo), math.log10(x_hi), 256)
    prefix = f"{target.name}: " if label_target else ""
    top = max(peak_tflops(target, d) for d in dtypes)
    ax.plot(xs, np.minimum(xs * bw, top), linestyle=style, color="tab:blue", linewidth=1.6,
            label=f"{prefix}DMA bandwidth {bw:.2f} TB/s")
    for i, dtype in enumerate(sorted(dtypes, key=lambda d: -peak_tflops(target, d))):
        peak = peak_tflops(target, dtype)
        ridge = peak / bw
        ax.plot([max(ridge, x_lo), x_hi], [peak, peak], linestyle=style if i == 0 else ":", color="tab:orange",
                linewidth=1.6, label=f"{prefix}{short_dtype(dtype)} compute peak {peak:g} TFLOP/s")


def roofline_limits(costs: Iterable[CostReport], targets: Iterable[Target], dtypes: Sequence[str]
                     ) -> tuple[float, float]:
    """An x range covering the points and every ridge point, with a margin."""
    xs = [c.arithmetic_intensity for c in costs if plottable(c)]
    for target in targets:
        bw = bandwidth_tb_s(target)
        xs += [peak_tflops(target, d) / bw for d in dtypes]
    if not xs:
        return 1.0, 1000.0
    return min(xs) / 4, max(xs) * 4


def param_table(rows: list[list[str]], header: list[str]) -> list[str]:
    def clean(cell: str) -> str:
        return cell.replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(clean(c) for c in row) + " |" for row in rows]
    return lines


def schedule_params(schedule: Any) -> dict[str, Any]:
    return dict(schedule.as_dict()) if hasattr(schedule, "as_dict") else {"schedule": str(schedule)}
