"""The per-layer candidates of ``nmmc compress --choose-ranks --target trn3 --dtype ... --tokens ...`` for a shipped
config, priced as the format choice prices them (compression/format_choice.latency_costs: each candidate's fused
MLP kernel tuned by nmmc's cost model, MX candidates' MX kernel), with the ones dropped before measuring and why.
No weights are read: this is the cost side of the choice only (accuracy needs a checkpoint: docs/compression.md,
"Choosing formats per layer").

    python benchmarks/joint_format_costs.py llama-3.2-1b --dtype bf16,mxfp8,mxfp4 --tokens 1
"""

from __future__ import annotations

import argparse
import time

from neuronmm_compiler.checkpoints.config import known_config, read_config
from neuronmm_compiler.cli.options import resolve_target
from neuronmm_compiler.compression.format_choice import latency_costs, unsupported_notes
from neuronmm_compiler.compression.measured_choice import cost_lines
from neuronmm_compiler.model_tuning.formats import FormatRequest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a shipped config name (nmmc's checkpoints/configs) or a model directory")
    parser.add_argument("--dtype", default="bf16,fp8,mxfp8,mxfp4")
    parser.add_argument("--tokens", default="1,128")
    parser.add_argument("--target", default="trn3")
    parser.add_argument("--align", type=int, default=128)
    args = parser.parse_args()
    config = read_config(known_config(args.model) if "/" not in args.model else args.model)
    formats = FormatRequest.parse(args.dtype).weights
    buckets = [int(b) for b in args.tokens.split(",")]
    target = resolve_target(args.target, None)
    began = time.perf_counter()
    costs = latency_costs(config, formats, buckets, target, args.align)
    print(f"{config.name}: hidden {config.hidden_size}, intermediate {config.intermediate_size}; formats "
          f"{', '.join(formats)}; {time.perf_counter() - began:.0f} s of tuning")
    for line in unsupported_notes(costs["unsupported"]):
        print(f"  note: {line}")
    for line in cost_lines(costs):
        print(line)


if __name__ == "__main__":
    main()
