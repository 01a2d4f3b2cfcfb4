"""Cost model vs published Trainium measurements: per source and per target, default / fitted / cross-validated.

    python benchmarks/fidelity.py [--data benchmarks/published] [--fit NAME ...] [--json OUT]

For every row of the published dataset (``benchmarks/published/*.csv``) nmmc compiles the schedule the
row maps to and predicts its latency. Per hardware target it prints the error ``|ln(pred/measured)|``
of the shipped model, of the model fitted to every row of that target (in-sample), and of the model
fitted without the row's source (leave-one-source-out: the honest figure), with the median, the worst,
and, within each source, the Spearman rank correlation of the held-out predictions with the
measurements and how many of the pairs measured at least 2% apart they order right. Rows nmmc cannot map
are listed with the reason. Results go to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from neuronmm_compiler.calibration.fidelity import SEPARABLE, assess
from neuronmm_compiler.calibration.fit import PUBLISHED_FIT
from neuronmm_compiler.calibration.published import load_rows
from neuronmm_compiler.targets import get_target

ROOT = Path(__file__).resolve().parents[1]


def _pct(value: float | None) -> str:
    return "     -" if value is None or value != value else f"{value:6.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT / "benchmarks" / "published"))
    parser.add_argument("--fit", nargs="+", default=list(PUBLISHED_FIT), help="parameters to fit")
    parser.add_argument("--json", default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)

    dataset = load_rows(args.data)
    print(f"published dataset {args.data}: {len(dataset.rows)} rows mapped from {len(dataset.sources())} sources "
          f"(digest {dataset.digest}); {len(dataset.skipped)} not mapped")
    for where, why in dataset.skipped:
        print(f"  not used: {where}: {why[:110]}")
    out: dict[str, object] = {"digest": dataset.digest, "targets": {}}
    for hardware in sorted({r.hardware for r in dataset.rows}):
        rows = [r for r in dataset.rows if r.hardware == hardware]
        result = assess(rows, get_target(hardware), args.fit)
        fitted = ", ".join(f"{k}={v:.4g}" for k, v in result.fitted.items())
        print(f"\n== {hardware}: {len(rows)} rows, fitted {fitted}")
        print(f"  {'row':<64} {'measured':>10} {'default':>9} {'fitted':>9} {'held-out':>9}   |ln| held-out")
        for p in result.predictions:
            held = f"{p.held_out_us:9.1f}" if p.held_out_us is not None else "        -"
            err = p.error(p.held_out_us, p.measured_us)
            print(f"  {p.row.label[:64]:<64} {p.measured_us:10.1f} {p.default_us:9.1f} {p.fitted_us:9.1f} {held}"
                  f"   {_pct(err)}")
        print(f"  {'source':<28} {'rows':>4} {'median':>7} {'max':>7} {'spearman':>9}   pairs >={SEPARABLE:.0%} apart "
              "ordered right")
        for s in result.sources:
            rho = "        -" if s.spearman is None else f"{s.spearman:9.3f}"
            print(f"  {s.source_id:<28} {s.rows:4d} {_pct(s.median_error)} {_pct(s.max_error)} {rho}   "
                  f"{s.ordered_right}/{s.ordered_pairs}")
        summary = {}
        for which in ("default", "fitted", "held_out"):
            median, worst, n = result.summary(which)
            summary[which] = {"median_abs_log_ratio": median, "max_abs_log_ratio": worst, "rows": n}
            print(f"  {which:<9} median |ln ratio| {median:.3f}, max {worst:.3f} over {n} rows")
        out["targets"][hardware] = {"fitted": result.fitted, "summary": summary,  # type: ignore[index]
                                    "sources": [vars(s) for s in result.sources]}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
