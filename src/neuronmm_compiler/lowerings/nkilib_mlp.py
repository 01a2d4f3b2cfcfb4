"""AWS nki-library's fused MLP (``nkilib-mlp``): what a serving stack runs for an MLP on trn2/trn3, as a baseline.

vLLM Neuron calls ``nkilib.core.mlp.mlp`` for every dense bf16 MLP (``NF.mlp(hidden, gate_w, up_w, down_w)`` from its
model files, e.g. vllm-project/vllm-neuron@04c112d1, ``vllm_neuron/model/qwen3/model_bf16.py``, ``Qwen3DenseMLP``:
row-major weights [H, I/TP], [H, I/TP], [I/TP, H], this rank's slice of the intermediate dim, no norm fused, the
all-reduce or reduce-scatter outside the kernel). Its ``vllm_neuron/functional/mlp.py`` (read at
longdct/vllm-neuron@75ac066de2750d350e35bdf5300489547c600adf: the code index holds no copy of vllm-project's own)
launches it at LNC=2, ``wrap_nki(nkilib_mlp)[2](...)``, with ``normalization_type=NO_NORM``, no bias or quantization,
``use_tkg_gate_up_proj_column_tiling=True``, ``use_tkg_down_proj_column_tiling=True``,
``use_tkg_down_proj_optimized_layout=False``, ``store_output_in_sbuf=False``, ``force_cte_mode=False``, and only where
its own gate ``_can_use_kernel`` passes (:func:`vllm_refusal`); elsewhere it runs a PyTorch fallback
(``_torch_mlp_impl``), which neuronx-cc compiles and nmmc does not model. NxD Inference calls the same kernel from
``NeuronLlamaMLP`` (aws-neuron/neuronx-distributed-inference@4bcdc54bf3b6ccdad490e5cd0680a3dc95270b8e,
``src/neuronx_distributed_inference/models/llama/modeling_llama.py:77, 492, 643``; its FP8 path is modelled as it
calls it).

No latency of the kernel is published, so nmmc models it: its schedule is written as a program of nmmc's own kernel
IR (:mod:`.nkilib_tkg` for the decode kernel, :mod:`.nkilib_cte` for prefill), costed by the same cost model and run
by the same interpreter as nmmc's kernels (``scripts/verify_nkilib.py``). It is a reference, never emitted for
users. Which aws-neuron/nki-library commit each part is read from: :mod:`.nkilib_source`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .nkilib_source import (
    NKILIB_COMMIT,
    NKILIB_SELECT_COMMIT,
    NKILIB_TKG_COMMIT,
    DoesNotRun,
    NotModelled,
    nkilib_commit,
)

if TYPE_CHECKING:
    from ..frontends.workloads import MlpWorkload
    from ..kernel_ir.program import Program
    from ..targets import Target
    from .base import Baseline

__all__ = ["NKILIB_COMMIT", "TKG_MAX_TOKENS", "DoesNotRun", "NotModelled", "nkilib_baseline", "nkilib_label",
           "nkilib_program", "nkilib_programs", "nkilib_source", "nkilib_variant", "vllm_refusal"]

#: batch x sequence at or below which ``mlp`` runs its decode kernel (TKG), else prefill (CTE)
#: (aws-neuron/nki-library@092a49dc, core/mlp/mlp_parameters.py: ``TKG_BS_SEQLEN_THRESHOLD = 96``, ``is_mlp_tkg``
#: with ``mode=AUTO`` and ``force_cte_mode=False``, as vLLM Neuron calls it).
TKG_MAX_TOKENS = 96
#: batch x sequence at or below which NxD Inference calls the MLP kernel as for decode (a bf16 hidden, no
#: rmsnorm_quant before it) (aws-neuron/neuronx-distributed-inference@4bcdc54b,
#: models/llama/modeling_llama.py:706-725 ``TKG_BS_SEQLEN_THRESHOLD = 128``)
NXDI_TKG_MAX_TOKENS = 128

#: vLLM Neuron's gate before it calls the kernel (longdct/vllm-neuron@75ac066d, vllm_neuron/functional/mlp.py, its
#: copies of nki-library's limits "for grid=2 (lnc=2)"): ``_TKG_BS_SEQLEN_THRESHOLD = 128`` (its own, not the kernel's
#: 96), ``_NUM_HW_PSUM_BANKS = 8``, ``_SRC_PROJ_INT_DIM_TILE_SIZE = 512``, ``_MIN_H_FOR_I_SHARDING = 7168``,
#: ``_MIN_I_FOR_I_SHARDING = 1024``, ``_MAX_T_FOR_I_SHARDING = 256``.
VLLM_TKG_MAX_TOKENS = 128
VLLM_PSUM_BANKS, VLLM_I_TILE = 8, 512
VLLM_MIN_H_SHARD_I, VLLM_MIN_I_SHARD_I, VLLM_MAX_T_SHARD_I = 7168, 1024, 256
#: How vLLM Neuron launches the kernel (``tune --json`` details).
VLLM_CALL = ("vLLM Neuron: vllm_neuron.functional.mlp -> wrap_nki(nkilib.core.mlp.mlp)[2](hidden [1, T, H], gate/up "
             "[H, I], down [I, H], NO_NORM, no bias, no quantization, column tiling on, output in HBM) "
             "(longdct/vllm-neuron@75ac066d, vllm_neuron/functional/mlp.py); I is this rank's TP slice")
#: How NxD Inference calls the FP8 ROW prefill path (``tune --json`` details): two kernels, two launches.
FP8_PREFILL_CALL = (
    "two kernels, as NxD Inference runs QuantizationType.ROW above 128 tokens (modeling_llama.py:481-505, 706-725): "
    "rmsnorm_quant (core/rmsnorm/rmsnorm_quant.py, @d2ad3a57; NO_NORM here) quantizes x per token into FP8 rows and "
    "scales, then mlp_cte (@092a49dc) reads them, re-quantizes the intermediate per token and runs double_row FP8 "
    "matmuls; lowerings/nkilib_cte_fp8.py")
#: Who calls the MX path: no serving stack nmmc knows (vLLM Neuron's ``mlp`` passes no quantization).
MX_CALL = ("nkilib.core.mlp.mlp(..., quantization_type=QuantizationType.MX, column tiling off) as its own tests call "
           "it (test/integration/nkilib/core/mlp/test_mlp_tkg.py:418-439); vLLM Neuron's mlp passes no quantization")
#: What the MX prefill row leaves out (``tune --json`` details).
MX_PREFILL_CALL = (
    "mlp_cte_mx (@092a49dc, mlp_cte/mx/) on a hidden already MX-quantized as rmsnorm_mx_prefill packs it: that "
    "quantizing kernel and its launch are not modelled, so nki-library is charged less than it runs; the "
    "intermediate's quantize_mx read from an unattributed code-index copy of mlp_cte_mx_quantization.py whose "
    "signature matches 092a49dc's call; lowerings/nkilib_cte_mx.py")
VLLM_FALLBACK = ("vLLM Neuron runs its PyTorch fallback there (vllm_neuron/functional/mlp.py, _torch_mlp_impl), "
                 "compiled by neuronx-cc: not modelled")


def vllm_refusal(tokens: int, hidden: int, intermediate: int) -> str | None:
    """Why vLLM Neuron does not call nki-library's kernel for a bf16 MLP x[tokens, hidden] -> ``intermediate`` (no
    bias) and runs its PyTorch fallback instead, or None where it calls it (``_can_use_kernel``: H a multiple of 128;
    at <= 128 tokens H a multiple of 256; above, ``ceil(I_eff / 512) <= 8`` with ``I_eff = I / 2`` when
    ``H >= 7168 and I >= 1024 and tokens <= 256``, else ``I``)."""
    where = "vllm_neuron/functional/mlp.py, _can_use_kernel"
    if hidden % 128:
        return f"vLLM Neuron does not call nki-library's MLP for hidden={hidden} (not a multiple of 128; {where})"
    if tokens <= VLLM_TKG_MAX_TOKENS:
        if hidden % 256:
            return (f"vLLM Neuron does not call nki-library's MLP at <= {VLLM_TKG_MAX_TOKENS} tokens for "
                    f"hidden={hidden} (not a multiple of 256; {where})")
        return None
    shard = hidden >= VLLM_MIN_H_SHARD_I and intermediate >= VLLM_MIN_I_SHARD_I and tokens <= VLLM_MAX_T_SHARD_I
    effective = intermediate // 2 if shard else intermediate
    tiles = -(-effective // VLLM_I_TILE)
    if tiles <= VLLM_PSUM_BANKS:
        return None
    return (f"vLLM Neuron does not call nki-library's MLP above {VLLM_TKG_MAX_TOKENS} tokens for intermediate="
            f"{intermediate}: {tiles} tiles of {VLLM_I_TILE} columns of {'I/2' if shard else 'I'} exceed its "
            f"{VLLM_PSUM_BANKS} PSUM banks ({where})")


def nkilib_variant(tokens: int) -> str:
    """``tkg`` (decode) for at most :data:`TKG_MAX_TOKENS` tokens, else ``cte`` (prefill)."""
    return "tkg" if tokens <= TKG_MAX_TOKENS else "cte"


#: The FP8 weight format nki-library's MLP reads (``SUPPORTED_DTYPES``, mlp/mlp_parameters.py:30-40: float8_e4m3 and
#: the OCP e4m3fn / MX x4 types; no plain float8_e5m2).
NKILIB_FP8_FORMATS = ("float8_e4m3",)


def nkilib_label(tokens: int, target: Target, fp8: str | None = None, mx: str | None = None) -> str:
    """How tables name the baseline: ``nki-library MLP (decode kernel, LNC=2, @d2ad3a57)``, with the nki-library
    commit its model is read from; with ``fp8``, the FP8 scheme NxD Inference gets from it
    (``QuantizationType.ROW``): at decode FP8 weights only (bf16 activations); with ``mx`` (an nmmc MX format) its
    ``QuantizationType.MX`` path (:mod:`.nkilib_mx`)."""
    variant = nkilib_variant(tokens)
    kind = "decode" if variant == "tkg" else "prefill"
    scheme = ""
    if mx:
        from ..ir.mx import MX_FORMATS

        scheme = f", {mx} weights, {MX_FORMATS[mx].activations} activations (QuantizationType.MX)"
        if kind == "prefill":  # lowerings/nkilib_cte_mx.py: the hidden arrives quantized (rmsnorm_mx_prefill)
            scheme += "; x pre-quantized, its quantizing kernel not charged"
    elif fp8:
        if kind == "decode":
            scheme = ", FP8 weights, bf16 activations"
        else:  # two kernels (lowerings/nkilib_cte_fp8.py): rmsnorm_quant read at the decode kernel's commit
            return (f"nki-library MLP (prefill: rmsnorm_quant @{NKILIB_TKG_COMMIT[:8]} + mlp_cte, 2 kernels, "
                    f"LNC={target.lnc}, FP8 weights, per-token FP8 activations, @{nkilib_commit(variant)[:8]})")
    return f"nki-library MLP ({kind} kernel, LNC={target.lnc}{scheme}, @{nkilib_commit(variant)[:8]})"


def nkilib_program(tokens: int, hidden: int, intermediate: int, target: Target, dtype: str = "bfloat16",
                   fp8: str | None = None, mx: str | None = None) -> Program:
    """nki-library's MLP kernel for ``tokens`` x ``hidden`` -> ``intermediate`` on ``target`` as nmmc's IR; ``fp8``
    (the weights' FP8 format) for its FP8 path as NxD Inference calls it (``QuantizationType.ROW``); raises
    :class:`NotModelled` where it does not run (trn1: NxD Inference runs no NKI kernels there since 2.29; other
    dtypes than bf16; FP8 formats it does not read; its asserts) or where nmmc does not model it (FP8 prefill); ``mx``
    (an nmmc MX format) for its ``QuantizationType.MX`` path (:mod:`.nkilib_mx`; prefill :mod:`.nkilib_cte_mx`, its
    hidden already MX-quantized: the quantizing kernel is not charged)."""
    if target.max_lnc < 2:
        raise DoesNotRun(f"nki-library's MLP is not modelled on {target.name}: NxD Inference runs no NKI kernels "
                          "on trn1/inf2 since its 2.29 release")
    if dtype != "bfloat16":
        raise NotModelled(f"nki-library's bf16 MLP path is modelled; {dtype} is not")
    if mx is not None:
        from .nkilib_mx import mx_asserts, mx_tkg_program

        if nkilib_variant(tokens) == "tkg":
            return mx_tkg_program(tokens, hidden, intermediate, target, mx)
        mx_asserts(tokens, hidden, intermediate, target.lnc)
        from .nkilib_cte_mx import mx_cte_program

        return mx_cte_program(tokens, hidden, intermediate, target, mx)
    if fp8 is not None and fp8 not in NKILIB_FP8_FORMATS:
        raise DoesNotRun(f"nki-library's MLP reads float8_e4m3 weights, not {fp8} (mlp/mlp_parameters.py:30-40)")
    if nkilib_variant(tokens) == "tkg":
        from .nkilib_tkg import tkg_program

        return tkg_program(tokens, hidden, intermediate, target, dtype, fp8=fp8)
    if fp8 is not None and tokens <= NXDI_TKG_MAX_TOKENS:
        raise DoesNotRun(f"NxD Inference passes a bf16 hidden with QuantizationType.ROW at <= "
                          f"{NXDI_TKG_MAX_TOKENS} tokens (modeling_llama.py:706-725, 492-505), nki-library picks its "
                          "prefill kernel above 96, and that reads per-token hidden scales it only loads for an FP8 "
                          "hidden (mlp_cte_utils.py:413 indexes an empty list; mlp_cte_allocation.py:64-71, "
                          "mlp_parameters.py:540-545)")
    if fp8 is not None:
        raise NotModelled("nki-library's FP8 prefill path is two kernels: nkilib_programs "
                          "(lowerings/nkilib_cte_fp8.py)")
    from .nkilib_cte import cte_program

    return cte_program(tokens, hidden, intermediate, target, dtype)


def nkilib_programs(tokens: int, hidden: int, intermediate: int, target: Target, dtype: str = "bfloat16",
                    fp8: str | None = None, mx: str | None = None) -> list[Program]:
    """The kernels a serving stack launches one after another for the MLP (:func:`nkilib_program`'s one, except
    the FP8 prefill path as NxD Inference calls it above 128 tokens: ``rmsnorm_quant`` then ``mlp_cte``,
    :mod:`.nkilib_cte_fp8`); same refusals."""
    if (fp8 is not None and mx is None and dtype == "bfloat16" and target.max_lnc >= 2 and fp8 in NKILIB_FP8_FORMATS
            and tokens > NXDI_TKG_MAX_TOKENS):
        from .nkilib_cte_fp8 import fp8_prefill_programs

        return fp8_prefill_programs(tokens, hidden, intermediate, target)
    return [nkilib_program(tokens, hidden, intermediate, target, dtype, fp8=fp8, mx=mx)]


def _instead(workload: MlpWorkload, target: Target) -> str:
    """What the serving stack runs where nki-library's kernel does not: as vLLM Neuron calls it (LNC=2, bf16), its
    PyTorch fallback where its gate refuses the shape, else nothing (the kernel's assert fails the model's
    compile); elsewhere (LNC=1, FP8 as NxD Inference calls it) not known to nmmc."""
    tokens, hidden, inter = workload.tokens, workload.hidden, workload.intermediate
    if target.lnc != 2 or workload.fp8 is not None or workload.mx is not None:
        return "what the serving stack runs instead is not modelled"
    refusal = vllm_refusal(tokens, hidden, inter)
    if refusal:
        return f"{refusal}: {VLLM_FALLBACK}"
    return ("vLLM Neuron's gate (vllm_neuron/functional/mlp.py, _can_use_kernel) passes this shape to the kernel, so "
            "a model graph that calls it here does not compile (no fallback); under tensor parallelism each rank "
            "runs a smaller intermediate slice (nmmc tune --tp N)")


def nkilib_baseline(workload: MlpWorkload, target: Target) -> Baseline:
    """The ``nkilib-mlp`` baseline of an MLP workload: nki-library's kernel on the dense MLP, on the target's logical
    core and in its launch context (one kernel), as vLLM Neuron calls it (module docstring). No cost, with the
    reason, where it does not run or nmmc does not model it; not runnable (a reference row, no speedup) where the
    kernel's asserts stop it or where vLLM Neuron does not call it, with what runs there instead."""
    from ..cost_model import combine_reports, estimate
    from .base import Baseline

    tokens, hidden, inter = workload.tokens, workload.hidden, workload.intermediate
    fp8 = workload.fp8.format if workload.fp8 is not None else None
    mx = workload.mx.format if workload.mx is not None else None
    variant = nkilib_variant(tokens)
    details = {"variant": variant, "source": f"aws-neuron/nki-library@{nkilib_commit(variant)}",
               "selection": f"decode kernel (TKG) at <= {TKG_MAX_TOKENS} tokens, else prefill (CTE) "
                            f"(aws-neuron/nki-library@{NKILIB_SELECT_COMMIT}, core/mlp/mlp_parameters.py)",
               "called_as": VLLM_CALL if target.lnc == 2 and not fp8 and not mx else MX_CALL if mx else
               "as NxD Inference calls it (modeling_llama.py; vLLM Neuron launches it at LNC=2 only)"}
    if mx:
        if variant == "cte":
            details["mx_prefill"] = MX_PREFILL_CALL
        details["mx"] = (f"QuantizationType.MX (aws-neuron/nki-library@{NKILIB_COMMIT}, core/mlp/mlp.py:285-287, "
                         "mlp_tkg/mlp_tkg_mx.py): MX weights and scales in its layouts, x and the intermediate "
                         "quantize_mx'd to float8_e4m3fn_x4 on chip, bf16 PSUM; lowerings/nkilib_mx.py")
    if fp8:
        details["fp8"] = ("QuantizationType.ROW, as NxD Inference calls it (aws-neuron/neuronx-distributed-inference@"
                          "4bcdc54b, models/llama/modeling_llama.py:481-505): per-channel weight scales; the decode "
                          "kernel quantizes no activation (bf16 x FP8-weight matmuls, no double_row), unlike nmmc's "
                          "static per-tensor activation scales")
    label = nkilib_label(tokens, target, fp8, mx)
    if workload.prologue is not None:  # conservative: nki-library is charged less than it runs
        label = f"{label[:-1]}; without its fused norm/residual, not modelled)"
        details["prologue"] = "not modelled: the baseline is nki-library's MLP alone"
    name = "nki-library's fused MLP"
    try:
        programs = nkilib_programs(tokens, hidden, inter, target, workload.dtype, fp8=fp8, mx=mx)
    except DoesNotRun as exc:
        return Baseline(label, name, None, one_core=False, reason=str(exc), details=details, runnable=False,
                        not_runnable=f"{exc}; {_instead(workload, target)}")
    except NotModelled as exc:
        return Baseline(label, name, None, one_core=False, reason=str(exc), details=details)
    details["lnc_split"] = programs[-1].split or "none"
    if len(programs) > 1:  # launched one after another: each pays its launch in a model graph (combine_reports)
        details["kernels"] = len(programs)
        details["fp8_prefill"] = FP8_PREFILL_CALL
    reports = [estimate(p, target) for p in programs]
    cost = combine_reports(reports)
    misfit = [(p, r) for p, r in zip(programs, reports, strict=True) if not r.feasible]
    reason = "" if not misfit else (
        f"nki-library's kernel{f' {misfit[0][0].name}' if len(programs) > 1 else ''} does not fit on chip at this "
        f"shape: SBUF {misfit[0][1].sbuf_bytes_per_partition} of {misfit[0][1].sbuf_capacity} bytes/partition, PSUM "
        f"{misfit[0][1].psum_banks} of {misfit[0][1].psum_capacity} banks")
    refusal = vllm_refusal(tokens, hidden, inter) if target.lnc == 2 and not fp8 and not mx else None
    if refusal:  # the kernel would run, but the serving stack does not call it here
        return Baseline(f"{label[:-1]}; not called by vLLM Neuron here)", name, cost, one_core=False, reason=reason,
                        details=details, runnable=False, not_runnable=f"{refusal}: {VLLM_FALLBACK}")
    return Baseline(label, name, cost, one_core=False, reason=reason, details=details)


def nkilib_source(tokens: int, hidden: int, intermediate: int, target: Target, fp8: str | None = None,
                  mx: str | None = None) -> str:
    """nki-library's MLP as nmmc models it, printed as a kernel file of the nki dialect for nmmc's interpreter
    (``scripts/verify_nkilib.py``; never written for users). With ``fp8`` the file holds the kernel alone (no
    graph: nmmc's quantized graph scales activations, this kernel does not; :mod:`.nkilib_fp8` verifies it); with
    ``mx`` likewise (its layouts are not nmmc's; :mod:`.nkilib_mx` verifies it)."""
    from ..codegen.emit import emit_kernel
    from ..frontends.workloads import mlp_workload

    if mx is not None:
        from .nkilib_mx import mx_source

        return mx_source(nkilib_program(tokens, hidden, intermediate, target, mx=mx), target)

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
    commit = nkilib_commit(nkilib_variant(tokens))
    record = {"kind": "nkilib-mlp", "name": f"nki-library {nkilib_variant(tokens)} @{commit[:12]}",
              "params": {}}
    return emit_kernel(program, workload.graph(), target=target, dialect="nki",
                       summary=[("workload", workload.describe()),
                                ("schedule", f"nki-library's MLP as nmmc models it ({commit})")],
                       schedule=record).source
