"""Regenerate or check the expected outputs of the pass test cases (tests/opt/NAME.expected.ir).

    python scripts/update_opt_golden.py                  # check: exit 1 listing every case whose output changed
    python scripts/update_opt_golden.py --update         # rewrite every NAME.expected.ir
    python scripts/update_opt_golden.py --update NAME    # only these cases

Each case's RUN line (``# RUN: nmmc opt ...``, the first line of NAME.ir) runs through the real
command line; see docs/opt.md. Read every rewritten file before committing it: the expected
outputs are the specification of the passes, not a snapshot to accept blindly.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from opt.cases import case_files, expected_path, run_args, run_case  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the expected outputs")
    parser.add_argument("names", nargs="*", help="only these cases (file stems; default: all)")
    options = parser.parse_args()
    cases = case_files()
    unknown = set(options.names) - {case.stem for case in cases}
    if unknown:
        parser.error(f"no such case(s): {', '.join(sorted(unknown))}")
    changed, failed = [], []
    for case in cases:
        if options.names and case.stem not in options.names:
            continue
        result = run_case(case)
        if result.exit_code != 0:
            failed.append(f"{case.stem}: nmmc {' '.join(run_args(case))} exited {result.exit_code}: "
                          f"{result.stderr.strip()}")
            continue
        path = expected_path(case)
        if options.update:
            if not path.exists() or path.read_text() != result.stdout:
                path.write_text(result.stdout)
                print(f"wrote {path.relative_to(ROOT)}")
        elif not path.exists() or path.read_text() != result.stdout:
            changed.append(case.stem)
    for name in changed:
        print(f"CHANGED: {name}", file=sys.stderr)
    for message in failed:
        print(f"FAILED: {message}", file=sys.stderr)
    return 1 if changed or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
