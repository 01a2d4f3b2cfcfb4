#!/usr/bin/env python3
"""From a model to a running fused kernel, end to end, on the CPU.

1. Writes a tiny random Llama-style model (config.json + model.safetensors, weights stored as
   Hugging Face stores them: [out_features, in_features]) with a decaying spectrum, like trained
   weights have.
2. Compresses its MLPs: ``nmmc compress MODEL --keep-ratio 0.8 -o FACTORS`` (here through the API).
3. Tunes the fused SVD MLP kernel for a token bucket: ``nmmc tune --model FACTORS --tokens 8 -o KERNELS``.
4. Maps layer 0's factor tensors onto the kernel's arguments and runs the emitted kernel file in
   nmmc's interpreter; compares with the dense MLP in float64.

How the factor files map onto the MLP: for layer i and projection p in (gate, up, down), the layer
file ``layer_{i:03d}.safetensors`` holds ``model.layers.{i}.mlp.{p}_proj.u`` [in, r] and ``.v``
[r, out], with ``x @ u @ v ~= x @ W`` for ``W = weight.T``. The kernel's arguments are named
``x, u_gate, v_gate, u_up, v_up, u_down, v_down`` (see the kernel file's header and index.json).

On a Trainium host with AWS's ``nki`` package, the same file runs as it is: import it and call the
kernel (``svd_mlp_k0``, or ``svd_mlp_k0`` then ``svd_mlp_k1`` for a split MLP) with device
tensors in the same order; ``nki.simulate`` runs it in AWS's simulator.

Usage: python examples/svd_mlp_end_to_end.py [--workdir DIR] [--tokens 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

from neuronmm_compiler.interpreter import run_kernel
from neuronmm_compiler.model_tuning import resolve_model, tune_model
from neuronmm_compiler.models import compress_model, factor_names, layer_file
from neuronmm_compiler.targets import get_target

HIDDEN, INTERMEDIATE, LAYERS = 256, 768, 2


def write_tiny_model(model_dir: Path, seed: int = 0) -> None:
    """A random Llama-style model whose MLP weights have a decaying singular spectrum."""
    rng = np.random.default_rng(seed)
    model_dir.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN,
              "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "torch_dtype": "float32",
              "_name_or_path": "tiny-llama-example"}
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {}
    for layer in range(LAYERS):
        for proj, (out_f, in_f) in {"gate": (INTERMEDIATE, HIDDEN), "up": (INTERMEDIATE, HIDDEN),
                                    "down": (HIDDEN, INTERMEDIATE)}.items():
            rank = min(out_f, in_f)
            left, _ = np.linalg.qr(rng.standard_normal((out_f, rank)))
            right, _ = np.linalg.qr(rng.standard_normal((in_f, rank)))
            spectrum = np.exp(-np.arange(rank) / 24.0)
            weight = (left * spectrum) @ right.T / np.sqrt(in_f) * 8
            tensors[f"model.layers.{layer}.mlp.{proj}_proj.weight"] = weight.astype(np.float32)
    save_file(tensors, str(model_dir / "model.safetensors"))


def dense_mlp(x: np.ndarray, weights: dict[str, np.ndarray], layer: int) -> np.ndarray:
    w = {p: weights[f"model.layers.{layer}.mlp.{p}_proj.weight"].astype(np.float64).T for p in ("gate", "up", "down")}
    gate, up = x @ w["gate"], x @ w["up"]
    return (gate / (1.0 + np.exp(-gate)) * up) @ w["down"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="nmmc-example-"))
    model, factors, kernels = work / "model", work / "factors", work / "kernels"
    write_tiny_model(model)
    manifest = compress_model(model, factors, keep_ratio=0.8)
    print(f"compressed: ranks {manifest.ranks}, kept {manifest.kept_fraction:.3f} of the MLP parameters")

    source = resolve_model(factors, None)  # ranks from the manifest
    index = tune_model(source, [args.tokens], kernels, target=get_target("trn1"), dialect="nki", trials=30, seed=0)
    entry = index["buckets"][0]
    print(f"tuned {entry['file']}: predicted {entry['predicted_us']:.1f} us, "
          f"{entry['speedup_vs_baseline']:.2f}x vs dense, {entry['speedup_vs_unfused']:.2f}x vs unfused SVD")

    layer = 0
    stored = load_file(str(factors / layer_file(layer)))
    args_by_name: dict[str, np.ndarray] = {}
    for proj in ("gate", "up", "down"):
        u_name, v_name = factor_names(layer, proj)
        args_by_name[f"u_{proj}"] = stored[u_name].astype(ml_dtypes.bfloat16)
        args_by_name[f"v_{proj}"] = stored[v_name].astype(ml_dtypes.bfloat16)
    x = np.random.default_rng(1).standard_normal((args.tokens, HIDDEN)).astype(ml_dtypes.bfloat16)
    args_by_name["x"] = x
    source_text = (kernels / entry["file"]).read_text()
    tensors = dict(args_by_name)
    for kernel in entry["kernels"]:  # one kernel, or two for a split MLP (h^T handed over by name)
        run = run_kernel(source_text, filename=entry["file"], kernel_name=kernel["name"],
                         args=[tensors[name] for name in kernel["inputs"]], target=get_target("trn1"),
                         arg_names=kernel["inputs"], output_names=kernel["outputs"])
        tensors.update(zip(kernel["outputs"], run.outputs, strict=True))
    out = np.asarray(tensors["out"], dtype=np.float64)

    weights = load_file(str(model / "model.safetensors"))
    exact = dense_mlp(np.asarray(x, dtype=np.float64), weights, layer)
    svd64 = {p: np.asarray(args_by_name[f"u_{p}"], np.float64) @ np.asarray(args_by_name[f"v_{p}"], np.float64)
             for p in ("gate", "up", "down")}
    gate, up = np.asarray(x, np.float64) @ svd64["gate"], np.asarray(x, np.float64) @ svd64["up"]
    truncated = (gate / (1.0 + np.exp(-gate)) * up) @ svd64["down"]
    norm = np.linalg.norm(exact)
    truncation = np.linalg.norm(truncated - exact) / norm
    kernel_vs_svd = np.linalg.norm(out - truncated) / np.linalg.norm(truncated)
    kernel_vs_dense = np.linalg.norm(out - exact) / norm
    print(f"relative error vs the dense MLP: {kernel_vs_dense:.4f} (rank truncation alone: {truncation:.4f}; "
          f"kernel vs the SVD MLP in float64: {kernel_vs_svd:.4f})")
    ok = kernel_vs_svd < 3e-2 and kernel_vs_dense <= truncation + 3e-2
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
