"""docs/fusion.md quotes its committed results figure for figure (the nki-library comparison of
benchmarks/results/vs_nkilib-2026-12-07.txt and the tune example), and the sections the code and the docs cite in
docs/fusion.md, docs/nkilib-mlp.md and docs/architecture.md exist. Reads files only."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
VS_NKILIB = RESULTS / "vs_nkilib-2026-12-07.txt"
TUNE = RESULTS / "fusion-tune-example-2026-12-07.txt"
CITED_PAGES = ("fusion.md", "nkilib-mlp.md", "architecture.md")


def _page(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _compared_rows(path: Path) -> dict[str, list[list[str]]]:
    """'LNC=2' / 'LNC=1' -> the rows where nki-library has a latency and a ratio is printed, as the page writes them."""
    out: dict[str, list[list[str]]] = {}
    lnc = ""
    for line in path.read_text().splitlines():
        if line.startswith("== trn2 "):
            lnc = line.split()[2].rstrip(",")
            continue
        cells = re.split(r" {2,}", line.strip())
        if len(cells) < 11 or not re.fullmatch(r"[\d.]+", cells[3]):  # header, n/a or a 'cte ref' reference row
            continue
        model = cells[0].replace(" tp8", " (tp 8 rank)")
        out.setdefault(lnc, []).append([model, *cells[1:4], *cells[5:11]])
    return out


def test_the_nkilib_tables_are_the_run():
    page, rows = _page("fusion.md"), _compared_rows(VS_NKILIB)
    assert VS_NKILIB.name in page and "fusion-history.md" in page
    assert {lnc: len(r) for lnc, r in rows.items()} == {"LNC=2": 15, "LNC=1": 19}
    for lnc, table in rows.items():
        section = page.split(f"**trn2, {lnc}", 1)[1].split("\n\n", 2)[1]
        assert [line.strip("| ").split(" | ") for line in section.splitlines()[2:]] == table, lnc
    summary = re.findall(r"^(dense|svd 0.9|svd 0.8) vs nkilib over (\d+) points: geomean ([\d.]+x), median ([\d.]+x), "
                         r"min ([\d.]+x), max ([\d.]+x)$", VS_NKILIB.read_text(), flags=re.M)
    dense, svd9, svd8 = summary
    flat = _flat(page)
    assert "points where nmmc's dense MLP is predicted slower than nkilib: none" in VS_NKILIB.read_text()
    assert f"Over the {dense[1]} points" in flat and "**nmmc's dense MLP is predicted faster at every one**" in flat
    assert f"(geomean {dense[2]}, median {dense[3]}, min {dense[4]}, max {dense[5]})" in flat
    assert f"SVD keep 0.9 geomean {svd9[2]}, keep 0.8 {svd8[2]}" in flat


def test_the_tune_example_is_the_run():
    page, text = _page("fusion.md"), TUNE.read_text()
    assert TUNE.name in page
    first = text.split("\n$ ", 2)[1]
    block = page.split("recorded it (notes wrapped, runners-up cut):", 1)[1].split("```")[1]
    rows = r"^  (nmmc tuned|nki-library|dense|ref:)"
    quoted = [line for line in block.splitlines() if re.match(rows, line)]
    assert len(quoted) == 5
    printed = [line for line in first.splitlines() if re.match(rows, line)]
    assert [_flat(line) for line in quoted] == [" ".join(_flat(line).split()[:len(q.split())])
                                                for line, q in zip(printed, quoted, strict=True)]
    for speedup in re.findall(r"^speedup vs (.+?) \(in-graph\): ([\d.]+x)", first, flags=re.M):
        assert f"speedup vs {speedup[0]} (in-graph): {speedup[1]}" in page, speedup
    standalone = dict(re.findall(r"^speedup vs (.+?) \(standalone\): ([\d.]+x)", text, flags=re.M))
    assert list(standalone.values()) == ["1.25x", "1.23x", "2.02x", "1.88x"]
    assert "prints 1.25x over nki-library, 1.23x over nmmc's dense MLP, 2.02x over `dense` and 1.88x over `unfused`" \
        in _flat(page)


def _sections(page: str) -> list[str]:
    """Headings and bold paragraph leads of a page."""
    heads = [h.strip() for h in re.findall(r"^#+ (.+)$", page, flags=re.M)]
    leads = re.findall(r"\*\*([^*]+)\*\*", page)
    return heads + leads


def test_every_cited_section_exists():
    cited: set[tuple[str, str]] = set()
    sources = [*(ROOT / "src").rglob("*.py"), *(ROOT / "scripts").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
               ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    for path in sources:
        text = _flat(path.read_text(encoding="utf-8"))
        for name, section in re.findall(r"docs/(fusion\.md|nkilib-mlp\.md|architecture\.md),? [\"']([^\"']{3,60})[\"']",
                                        text):
            cited.add((name, section))
    assert ("fusion.md", "The norm prologue") in cited and ("architecture.md", "Search") in cited
    for name, section in sorted(cited):
        assert any(s.startswith(section) for s in _sections(_page(name))), (name, section)


def test_the_pages_stay_short_and_name_no_issue():
    """Every page of docs/ (a user's page: run logs live beside their results in benchmarks/results/)."""
    names = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert {*CITED_PAGES, "compression.md", "quantization.md", "mx.md"} <= set(names)
    for name in names:
        page = _page(name)
        assert len(page.splitlines()) <= 400, name
        assert not re.search(r"\bissues? #?\d", page, flags=re.I), name


def test_the_layout_map_is_the_tree():
    """docs/architecture.md opens with the package map: every line names a package or top-level module of
    src/neuronmm_compiler that exists, and every package and top-level module has one."""
    page = _page("architecture.md")
    assert re.search(r"\A# [^\n]+\n\n(?:[^#\n][^\n]*\n)*\n## Layout\n", page), "'## Layout' is the first section"
    section = page.split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^\| `([a-z_]+/|[a-z_]+\.py)` \| \S", section, flags=re.M)
    package = ROOT / "src" / "neuronmm_compiler"
    assert len(named) == len(set(named)), "a package or module named twice"
    for name in named:
        assert (package / name).exists(), name
    packages = {p.name + "/" for p in package.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    assert set(named) == packages | modules, (packages | modules) ^ set(named)
