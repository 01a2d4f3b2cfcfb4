"""docs/integration.md as a user page: at most 400 lines, no issue named, every section the code and the docs cite
in it exists, every repository path it names exists, and its Llama-3.2-1B export and SmolLM2 FP8 figures are those
of the committed results files (the longer accounts are benchmarks/results/export-notes.md). Reads files only."""

from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "integration.md"
NOTES = ROOT / "benchmarks" / "results" / "export-notes.md"
LLAMA1B = ROOT / "benchmarks" / "results" / "export-llama1b-2026-12-07.txt"
SMOLLM2 = ROOT / "benchmarks" / "results" / "export-check-2026-12-02.json"
#: A bucket's line of an export: "   128 tokens: 66.9 us predicted (typically ...) incl. 11.3 us all-reduce, ..."
PREDICTED = r"\s+(\d+) tokens: ([\d.]+) us predicted.*?(?:incl\. ([\d.]+) us all-reduce)?[,;]"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _page() -> str:
    return PAGE.read_text(encoding="utf-8")


def test_the_page_stays_short_and_names_no_issue():
    page = _page()
    assert len(page.splitlines()) <= 400
    assert not re.search(r"\bissues? #?\d|#\d{2,}", page, flags=re.I)


def test_every_cited_section_exists():
    """A citation ``docs/integration.md, "Section"`` (or with single quotes) in the code, scripts, benchmarks, README
    or another page names a heading or a bold paragraph lead of the page."""
    page = _page()
    sections = [h.strip() for h in re.findall(r"^#+ (.+)$", page, flags=re.M)] + re.findall(r"\*\*([^*]+)\*\*", page)
    sources = [*(ROOT / "src").rglob("*.py"), *(ROOT / "scripts").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
               ROOT / "README.md", *(p for p in (ROOT / "docs").glob("*.md") if p != PAGE)]
    cited = {section for path in sources
             for section in re.findall(r"docs/integration\.md,? [\"']([^\"']{3,60})[\"']",
                                       _flat(path.read_text(encoding="utf-8")))}
    assert {"vLLM Neuron", "FP8 and per-layer formats", "What is not done"} <= cited
    for section in sorted(cited):
        assert any(s.startswith(section) for s in sections), section


def test_every_named_path_exists():
    """Files the page and its notes name under tests/, scripts/, benchmarks/, examples/, docs/, src/neuronmm_compiler/
    or one of its packages are in the repository (``models/...`` is left out: the page also cites NxD Inference's)."""
    prefixes = (r"(?:tests|scripts|benchmarks|examples|docs|src/neuronmm_compiler|lowerings|compression|checkpoints"
                r"|export)")
    for text in (_page(), NOTES.read_text(encoding="utf-8")):
        for path in re.findall(rf"(?<![\w./:-]){prefixes}/[\w./-]+\.(?:py|md|txt|json)", text):
            assert (ROOT / path).exists() or (ROOT / "src" / "neuronmm_compiler" / path).exists(), path
    assert "benchmarks/results/export-notes.md" in _page()


def _llama1b_runs() -> dict[str, dict[str, str]]:
    """Each command of the results file ('', 'fp8', 'tp2', 'fp8 tp2') -> its predicted latencies and all-reduce
    shares per token count, its CPU seconds; and each verify (in the file's order) -> its relative errors."""
    runs: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    verifies = 0
    for line in LLAMA1B.read_text(encoding="utf-8").splitlines():
        if line.startswith("$ nmmc export"):
            key = " ".join(k for k, flag in (("fp8", "--dtype fp8"), ("tp2", "--tp 2")) if flag in line)
            current = runs.setdefault(key, {})
        elif line.startswith("$ nmmc verify"):
            current = runs.setdefault(f"verify{verifies}", {})
            verifies += 1
        elif match := re.match(PREDICTED, line):
            current[f"t{match[1]}"] = match[2]
            if match[3]:
                current[f"comm{match[1]}"] = match[3]
        elif match := re.match(r"\s+OK\s+kernels/\S+/t(\d+)/\S+, relative error ([\d.]+)e-0(\d)", line):
            current[f"err{match[1]}"] = f"{float(match[2]):.2f}e-{match[3]}"
        elif match := re.match(r"time: wall [\d.]+ s, user ([\d.]+) s, sys ([\d.]+) s", line):
            cpu = Decimal(match[1]) + Decimal(match[2])  # user + sys, to 0.1 s, half up (7.15 -> 7.2)
            current["cpu"] = str(cpu.quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))
    return runs


def test_llama1b_figures_are_the_results_file():
    page = _flat(_page())
    runs = _llama1b_runs()
    bf16, fp8, tp2, fp8tp2 = runs[""], runs["fp8"], runs["tp2"], runs["fp8 tp2"]
    assert f"takes {bf16['cpu']} s of CPU time with the result cache off" in page
    assert f"its `nmmc verify` {runs['verify0']['cpu']} s" in page
    assert (f"dense FP8 {fp8['t1']} us at 1 token and {fp8['t128']} us at 128 tokens, against {bf16['t1']} and "
            f"{bf16['t128']} us for the bf16 export") in page
    assert (f"{fp8tp2['t1']} us at 1 token and {fp8tp2['t128']} us at 128 tokens including {fp8tp2['comm1']} / "
            f"{fp8tp2['comm128']} us all-reduce, against {tp2['t1']} and {tp2['t128']} us") in page
    ratios = [f"{float(fp8[t]) / float(bf16[t]):.2f}x" for t in ("t1", "t128")]
    assert f"({ratios[0]} and {ratios[1]})" in page
    verify_fp8, verify_fp8tp2 = runs["verify1"], runs["verify2"]
    assert f"relative error {verify_fp8['err1']} and {verify_fp8['err128']} against the quantized graph" in page
    assert f"relative error {verify_fp8tp2['err1']} and {verify_fp8tp2['err128']} against the quantized unsharded" \
        in page


def test_smollm2_fp8_perplexities_are_the_results_file():
    ppl = json.loads(SMOLLM2.read_text(encoding="utf-8"))["fp8"]["perplexity"]
    expected = (f"perplexity {ppl['patched']:.2f} patched, {ppl['emulation']:.2f} emulated, "
                f"{ppl['unpatched']:.2f} unquantized")
    assert expected in _flat(_page())


def test_vllm_neuron_figures_match_the_notes():
    """The page's one-paragraph account of the Llama-3.1-8B --serving export is the notes' account."""
    page, notes = _flat(_page()), _flat(NOTES.read_text(encoding="utf-8"))
    for figure in ("11 kernels, one per token count", "47.5 s", "3 min 32 s", "2.8e-3 to 2.9e-3", "6 min 10 s",
                   "all 22 kernel and plan files", "7 kernels: 1 to 32 and 2048"):
        assert figure in page and figure in notes, figure
