"""Every kernel of this package as a PyTorch custom operator, and the per-rank entry point a serving router calls.

Operators. Each kernel file (one per layer group, token bucket and tensor-parallel role) is one operator
``torch.ops.nmmc.<package>_<digest>_<group>_t<bucket>_<role>`` (:func:`op_name`): ``package`` is the package's
directory (import) name, ``digest`` the first 8 hex digits of a SHA-256 over its manifest and kernel files, ``group``,
``bucket`` and ``role`` the manifest's; every character outside ``[A-Za-z0-9_]`` becomes ``_``. Two packages imported
into one process therefore never share an operator name unless their manifests and kernels are byte for byte the
same, in which case the operator already registered is reused (it runs the same kernels). The operator's arguments
are the kernel's inputs by their kernel argument names (``x``, ``w_gate``, ... all tensors; no Python objects), its
results the kernel's (one tensor, or a tuple), all at the bucket's static shapes. Inside ``torch.compile`` each call
is one node of the graph.

How it is registered:

- where ``torch_neuronx`` imports (TorchNeuron, torch-neuronx 2.14 on trn2/trn3), with ``torch_neuronx.nki_op``
  (AWS Neuron docs, "How to work with NKI kernels from torch-neuronx" and "Quickstart: Run an NKI kernel from
  torch-neuronx"): its body launches the ``@nki.jit`` kernel on neuron tensors as the manifest says
  (``kernel[lnc](...)``, :meth:`.backend.KernelRunner.launcher`); tensors on another device go to the CPU operator
  below. This path is written against the documented API and has not been run: nmmc has no Neuron host.
- everywhere, ``torch.library.custom_op`` with a fake (meta) implementation that returns empty tensors of the
  manifest's result shapes and dtypes, and an implementation that runs nmmc's NKI interpreter on CPU tensors
  (:meth:`.backend.KernelRunner.run`) and the ``@nki.jit`` kernel on XLA tensors (PyTorch/XLA torch-neuronx,
  which has no ``nki_op``: the legacy NxD Inference path, as before operators). Without ``torch_neuronx.nki_op``
  this is the operator; with it, it is ``..._cpu``, which the ``nki_op`` body calls for tensors not on a Neuron
  device.

Router API (what a vLLM Neuron integration calls; stable):

- ``run_rank(group: str, tokens: int, rank: int, x: Tensor, weights: Mapping[str, Tensor]) -> Tensor``: ``x`` is
  ``[tokens, hidden]``; the rows are padded with zeros to the smallest bucket of ``group`` that holds ``tokens``
  (more than the largest bucket: chunks of the largest), rank ``rank``'s steps of that bucket run up to but
  excluding a final all-reduce, and the rank's partial output ``[tokens, hidden]`` is returned in the package's
  ``activation_dtype`` (at tp 1: the MLP's output). ``weights`` maps each weight argument to the rank's tensor, by
  kernel argument name (dense: ``w_gate`` and ``w_up`` ``[hidden, intermediate / tp]``, ``w_down``
  ``[intermediate / tp, hidden]``; FP8 also ``w_gate_scale``, ``x_scale``, ...) or by the operand key
  :func:`.weights.layer_arguments` returns (``w_gate__cols_0_4096``), which names the slice exactly; shapes and
  dtypes are checked against the manifest. ``tokens`` must equal ``x.shape[0]``: it is a Python int, so the
  bucket is chosen without reading a tensor and the call traces under ``torch.compile``.
- ``routable(group: str, tokens: int, rank: int) -> bool``: whether ``run_rank`` can serve that call: False when a
  bucket it would run has a collective before its last step (``replicate-u/reduce-rank``: the all-reduce sits
  between two kernels), which a caller owning only the final all-reduce cannot run.
- ``bucket_tokens(group: str, tokens: int) -> list[int]``: the buckets a call of ``tokens`` rows runs, in order.

Part of a package written by ``nmmc export``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .backend import KernelRunner, torch_dtype
from .weights import operand_key

#: The namespace of every operator of every nmmc export.
NAMESPACE = "nmmc"
#: Tensors on these devices run the NKI kernel (``nki.jit``); any other device runs nmmc's interpreter on the CPU.
DEVICE_TYPES = ("neuron", "xla")
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")


def op_name(package: str, digest: str, group: str, tokens: int, role: str) -> str:
    """The operator name (without namespace) of one kernel file; see the module docstring."""
    return _NOT_IDENTIFIER.sub("_", f"{package}_{digest}_{group}_t{tokens}_{role}")


def package_digest(runner: KernelRunner) -> str:
    """8 hex digits of a SHA-256 over the manifest (canonical JSON) and every kernel file the manifest names."""
    digest = hashlib.sha256(json.dumps(runner.manifest, sort_keys=True).encode())
    files = sorted({k["file"] for g in runner.manifest["groups"].values() for b in g["buckets"]
                    for k in b["kernels"].values()})
    for file in files:
        digest.update(file.encode() + b"\0" + (runner.root / file).read_bytes() + b"\0")
    return digest.hexdigest()[:8]


def _nki_op() -> Any:
    """``torch_neuronx.nki_op`` where torch-neuronx imports, else None."""
    try:
        from torch_neuronx import nki_op
    except ImportError:
        return None
    return nki_op


class KernelOp:
    """One kernel file as a custom operator: ``op`` (the ``OpOverload``), ``inputs`` (the kernel's argument names in
    call order: every argument of its functions not produced by an earlier one), ``results`` (the last function's
    results: name, shape, dtype) and ``specs`` (each input's manifest entry)."""

    def __init__(self, qualname: str, kernel: dict[str, Any], runner: KernelRunner) -> None:
        self.qualname = qualname
        produced: set[str] = set()
        self.specs: dict[str, dict[str, Any]] = {}
        for function in kernel["functions"]:
            for argument in function["arguments"]:
                if argument["name"] not in produced:
                    self.specs.setdefault(argument["name"], argument)
            produced.update(r["name"] for r in function["results"])
        self.inputs = tuple(self.specs)
        self.results = tuple((r["name"], tuple(r["shape"]), r["dtype"]) for r in kernel["functions"][-1]["results"])
        self.op = self._register(kernel, runner)

    def __deepcopy__(self, memo: Any) -> KernelOp:
        return self  # an operator registration is process-wide: a copied model calls the same one

    def _register(self, kernel: dict[str, Any], runner: KernelRunner) -> torch._ops.OpOverload:
        namespace, name = self.qualname.split("::")
        nki_op = _nki_op()
        cpu_name = name if nki_op is None else f"{name}_cpu"
        cpu = _existing(namespace, cpu_name) or self._register_library(f"{namespace}::{cpu_name}", kernel, runner)
        if nki_op is None:
            return cpu
        return _existing(namespace, name) or self._register_nki(nki_op, kernel, runner, cpu)

    def _register_library(self, qualname: str, kernel: dict[str, Any], runner: KernelRunner) -> torch._ops.OpOverload:
        def interpret(*args: torch.Tensor) -> Any:
            named = dict(zip(self.inputs, args, strict=True))
            if args[0].device.type in DEVICE_TYPES:  # PyTorch/XLA without nki_op (legacy NxD Inference): nki.jit
                got = runner.run(kernel, named, "neuron")
                return self._pack([got[name] for name, _, _ in self.results])
            got = runner.run(kernel, named, "interpreter")
            return self._pack([got[name].to(args[0].device) for name, _, _ in self.results])

        def fake(*args: torch.Tensor) -> Any:
            for name, value in zip(self.inputs, args, strict=True):
                spec = self.specs[name]
                if tuple(value.shape) != tuple(spec["shape"]):
                    raise ValueError(f"{self.qualname}: argument {name} is {tuple(value.shape)}, the kernel takes "
                                     f"{tuple(spec['shape'])}")
            return self._pack([torch.empty(shape, dtype=torch_dtype(dtype), device=args[0].device)
                               for _, shape, dtype in self.results])

        defined = torch.library.custom_op(qualname, interpret, mutates_args=(), schema=self._schema())
        defined.register_fake(fake)
        namespace, name = qualname.split("::")
        return getattr(getattr(torch.ops, namespace), name).default

    def _register_nki(self, nki_op: Any, kernel: dict[str, Any], runner: KernelRunner,
                      cpu: torch._ops.OpOverload) -> torch._ops.OpOverload:
        """The documented TorchNeuron registration (not run here: no Neuron host). The body is also nki_op's fake
        implementation: on neuron tensors the ``@nki.jit`` call gives the result shapes, elsewhere the CPU
        operator's fake does."""
        runner.preload(kernel)  # import the kernel file (and nki) now, not while torch.compile traces the body

        def body(*args: torch.Tensor) -> Any:
            if args[0].device.type in DEVICE_TYPES:
                got = runner.run(kernel, dict(zip(self.inputs, args, strict=True)), "neuron")
                return self._pack([got[name] for name, _, _ in self.results])
            return cpu(*args)

        parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor)
                      for name in self.inputs]
        returns = torch.Tensor if len(self.results) == 1 else tuple[(torch.Tensor,) * len(self.results)]  # type: ignore[misc]
        body.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
        nki_op(self.qualname, mutates_args=())(body)
        namespace, name = self.qualname.split("::")
        return getattr(getattr(torch.ops, namespace), name).default

    def _schema(self) -> str:
        returns = "Tensor" if len(self.results) == 1 else "(" + ", ".join(["Tensor"] * len(self.results)) + ")"
        return "(" + ", ".join(f"Tensor {name}" for name in self.inputs) + ") -> " + returns

    def _pack(self, values: list[torch.Tensor]) -> Any:
        return values[0] if len(values) == 1 else tuple(values)

    def __call__(self, args: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run the operator on its inputs (in :attr:`inputs` order); its results by name."""
        out = self.op(*args)
        values = (out,) if len(self.results) == 1 else tuple(out)
        return {name: value for (name, _, _), value in zip(self.results, values, strict=True)}


def _existing(namespace: str, name: str) -> torch._ops.OpOverload | None:
    """The operator ``namespace::name`` if this process registered it already (an identical package, see the module
    docstring), else None."""
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):
        return None


#: A step of a rank's program. ("kernel", op, args, outputs): ``args`` one (argument name, tensor name, weight
#: operand key or None, rows or None, cols or None) per op input, ``outputs`` (result name, tensor name) pairs;
#: ("all_reduce", tensor, result).
Step = tuple[Any, ...]


class PackageOps:
    """The operators of one package and the programs (per group, bucket and rank) that call them."""

    def __init__(self, runner: KernelRunner) -> None:
        self.runner = runner
        self.manifest = runner.manifest
        self.package = runner.root.name
        self.digest = package_digest(runner)
        self.activation_dtype = torch_dtype(self.manifest["activation_dtype"])
        self.hidden_size = int(self.manifest["model"]["hidden_size"])
        self.kernels: dict[tuple[str, int, str], KernelOp] = {}
        self.programs: dict[tuple[str, int, int], tuple[Step, ...]] = {}
        self.outputs: dict[tuple[str, int], str] = {}
        names: dict[str, tuple[str, int, str]] = {}
        for group, entry in self.manifest["groups"].items():
            for bucket in entry["buckets"]:
                tokens = int(bucket["tokens"])
                self.outputs[group, tokens] = bucket["output"]
                for role, kernel in bucket["kernels"].items():
                    name = op_name(self.package, self.digest, group, tokens, role)
                    if names.setdefault(name, (group, tokens, role)) != (group, tokens, role):
                        raise ValueError(f"operator name {name} stands for two kernels: {names[name]} and "
                                         f"{(group, tokens, role)}")
                    self.kernels[group, tokens, role] = KernelOp(f"{NAMESPACE}::{name}", kernel, runner)
                for program in bucket["ranks"]:
                    self.programs[group, tokens, int(program["rank"])] = tuple(
                        self._step(group, tokens, step, entry["tensors"]) for step in program["steps"])

    def __deepcopy__(self, memo: Any) -> PackageOps:
        return self

    def _step(self, group: str, tokens: int, step: dict[str, Any], weights: dict[str, Any]) -> Step:
        if "collective" in step:
            if step["collective"] != "all_reduce":
                raise ValueError(f"collective {step['collective']!r} is not supported by this runtime")
            return ("all_reduce", step["tensor"], step["result"])
        kernel = self.kernels[group, tokens, step["kernel"]]
        args = []
        for name in kernel.inputs:
            spec = step["args"][name]
            key = operand_key(spec) if spec["tensor"] in weights else None
            args.append((name, spec["tensor"], key, tuple(spec["rows"]) if "rows" in spec else None,
                         tuple(spec["cols"]) if "cols" in spec else None))
        return ("kernel", kernel, tuple(args), tuple(step["outputs"].items()))

    # -- buckets ---------------------------------------------------------------------------------------------------
    def buckets(self, group: str) -> tuple[int, ...]:
        if group not in self.manifest["groups"]:
            raise KeyError(f"no layer group {group!r} in this package ({', '.join(self.manifest['groups'])})")
        return tuple(sorted(int(b["tokens"]) for b in self.manifest["groups"][group]["buckets"]))

    def bucket_tokens(self, group: str, tokens: int) -> list[int]:
        """The buckets a call of ``tokens`` rows runs (:func:`bucket_plan`)."""
        return bucket_plan(self.buckets(group), tokens)

    def routable(self, group: str, tokens: int, rank: int) -> bool:
        """Whether every bucket of the call has at most one collective, its last step (see the module docstring)."""
        return all(not any(s[0] != "kernel" for s in self.program(group, b, rank)[:-1])
                   for b in self.bucket_tokens(group, tokens))

    def program(self, group: str, tokens: int, rank: int) -> tuple[Step, ...]:
        key = (group, tokens, rank)
        if key not in self.programs:
            raise KeyError(f"no program for group {group!r}, bucket {tokens}, rank {rank} in this package")
        return self.programs[key]

    # -- running ---------------------------------------------------------------------------------------------------
    def run_rank(self, group: str, tokens: int, rank: int, x: torch.Tensor, weights: Mapping[str, torch.Tensor]
                 ) -> torch.Tensor:
        """Rank ``rank``'s partial MLP output of ``x`` [tokens, hidden] (see the module docstring)."""
        if x.dim() != 2 or x.shape[1] != self.hidden_size or x.shape[0] != tokens:
            raise ValueError(f"x must be [tokens={tokens}, {self.hidden_size}], got {list(x.shape)}")
        if not self.routable(group, tokens, rank):
            raise ValueError(f"group {group!r} at {tokens} tokens: rank {rank}'s plan all-reduces between kernels "
                             "(routable() is False); run it through the package's module instead")
        buckets, chunks = split_rows(self.buckets(group), x.to(self.activation_dtype))
        outs = []
        for bucket, chunk in zip(buckets, chunks, strict=True):
            program = self.program(group, bucket, rank)
            env = {"x": chunk}
            stop = run_steps(program, env, lambda key, name, op: _weight(weights, key, name, op))
            outs.append(env[program[stop][1]] if stop < len(program) else env[self.outputs[group, bucket]])
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out[:tokens]


def _weight(weights: Mapping[str, torch.Tensor], key: str, name: str, op: KernelOp) -> torch.Tensor:
    value = weights[key] if key in weights else weights.get(name)
    if value is None:
        raise KeyError(f"{op.qualname}: no weight {name!r} (or {key!r}) given")
    spec = op.specs[name]
    if tuple(value.shape) != tuple(spec["shape"]) or value.dtype != torch_dtype(spec["dtype"]):
        raise ValueError(f"{op.qualname}: weight {name} is {tuple(value.shape)} {value.dtype}, the kernel takes "
                         f"{tuple(spec['shape'])} {torch_dtype(spec['dtype'])}")
    return value


def bucket_plan(buckets: tuple[int, ...], tokens: int) -> list[int]:
    """The buckets (sorted) a call of ``tokens`` rows runs: the smallest that holds them, or chunks of the largest
    and then the smallest bucket holding the rest (one bucket for 0 rows). Python ints only: under torch.compile
    the row count is static, so the choice is made while tracing."""
    largest, out, left = buckets[-1], [], int(tokens)
    while left > largest:
        out.append(largest)
        left -= largest
    out.append(next(b for b in buckets if b >= left))
    return out


def split_rows(buckets: tuple[int, ...], rows: torch.Tensor) -> tuple[list[int], list[torch.Tensor]]:
    """(the buckets of :func:`bucket_plan`, ``rows`` [T, H] padded with zero rows by one ``F.pad`` and cut into one
    [bucket, H] chunk each): tensor operations that trace, no data-dependent control flow."""
    plan = bucket_plan(buckets, rows.shape[0])
    padded = F.pad(rows, (0, 0, 0, sum(plan) - rows.shape[0]))
    chunks, start = [], 0
    for bucket in plan:
        chunks.append(padded[start:start + bucket])
        start += bucket
    return plan, chunks


def run_steps(program: tuple[Step, ...], env: dict[str, torch.Tensor], weight: Any, start: int = 0) -> int:
    """Run ``program``'s kernel steps from ``start`` on ``env`` (tensor name -> tensor, ``x`` the padded rows; the
    results are added to it) until a collective or the end; the index of that collective (``len(program)`` at the
    end). A weight argument is ``weight(operand key, argument name, op)``."""
    for index in range(start, len(program)):
        step = program[index]
        if step[0] != "kernel":
            return index
        _, op, args, outputs = step
        values = []
        for name, tensor, key, rows, cols in args:
            if key is not None:
                values.append(weight(key, name, op))
                continue
            value = env[tensor]
            if rows is not None:
                value = value[rows[0]:rows[1]]
            if cols is not None:
                value = value[:, cols[0]:cols[1]]
            values.append(value.contiguous())
        results = op(values)
        for result, tensor in outputs:
            env[tensor] = results[result]
    return len(program)


_PACKAGES: dict[tuple[str, str], PackageOps] = {}


def ops_for(runner: KernelRunner) -> PackageOps:
    """The operators of ``runner``'s package, registered once per process."""
    key = (str(runner.root.resolve()), package_digest(runner))
    if key not in _PACKAGES:
        _PACKAGES[key] = PackageOps(runner)
    return _PACKAGES[key]


@functools.cache
def package_ops() -> PackageOps:
    """The operators of the package this module belongs to."""
    root = Path(__file__).resolve().parent
    return ops_for(KernelRunner(root, json.loads((root / "manifest.json").read_text(encoding="utf-8"))))


def run_rank(group: str, tokens: int, rank: int, x: torch.Tensor, weights: Mapping[str, torch.Tensor]
             ) -> torch.Tensor:
    """Rank ``rank``'s partial output of this package's MLP for ``x`` [tokens, hidden], excluding a final
    all-reduce (module docstring)."""
    return package_ops().run_rank(group, tokens, rank, x, weights)


def routable(group: str, tokens: int, rank: int) -> bool:
    """Whether :func:`run_rank` can serve a call of ``tokens`` rows for ``rank`` (module docstring)."""
    return package_ops().routable(group, tokens, rank)


def bucket_tokens(group: str, tokens: int) -> list[int]:
    """The buckets a call of ``tokens`` rows runs, in order."""
    return package_ops().bucket_tokens(group, tokens)
