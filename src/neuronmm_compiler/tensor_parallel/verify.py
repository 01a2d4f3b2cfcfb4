"""Verify a tensor-parallel plan across ranks: run every rank's kernels in the interpreter on its slices of
one set of random tensors, perform the collectives in NumPy, and compare the combined output with a
float64 reference of the unsharded computation.

The reference: when every weight the plan reads is a slice of an unsharded factor, the unsharded graph
(the whole MLP) evaluated on those factors; when some shard is factorised on its own, the MLP those
shards make together, i.e. the graph of all ranks with each all-reduce as a sum (equal to the unsharded
MLP whose weight blocks are the shards' products). The tolerance is ``nmmc verify``'s (bf16 1e-2, fp32
1e-5, plus the rounding allowance of stored intermediates, computed on the graph of all ranks, so the
rounding of every partial sum handed to a collective counts).

An FP8 plan (docs/tensor-parallel.md, "FP8") is verified as one FP8 kernel is: the unquantized tensors are drawn,
the weights quantized and the static scales calibrated on the plan's tensors (:mod:`.calibration`), the reference
is the *quantized* computation (the unsharded FP8 MLP, or the FP8 graph of all ranks), and the error against the
unquantized MLP is reported beside it, never checked. Each rank's kernel also has its scale units checked (rule
NMMC-FP8-SCALE-ONCE).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..codegen import read_metadata
from ..errors import InputError, KernelError
from ..frontends.workloads import MlpWorkload, workload_from_dict
from ..ir import Graph, evaluate, parse_text
from ..ir.quantized import unquantized
from ..passes.quantize_fp8 import quantize_fp8
from ..targets import Target, get_target
from ..verification import NUMPY_DTYPES, TOLERANCES, interpreter_runner, merge_counters, read_kernel_file
from ..verification.reference import reference_chunks
from ..verification.sandbox import check_source
from ..vocab import ElementwiseOp, NodeKind
from .plan import read_plan
from .sharding import unsharded_graph

#: The plan's ranks evaluated unquantized in float64 against the unsharded MLP (FP8 plans followed kernel by kernel,
#: every tensor a slice of an unsharded one): the same sums in another order, so only float64 rounding differs.
WIRING_TOLERANCE = 1e-9


@dataclass
class TpVerifyReport:
    """The outcome of :func:`verify_plan`: counters per rank and summed over ranks."""

    ok: bool
    tp: int
    strategy: str
    target: str
    seed: int
    tolerance: float
    rel_error: float | None = None
    rounding_allowance: float = 0.0
    reference: str = ""
    error: str | None = None
    #: An FP8 plan's outputs against the unquantized MLP on the same values (reported, never checked; None: bf16)
    unquantized_rel_error: float | None = None
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def lines(self, source: str | None) -> list[str]:
        head = (f"{source}: {self.tp} ranks, strategy {self.strategy}, {self.target}, seed {self.seed}; "
                f"reference: {self.reference}")
        rel = "n/a" if self.rel_error is None else f"{self.rel_error:.3e}"
        status = "OK" if self.ok else "FAILED"
        out = [head, f"{status}: relative error {rel} (tolerance {self.tolerance:.0e} + rounding allowance "
                     f"{self.rounding_allowance:.1e})" + (f"; {self.error}" if self.error else "")]
        if self.unquantized_rel_error is not None:
            out.append(f"  error against the unquantized MLP: {self.unquantized_rel_error:.3e} (FP8's quantization "
                       "error on these random values, reported, not checked; docs/quantization.md)")
        for entry in [*self.per_rank, {"rank": "all", **self.totals}] if self.per_rank else []:
            out.append(f"  {'rank ' + str(entry['rank']) if entry['rank'] != 'all' else 'all ranks':<9} HBM read "
                       f"{entry.get('total_hbm_bytes_read', 0)} B, "
                       f"written {entry.get('total_hbm_bytes_written', 0)} B, "
                       f"DMAs {entry.get('dma_transfers', 0)}, matmuls {entry.get('matmul_instructions', 0)}, "
                       f"peak SBUF {entry.get('sbuf_peak_bytes', 0)} B/partition")
        return out


def _operand(arrays: dict[str, np.ndarray], spec: dict[str, Any]) -> np.ndarray:
    value = arrays[spec["tensor"]]
    if "rows" in spec:
        value = value[spec["rows"][0]:spec["rows"][1], :]
    if "cols" in spec:
        value = value[:, spec["cols"][0]:spec["cols"][1]]
    return np.ascontiguousarray(value)


class _Kernels:
    """The plan's kernel files, read, sandbox-checked and run by name."""

    def __init__(self, plan: dict[str, Any], directory: Path, target: Target) -> None:
        self.target = target
        self.files: dict[str, tuple[str, str, Any]] = {}
        for key, entry in plan["kernels"].items():
            path = directory / entry["file"]
            source = read_kernel_file(path)
            meta = read_metadata(source)
            if meta is None:
                raise InputError(f"{path}: not an nmmc kernel file")
            check_source(source, str(path))
            self.files[key] = (source, str(path), meta, parse_text(meta.graph))

    def run(self, key: str, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        source, filename, meta, graph = self.files[key]
        runner = interpreter_runner(source, filename, graph)  # an FP8 graph's scale units checked too
        tensors, counters = dict(inputs), {}
        for kernel in meta.kernels:
            outputs, part = runner(kernel, [tensors[s.name] for s in kernel.inputs], self.target)
            tensors.update({s.name: v for s, v in zip(kernel.outputs, outputs, strict=True)})
            merge_counters(counters, part or {})
        return {s.name: tensors[s.name] for s in meta.outputs}, counters


def _combined_graph(plan: dict[str, Any], workloads: dict[str, Any]) -> tuple[Graph, dict[str, tuple[int, str]]]:
    """The graph of all ranks (inputs ``r<rank>_<arg>``, each all-reduce a chain of adds), output ``out``;
    and which (rank, argument) each input is."""
    graph = Graph("tp_combined")
    values: list[dict[str, str]] = [{} for _ in plan["ranks"]]
    bindings: dict[str, tuple[int, str]] = {}
    steps = len(plan["ranks"][0]["steps"])
    for index in range(steps):
        for rank_entry in plan["ranks"]:
            rank = rank_entry["rank"]
            step = rank_entry["steps"][index]
            if "collective" in step:
                continue
            kernel_graph = quantize_fp8(workloads[step["kernel"]].graph())  # its arguments, scales included
            ids: dict[str, str] = {}
            for node in kernel_graph.nodes():
                if node.kind == NodeKind.INPUT:
                    spec = step["args"][node.name]
                    if spec["tensor"] in values[rank] and "rows" not in spec and "cols" not in spec:
                        ids[node.id] = values[rank][spec["tensor"]]
                        continue
                    name = f"r{rank}_{node.name}"
                    bindings[name] = (rank, node.name)
                    ids[node.id] = graph.add_input(name, node.shape, node.dtype)
                elif node.kind == NodeKind.OUTPUT:
                    values[rank][step["outputs"][node.name]] = ids[node.operands[0]]
                elif node.kind == NodeKind.MATMUL:
                    ids[node.id] = graph.add_matmul(*(ids[o] for o in node.operands))
                elif node.kind == NodeKind.TRANSPOSE:
                    ids[node.id] = graph.add_transpose(ids[node.operands[0]])
                else:
                    ids[node.id] = graph.add_elementwise(node.attrs["op"], *(ids[o] for o in node.operands),
                                                         dtype=node.attrs.get("dtype") or None)
        first = plan["ranks"][0]["steps"][index]
        if "collective" in first:
            parts = [values[r["rank"]][r["steps"][index]["tensor"]] for r in plan["ranks"]]
            total = parts[0]
            for part in parts[1:]:
                total = graph.add_elementwise(ElementwiseOp.ADD, total, part)
            for rank_values in values:
                rank_values[first["result"]] = total
    graph.add_output("out", values[0][plan.get("output", "out")])
    return graph, bindings


def verify_plan(path: str | Path | None, *, seed: int = 0, max_memory: int | None = None) -> TpVerifyReport:
    """Verify the plan at ``path`` (plan.json or its directory); see the module docstring. ``max_memory`` (bytes)
    refuses, before anything runs, a plan estimated to need more (:func:`..verification.memory.plan_bytes`)."""
    if path is None:
        raise InputError("verify of a tensor-parallel plan needs the plan's path")
    plan, directory = read_plan(path)
    if max_memory is not None:
        from ..verification.memory import check_plan_memory

        try:
            elements = sum(int(np.prod(entry["shape"])) for entry in plan["tensors"].values())
            ranks = len(plan["ranks"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"{path}: malformed plan ({exc})") from None
        check_plan_memory(str(path), elements, ranks, max_memory)
    try:
        workload = workload_from_dict(plan["workload"])
        workloads = {key: workload_from_dict(entry["workload"]) for key, entry in plan["kernels"].items()}
        target = get_target(str(plan["target"]))
    except (KeyError, TypeError) as exc:
        raise InputError(f"{path}: malformed plan ({exc})") from None
    if not isinstance(workload, MlpWorkload):
        raise InputError(f"{path}: a tensor-parallel plan shards an MLP workload")
    kernels = _Kernels(plan, directory, target)
    report = TpVerifyReport(ok=False, tp=int(plan["tp"]), strategy=str(plan["strategy"]["name"]), target=target.name,
                            seed=seed, tolerance=TOLERANCES[workload.dtype])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            _run(plan, workload, workloads, kernels, report)
        except KernelError as exc:
            report.error = str(exc)
    return report


def _run(plan: dict[str, Any], workload: MlpWorkload, workloads: dict[str, Any], kernels: _Kernels,
         report: TpVerifyReport) -> None:
    rng = np.random.default_rng(report.seed)
    dtype = NUMPY_DTYPES[workload.dtype]
    raw = {name: rng.standard_normal(tuple(entry["shape"]), dtype=np.float32).astype(dtype)
           for name, entry in sorted(plan["tensors"].items())}
    ranks = plan["ranks"]
    combined, bindings = _combined_graph(plan, workloads)
    arrays = raw
    if workload.fp8 is not None:
        from .calibration import quantize_plan

        arrays = quantize_plan(plan, workloads, raw, combined, bindings,
                               lambda rank, arg: _operand(raw, _arg_spec(ranks[rank], arg)))
    held: list[dict[str, np.ndarray]] = [dict(arrays) for _ in ranks]
    counters: list[dict[str, Any]] = [{} for _ in ranks]
    for index in range(len(ranks[0]["steps"])):
        first = ranks[0]["steps"][index]
        if "collective" in first:
            if first["collective"] != "all_reduce":
                raise InputError(f"plan collective {first['collective']!r} is not one verify performs")
            total = sum(held[r["rank"]][r["steps"][index]["tensor"]].astype(np.float32) for r in ranks)
            for rank_arrays in held:
                rank_arrays[first["result"]] = np.asarray(total).astype(NUMPY_DTYPES[first["dtype"]])
            continue
        for entry in ranks:
            rank, step = entry["rank"], entry["steps"][index]
            inputs = {name: _operand(held[rank], spec) for name, spec in step["args"].items()}
            try:
                outputs, part = kernels.run(step["kernel"], inputs)
            except KernelError as exc:
                raise KernelError(f"rank {rank}, kernel {step['kernel']}: {exc}") from None
            for name, tensor in step["outputs"].items():
                held[rank][tensor] = outputs[name]
            merge_counters(counters[rank], part)
    report.per_rank = [{"rank": r["rank"], **c} for r, c in zip(ranks, counters, strict=True)]
    for part in counters:
        merge_counters(report.totals, part)
    combined_inputs = {name: _operand(held[rank], _arg_spec(ranks[rank], arg)) for name, (rank, arg)
                       in bindings.items()}
    sigmas = [chunk.sigmas.get("out") for chunk in reference_chunks(combined, combined_inputs)]
    allowance = float(np.sqrt(sum(float(np.sum(s * s)) for s in sigmas if s is not None)))
    unsharded = all(name == "x" or "." not in name for name in plan["tensors"])
    fp8 = "" if workload.fp8 is None else "FP8 "
    stepwise = bool(fp8) and _quantizes_a_collective(ranks)
    sliced = unsharded  # every tensor a slice of an unsharded one
    if stepwise:
        unsharded, graph = False, combined
        expected = _stepwise(plan, workloads, arrays)
        report.reference = ("the FP8 computation of all ranks, kernel by kernel (each kernel's float64 reference, its "
                            "outputs and the all-reduced sums rounded to their dtypes as handed on)")
    elif unsharded:
        graph = unsharded_graph(workload)
        expected = evaluate(graph, {n.name: arrays[n.name] for n in graph.inputs()})["out"]
        report.reference = f"the unsharded {fp8}MLP on the unsharded weights"
    else:
        graph = combined
        expected = evaluate(combined, combined_inputs)["out"]
        report.reference = (f"the {fp8}MLP of the shards' own factors (all ranks, all-reduce as a sum)" if not fp8 else
                            "the FP8 computation of all ranks (each rank's own scales; all-reduce as a sum)")
    output = plan.get("output", "out")
    _compare(report, held, ranks, np.asarray(expected, dtype=np.float64), allowance, output)
    if workload.fp8 is not None and report.ok:
        plain = unquantized(graph, workload.dtype)
        plain_inputs = {n.name: raw[n.name] if unsharded else _operand(raw, _arg_spec(ranks[bindings[n.name][0]],
                                                                                   bindings[n.name][1]))
                        for n in plain.inputs()}
        reference = np.asarray(evaluate(plain, plain_inputs)["out"], dtype=np.float64)
        denom = float(np.linalg.norm(reference)) or 1.0
        report.unquantized_rel_error = max(
            float(np.linalg.norm(np.asarray(held[e["rank"]][output], dtype=np.float64) - reference)) / denom
            for e in ranks)
        if stepwise and sliced:  # the kernel-by-kernel reference reads the plan's bindings: check them here
            whole = unquantized(unsharded_graph(workload), workload.dtype)
            want = np.asarray(evaluate(whole, {n.name: raw[n.name] for n in whole.inputs()})["out"], np.float64)
            wiring = float(np.linalg.norm(reference - want)) / (float(np.linalg.norm(want)) or 1.0)
            if wiring > WIRING_TOLERANCE:
                report.ok = False
                report.error = (f"the plan's ranks, unquantized, differ from the unsharded MLP by {wiring:.3e} (a "
                                "weight bound to the wrong tensor or slice)")


def _quantizes_a_collective(ranks: list[dict[str, Any]]) -> bool:
    """Whether a kernel reads a collective's result (reduce-rank's ``down_v``): in an FP8 plan it quantizes that
    bf16 sum, so the reference must hold the very bf16 values handed on (one rounding apart moves whole FP8 steps of
    some elements; verification/reference.py's module docstring)."""
    results = {step["result"] for step in ranks[0]["steps"] if "collective" in step}
    return any(spec["tensor"] in results for step in ranks[0]["steps"] if "args" in step
               for spec in step["args"].values())


def _stepwise(plan: dict[str, Any], workloads: dict[str, Any], arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Rank 0's output of the plan run step by step on float64 references: each kernel's quantized graph evaluated
    on its operands, its outputs rounded to their dtypes (as stored in HBM), each all-reduce summed and rounded to
    its dtype (as :func:`_run` performs it)."""
    ranks = plan["ranks"]
    held: list[dict[str, np.ndarray]] = [dict(arrays) for _ in ranks]
    for index in range(len(ranks[0]["steps"])):
        first = ranks[0]["steps"][index]
        if "collective" in first:
            total = sum(held[r["rank"]][r["steps"][index]["tensor"]].astype(np.float64) for r in ranks)
            for rank_arrays in held:
                rank_arrays[first["result"]] = np.asarray(total).astype(NUMPY_DTYPES[first["dtype"]])
            continue
        for entry in ranks:
            step = entry["steps"][index]
            graph = quantize_fp8(workloads[step["kernel"]].graph())
            values = evaluate(graph, {name: _operand(held[entry["rank"]], spec) for name, spec in step["args"].items()})
            dtypes = {node.name: node.dtype for node in graph.outputs()}
            for name, tensor in step["outputs"].items():
                held[entry["rank"]][tensor] = np.asarray(values[name]).astype(NUMPY_DTYPES[dtypes[name]])
    return np.asarray(held[0][plan.get("output", "out")], dtype=np.float64)


def _arg_spec(rank_entry: dict[str, Any], arg: str) -> dict[str, Any]:
    """The operand of ``arg`` in the rank's first kernel step that reads an argument of that name."""
    for step in rank_entry["steps"]:
        if "args" in step and arg in step["args"]:
            return step["args"][arg]
    raise InputError(f"rank {rank_entry['rank']} never reads {arg!r}")


def _compare(report: TpVerifyReport, held: list[dict[str, np.ndarray]], ranks: list[dict[str, Any]],
             expected: np.ndarray, allowance: float, output: str) -> None:
    denom = float(np.linalg.norm(expected)) or 1.0
    worst, ok = 0.0, True
    for entry in ranks:
        got = np.asarray(held[entry["rank"]][output], dtype=np.float64)
        if got.shape != expected.shape or not np.all(np.isfinite(got)):
            report.error = f"rank {entry['rank']}: output {output} has shape {got.shape} or non-finite values"
            return
        error = float(np.linalg.norm(got - expected))
        worst = max(worst, error / denom)
        ok = ok and error <= report.tolerance * denom + allowance
    report.rel_error, report.rounding_allowance, report.ok = worst, allowance / denom, ok
    if not ok:
        report.error = f"relative error {worst:.3e} exceeds the tolerance"
