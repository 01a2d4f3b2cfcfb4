"""Verification of nki-library's FP8 MLP as nmmc models it (``nkilib_tkg`` with ``fp8``): its own inputs and float64
reference, because its scheme is not nmmc's quantized graph.

nki-library's FP8 decode kernel as NxD Inference calls it (``QuantizationType.ROW``) quantizes only the weights: FP8
weights with one float32 scale per output channel, stored broadcast over 128 rows ([128, I] for gate and up, [128, H]
for down; aws-neuron/nki-library@d2ad3a57, ``core/mlp/mlp_parameters.py:197-208``); the hidden state and the
intermediate stay bf16 (docs/quantization.md, "Baselines"). nmmc's FP8 graph quantizes the activations too, so ``nmmc
verify``'s reference does not apply. Here: the weights are drawn standard normal, quantized per output channel with
the rule nmmc's kernels use (:func:`~neuronmm_compiler.ir.quantized.quantize_weight`), and the reference is
``(bf16(silu(x @ Wg~) * (x @ Wu~))) @ Wd~`` in float64 with ``W~ = q * scale`` (the intermediate rounded to bf16 where
the kernel stores it, ``mlp_tkg.py:193-198``). The kernel runs in nmmc's interpreter with every program of its logical
core, and the static NKI rule pass reads its source.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..interpreter import run_kernel
from ..ir.quantized import quantize_weight
from ..targets import Target
from ..verification import TOLERANCES, static_rules
from .nkilib_mlp import nkilib_program, nkilib_source


@dataclass
class Fp8Check:
    """The outcome of :func:`verify_nkilib_fp8`: ``rel_error`` = ``||out - ref||_F / ||ref||_F`` (None when the
    kernel failed, ``error`` then says why), the NKI rule violations, and the bound it is held to."""

    ok: bool
    rel_error: float | None
    tolerance: float
    violations: list[str]
    error: str | None = None


def fp8_inputs(tokens: int, hidden: int, inter: int, fmt: str, seed: int = 0) -> dict[str, np.ndarray]:
    """The kernel's arguments by name: x bf16, FP8 weights and their [128, N] float32 scales (standard-normal draws,
    quantized per output channel)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden), dtype=np.float32)
    out: dict[str, np.ndarray] = {"x": x.astype(ml_dtypes.bfloat16)}
    for name, shape in (("w_gate", (hidden, inter)), ("w_up", (hidden, inter)), ("w_down", (inter, hidden))):
        q, scale = quantize_weight(rng.standard_normal(shape, dtype=np.float32), fmt)
        out[name] = q
        out[f"{name}_scale"] = np.broadcast_to(scale.reshape(1, -1), (128, shape[1])).astype(np.float32)
    return out


def fp8_reference(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """float64 ``(bf16(silu(x @ Wg~) * (x @ Wu~))) @ Wd~``, ``W~ = q * scale`` (per output channel)."""
    def weight(name: str) -> np.ndarray:
        return inputs[name].astype(np.float64) * inputs[f"{name}_scale"][0].astype(np.float64)

    x = inputs["x"].astype(np.float64)
    gate, up = x @ weight("w_gate"), x @ weight("w_up")
    h = (gate / (1.0 + np.exp(-gate)) * up).astype(ml_dtypes.bfloat16).astype(np.float64)
    return h @ weight("w_down")


def verify_nkilib_fp8(tokens: int, hidden: int, inter: int, target: Target, fmt: str = "float8_e4m3",
                      seed: int = 0) -> Fp8Check:
    """Run the FP8 decode kernel in the interpreter (every program of ``target``'s logical core) against
    :func:`fp8_reference`; rules checked statically. Raises :class:`~.nkilib_source.NotModelled` where the model
    does not exist (as :func:`~.nkilib_mlp.nkilib_program`)."""
    from ..errors import KernelError

    program = nkilib_program(tokens, hidden, inter, target, fp8=fmt)
    source = nkilib_source(tokens, hidden, inter, target, fp8=fmt)
    _, violations = static_rules(source, "nki", target.name, None)
    tolerance = TOLERANCES["bfloat16"]
    inputs = fp8_inputs(tokens, hidden, inter, fmt, seed)
    names = [b.name for b in program.params]
    try:
        run = run_kernel(source, filename=f"nkilib_fp8_{tokens}x{hidden}x{inter}.py", kernel_name=program.name,
                         args=[inputs[n] for n in names], target=target, arg_names=names, output_names=["out"])
    except KernelError as exc:
        return Fp8Check(False, None, tolerance, [str(v) for v in violations], error=str(exc))
    ref = fp8_reference(inputs)
    diff = run.outputs[0].astype(np.float64) - ref
    rel = float(np.linalg.norm(diff) / (np.linalg.norm(ref) or 1.0))
    return Fp8Check(rel <= tolerance and not violations, rel, tolerance, [str(v) for v in violations])
