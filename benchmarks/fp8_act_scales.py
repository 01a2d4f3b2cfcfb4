"""Accuracy of FP8 activation scales, static per tensor vs per token (docs/quantization.md, "Per-token activation
scales").

    python benchmarks/fp8_act_scales.py [--tokens 128] [--hidden 1024] [--intermediate 2816] [--seeds 3]

For a random gated MLP (dense, and SVD at keep 0.8) with FP8 e4m3 weights (per-channel scales), evaluates in float64
the quantized graph nmmc verifies kernels against (``quantize-fp8`` with ``act_scale=static`` or ``row``) and the
unquantized graph on the same inputs, and prints the relative error (Frobenius) of the output and its worst token.
Static scales are calibrated on the very inputs evaluated (``ir/quantized.calibrate``: the best a static scale can
do); row scales need no calibration. Two input distributions: x standard normal (every token alike) and x whose
tokens have log-normal magnitudes (sigma 1.5: a few tokens far larger than the rest, as outlier tokens in real
hidden states; the MLP's weights are scaled so h stays of order one).

Next to each graph-level figure, the same figure for the kernel nmmc emits for that workload (``--dtype fp8
--act-scale static|row``, default schedule, trn2 at LNC=2) run in nmmc's interpreter on the same FP8 inputs: the
kernel computes its row scales on chip (lowerings/row_scales.py), its h in fp32 and its output in bf16, so its error
against the unquantized graph differs from the float64 graph's by those roundings only. ``--graph-only`` skips the
kernels; ``--tuned`` runs the kernel ``nmmc tune`` writes for each workload instead (150 trials, seed 0, trn2 at LNC=2
in-graph, as the command line tunes an MLP).
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

from neuronmm_compiler.codegen import read_metadata
from neuronmm_compiler.driver import compile_workload, tune
from neuronmm_compiler.frontends.shapes import Fp8Weights, block_aligned_rank, mlp_graph
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.ir import parse_text
from neuronmm_compiler.ir.evaluate import evaluate
from neuronmm_compiler.ir.quantized import calibrate, unquantized
from neuronmm_compiler.passes.quantize_fp8 import quantize_fp8
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import interpreter_runner

#: Where the emitted kernels are built for and run (the interpreter runs both programs of the logical core).
TARGET = "trn2:lnc=2"


def _errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    whole = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    per_token = np.linalg.norm(got - want, axis=1) / np.maximum(np.linalg.norm(want, axis=1), 1e-300)
    return whole, float(np.max(per_token))


class Kernel:
    """The emitted kernel of one FP8 MLP workload, run in nmmc's interpreter."""

    def __init__(self, tokens: int, hidden: int, intermediate: int, ranks: tuple[int, int, int] | None, kind: str,
                 tuned: bool = False):
        workload = mlp_workload(tokens, hidden, intermediate, ranks=ranks, dense=ranks is None,
                                fp8=Fp8Weights(act_scale=kind))
        if tuned:
            self.target = get_target(f"{TARGET}:launch=in-graph")
            self.source = tune(workload, target=self.target, trials=150, seed=0).compiled.kernel.source
        else:
            self.target = get_target(TARGET)
            self.source = compile_workload(workload, target=self.target).kernel.source
        self.meta = read_metadata(self.source)
        self.runner = interpreter_runner(self.source, f"<{kind} {ranks}>", parse_text(self.meta.graph))

    def out(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        tensors = dict(inputs)
        for kernel in self.meta.kernels:
            outputs, _ = self.runner(kernel, [tensors[s.name] for s in kernel.inputs], self.target)
            tensors.update(zip([s.name for s in kernel.outputs], outputs, strict=True))
        return np.asarray(tensors["out"], dtype=np.float64)


def run(tokens: int, hidden: int, intermediate: int, seeds: int, kernels: bool = True,
        tuned: bool = False) -> list[str]:
    schedule = "the schedule nmmc tune chooses, 150 trials, seed 0, in-graph" if tuned else "default schedule"
    lines = [f"MLP tokens={tokens} hidden={hidden} intermediate={intermediate}, float8_e4m3 weights (row scales); "
             f"relative error vs the unquantized graph: whole output / worst token, mean over {seeds} seeds; graph: "
             "float64 evaluation of the quantized graph" + (f"; kernel: nmmc's emitted kernel ({TARGET}, {schedule}) "
                                                            "in nmmc's interpreter" if kernels else "")]
    rank = block_aligned_rank(hidden, intermediate, 0.8)
    for structure, ranks in (("dense", None), (f"SVD keep 0.8 (rank {rank})", (rank, rank, rank))):
        emitted = {kind: Kernel(tokens, hidden, intermediate, ranks, kind, tuned) for kind in ("static", "row")} \
            if kernels else {}
        for spread in (0.0, 1.5):
            row: dict[str, list[tuple[float, float]]] = {"static": [], "row": []}
            ran: dict[str, list[tuple[float, float]]] = {"static": [], "row": []}
            for seed in range(seeds):
                rng = np.random.default_rng(seed)
                plain = mlp_graph(tokens, hidden, intermediate, ranks)
                raw = {}
                for node in plain.inputs():
                    fan_in = node.shape[0]
                    value = rng.standard_normal(node.storage_shape) / (1.0 if node.name == "x" else np.sqrt(fan_in))
                    if node.name == "x":
                        value *= np.exp(spread * rng.standard_normal((tokens, 1)))
                    raw[node.name] = value.astype(ml_dtypes.bfloat16)
                want = evaluate(plain, raw)["out"]
                for kind in row:
                    graph = quantize_fp8(mlp_graph(tokens, hidden, intermediate, ranks, fp8=Fp8Weights(act_scale=kind)))
                    assert unquantized(graph) == plain
                    inputs = calibrate(graph, raw)
                    row[kind].append(_errors(evaluate(graph, inputs)["out"], want))
                    if kind in emitted:
                        ran[kind].append(_errors(emitted[kind].out(inputs), want))
            label = "x ~ N(0, 1)" if spread == 0 else f"x tokens log-normal (sigma {spread})"
            for kind, errs in row.items():
                whole, worst = np.mean(errs, axis=0)
                line = f"  {structure:28s} {label:34s} {kind:6s} graph {whole:.4f} / {worst:.4f}"
                if ran[kind]:
                    k_whole, k_worst = np.mean(ran[kind], axis=0)
                    line += f"   kernel {k_whole:.4f} / {k_worst:.4f} (worst token {k_worst / worst:.3f}x the graph's)"
                lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--graph-only", action="store_true", help="skip the emitted kernels")
    parser.add_argument("--tuned", action="store_true", help="run the kernels nmmc tune writes (default schedule: off)")
    args = parser.parse_args()
    print("\n".join(run(args.tokens, args.hidden, args.intermediate, args.seeds, kernels=not args.graph_only,
                         tuned=args.tuned)))


if __name__ == "__main__":
    main()
