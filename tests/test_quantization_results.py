"""The perplexity table of every compress format (docs/quantization.md, "What each format costs the model") quotes
its committed run row for row: the table ``benchmarks/quantization_ppl.py`` printed into its results file is in the
page, with the file's name and the commands it ran. Reads files only."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "quantization-ppl-2026-12-07.txt"
PAGE = ROOT / "docs" / "quantization.md"
FORMATS = ("bf16", "fp8-static", "fp8-row", "mxfp8", "mxfp4")


def _table(text: str) -> list[str]:
    """The table's header and rows as printed (``| ... |`` lines after the run's summary)."""
    return [line for line in text.splitlines() if line.startswith("| ") and line.endswith(" |")]


def test_the_table_is_the_run():
    text, page = RESULTS.read_text(encoding="utf-8"), PAGE.read_text(encoding="utf-8")
    rows = _table(text)
    assert len(rows) == 1 + len(FORMATS) and RESULTS.name in page
    assert [r.split(":")[0].removeprefix("| ") for r in rows[1:]] == list(FORMATS)
    for row in rows:
        assert row in page, row
    # at least three texts of different domains, each with its original perplexity
    assert len(re.findall(r"\| (docs|licences|code|changelogs) \([\d.]+\)", rows[0])) >= 3


def test_the_commands_are_the_run():
    text, page = RESULTS.read_text(encoding="utf-8"), " ".join(PAGE.read_text(encoding="utf-8").split())
    commands = [line[2:] for line in text.splitlines() if line.startswith("$ nmmc compress ")]
    assert len(commands) == len(FORMATS)
    for cmd in commands:  # as the page shows them: the work directory as DIR
        shown = re.sub(r"/\S+/runs/qppl/", "DIR/", cmd).replace("/work/smollm2/model", "M")
        assert shown in page, shown
    assert "python benchmarks/quantization_ppl.py" in page


def test_the_reading_holds():
    """The page's reading: FP8 costs a few percent at most overall, MXFP4 far more than MXFP8."""
    rows = {r.split(":")[0].removeprefix("| "): r for r in _table(RESULTS.read_text(encoding="utf-8"))[1:]}

    def overall(label: str) -> float:
        return float(re.findall(r"\(([+-][\d.]+)%", rows[label])[-1])

    assert abs(overall("bf16")) < 0.5
    assert max(overall("fp8-static"), overall("fp8-row"), overall("mxfp8")) < 5.0 < overall("mxfp4")
