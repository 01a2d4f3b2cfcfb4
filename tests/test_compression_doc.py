"""docs/compression.md quotes the committed results figure for figure: the perplexities from the full run, the
predicted latencies from the latest --latency-only run, the healing recipe's run and its time. The run log beside
the results (benchmarks/results/compression-runs.md) holds the superseded figures, each still tied to its results
file: the heal study's runs, the standalone latencies and the stale 2026-11-30 rank choice, marked stale."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FULL = RESULTS / "compression-2026-11-30.txt"
LATENCY = RESULTS / "compression-latency-2026-12-03.txt"  # trn2, nmmc's default target, in-graph
LATENCY_TRN1 = RESULTS / "compression-latency-trn1-2026-12-03.txt"
JOINT_TRN2 = RESULTS / "compression-trn2-2026-12-03.txt"  # the full run on trn2, in-graph
STANDALONE = RESULTS / "compression-latency-2026-12-01.txt"  # trn1 standalone, before the benchmark ran in-graph


NOTES = RESULTS / "compression-runs.md"


def _doc() -> str:
    return " ".join((ROOT / "docs" / "compression.md").read_text(encoding="utf-8").split())


def _notes() -> str:
    return " ".join(NOTES.read_text(encoding="utf-8").split())


def _latencies(path: Path) -> dict[int, dict[str, float]]:
    """tokens -> variant ('dense', '128/128', ...) -> predicted us, from a results file's latency lines."""
    out = {}
    for tokens, cells in re.findall(r"^  tokens (\d+): (.*)$", path.read_text(), flags=re.M):
        out[int(tokens)] = {name: float(v) for name, v in re.findall(r"(\S+) ([\d.]+)(?:,|$)", cells)}
    return out


def _grouped(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def test_the_doc_names_the_result_files_and_the_text():
    doc, notes = _doc(), _notes()
    assert all(f.name in doc for f in (FULL, LATENCY, LATENCY_TRN1, JOINT_TRN2))
    assert f"benchmarks/results/{NOTES.name}" in doc and STANDALONE.name in notes
    assert "the same source" in doc and "CPython documentation" in doc


def test_perplexities_are_the_full_runs():
    doc, text = _doc(), FULL.read_text()
    original = float(re.search(r"^original perplexity ([\d.]+)$", text, flags=re.M).group(1))
    assert f"Original perplexity {original:.2f}" in doc
    rows = re.findall(r"^(0\.\d)  \| ([\d.]+) \| +([\d.]+) \(([\d.]+)\) \| +([\d.]+) \(([\d.]+)\) \| +([\d.]+)x$",
                      text, flags=re.M)
    assert len(rows) == 5
    for _, kept, plain, plain_agree, white, white_agree, gap in rows:
        cells = (f"| {kept} | {_grouped(float(plain), 0)} ({plain_agree}) | {white} ({white_agree}) | "
                 f"{_grouped(float(gap), 0)}x |")
        assert cells in doc, cells
    white_08 = float(next(r[4] for r in rows if r[0] == "0.8"))
    assert f"+{white_08 / original - 1:.0%} perplexity here ({white_08:.2f} against {original:.2f}" in doc


def test_latencies_are_the_latest_runs_and_the_old_ones_are_marked_stale():
    doc, notes = _doc(), _notes()
    now, trn1, then = _latencies(LATENCY), _latencies(LATENCY_TRN1), _latencies(FULL)
    assert "on trn2 LNC=2 in-graph" in LATENCY.read_text() and "on trn1 in-graph" in LATENCY_TRN1.read_text()
    for rows in (now, trn1):
        n512 = rows[512]
        assert (f"at 512 tokens fused dense {n512['dense']}, ranks 128/128 {n512['128/128']}, "
                f"256/256 {n512['256/256']}, 384/384 {n512['384/384']}") in doc
        ranks = [v for t in (1, 128) for name, v in rows[t].items() if name != "dense"]
        assert (f"at 1 and 128 tokens fused dense {rows[1]['dense']} and {rows[128]['dense']}, every rank "
                f"{min(ranks)}–{max(ranks)}") in doc
    # trn2: every rank faster than dense at 512 tokens; at 1 and 128 tokens 128/128 is and 384/384 is not
    assert all(v < now[512]["dense"] for k, v in now[512].items() if k != "dense")
    assert all(now[t]["128/128"] < now[t]["dense"] < now[t]["384/384"] for t in (1, 128))
    assert (f"the small ranks are (128/128: {now[1]['128/128']} and {now[128]['128/128']}) and 384/384 is not "
            f"({now[1]['384/384']} and {now[128]['384/384']})") in doc
    # the joint choice on trn2, as its run printed it
    joint = JOINT_TRN2.read_text()
    assert joint.count("predicted latency of one layer's MLP on trn2 LNC=2 in-graph") == 1
    assert _latencies(JOINT_TRN2) == now  # the run searched at LNC=2, as the latency file
    keep08 = joint.split("keep 0.8: ranks", 1)[1].split("\nkeep ", 1)[0]
    uniform, dense, chosen, ppl, layers = re.search(
        r"buckets 512, most accurate within the uniform ranks' predicted latency: predicted MLP latency uniform "
        r"([\d.]+) us, fused dense ([\d.]+) us; chosen ranks ([\d.]+) us, kept [\d.]+, ppl ([\d.]+) agree [\d.]+, "
        r"(\d+) dense layers", keep08).groups()
    assert (f"uniform whitened ranks are predicted {uniform} µs against {dense} for the fused dense MLP" in doc
            and f"keeps {layers} layers dense" in doc and f"measures {ppl} at {chosen} µs" in doc)
    # trn1: dense fastest at every bucket, so the joint choice keeps every layer dense
    assert all(row["dense"] < min(v for k, v in row.items() if k != "dense") for row in trn1.values())
    assert LATENCY_TRN1.read_text().count("every rank choice keeps every layer dense") == 2
    old = _latencies(STANDALONE)[512]
    assert f"fused dense {old['dense']} against ranks {old['128/128']}–{old['384/384']} at 512 tokens" in notes
    # the 2026-11-30 figures appear only in the run log's section marked stale, never on the page
    stale = notes.split("**Stale: the 2026-11-30 rank choice**", 1)
    assert len(stale) == 2
    t512 = then[512]
    old = (f"fused dense {t512['dense']} µs per layer, ranks 128/128 {t512['128/128']}, 256/256 {t512['256/256']}, "
           f"384/384 {t512['384/384']}")
    assert old in stale[1] and old not in stale[0] and old not in doc


def test_the_stale_rank_choice_table_is_the_full_runs():
    text = FULL.read_text()
    stale = _notes().split("**Stale: the 2026-11-30 rank choice**", 1)[1]
    for keep in ("0.5", "0.8"):
        block = text.split(f"keep {keep}: ranks", 1)[1].split("\nkeep ", 1)[0]
        accurate = [line for line in block.splitlines() if "most accurate within" in line]
        assert len(accurate) == 2
        for line in accurate:
            uniform, chosen = (float(x) for x in re.search(r"uniform ([\d.]+) us, fused dense [\d.]+ us; chosen ranks "
                                                           r"([\d.]+) us", line).groups())
            ppl = float(re.search(r"ppl ([\d.]+) agree", line).group(1))
            assert f"{uniform:.1f} /" in stale and f"{chosen:.1f} / {ppl:.2f}" in stale, line


HEAL = RESULTS / "compression-heal-2026-12-01.json"


def test_the_healing_table_is_the_heal_studys():
    """Every perplexity of benchmarks/compression.py --heal-study's committed run is in the run log's table."""
    import json

    doc, data = _notes(), json.loads(HEAL.read_text())
    assert HEAL.name in doc
    for name, ppl in data["originals"].items():
        assert f"{name} ({ppl:.2f})" in doc
    for row in data["rows"]:
        cells = " | ".join(f"{q['ppl']:,.2f} ({q['increase']:+.1%})" for q in row["quality"].values())
        assert f"| {row['rank']} | {row['method']} | {cells} |" in doc, row["method"]


def test_the_fp8_tables_are_the_formats_runs():
    """docs/compression.md and docs/quantization.md quote benchmarks/compression.py --formats-study's summary rows."""
    text = (RESULTS / "compression-formats-2026-12-01.txt").read_text()
    rows = re.findall(r"^(dense|SVD 384) \| (bf16|fp8 \(e4m3\)) \| (.+)$", text, flags=re.M)
    assert len(rows) == 4
    for doc in (_doc(), " ".join((ROOT / "docs" / "quantization.md").read_text(encoding="utf-8").split())):
        assert "compression-formats-2026-12-01.txt" in doc
        for weights, fmt, cells in rows:
            assert re.search(rf"\| {re.escape(weights)} \| {re.escape(fmt)} \| [\d.]+ \| {re.escape(cells)} \|", doc), \
                (weights, fmt)


HEAL_FINETUNE = RESULTS / "compression-heal-finetune-2026-12-01.json"


def test_the_fine_tuning_rows_are_the_second_heal_runs():
    """The rank-384 rows of the fine-tuning rerun (faster, measured settings) are in the run log, figure for figure."""
    import json

    doc, data = _notes(), json.loads(HEAL_FINETUNE.read_text())
    assert HEAL_FINETUNE.name in doc
    assert {row["method"] for row in data["rows"]} == {"whitened", "whitened+closed-form", "whitened+finetune"}
    for row in data["rows"]:
        cells = " | ".join(f"{q['ppl']:,.2f} ({q['increase']:+.1%})" for q in row["quality"].values())
        usage = f"{row['seconds']:.0f} | {row['cpu_seconds']:.0f} | {row['peak_mib']:.0f}"
        assert f"| {row['rank']} | {row['method']} | {cells} | {usage} |" in doc, row["method"]


HEAL_COMPRESS = RESULTS / "compression-heal-finetune-2026-12-02.json"


def test_the_compress_finetune_run_and_the_distillation_data_rows_are_in_the_doc():
    """`nmmc compress --heal finetune`'s own run (time, memory, per-file perplexities), its kill-and-resume, and
    the fine-tuning runs with the model's samples are quoted in the run log from the 2026-12-02 record."""
    import json

    doc, data = _notes(), json.loads(HEAL_COMPRESS.read_text())
    assert HEAL_COMPRESS.name.replace(".json", ".txt") in doc
    full = data["full"]
    assert f"{full['cpu_s']:.0f} CPU s (user + system), {full['peak_mib']} MiB peak RSS" in doc
    for name, q in full["per_file"].items():
        assert f"{name.split('.')[0].split('-')[0]} {q['ppl']:.2f} ({q['increase']:+.1%})" in doc, name
    new = data["samples_16384"]
    assert f"{new['cpu_s']:.0f} CPU s, {new['peak_mib']} MiB peak RSS" in doc
    for name, q in new["per_file"].items():
        assert f"{name.split('.')[0].split('-')[0]} {q['ppl']:.2f} ({q['increase']:+.1%})" in doc, name
    chain = data["kill_chain"]
    assert chain["factors_bitwise_equal"] and "bitwise equal to the uninterrupted" in doc
    for run in data["sweep"]:
        cells = " | ".join(f"{run['perplexity'][n]:.2f} ({run['perplexity'][n] / run['original'][n] - 1:+.1%})"
                           for n in ("docs", "licences", "code", "changelogs"))
        assert f"| {run['distill_tokens']:,} | {cells} | {run['cpu_s']} | {run['peak_mib']} |" in doc


RECIPE = RESULTS / "compression-recipe-250-steps-2026-12-03.txt"
RECIPE_TP = RESULTS / "compression-tp-label-2026-12-03.txt"
TEXTS = ("docs-eval", "licences", "code", "changelogs")


def _per_file(text: str) -> dict[str, tuple[str, str]]:
    """eval file -> (signed increase, top-1 agreement) from a compress run's per-file lines (the first of each)."""
    out: dict[str, tuple[str, str]] = {}
    for name, inc, agree in re.findall(r"^ +(\S+)\.txt: \d+ tokens, perplexity [\d.]+ -> [\d.]+ \(([+-][\d.]+%)[^)]*\)"
                                       r", top-1 agreement ([\d.]+)$", text, flags=re.M):
        out.setdefault(name, (inc, agree))
    return out


def test_the_recipe_rows_and_its_time_are_the_runs():
    """The page's healing table (the recipe, and its --tp 2 blocks) and its time table's first row are the runs'
    printed figures."""
    doc, recipe = _doc(), RECIPE.read_text()
    files = _per_file(recipe)
    overall = re.search(r"perplexity [\d.]+ -> [\d.]+ \(([+-][\d.]+%);.*top-1 agreement ([\d.]+),", recipe).groups()
    cells = " | ".join(f"{files[n][0]} ({files[n][1]})" for n in TEXTS) + f" | {overall[0]} ({overall[1]})"
    assert f"| recipe: Fisher metric, closed form, 250 fine-tuning steps | {cells} |" in doc
    took = re.search(r"healing took (\d+:\d\d) on 2 threads \(wall time\): whitened SVD (\d+ s), Fisher (\d+ s), "
                     r"closed form (\d+:\d\d), fine-tuning (\d+:\d\d)", recipe).groups()
    assert f"| 2, idle (host B) | {took[0]} (250 steps: {', '.join(took[1:])}) |" in doc
    minutes, seconds = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\d+):([\d.]+)", recipe).groups()
    wall = f"{minutes}:{round(float(seconds)):02d}"
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", recipe).group(1)) // 1024
    assert f"| {wall} | `{RECIPE.name}` |" in doc and f"Peak RSS of the recipe: {peak} MiB" in doc
    # the --tp 2 run printed the recipe's figures for the unsharded factors, then the blocks'
    unsharded, blocks = RECIPE_TP.read_text().split("--tp 2 factor-shard blocks (kept 0.778", 1)
    assert _per_file(unsharded) == files
    tp_files = _per_file(blocks)
    tp_overall = re.search(r"perplexity [\d.]+ -> [\d.]+ \(([+-][\d.]+%);.*?top-1 agreement ([\d.]+)", blocks).groups()
    cells = " | ".join(f"{tp_files[n][0]} ({tp_files[n][1]})" for n in TEXTS) + f" | {tp_overall[0]} ({tp_overall[1]})"
    assert RECIPE_TP.name in doc and f"the factor-shard blocks (kept 0.778) | {cells} |" in doc
