"""Regenerate or check the golden corpus of emitted kernels (tests/golden).

    python scripts/update_golden.py            # check: exit 1 listing every case whose kernel changed
    python scripts/update_golden.py --update   # rewrite the stored kernels (an intended change only)

Run from the repository root (the cases name example graph files by relative path).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from click.testing import CliRunner  # noqa: E402

from golden.cases import CASES  # noqa: E402
from neuronmm_compiler.cli import main as nmmc  # noqa: E402

KERNELS = ROOT / "tests" / "golden" / "kernels"


def run_case(args: tuple[str, ...]) -> str:
    """The kernel source an ``nmmc`` command line prints to stdout (raises on a failed run)."""
    result = CliRunner().invoke(nmmc, list(args), catch_exceptions=False)
    if result.exit_code != 0:
        raise RuntimeError(f"nmmc {' '.join(args)} exited {result.exit_code}: {result.output}")
    return result.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the stored kernels")
    parser.add_argument("names", nargs="*", help="only these cases (default: all)")
    options = parser.parse_args()
    changed = []
    for name, args in CASES.items():
        if options.names and name not in options.names:
            continue
        source = run_case(args)
        path = KERNELS / f"{name}.py"
        if options.update:
            KERNELS.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
        elif not path.exists() or path.read_text() != source:
            changed.append(name)
        print(name, flush=True)
    for name in changed:
        print(f"CHANGED: {name}", file=sys.stderr)
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
