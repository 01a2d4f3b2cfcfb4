"""AWS nki-library's fused MLP (``nkilib-mlp``): what a user of an MLP on trn2/trn3 runs today, as a baseline.

NxD Inference calls ``nkilib.core.mlp.mlp`` from ``NeuronLlamaMLP`` (one launch per MLP,
aws-neuron/neuronx-distributed-inference@4bcdc54bf3b6ccdad490e5cd0680a3dc95270b8e,
``src/neuronx_distributed_inference/models/llama/modeling_llama.py:77, 492, 643``). No latency of it is
published, so nmmc models it: its schedule is written as a program of nmmc's own kernel IR
(:mod:`.nkilib_tkg` for the decode kernel, :mod:`.nkilib_cte` for prefill), costed by the same cost model and run
by the same interpreter as nmmc's kernels (``scripts/verify_nkilib.py``). It is a reference, never emitted for
users. Source: aws-neuron/nki-library at :data:`NKILIB_COMMIT`, ``src/nkilib_src/nkilib/core/mlp/``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .nkilib_source import NKILIB_COMMIT, NotModelled

if TYPE_CHECKING:
    from ..frontends.workloads import MlpWorkload
    from ..kernel_ir.program import Program
    from ..targets import Target
    from .base import Baseline

__all__ = ["NKILIB_COMMIT", "TKG_MAX_TOKENS", "NotModelled", "nkilib_baseline", "nkilib_label", "nkilib_program",
           "nkilib_source", "nkilib_variant"]

#: batch x sequence at or below which ``mlp`` runs its decode kernel (TKG), else prefill (CTE)
#: (mlp/mlp_parameters.py:77 ``TKG_BS_SEQLEN_THRESHOLD = 96``, :532-533 ``is_mlp_tkg``).
TKG_MAX_TOKENS = 96
#: batch x sequence at or below which NxD Inference calls the MLP kernel as for decode (a bf16 hidden, no
#: rmsnorm_quant before it) (aws-neuron/neuronx-distributed-inference@4bcdc54b,
#: models/llama/modeling_llama.py:706-725 ``TKG_BS_SEQLEN_THRESHOLD = 128``)
NXDI_TKG_MAX_TOKENS = 128


def nkilib_variant(tokens: int) -> str:
    """``tkg`` (decode) for at most :data:`TKG_MAX_TOKENS` tokens, else ``cte`` (prefill)."""
    return "tkg" if tokens <= TKG_MAX_TOKENS else "cte"


#: The FP8 weight format nki-library's MLP reads (``SUPPORTED_DTYPES``, mlp/mlp_parameters.py:30-40: float8_e4m3 and
#: the OCP e4m3fn / MX x4 types; no plain float8_e5m2).
NKILIB_FP8_FORMATS = ("float8_e4m3",)


def nkilib_label(tokens: int, target: Target, fp8: str | None = None) -> str:
    """How tables name the baseline: ``nki-library MLP (decode kernel, LNC=2)``; with ``fp8``, the FP8 scheme NxD
    Inference gets from it (``QuantizationType.ROW``): at decode FP8 weights only (bf16 activations)."""
    kind = "decode" if nkilib_variant(tokens) == "tkg" else "prefill"
    scheme = ""
    if fp8:
        scheme = (", FP8 weights, bf16 activations" if kind == "decode"
                  else ", FP8 weights, per-token FP8 activations")
    return f"nki-library MLP ({kind} kernel, LNC={target.lnc}{scheme})"


def nkilib_program(tokens: int, hidden: int, intermediate: int, target: Target, dtype: str = "bfloat16",
                   fp8: str | None = None) -> Program:
    """nki-library's MLP kernel for ``tokens`` x ``hidden`` -> ``intermediate`` on ``target`` as nmmc's IR; ``fp8``
    (the weights' FP8 format) for its FP8 path as NxD Inference calls it (``QuantizationType.ROW``); raises
    :class:`NotModelled` where it does not run (trn1: NxD Inference runs no NKI kernels there since 2.29; other
    dtypes than bf16; FP8 formats it does not read; its asserts) or where nmmc does not model it (FP8 prefill)."""
    if target.max_lnc < 2:
        raise NotModelled(f"nki-library's MLP is not modelled on {target.name}: NxD Inference runs no NKI kernels "
                          "on trn1/inf2 since its 2.29 release")
    if dtype != "bfloat16":
        raise NotModelled(f"nki-library's bf16 MLP path is modelled; {dtype} is not")
    if fp8 is not None and fp8 not in NKILIB_FP8_FORMATS:
        raise NotModelled(f"nki-library's MLP reads float8_e4m3 weights, not {fp8} (mlp/mlp_parameters.py:30-40)")
    if nkilib_variant(tokens) == "tkg":
        from .nkilib_tkg import tkg_program

        return tkg_program(tokens, hidden, intermediate, target, dtype, fp8=fp8)
    if fp8 is not None and tokens <= NXDI_TKG_MAX_TOKENS:
        raise NotModelled(f"NxD Inference passes a bf16 hidden with QuantizationType.ROW at <= "
                          f"{NXDI_TKG_MAX_TOKENS} tokens (modeling_llama.py:706-725, 492-505), nki-library picks its "
                          "prefill kernel above 96, and that reads per-token hidden scales it only loads for an FP8 "
                          "hidden (mlp_cte_utils.py:413 indexes an empty list; mlp_cte_allocation.py:64-71, "
                          "mlp_parameters.py:540-545)")
    if fp8 is not None:
        from .nkilib_cte import split_on_intermediate, token_tile

        # its tiling asserts first, as for bf16 (the token tile follows the fp32 PSUM accumulators, whatever the
        # weights' dtype): mlp_cte_sharding.py:38-78, mlp_cte_tile_info.py:82-134
        split = target.lnc > 1 and split_on_intermediate(tokens, hidden, intermediate)
        token_tile(tokens if split else tokens // target.lnc, hidden, intermediate // target.lnc if split
                   else intermediate)
        raise NotModelled("nki-library's FP8 prefill (mlp_cte, QuantizationType.ROW) is not modelled: it reads an "
                          "FP8 hidden with per-token scales from a separate rmsnorm_quant kernel and re-quantizes the "
                          "intermediate per token with tensor_scalar_reduce(abs, max) (mlp_cte_quantization.py:"
                          "103-199), a reduction nmmc's kernel IR does not express yet")
    from .nkilib_cte import cte_program

    return cte_program(tokens, hidden, intermediate, target, dtype)


def nkilib_baseline(workload: MlpWorkload, target: Target) -> Baseline:
    """The ``nkilib-mlp`` baseline of an MLP workload: nki-library's kernel on the dense MLP, on the target's logical
    core and in its launch context (one kernel); no cost, with the reason, where it does not run."""
    from ..cost_model import estimate
    from .base import Baseline

    tokens, hidden, inter = workload.tokens, workload.hidden, workload.intermediate
    fp8 = workload.fp8.format if workload.fp8 is not None else None
    details = {"variant": nkilib_variant(tokens), "source": f"aws-neuron/nki-library@{NKILIB_COMMIT}",
               "selection": f"decode kernel (TKG) at <= {TKG_MAX_TOKENS} tokens, else prefill (CTE)"}
    if fp8:
        details["fp8"] = ("QuantizationType.ROW, as NxD Inference calls it (aws-neuron/neuronx-distributed-inference@"
                          "4bcdc54b, models/llama/modeling_llama.py:481-505): per-channel weight scales; the decode "
                          "kernel quantizes no activation (bf16 x FP8-weight matmuls, no double_row), unlike nmmc's "
                          "static per-tensor activation scales")
    label = nkilib_label(tokens, target, fp8)
    if workload.prologue is not None:  # conservative: nki-library is charged less than it runs
        label = f"{label[:-1]}; without its fused norm/residual, not modelled)"
        details["prologue"] = "not modelled: the baseline is nki-library's MLP alone"
    try:
        program = nkilib_program(tokens, hidden, inter, target, workload.dtype, fp8=fp8)
    except NotModelled as exc:
        return Baseline(label, "nki-library's fused MLP", None, one_core=False, reason=str(exc), details=details)
    details["lnc_split"] = program.split or "none"
    cost = estimate(program, target)
    reason = "" if cost.feasible else (
        f"nki-library's kernel does not fit on chip at this shape: SBUF {cost.sbuf_bytes_per_partition} of "
        f"{cost.sbuf_capacity} bytes/partition, PSUM {cost.psum_banks} of {cost.psum_capacity} banks")
    return Baseline(label, "nki-library's fused MLP", cost, one_core=False, reason=reason, details=details)


def nkilib_source(tokens: int, hidden: int, intermediate: int, target: Target, fp8: str | None = None) -> str:
    """nki-library's MLP as nmmc models it, printed as a kernel file of the nki dialect for nmmc's interpreter
    (``scripts/verify_nkilib.py``; never written for users). With ``fp8`` the file holds the kernel alone (no
    graph: nmmc's quantized graph scales activations, this kernel does not; :mod:`.nkilib_fp8` verifies it)."""
    from ..codegen.emit import emit_kernel
    from ..frontends.workloads import mlp_workload

    program = nkilib_program(tokens, hidden, intermediate, target, fp8=fp8)
    if fp8 is not None:
        from ..codegen.printer import PRINTERS
        from ..kernel_ir.psum_banks import split_psum_banks
        from ..vocab import Dialect

        printer = PRINTERS[Dialect.NKI]()
        lines = ['"""nki-library FP8 MLP as nmmc models it (not a user kernel)."""', "", "import numpy as np", "",
                 *printer.imports, "", "", *printer.kernel(split_psum_banks(program, target.psum_bank_bytes))]
        return "\n".join(lines) + "\n"
    workload = mlp_workload(tokens, hidden, intermediate, dense=True)
    record = {"kind": "nkilib-mlp", "name": f"nki-library {nkilib_variant(tokens)} @{NKILIB_COMMIT[:12]}",
              "params": {}}
    return emit_kernel(program, workload.graph(), target=target, dialect="nki",
                       summary=[("workload", workload.describe()),
                                ("schedule", f"nki-library's MLP as nmmc models it ({NKILIB_COMMIT})")],
                       schedule=record).source
