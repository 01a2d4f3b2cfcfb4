"""Write docs/nki-rules.md from the rule book (neuronmm_compiler.verification.rules.RULES).

Usage: python scripts/nki_rules_doc.py [--check]

The document is generated, never edited by hand: a table per topic, then the counts of the checkable rules' violations
over tests/golden/kernels (the known violations of the current emitter). ``--check`` exits 1 when the file differs
from what would be written; tests/test_nki_rules.py runs the same comparison.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

from check_nki_rules import DEFAULT, GOLDEN, check_dir, counts  # noqa: E402

from neuronmm_compiler.support import (  # noqa: E402
    KNOWN_SDKS,
    LATER_SDKS,
    NEURONXCC_REMOVED_IN,
    NKI_LNC_FROM,
    SUPPORT,
    newest_sdk,
    resolve_dialect,
    support_for,
)
from neuronmm_compiler.targets import TARGETS  # noqa: E402
from neuronmm_compiler.verification.rules import (  # noqa: E402
    LATEST_DOCS,
    LEGACY_DOCS,
    NKILIB,
    NMMC,
    RULES,
    RULES_BY_ID,
    SDK229_DOCS,
    SDK232_DOCS,
    SDK233_DOCS,
    SDK234_DOCS,
    SDK_DOCS,
    TOPICS,
    Rule,
)
from neuronmm_compiler.vocab import Dialect  # noqa: E402

OUT = ROOT / "docs" / "nki-rules.md"
TITLES = {"memory": "On-chip memory", "tiles": "Tile limits", "loops": "Loops", "isa": "ISA calls", "fp8": "FP8",
          "mx": "MX (microscaling)", "dialect": "Dialects and SDK releases"}
#: SDK releases the known-violations table is computed for (DEFAULT: each file's nmmc verify default; None: no SDK
#: given, only unbounded rules; 2.30: the first release without neuronxcc.nki).
SDKS = (DEFAULT, None, "2.30")
SDK_TITLES = {DEFAULT: "verify's default SDK", None: "no SDK given", "2.30": "SDK 2.30"}
MODULES = ("nl", "nisa", "nki")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _short(citation: str) -> str:
    """A citation with its pinned repository shortened (the full commits are in the introduction)."""
    for repo in (SDK_DOCS, LEGACY_DOCS, NKILIB):
        name, commit = repo.split("@")
        citation = citation.replace(repo, f"{name}@{commit[:8]}")
    return citation


def _sdk(rule: Rule) -> str:
    if rule.sdk_min is None and rule.sdk_max is None:
        return "all"
    return f"{rule.sdk_min or ''}–{rule.sdk_max or ''}"


def _limit(rule: Rule) -> str:
    if rule.target_field is not None:
        values = ", ".join(f"{t} {v}" for t, v in rule.documented)
        held = ", ".join(f"{t} {getattr(TARGETS[t], rule.target_field)}" for t, _ in rule.documented)
        text = f"`Target.{rule.target_field}`: documented {values}"
        return text + ("" if not rule.targets_disagree else f" (targets.py: {held})")
    if rule.limit is None:
        return ""
    if isinstance(rule.limit, (frozenset, set)):
        return ", ".join(sorted(rule.limit))
    if isinstance(rule.limit, dict):
        return "; ".join(f"{k}: {'/'.join(v)}" for k, v in rule.limit.items())
    return str(rule.limit)


def golden_calls() -> list[tuple[str, int]]:
    """(call, occurrences) of every nl.*/nisa.*/nki.* (and nki.lnc.*) call in the golden kernels, most used first."""
    found: Counter = Counter()
    for path in sorted(GOLDEN.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = node.func if isinstance(node, ast.Call) else None
            if not isinstance(func, ast.Attribute):
                continue
            if isinstance(func.value, ast.Name) and func.value.id in MODULES:
                found[f"{func.value.id}.{func.attr}"] += 1
            elif ast.unparse(func.value) == "nki.lnc":
                found[f"nki.lnc.{func.attr}"] += 1
    return sorted(found.items(), key=lambda item: (-item[1], item[0]))


def support_matrix() -> list[str]:
    """The "Support matrix" section: support.SUPPORT with the rules (and their sources) it was chosen from."""
    lines = ["## Support matrix", "",
             "Generated from `src/neuronmm_compiler/support.py` (`SUPPORT`): where each dialect runs, and the rules "
             "of this book that decide it (the evidence; where the docs conflict, the rule's note says which "
             "reading was chosen). `nmmc verify --sdk` defaults to the release a file records (a kernel that "
             "exchanges), else the newest release of the dialect's range on the file's target.", "",
             "| dialect | targets | Neuron SDK | evidence |", "|---|---|---|---|"]
    for entry in SUPPORT:
        rules = [RULES_BY_ID[rid] for rid in entry.rules]
        evidence = "<br>".join(f"`{r.id}`: {_cell(r.summary)} ({_cell(_short(r.citation))})" for r in rules)
        lines.append(f"| {entry.dialect.value} | {', '.join(entry.targets)} | {entry.sdk_min}–{entry.sdk_max} | "
                     f"{evidence} |")
    lines += ["", "Per target and release (`--dialect auto` picks the dialect shown first; `—`: no documented "
              "dialect; `verify` default: the `--sdk` `nmmc verify` checks by default):", "",
              "| target | " + " | ".join(KNOWN_SDKS) + " | verify default |",
              "|---|" + "---|" * (len(KNOWN_SDKS) + 1)]
    for target in TARGETS:
        cells = []
        for sdk in KNOWN_SDKS:
            supported = [d.value for d in (Dialect.NKI, Dialect.NEURONXCC)
                         if any(s.covers(d, target, sdk) for s in SUPPORT)]
            cells.append(", ".join(supported) if supported else "—")
        defaults = ", ".join(f"{d.value} {newest_sdk(d, target)}" + ("" if support_for(d, target) else " (unsupported)")
                             for d in Dialect)
        lines.append(f"| {target} | " + " | ".join(cells) + f" | {defaults} |")
    lines += ["", "Without `--sdk`, `--dialect auto` gives: " + ", ".join(
        f"{target} {resolve_dialect('auto', target).value}" for target in TARGETS) + ".", "",
        f"`--dialect neuronxcc --sdk {NEURONXCC_REMOVED_IN}` (or later) is refused with a one-line user error (exit 2) "
        f"that gives the reason: Neuron {NEURONXCC_REMOVED_IN} removes the `neuronxcc.nki` namespace "
        "(`NKI-NEURONXCC-REMOVED`, naming the announcement)" + (
            "" if not LATER_SDKS else "; " + ", ".join(f"`--sdk {sdk}`" for sdk in LATER_SDKS)
            + f" is refused for every dialect: the rule book stops at {KNOWN_SDKS[-1]}") + ".", "",
        f"Within the `nki` range one emitted line depends on the release: the exchange between the programs of a "
        f"logical core is `nki.lnc.sendrecv` (no `pipe_id`; the file imports `nki.lnc`) from {NKI_LNC_FROM} "
        "(`NKI-ISA-LNC-DEPRECATED`) and `nisa.sendrecv(..., pipe_id=0)` before it (`NKI-LNC-MODULE`). `nmmc emit` and "
        "`tune` write a kernel for `--sdk` (default: the newest release of the dialect on the target); a kernel that "
        "exchanges records that release in its metadata (`sdk`) and its header states the narrower range it runs "
        "on; `nmmc verify` checks such a file against its recorded release by default.", ""]
    return lines


def render() -> str:
    lines = [
        "# NKI rule book",
        "",
        "Generated by `scripts/nki_rules_doc.py` from `src/neuronmm_compiler/verification/rules.py`; do not edit.",
        "",
        "The documented rules nmmc's kernels rely on, each read in the cited source: the Neuron SDK documentation "
        f"repository at `{SDK_DOCS}` (NKI 0.1 to 0.6, SDK up to 2.32) and, for NKI 0.1, the same repository at "
        f"`{LEGACY_DOCS}`, before its `general/nki/` pages were removed. That repository's snapshot ends at SDK 2.32: "
        f"the SDK 2.33 (NKI 0.7) rules were read in the published documentation at `{SDK233_DOCS}`, the SDK 2.34 "
        f"(NKI 0.8.0) ones at `{SDK234_DOCS}`, and the announcements made after 2.33, and 2.34 pages the stored "
        f"v2.34.0 copy lacks (the `nki.lnc` API), at `{LATEST_DOCS}` (not pinned to a release; each announcement is "
        f"cited with its posting date); the MX scale dtype's change at `{SDK229_DOCS}` and `{SDK232_DOCS}`. How the "
        "documented APIs are used in practice is cited from AWS's NKI "
        f"library at `{NKILIB}`. "
        f"Rules whose id starts with `NMMC-` are nmmc's own (source `{NMMC}`): its graph semantics, which a kernel "
        "can break while satisfying every AWS rule. "
        "Sources are `repo@commit:path (section)`, the commit shortened to 8 characters, or `page (section)`. "
        "A rule marked *checked* "
        "is enforced by `verification/static_check.py` (`check_kernel_source`); SDK-bounded rules are checked only "
        "when an SDK release is given. Where sources conflict, the note says which reading was chosen "
        "(conservatively).",
        "",
    ]
    for topic in TOPICS:
        lines += [f"## {TITLES[topic]}", "",
                  "| id | rule | dialects | SDK | targets | limit | source | note |",
                  "|---|---|---|---|---|---|---|---|"]
        for rule in (r for r in RULES if r.topic == topic):
            rid = f"`{rule.id}`" + (" (checked)" if rule.checkable else "")
            source = "<br>".join(_cell(_short(c)) for c in rule.citations)
            lines.append(f"| {rid} | {_cell(rule.summary)} | {', '.join(d.value for d in rule.dialects)} | "
                         f"{_sdk(rule)} | {', '.join(rule.targets)} | {_cell(_limit(rule))} | {source} | "
                         f"{_cell(rule.note)} |")
        lines.append("")
    lines += support_matrix()
    lines += ["## NKI calls the golden kernels use", "",
              "Calls of `nl.*`, `nisa.*`, `nki.*` and `nki.lnc.*` in `tests/golden/kernels` (occurrences): the API "
              "surface these rules cover.", "", ", ".join(f"`{name}` {count}" for name, count in golden_calls()), ""]
    lines += [
        "## Known violations of the current emitter",
        "",
        "`python scripts/check_nki_rules.py [--sdk X]` over the "
        f"{len(list(GOLDEN.glob('*.py')))} files of `tests/golden/kernels` (dialect and target from each file's "
        "metadata): violations (files). `nmmc verify` runs the same checker (with `--sdk`, default the release the "
        "file records, else the newest release supporting the file's dialect on its target) and fails on any "
        "violation; "
        "`python scripts/emit_matrix.py` runs it over the whole emit matrix. `NKI-DIALECT-TRN1` counts the golden "
        "cases that ask for the `nki` dialect on trn1, a pairing the support matrix calls unsupported (kept to show "
        "it); `NKI-NEURONXCC-IMPORT` at SDK 2.30 counts the `neuronxcc` files, whose range ends at 2.29; "
        "`NKI-LNC-MODULE` at SDK 2.30 counts the files emitted for 2.34 that exchange through `nki.lnc` (the import "
        "line and each call), a module 2.30 does not have.",
        "",
        "| rule | " + " | ".join(SDK_TITLES[s] for s in SDKS) + " |",
        "|---|" + "---|" * len(SDKS),
    ]
    tables = [counts(check_dir(GOLDEN, sdk)) for sdk in SDKS]
    found = sorted({rid for per_rule, _files in tables for rid in per_rule})
    for rule_id in found:
        cells = [f"{per_rule[rule_id]} ({files[rule_id]})" if per_rule[rule_id] else "0" for per_rule, files in tables]
        lines.append(f"| `{rule_id}` | " + " | ".join(cells) + " |")
    if not found:
        lines.append("| none | " + " | ".join("0" for _ in SDKS) + " |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/nki-rules.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python scripts/nki_rules_doc.py")
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
