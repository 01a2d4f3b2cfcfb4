"""The MLP module that runs this package's kernels in place of a model's gated MLP.

``forward`` flattens ``[..., hidden]`` to tokens, pads them with zero rows to the smallest bucket that holds them
(more tokens than the largest bucket: chunks of the largest), runs the bucket's steps for this module's rank (each
kernel through its custom operator, :mod:`.ops`; the tensor-parallel collective through the ``all_reduce`` it was
given), slices the padding off and restores the shape and dtype. The bucket is chosen from the static row count
(Python ints) and the padding is one ``F.pad``, so the forward traces under ``torch.compile`` (``fullgraph=True``):
each kernel call is one node of the graph and each distinct row count its own graph, as NxD Inference fixes its own
MLP kernel's branch per bucket.

:class:`NmmcMLP` has the forward signature of Hugging Face's ``LlamaMLP``/``Qwen3MLP`` (``forward(x) -> y``): the
module for TorchNeuron (torch-neuronx 2.14: the ``neuron`` device, eager and ``torch.compile(backend="neuron")``)
and for CPU checks. :class:`NeuronNmmcMLP` has that of NxD Inference's ``NeuronLlamaMLP`` (``forward(x,
rmsnorm=None, residual=None, adapter_ids=None) -> (y, residual)``): legacy, for NxD Inference on trn1/inf2, which
is in maintenance only since Neuron 2.34 ended NxD Inference on trn2/trn3.

Part of a package written by ``nmmc export``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .backend import KernelRunner, torch_dtype
from .ops import KernelOp, ops_for, run_steps, split_rows
from .weights import rank_operands

AllReduce = Callable[[torch.Tensor], torch.Tensor]
BACKENDS = ("auto", "neuron", "interpreter")


def default_all_reduce() -> AllReduce:
    """The all-reduce of a tensor-parallel bucket when none is given: NxD's
    ``reduce_from_tensor_model_parallel_region`` (what NxD Inference's MLP runs after its kernel; legacy) when
    neuronx-distributed is installed, else a sum over torch.distributed's default group with the functional
    collective (which ``torch.compile`` traces; pass ``all_reduce=`` for another group), else an error naming what
    to pass."""
    try:
        from neuronx_distributed.parallel_layers.mappings import reduce_from_tensor_model_parallel_region
    except ImportError:
        pass
    else:
        return reduce_from_tensor_model_parallel_region
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from torch.distributed import _functional_collectives as funcol

        def world_sum(tensor: torch.Tensor) -> torch.Tensor:
            return funcol.all_reduce(tensor, "sum", torch.distributed.group.WORLD)
        return world_sum

    def missing(tensor: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this bucket's plan all-reduces across tensor-parallel ranks: pass all_reduce= (or "
                           "initialize torch.distributed, or install neuronx-distributed)")
    return missing


class NmmcMLP(nn.Module):
    """One rank's share of a gated MLP, computed by the exported kernels of one layer group (``group``: its name in
    the manifest; :func:`.weights.layer_group` gives a layer's; None: the package's only group). The weight
    arguments are buffers named by :func:`.weights.operand_key`, each in its manifest dtype (FP8 weights as
    ``torch.float8_e4m3fn``, their scales float32; MX weights as the int32/int16 words of their packed elements with
    uint8 E8M0 scales, :mod:`.mx`; fill them with :meth:`load`); the activations are cast to the
    manifest's ``activation_dtype``. Every kernel runs through its custom operator (:mod:`.ops`), which dispatches
    on the tensors' device: the ``@nki.jit`` kernel on a Neuron device, nmmc's interpreter on the CPU. ``backend``
    only checks that: ``auto`` (either), ``neuron`` or ``interpreter`` (refuses tensors on another device)."""

    def __init__(self, manifest: dict[str, Any], runner: KernelRunner, *, rank: int = 0,
                 all_reduce: AllReduce | None = None, backend: str = "auto", group: str | None = None) -> None:
        super().__init__()
        tp = manifest["tp"]["degree"]
        if not 0 <= rank < tp:
            raise ValueError(f"rank {rank} outside the package's tensor-parallel group of {tp}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}: {', '.join(BACKENDS)}")
        if group is None:
            if len(manifest["groups"]) != 1:
                raise ValueError(f"the package's layers run different kernels ({', '.join(manifest['groups'])}): "
                                 "pass group= (weights.layer_group(manifest, layer))")
            group = next(iter(manifest["groups"]))
        self.manifest, self.runner, self.rank, self.backend, self.group = manifest, runner, rank, backend, group
        self.all_reduce = all_reduce if all_reduce is not None or tp == 1 else default_all_reduce()
        self.hidden_size = manifest["model"]["hidden_size"]
        self.intermediate_size = manifest["model"]["intermediate_size"]
        self.tensors = manifest["groups"][group]["tensors"]
        self.dtype = torch_dtype(manifest["activation_dtype"])
        ops = ops_for(runner)
        self.buckets = ops.buckets(group)
        self.programs = {tokens: ops.program(group, tokens, rank) for tokens in self.buckets}
        self.outputs = {tokens: ops.outputs[group, tokens] for tokens in self.buckets}
        #: The modules of every rank when they run in this process (:class:`.patch.EmulatedGroup`); else empty.
        self.peers: tuple[NmmcMLP, ...] = ()
        for key, spec in rank_operands(manifest, rank, group).items():
            info = self.tensors[spec["tensor"]]
            shape = list(info["shape"])  # 2-D, or an MX scale argument's [16, K/512, N]
            if "rows" in spec:
                shape[0] = spec["rows"][1] - spec["rows"][0]
            if "cols" in spec:
                shape[1] = spec["cols"][1] - spec["cols"][0]
            self.register_buffer(key, torch.zeros(shape, dtype=torch_dtype(info["dtype"])))

    def load(self, arguments: dict[str, torch.Tensor]) -> None:
        """Copy the rank's weight arguments (:func:`.weights.layer_arguments`) into the buffers."""
        for key, value in arguments.items():
            buffer = getattr(self, key)
            if tuple(buffer.shape) != tuple(value.shape) or buffer.dtype != value.dtype:
                raise ValueError(f"{key}: expected {tuple(buffer.shape)} {buffer.dtype}, got {tuple(value.shape)} "
                                 f"{value.dtype}")
            buffer.copy_(value)

    def bucket_for(self, tokens: int) -> int:
        """The smallest bucket that holds ``tokens`` rows (the largest when none does)."""
        return next((b for b in self.buckets if b >= tokens), self.buckets[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._mlp(x)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        if shape[-1] != self.hidden_size:
            raise ValueError(f"expected [..., {self.hidden_size}] activations, got {list(shape)}")
        device = x.device.type
        if (self.backend == "neuron" and device not in ("neuron", "xla")) or \
                (self.backend == "interpreter" and device != "cpu"):
            raise ValueError(f"backend {self.backend!r} given tensors on {device}: the operators dispatch on the "
                             "device (neuron: the NKI kernel, cpu: nmmc's interpreter)")
        rows = x.reshape(-1, self.hidden_size).to(self.dtype)
        buckets, chunks = split_rows(self.buckets, rows)
        outs = [self._run_bucket(bucket, chunk) for bucket, chunk in zip(buckets, chunks, strict=True)]
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out[:rows.shape[0]].to(dtype).reshape(shape)

    def _weight(self, key: str, name: str, op: KernelOp) -> torch.Tensor:
        return getattr(self, key)

    def _run_bucket(self, bucket: int, chunk: torch.Tensor) -> torch.Tensor:
        """Every rank's program of ``bucket`` (this module's alone, or all :attr:`peers`), kernel steps up to each
        collective, which sums the ranks' partials (emulated: in float32, rounded to their dtype, as a bf16
        all-reduce delivers them; else through :attr:`all_reduce`)."""
        ranks = self.peers or (self,)
        programs = [module.programs[bucket] for module in ranks]
        envs = [{"x": chunk} for _ in ranks]
        stops = [0] * len(ranks)
        while True:
            stops = [run_steps(program, env, module._weight, start)
                     for module, program, env, start in zip(ranks, programs, envs, stops, strict=True)]
            if len(set(stops)) != 1:
                raise RuntimeError(f"bucket {bucket}: the ranks' collectives are at different steps {stops}")
            if stops[0] == len(programs[0]):
                return envs[0][self.outputs[bucket]]
            parts = [env[program[stop][1]] for program, env, stop in zip(programs, envs, stops, strict=True)]
            if len(ranks) == 1:
                reduced = self.all_reduce(parts[0])
            else:
                reduced = sum(part.float() for part in parts).to(parts[0].dtype)
            for program, env, stop in zip(programs, envs, stops, strict=True):
                env[program[stop][2]] = reduced
            stops = [stop + 1 for stop in stops]


class NeuronNmmcMLP(NmmcMLP):
    """:class:`NmmcMLP` with NxD Inference's ``NeuronLlamaMLP`` signature (legacy: NxD Inference is in maintenance
    for trn1/inf2 only since Neuron 2.34, which ended it on trn2/trn3; use :class:`NmmcMLP` with TorchNeuron there).
    ``rmsnorm`` (the decoder layer's post-attention norm, passed when ``mlp_kernel_enabled`` fuses it) is applied
    before the kernels; ``residual`` (``mlp_kernel_fuse_residual_add``) is added first and returned, as NxD
    Inference's kernel does."""

    def forward(self, x: torch.Tensor, rmsnorm: nn.Module | None = None,  # type: ignore[override]
                residual: torch.Tensor | None = None, adapter_ids: Any = None) -> tuple[torch.Tensor, Any]:
        if adapter_ids is not None:
            raise ValueError("LoRA adapters are not supported by the exported MLP kernels")
        if residual is not None:
            x = x + residual
            residual = x
        if rmsnorm is not None:
            x = rmsnorm(x)
        return self._mlp(x), residual
