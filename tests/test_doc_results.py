"""docs/quantization.md and docs/cost_model.md quote their committed results figure for figure: the predicted FP8 and
bf16
MLP latencies (benchmarks/fp8_svd_ranks.py), the tune and verify output of the FP8 example, and the nmmc cost output
the cost model's page explains line by line. Reads files only."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FP8_RANKS = RESULTS / "fp8-svd-ranks-2026-12-07.txt"
FP8_TUNE = RESULTS / "fp8-tune-example-2026-12-07.txt"
COST = RESULTS / "cost-example-2026-12-07.txt"
TUNE_MODEL_MX = RESULTS / "tune-model-mx-2026-12-07.txt"


def _page(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _runs(path: Path) -> dict[tuple[int, int], dict[str, list[str]]]:
    """(hidden, intermediate) -> candidate ('dense', 'rank 128', ...) -> its cells, as fp8_svd_ranks.py printed them."""
    out: dict[tuple[int, int], dict[str, list[str]]] = {}
    for block in path.read_text().split("\n$ ")[1:]:
        hidden, intermediate = map(int, re.search(r"hidden (\d+) x intermediate (\d+)", block).groups())
        rows = re.findall(r"^\| (dense|rank \d+) \| (.+) \|$", block, flags=re.M)
        out[(hidden, intermediate)] = {name: [c.strip() for c in cells.split("|")] for name, cells in rows}
    return out


def test_the_fp8_cost_tables_are_the_runs():
    page, runs = _page("quantization.md"), _runs(FP8_RANKS)
    assert FP8_RANKS.name in page and set(runs) == {(4096, 14336), (2048, 8192), (576, 1536)}
    for name, label in (("dense", "dense"), ("rank 2560", "SVD keep 0.8 (rank 2560)")):
        b1, f1, b512, f512 = (float(c) for c in runs[(4096, 14336)][name])
        row = f"| {label} | {b1} | {f1} | {f1 / b1:.2f} | {b512} | {f512} | {f512 / b512:.2f} |"
        assert row in page, row
    for (hidden, intermediate), rows in runs.items():
        if hidden == 4096:
            continue
        for name, cells in rows.items():
            row = f"| {hidden} x {intermediate}, {name} | " + " | ".join(cells) + " |"
            assert row in page, row
    # the page's reading of the table: FP8 slower than bf16 at rank 128, at both smaller sizes
    assert all(float(rows["rank 128"][1]) > float(rows["rank 128"][0]) for (h, _), rows in runs.items() if h != 4096)


def test_the_fp8_tune_and_verify_example_is_the_run():
    page, text = _flat(_page("quantization.md")), FP8_TUNE.read_text()
    assert FP8_TUNE.name in page
    for label in ("nmmc tuned", "dense MLP without FP8 (nmmc's fused kernel, tuned)",
                  "ref: dense bfloat16 (AWS kernels, no FP8, LNC=1)"):
        latency, band = re.search(rf"^  {re.escape(label)} +([\d.]+) +([\d.]+-[\d.]+)", text, flags=re.M).groups()
        assert re.search(rf"{re.escape(label)} {latency} {band} ", page), label
    speedup = re.search(r"^speedup vs nmmc's fused dense MLP without FP8 .*$", text, flags=re.M).group(0)
    assert _flat(speedup) in page
    for check in re.findall(r"relative error [\d.e+-]+ against the (?:quantized|unquantized) graph", text):
        assert check in page, check


def test_the_cost_example_is_the_run():
    page, text = _page("cost_model.md"), COST.read_text()
    assert COST.name in page
    block = page.split("$ nmmc cost --mlp --tokens 1 --hidden 2048 --intermediate 8192 --dense", 1)[1].split("```")[0]
    quoted = [line for line in block.splitlines() if re.match(r"^  [a-z]", line)]
    assert len(quoted) >= 8
    cost = text.split("$ nmmc explain", 1)[0]
    printed = {line.split()[0]: _flat(line) for line in cost.splitlines() if re.match(r"^  [a-z]", line)}
    for line in quoted:
        key, shown = line.split()[0], _flat(line).split(" ...")[0]  # '...' marks where the page trims a line
        assert printed[key].startswith(shown), (key, shown)


SVD = RESULTS / "svd-accuracy-2026-12-07.txt"


def test_the_svd_route_figures_are_the_run():
    """docs/compression.md, "Factorization": the Gram route's time against the full SVD's, as the run printed it."""
    page, text = _flat(_page("compression.md")), SVD.read_text()
    rows = {name: tuple(float(x) for x in found) for name, *found in re.findall(
        r"^(\S+) .*\| full +([\d.]+)s ([\d.]+) \| gram +([\d.]+)s ([\d.]+) \(([-+.\de]+)\)", text, flags=re.M)}
    assert len(rows) == 5 and SVD.name in page
    full, _, gram, _, _ = rows["llama-3.2-1b"]
    assert f"2048 x 8192: {gram} s against {full} s" in page
    # "the full SVD's error to 15 digits in a sixth to a third of its time"
    assert all(abs(rel) < 1e-14 and 1 / 6.5 < g / f < 1 / 2.9 for f, _, g, _, rel in rows.values())


def test_the_tune_model_mx_front_is_the_run():
    """docs/quantization.md quotes tune --model's format front on trn3 (bf16, FP8, MXFP8, MXFP4) as the run printed
    it."""
    page = _flat(_page("quantization.md"))
    quoted = re.search(r"`(dense-bf16 [^`]+\(chosen\))` \(`benchmarks/results/(tune-model-mx-[\d-]+\.txt)`\)", page)
    assert quoted and quoted.group(2) == TUNE_MODEL_MX.name
    assert f"formats: {quoted.group(1)}" in TUNE_MODEL_MX.read_text()
