"""The cost model's formulas twice: as plain Python (what ``estimate`` and the search evaluate) and as
sympy expressions (what ``nmmc explain`` prints, built on first use so that nothing else imports sympy).

:func:`steady_times`, :func:`latency` and :func:`lower_bound` are the model; :func:`symbolic` returns
the same formulas as sympy expressions over the same symbol names. ``tests/test_cost_model.py``
evaluates both on real programs and asserts they agree, so the printed formulas are the computed ones.

    T_pe   = pe_cycles / f_pe                   T_vec = vec_cycles / f_vec     T_act = act_cycles / f_act
    T_dma  = n_dma * c_dma / q  +  B_eff / BW   (fixed cost overlapped over q queues; bytes at the
                                                  curve's efficiency for their bytes per partition)
    T_stall = t_stall                           (TensorE waiting on PSUM evictions: counts.psum_stall_us)
    T_exchange = t_exchange                     (an LNC=2 program waiting on its sendrecv exchanges)
    T_serial = serial * min(T_dma, max(T_pe + T_stall, T_vec, T_act))
                                                (serial = 1 when the loop loads have no room for a second copy:
                                                 loads and compute take turns instead of overlapping)
    latency = T_launch + T_prologue + max(T_pe + T_stall, T_dma, T_vec, T_act over the steady state) + T_epilogue
              + T_exchange + T_serial

(every count minus its prologue and epilogue part in the steady-state terms; docs/cost_model.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache
from typing import Any

#: Every input of the formulas, in a fixed order (counts, then the target's rates and constants).
SYMBOLS: tuple[str, ...] = (
    "pe_cycles", "vec_cycles", "act_cycles", "n_dma", "eff_bytes",
    "pro_pe_cycles", "pro_vec_cycles", "pro_n_dma", "pro_eff_bytes",
    "epi_pe_cycles", "epi_vec_cycles", "epi_n_dma", "epi_eff_bytes",
    "f_pe", "f_vec", "f_act", "c_dma", "q", "bw", "flops", "hbm_bytes", "compulsory_bytes", "peak_flops_per_us",
    "t_launch", "t_stall", "t_exchange", "serial",
)
#: The time terms, in the order ``explain`` prints them.
TERMS: tuple[str, ...] = ("T_pe", "T_vec", "T_act", "T_dma", "T_prologue", "T_epilogue", "T_launch", "T_stall",
                          "T_exchange", "T_serial")


def engine_us(cycles: float, ghz: float) -> float:
    """Microseconds of ``cycles`` at ``ghz``."""
    return cycles / (1000 * ghz)


def matmul_cycles(moving_free: int, min_cycles: float, dtype_factor: float, tile_columns: int | None = None,
                  pe_columns: int | None = None, double_row: bool = False) -> float:
    """TensorEngine cycles one ``nc_matmul`` adds to ``pe_cycles``: ``max(N, min_cycles)`` times the fp32 factor
    (AWS NKI performance guide), and for a matmul in a PE column tile of ``tile_columns`` of the array's
    ``pe_columns`` columns, that tile's share of it: ``pe_columns / tile_columns`` matmuls in distinct column tiles
    run at once (nki.isa.nc_matmul, "Tiling mode"), and nmmc's lowerings issue them back to back in every tile
    (docs/cost_model.md, "PE column tiles"). ``double_row`` (FP8, ``perf_mode=double_row``): half of it, the
    documented "2x matmul throughput" applied to the whole instruction, floor included (an assumption: no FP8
    measurement on Trainium is published; docs/cost_model.md, "FP8")."""
    cycles = max(moving_free, min_cycles) * dtype_factor * (0.5 if double_row else 1.0)
    if tile_columns is not None and pe_columns is not None and tile_columns < pe_columns:
        cycles *= tile_columns / pe_columns
    return cycles


def _edge_us(v: Mapping[str, float], prefix: str) -> float:
    """An edge phase: its transfers issued together (ceil(n/q) rounds of fixed cost), nothing overlapped."""
    return (math.ceil(v[f"{prefix}_n_dma"] / v["q"]) * v["c_dma"] + v[f"{prefix}_eff_bytes"] / v["bw"]
            + engine_us(v[f"{prefix}_pe_cycles"], v["f_pe"]) + engine_us(v[f"{prefix}_vec_cycles"], v["f_vec"]))


def steady_times(v: Mapping[str, float]) -> dict[str, float]:
    """Every time term (microseconds) from the symbols' values."""
    n_dma = v["n_dma"] - v["pro_n_dma"] - v["epi_n_dma"]
    eff_bytes = v["eff_bytes"] - v["pro_eff_bytes"] - v["epi_eff_bytes"]
    times = {
        "T_pe": engine_us(v["pe_cycles"] - v["pro_pe_cycles"] - v["epi_pe_cycles"], v["f_pe"]),
        "T_vec": engine_us(v["vec_cycles"] - v["pro_vec_cycles"] - v["epi_vec_cycles"], v["f_vec"]),
        "T_act": engine_us(v["act_cycles"], v["f_act"]),
        "T_dma": n_dma * v["c_dma"] / v["q"] + eff_bytes / v["bw"],
        "T_prologue": _edge_us(v, "pro"),
        "T_epilogue": _edge_us(v, "epi"),
        "T_launch": v["t_launch"],
        "T_stall": v["t_stall"],
        "T_exchange": v["t_exchange"],
    }
    times["T_serial"] = serial_us(times, v["serial"])
    return times


def serial_us(t: Mapping[str, float], serial: float) -> float:
    """``T_serial``: with no room to rotate the loop loads (``serial`` 1), the steady state's DMA and compute take
    turns, so the shorter of the two adds to the longer instead of hiding under it (docs/cost_model.md, "Room to
    rotate")."""
    return serial * min(t["T_dma"], max(t["T_pe"] + t["T_stall"], t["T_vec"], t["T_act"]))


def latency(t: Mapping[str, float]) -> float:
    """The predicted latency from the time terms."""
    steady = max(t["T_pe"] + t["T_stall"], t["T_dma"], t["T_vec"], t["T_act"])
    return t["T_launch"] + t["T_prologue"] + steady + t["T_epilogue"] + t["T_exchange"] + t["T_serial"]


def lower_bound(v: Mapping[str, float]) -> float:
    """No kernel of this work is faster: its launch, plus its FLOPs at peak or its compulsory traffic at full
    bandwidth."""
    return v["t_launch"] + max(v["flops"] / v["peak_flops_per_us"], v["compulsory_bytes"] / v["bw"])


@cache
def symbolic() -> tuple[dict[str, Any], Any, Any]:
    """(terms, latency, lower bound) as sympy expressions over :data:`SYMBOLS` and the term names."""
    import sympy as sp

    s = {name: sp.Symbol(name, nonnegative=True) for name in SYMBOLS}

    def engine(cycles: Any, ghz: Any) -> Any:
        return cycles / (1000 * ghz)

    def edge(prefix: str) -> Any:
        return (sp.ceiling(s[f"{prefix}_n_dma"] / s["q"]) * s["c_dma"] + s[f"{prefix}_eff_bytes"] / s["bw"]
                + engine(s[f"{prefix}_pe_cycles"], s["f_pe"]) + engine(s[f"{prefix}_vec_cycles"], s["f_vec"]))

    terms = {
        "T_pe": engine(s["pe_cycles"] - s["pro_pe_cycles"] - s["epi_pe_cycles"], s["f_pe"]),
        "T_vec": engine(s["vec_cycles"] - s["pro_vec_cycles"] - s["epi_vec_cycles"], s["f_vec"]),
        "T_act": engine(s["act_cycles"], s["f_act"]),
        "T_dma": ((s["n_dma"] - s["pro_n_dma"] - s["epi_n_dma"]) * s["c_dma"] / s["q"]
                  + (s["eff_bytes"] - s["pro_eff_bytes"] - s["epi_eff_bytes"]) / s["bw"]),
        "T_prologue": edge("pro"),
        "T_epilogue": edge("epi"),
        "T_launch": s["t_launch"],
        "T_stall": s["t_stall"],
        "T_exchange": s["t_exchange"],
    }
    terms["T_serial"] = s["serial"] * sp.Min(terms["T_dma"], sp.Max(terms["T_pe"] + terms["T_stall"], terms["T_vec"],
                                                                    terms["T_act"]))
    t = {name: sp.Symbol(name) for name in terms}
    steady = sp.Max(t["T_pe"] + t["T_stall"], t["T_dma"], t["T_vec"], t["T_act"])
    total = t["T_launch"] + t["T_prologue"] + steady + t["T_epilogue"] + t["T_exchange"] + t["T_serial"]
    bound = s["t_launch"] + sp.Max(s["flops"] / s["peak_flops_per_us"], s["compulsory_bytes"] / s["bw"])
    return terms, total, bound
