"""The MLP module that runs this package's kernels in place of a model's gated MLP.

``forward`` flattens ``[..., hidden]`` to tokens, pads them with zero rows to the smallest bucket that holds them
(more tokens than the largest bucket: chunks of the largest), runs the bucket's steps for this module's rank
(kernels launched by :mod:`.backend`, the tensor-parallel collective through the ``all_reduce`` it was given),
slices the padding off and restores the shape and dtype. The kernel branch is fixed per bucket by the static
token count, as NxD Inference fixes its own MLP kernel's branch per bucket.

:class:`NmmcMLP` has the forward signature of Hugging Face's ``LlamaMLP``/``Qwen3MLP`` (``forward(x) -> y``);
:class:`NeuronNmmcMLP` that of NxD Inference's ``NeuronLlamaMLP`` (``forward(x, rmsnorm=None, residual=None,
adapter_ids=None) -> (y, residual)``), which its Llama and Qwen3 decoder layers call.

Part of a package written by ``nmmc export``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .backend import KernelRunner, choose, torch_dtype
from .weights import operand_key, rank_operands

AllReduce = Callable[[torch.Tensor], torch.Tensor]


def default_all_reduce() -> AllReduce:
    """NxD's ``reduce_from_tensor_model_parallel_region`` (the all-reduce NxD Inference's MLP runs after its
    kernel), when neuronx-distributed is installed; else an error naming what to pass."""
    try:
        from neuronx_distributed.parallel_layers.mappings import reduce_from_tensor_model_parallel_region
    except ImportError:
        def missing(tensor: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("this bucket's plan all-reduces across tensor-parallel ranks: pass all_reduce= (NxD's "
                               "reduce_from_tensor_model_parallel_region is used when neuronx-distributed is "
                               "installed)")
        return missing
    return reduce_from_tensor_model_parallel_region


class NmmcMLP(nn.Module):
    """One rank's share of a gated MLP, computed by the exported kernels of one layer group (``group``: its name in
    the manifest; :func:`.weights.layer_group` gives a layer's; None: the package's only group). The weight
    arguments are buffers named by :func:`.weights.operand_key`, each in its manifest dtype (FP8 weights as
    ``torch.float8_e4m3fn``, their scales float32; fill them with :meth:`load`); the activations are cast to the
    manifest's ``activation_dtype``. ``backend``: ``auto`` (nki.jit for tensors on a Neuron device, nmmc's
    interpreter on the CPU), ``neuron`` or ``interpreter``."""

    def __init__(self, manifest: dict[str, Any], runner: KernelRunner, *, rank: int = 0,
                 all_reduce: AllReduce | None = None, backend: str = "auto", group: str | None = None) -> None:
        super().__init__()
        tp = manifest["tp"]["degree"]
        if not 0 <= rank < tp:
            raise ValueError(f"rank {rank} outside the package's tensor-parallel group of {tp}")
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
        self.buckets = sorted(manifest["groups"][group]["buckets"], key=lambda b: b["tokens"])
        self.dtype = torch_dtype(manifest["activation_dtype"])
        for key, spec in rank_operands(manifest, rank, group).items():
            info = self.tensors[spec["tensor"]]
            shape = info["shape"]
            rows = spec["rows"][1] - spec["rows"][0] if "rows" in spec else shape[0]
            cols = spec["cols"][1] - spec["cols"][0] if "cols" in spec else shape[1]
            self.register_buffer(key, torch.zeros(rows, cols, dtype=torch_dtype(info["dtype"])))

    def load(self, arguments: dict[str, torch.Tensor]) -> None:
        """Copy the rank's weight arguments (:func:`.weights.layer_arguments`) into the buffers."""
        for key, value in arguments.items():
            buffer = getattr(self, key)
            if tuple(buffer.shape) != tuple(value.shape) or buffer.dtype != value.dtype:
                raise ValueError(f"{key}: expected {tuple(buffer.shape)} {buffer.dtype}, got {tuple(value.shape)} "
                                 f"{value.dtype}")
            buffer.copy_(value)

    def bucket_for(self, tokens: int) -> dict[str, Any]:
        """The smallest bucket that holds ``tokens`` rows (the largest when none does)."""
        for bucket in self.buckets:
            if bucket["tokens"] >= tokens:
                return bucket
        return self.buckets[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        if shape[-1] != self.hidden_size:
            raise ValueError(f"expected [..., {self.hidden_size}] activations, got {list(shape)}")
        tokens = x.reshape(-1, self.hidden_size).to(self.dtype)
        outputs, start = [], 0
        while start < tokens.shape[0] or not outputs:
            bucket = self.bucket_for(tokens.shape[0] - start)
            rows = tokens[start:start + bucket["tokens"]]
            outputs.append(self._run_bucket(bucket, rows)[:rows.shape[0]])
            start += bucket["tokens"]
        return torch.cat(outputs).to(dtype).reshape(shape)

    def _run_bucket(self, bucket: dict[str, Any], rows: torch.Tensor) -> torch.Tensor:
        padded = rows.new_zeros(bucket["tokens"], self.hidden_size)
        padded[:rows.shape[0]] = rows
        backend = choose(self.backend, padded)
        env: dict[str, torch.Tensor] = {"x": padded}
        for step in bucket["ranks"][self.rank]["steps"]:
            if "collective" in step:
                assert step["collective"] == "all_reduce" and self.all_reduce is not None
                env[step["result"]] = self.all_reduce(env[step["tensor"]])
                continue
            args = {name: self._operand(env, spec) for name, spec in step["args"].items()}
            results = self.runner.run(bucket["kernels"][step["kernel"]], args, backend)
            for name, tensor in step["outputs"].items():
                env[tensor] = results[name]
        return env[bucket["output"]]

    def _operand(self, env: dict[str, torch.Tensor], spec: dict[str, Any]) -> torch.Tensor:
        if spec["tensor"] in self.tensors:
            return getattr(self, operand_key(spec))
        value = env[spec["tensor"]]
        if "rows" in spec:
            value = value[spec["rows"][0]:spec["rows"][1]]
        if "cols" in spec:
            value = value[:, spec["cols"][0]:spec["cols"][1]]
        return value.contiguous()


class NeuronNmmcMLP(NmmcMLP):
    """:class:`NmmcMLP` with NxD Inference's ``NeuronLlamaMLP`` signature. ``rmsnorm`` (the decoder layer's
    post-attention norm, passed when ``mlp_kernel_enabled`` fuses it) is applied before the kernels; ``residual``
    (``mlp_kernel_fuse_residual_add``) is added first and returned, as NxD Inference's kernel does."""

    def forward(self, x: torch.Tensor, rmsnorm: nn.Module | None = None,  # type: ignore[override]
                residual: torch.Tensor | None = None, adapter_ids: Any = None) -> tuple[torch.Tensor, Any]:
        if adapter_ids is not None:
            raise ValueError("LoRA adapters are not supported by the exported MLP kernels")
        if residual is not None:
            x = x + residual
            residual = x
        if rmsnorm is not None:
            x = rmsnorm(x)
        return super().forward(x), residual
