"""The machine-readable plan of a tensor-parallel MLP (``plan.json``) and the kernel files beside it.

One kernel file per distinct per-rank workload (ranks with the same shapes share it), and a plan
saying, for each rank, which kernel it runs with which slices of which tensors, and which collective
(op, dtype, shape, group) follows: what an inference framework needs to call the kernels
(docs/tensor-parallel.md, "The plan"). :func:`read_plan` checks a plan before ``nmmc verify`` trusts it.
"""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Any

from ..cost_model.collectives import UNVALIDATED
from ..cost_model.trust import trust_note
from ..errors import InputError
from ..tuning.speedups import launch_dict
from .planner import StrategyResult, TpResult
from .sharding import CollectiveStep, KernelStep

FORMAT = "nmmc-tp-plan"
VERSION = 1
PLAN_NAME = "plan.json"
#: Kernel file names a plan may point at: plain names in the plan's directory.
_FILE_NAME = re.compile(r"[A-Za-z0-9_]+\.py\Z")
#: The largest plan ``nmmc verify`` reads.
MAX_PLAN_BYTES = 4 * 1024 * 1024


def _collective_entry(step: CollectiveStep, result: StrategyResult, index: int) -> dict[str, Any]:
    cost = result.collectives[index]
    return {"collective": step.op, "tensor": step.tensor, "result": step.result, "dtype": step.dtype,
            "shape": list(step.shape), "group": list(step.group), "bytes_sent_per_rank": cost.bytes_sent_per_rank,
            "predicted_us": cost.total_us}


def plan_dict(result: TpResult, dialect: str) -> dict[str, Any]:
    """The plan of the chosen strategy (see the module docstring), with every strategy's figures."""
    chosen = result.chosen
    sharded = chosen.sharded
    assert sharded is not None
    kernels: dict[str, dict[str, Any]] = {}
    ranks = []
    for program in sharded.ranks:
        steps: list[dict[str, Any]] = []
        collective_index = 0
        for step in program.steps:
            if isinstance(step, CollectiveStep):
                steps.append(_collective_entry(step, chosen, collective_index))
                collective_index += 1
                continue
            assert isinstance(step, KernelStep)
            compiled = chosen.kernels[step.key]
            entry = kernels.setdefault(step.key, {
                "file": f"{step.key}.py", "workload": step.workload.to_dict(), "ranks": [],
                "predicted_us": compiled.cost.latency_us, "schedule": compiled.schedule_name})
            entry["ranks"].append(program.rank)
            steps.append({"kernel": step.key, "args": {k: v.as_dict() for k, v in step.args.items()},
                          "outputs": dict(step.outputs)})
        ranks.append({"rank": program.rank, "role": program.role, "steps": steps})
    tensors: dict[str, dict[str, Any]] = {
        "x": {"shape": [result.workload.tokens, result.workload.hidden], "holds": "the activations"}}
    fp8 = result.workload.fp8 is not None
    if fp8:  # an FP8 plan says every tensor's dtype: FP8 weights, float32 scales (docs/tensor-parallel.md, "FP8")
        tensors["x"]["dtype"] = result.workload.dtype
    for f in sharded.factors.values():
        tensors[f.name] = {"shape": list(f.shape), "holds": f.holds}
        if fp8:
            tensors[f.name]["dtype"] = f.dtype or result.workload.dtype
    return {
        "format": FORMAT, "version": VERSION, "workload": result.workload.to_dict(), "tp": result.tp,
        "target": result.target.spec, "launch": launch_dict(result.target), "dialect": dialect,
        "strategy": {"name": chosen.strategy.name, "gate_up": chosen.strategy.gate_up, "down": chosen.strategy.down},
        "intermediate_shards": [{"rank": i, "start": start, "stop": start + size}
                                for i, (start, size) in enumerate(zip(sharded.offsets, sharded.sizes, strict=True))],
        "tensors": tensors, "kernels": kernels, "ranks": ranks, "output": "out",
        "predicted": {"kernel_us": chosen.kernel_us, "comm_us": chosen.comm_us, "total_us": chosen.total_us,
                      "model_error": trust_note(result.target, fused=True), "collectives": UNVALIDATED},
        "strategies": [r.as_dict() for r in result.results],
        "alternatives": result.alternatives,
    }


def write_plan(result: TpResult, dialect: str, out_dir: str | Path) -> list[Path]:
    """Write the chosen strategy's kernel files and ``plan.json`` into ``out_dir``; the paths written."""
    from ..io import write_text_atomic

    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    plan = plan_dict(result, dialect)
    written = []
    for key, entry in plan["kernels"].items():
        path = directory / entry["file"]
        write_text_atomic(path, result.chosen.kernels[key].kernel.source)
        written.append(path)
    path = directory / PLAN_NAME
    write_text_atomic(path, json.dumps(plan, indent=2) + "\n")
    return [*written, path]


def is_plan(path: str | Path) -> bool:
    """Whether ``path`` names a tensor-parallel plan (a ``.json`` file, or a directory holding plan.json)."""
    p = Path(path)
    return p.suffix == ".json" or (p.is_dir() and (p / PLAN_NAME).is_file())


def read_plan(path: str | Path) -> tuple[dict[str, Any], Path]:
    """(the plan, its directory) of a plan file or a directory holding one; InputError when it is not a
    readable nmmc plan or names a kernel file outside its directory."""
    p = Path(path)
    if p.is_dir():
        p = p / PLAN_NAME
    try:
        info = p.stat()
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"cannot read tensor-parallel plan {str(p)!r}: not a regular file")
        if info.st_size > MAX_PLAN_BYTES:
            raise InputError(f"cannot read tensor-parallel plan {str(p)!r}: larger than {MAX_PLAN_BYTES} bytes")
        plan = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read tensor-parallel plan {str(p)!r}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{p}: not a tensor-parallel plan (not UTF-8 JSON: {exc})") from None
    if not isinstance(plan, dict) or plan.get("format") != FORMAT:
        raise InputError(f"{p}: not an nmmc tensor-parallel plan (no \"format\": \"{FORMAT}\")")
    if plan.get("version") != VERSION:
        raise InputError(f"{p}: plan version {plan.get('version')!r} is not supported (this nmmc reads {VERSION})")
    for key in ("kernels", "ranks", "tensors"):
        if not isinstance(plan.get(key), dict if key != "ranks" else list):
            raise InputError(f"{p}: plan field {key!r} is missing or malformed")
    for key, entry in plan["kernels"].items():
        name = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _FILE_NAME.match(name):
            raise InputError(f"{p}: kernel {key!r} names file {name!r}; a plan's kernel files are plain names "
                             "(letters, digits, _) ending in .py, in the plan's directory")
    return plan, p.parent
