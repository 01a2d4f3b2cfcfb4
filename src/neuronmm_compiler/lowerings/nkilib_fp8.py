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

The FP8 prefill path (:mod:`.nkilib_cte_fp8`, two kernels) quantizes the activations too, per token:
:func:`verify_fp8_prefill` runs ``rmsnorm_quant`` on bf16 x, then ``mlp_cte`` on its FP8 rows and scales, against
:func:`fp8_prefill_reference` (both kernels' per-token rule, ``max(amax * (1/240), 1e-6)``, and every bf16 rounding
the kernel makes).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..interpreter import run_kernel
from ..ir.quantized import quantize_weight
from ..targets import Target
from ..verification import TOLERANCES, static_rules
from .nkilib_cte_fp8 import FP8_RANGE, SCALE_FLOOR
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


# ---- the FP8 prefill path (lowerings/nkilib_cte_fp8.py): two kernels, the second reading the first's outputs ----

def _row_quantize(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both kernels' per-token quantization of ``v`` (float32 values): (FP8 values as float64, dequant scale)."""
    f32 = np.float32
    amax = np.abs(v).max(axis=1, keepdims=True).astype(f32)
    ds = np.maximum(amax * f32(1.0 / FP8_RANGE), f32(SCALE_FLOOR)).astype(f32)
    qs = (f32(1.0) / ds).astype(f32)
    q = (v.astype(f32) * qs).astype(ml_dtypes.float8_e4m3).astype(np.float64)
    return q, ds.astype(np.float64)


def fp8_prefill_reference(inputs: dict[str, np.ndarray], lnc_inter: int = 1) -> np.ndarray:
    """float64 reference with the kernels' roundings: x quantized per token; gate and up dequantized by the weight
    and token scales into bf16 (each step rounded where the kernel writes bf16); the product quantized per token;
    down dequantized likewise; ``lnc_inter`` cores' bf16 partial outputs added in bf16 (intermediate split)."""
    def b(a: np.ndarray) -> np.ndarray:
        return a.astype(ml_dtypes.bfloat16).astype(np.float64)

    xq, xs = _row_quantize(inputs["x"].astype(np.float32))
    inter = inputs["w_gate"].shape[1]
    total = None
    for cols in np.split(np.arange(inter), lnc_inter):
        def weight(name: str, c: np.ndarray = cols) -> np.ndarray:
            return inputs[name][:, c].astype(np.float64)

        g = b(xq @ weight("w_gate") * inputs["w_gate_scale"][0, cols])
        g = b(g * xs)
        g = b(g / (1.0 + np.exp(-g)))
        u = b(g * (xq @ weight("w_up")))
        u = b(u * inputs["w_up_scale"][0, cols])
        hh = b(u * xs)
        hq, hs = _row_quantize(hh.astype(np.float32))
        part = b(b(hq @ inputs["w_down"][cols].astype(np.float64) * inputs["w_down_scale"][0]) * hs)
        total = part if total is None else b(total + part)
    return total


def verify_fp8_prefill(tokens: int, hidden: int, inter: int, target: Target, seed: int = 0,
                       sources: list[str] | None = None) -> Fp8Check:
    """Run both kernels in the interpreter (every program of ``target``'s logical core; the second reads the first's
    outputs) against :func:`fp8_prefill_reference`, rules checked statically. ``sources``: (mutated) kernel files
    instead of the model's."""
    from ..errors import KernelError
    from .nkilib_cte_fp8 import FMT, fp8_prefill_programs, fp8_prefill_sources

    programs = fp8_prefill_programs(tokens, hidden, inter, target)
    sources = sources or fp8_prefill_sources(programs, target)
    violations = [str(v) for src in sources for v in static_rules(src, "nki", target.name, None)[1]]
    inputs = fp8_inputs(tokens, hidden, inter, FMT, seed)
    tolerance = TOLERANCES["bfloat16"]
    values = dict(inputs)
    try:
        for program, source in zip(programs, sources, strict=True):
            names = [p.name for p in program.params]
            run = run_kernel(source, filename=f"{program.name}_{tokens}x{hidden}x{inter}.py", kernel_name=program.name,
                             args=[values[n] for n in names], target=target, arg_names=names,
                             output_names=[o.name for o in program.outputs])
            values.update({o.name: a for o, a in zip(program.outputs, run.outputs, strict=True)})
            if program.name == "nkilib_rmsnorm_quant":  # the MLP kernel reads the FP8 hidden as its x
                values["x"] = values.pop("x_fp8")
    except KernelError as exc:
        return Fp8Check(False, None, tolerance, violations, error=str(exc))
    split = programs[1].split == "intermediate"
    ref = fp8_prefill_reference(inputs, target.lnc if split else 1)
    rel = float(np.linalg.norm(values["out"].astype(np.float64) - ref) / (np.linalg.norm(ref) or 1.0))
    return Fp8Check(rel <= tolerance and not violations, rel, tolerance, violations)
