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


def nkilib_variant(tokens: int) -> str:
    """``tkg`` (decode) for at most :data:`TKG_MAX_TOKENS` tokens, else ``cte`` (prefill)."""
    return "tkg" if tokens <= TKG_MAX_TOKENS else "cte"


def nkilib_label(tokens: int, target: Target) -> str:
    """How tables name the baseline: ``nki-library MLP (decode kernel, LNC=2)``."""
    kind = "decode" if nkilib_variant(tokens) == "tkg" else "prefill"
    return f"nki-library MLP ({kind} kernel, LNC={target.lnc})"


def nkilib_program(tokens: int, hidden: int, intermediate: int, target: Target, dtype: str = "bfloat16") -> Program:
    """nki-library's MLP kernel for ``tokens`` x ``hidden`` -> ``intermediate`` on ``target`` as nmmc's IR; raises
    :class:`NotModelled` where it does not run (trn1: NxD Inference runs no NKI kernels there since 2.29; other
    dtypes than bf16; its asserts)."""
    if target.max_lnc < 2:
        raise NotModelled(f"nki-library's MLP is not modelled on {target.name}: NxD Inference runs no NKI kernels "
                          "on trn1/inf2 since its 2.29 release")
    if dtype != "bfloat16":
        raise NotModelled(f"nki-library's bf16 MLP path is modelled; {dtype} is not")
    if nkilib_variant(tokens) == "tkg":
        from .nkilib_tkg import tkg_program

        return tkg_program(tokens, hidden, intermediate, target, dtype)
    from .nkilib_cte import cte_program

    return cte_program(tokens, hidden, intermediate, target, dtype)


def nkilib_baseline(workload: MlpWorkload, target: Target) -> Baseline:
    """The ``nkilib-mlp`` baseline of an MLP workload: nki-library's kernel on the dense MLP, on the target's logical
    core and in its launch context (one kernel); no cost, with the reason, where it does not run."""
    from ..cost_model import estimate
    from .base import Baseline

    tokens, hidden, inter = workload.tokens, workload.hidden, workload.intermediate
    details = {"variant": nkilib_variant(tokens), "source": f"aws-neuron/nki-library@{NKILIB_COMMIT}",
               "selection": f"decode kernel (TKG) at <= {TKG_MAX_TOKENS} tokens, else prefill (CTE)"}
    label = nkilib_label(tokens, target)
    if workload.prologue is not None:  # conservative: nki-library is charged less than it runs
        label = f"{label[:-1]}; without its fused norm/residual, not modelled)"
        details["prologue"] = "not modelled: the baseline is nki-library's MLP alone"
    if workload.fp8 is not None:  # nki-library ships FP8 (QuantizationType.STATIC/ROW); nmmc models its bf16 path only
        label = f"{label[:-1]}; bf16, its FP8 path not modelled)"
        details["fp8"] = "not modelled: the baseline is nki-library's bf16 MLP"
    try:
        program = nkilib_program(tokens, hidden, inter, target, workload.dtype)
    except NotModelled as exc:
        return Baseline(label, "nki-library's fused MLP", None, one_core=False, reason=str(exc), details=details)
    details["lnc_split"] = program.split or "none"
    cost = estimate(program, target)
    reason = "" if cost.feasible else (
        f"nki-library's kernel does not fit on chip at this shape: SBUF {cost.sbuf_bytes_per_partition} of "
        f"{cost.sbuf_capacity} bytes/partition, PSUM {cost.psum_banks} of {cost.psum_capacity} banks")
    return Baseline(label, "nki-library's fused MLP", cost, one_core=False, reason=reason, details=details)


def nkilib_source(tokens: int, hidden: int, intermediate: int, target: Target) -> str:
    """nki-library's MLP as nmmc models it, printed as a kernel file of the nki dialect for nmmc's interpreter
    (``scripts/verify_nkilib.py``; never written for users)."""
    from ..codegen.emit import emit_kernel
    from ..frontends.workloads import mlp_workload

    program = nkilib_program(tokens, hidden, intermediate, target)
    workload = mlp_workload(tokens, hidden, intermediate, dense=True)
    record = {"kind": "nkilib-mlp", "name": f"nki-library {nkilib_variant(tokens)} @{NKILIB_COMMIT[:12]}",
              "params": {}}
    return emit_kernel(program, workload.graph(), target=target, dialect="nki",
                       summary=[("workload", workload.describe()),
                                ("schedule", f"nki-library's MLP as nmmc models it ({NKILIB_COMMIT})")],
                       schedule=record).source
