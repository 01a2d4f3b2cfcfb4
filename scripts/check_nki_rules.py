"""Run the static NKI rule checker over every golden kernel and print a count per rule id.

Usage: python scripts/check_nki_rules.py [--sdk 2.30|default] [--verbose] [DIR]

Each file's dialect and target come from its ``nmmc-metadata`` line. The counts are the "Known violations of the
current emitter" that docs/nki-rules.md lists. ``nmmc verify`` runs the same checker on one file (default SDK: the
newest supporting its dialect on its target); ``scripts/emit_matrix.py`` runs it over every kernel family.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from neuronmm_compiler.support import newest_sdk  # noqa: E402
from neuronmm_compiler.verification.static_check import Violation, check_kernel_source  # noqa: E402
from neuronmm_compiler.vocab import Dialect  # noqa: E402

#: ``--sdk default``: per file, the release ``nmmc verify`` checks by default (the one its metadata records, else
#: support.newest_sdk).
DEFAULT = "default"

GOLDEN = ROOT / "tests" / "golden" / "kernels"
METADATA = "# nmmc-metadata:"


def file_context(source: str) -> tuple[str, str, str | None]:
    """(dialect, target, Neuron SDK release or None) recorded in an nmmc kernel file's metadata line."""
    for line in source.splitlines():
        if line.startswith(METADATA):
            data = json.loads(line[len(METADATA):])
            return data["dialect"], data["target"], data.get("sdk")
    raise ValueError("no nmmc-metadata line")


def check_dir(directory: Path, sdk: str | None = None) -> dict[str, list[Violation]]:
    """Violations per file name, for every ``*.py`` in ``directory`` (``sdk`` DEFAULT: each file's default)."""
    out: dict[str, list[Violation]] = {}
    for path in sorted(directory.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        dialect, target, recorded = file_context(source)
        release = (recorded or newest_sdk(Dialect(dialect), target)) if sdk == DEFAULT else sdk
        out[path.name] = check_kernel_source(source, dialect=dialect, target=target, sdk=release)
    return out


def counts(results: dict[str, list[Violation]]) -> tuple[Counter, Counter]:
    """(violations per rule id, files per rule id)."""
    per_rule: Counter = Counter(v.rule_id for vs in results.values() for v in vs)
    files: Counter = Counter(rid for vs in results.values() for rid in {v.rule_id for v in vs})
    return per_rule, files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", type=Path, default=GOLDEN)
    parser.add_argument("--sdk", default=None, help="Neuron SDK release, e.g. 2.30 (enables SDK-bounded rules), or "
                        "'default': per file, the release nmmc verify checks by default")
    parser.add_argument("--verbose", action="store_true", help="print every violation")
    args = parser.parse_args(argv)
    results = check_dir(args.directory, args.sdk)
    if args.verbose:
        for name, violations in results.items():
            for violation in violations:
                print(f"{name}: {violation}")
    per_rule, files = counts(results)
    print(f"{len(results)} kernel files, SDK {args.sdk or 'unspecified'}")
    for rule_id in sorted(per_rule):
        print(f"{rule_id}: {per_rule[rule_id]} violations in {files[rule_id]} files")
    if not per_rule:
        print("no violations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
