#!/usr/bin/env python3
"""From a model to a patched PyTorch model running nmmc's fused SVD MLP kernels, end to end, on the CPU.

1. Writes a tiny Llama model as a Hugging Face checkpoint (config.json + model.safetensors, weights stored as
   Hugging Face stores them: [out_features, in_features]); its MLP weights have a decaying spectrum, as trained
   weights have.
2. Compresses its MLPs: ``nmmc compress MODEL --keep-ratio 0.8 -o FACTORS`` (here through the API).
3. Exports the kernels as a package: ``nmmc export FACTORS --tokens 8,32 --target trn2 -o PKG`` (LNC=2, the nki
   dialect, the launch NxD Inference uses: ``kernel[2](...)``), and verifies every kernel in it
   (``nmmc verify PKG``).
4. Imports the package, loads the model in PyTorch (the package's ``llama.py``: Hugging Face's module names, no
   transformers needed), replaces its MLPs with ``PKG.patch(model, FACTORS)`` and compares the logits with the
   unpatched model's, and with the unpatched model whose MLP weights are the factors' products (what the kernels
   compute; the difference is then the kernels' bf16 rounding alone).

On the CPU the package runs its kernels in nmmc's interpreter; on a Trainium host, the same package runs them
through ``nki.jit`` (docs/integration.md). Needs the ``torch`` extra: ``pip install 'nmmc[torch]'``.

Usage: python examples/svd_mlp_end_to_end.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from neuronmm_compiler.compression import compress_model, factor_names, layer_file
from neuronmm_compiler.export import ExportRequest, export_model
from neuronmm_compiler.export.verify import verify_dir
from neuronmm_compiler.targets import get_target, with_launch

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 768,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32", "tie_word_embeddings": False,
          "_name_or_path": "tiny-llama-example"}


def write_tiny_model(model_dir: Path, seed: int = 0) -> None:
    """A random Llama checkpoint whose MLP weights have a decaying singular spectrum."""
    import torch
    from safetensors.torch import save_file

    from neuronmm_compiler.export.runtime.llama import LlamaForCausalLM

    model_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    state = {k: v.detach().contiguous() for k, v in LlamaForCausalLM(CONFIG).state_dict().items()}
    rng = np.random.default_rng(seed)
    hidden, inter = CONFIG["hidden_size"], CONFIG["intermediate_size"]
    for layer in range(CONFIG["num_hidden_layers"]):
        for proj, (out_f, in_f) in {"gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter)}.items():
            rank = min(out_f, in_f)
            left, _ = np.linalg.qr(rng.standard_normal((out_f, rank)))
            right, _ = np.linalg.qr(rng.standard_normal((in_f, rank)))
            weight = (left * np.exp(-np.arange(rank) / 24.0)) @ right.T / np.sqrt(in_f) * 64
            state[f"model.layers.{layer}.mlp.{proj}_proj.weight"] = torch.from_numpy(weight.astype(np.float32))
    (model_dir / "config.json").write_text(json.dumps(CONFIG, indent=2))
    save_file(state, str(model_dir / "model.safetensors"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    import torch

    from neuronmm_compiler.export.runtime.llama import LlamaForCausalLM

    torch.set_num_threads(1)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="nmmc-example-"))
    model, factors, package = work / "model", work / "factors", work / "nmmc_tiny_llama"
    write_tiny_model(model)
    manifest = compress_model(model, factors, keep_ratio=0.8)
    print(f"compressed: ranks {manifest.ranks}, kept {manifest.kept_fraction:.3f} of the MLP parameters")

    target = with_launch(get_target("trn2:lnc=2"), "in-graph")  # trn2 default LNC=2; inside a model graph
    exported = export_model(ExportRequest(model=str(factors), buckets=(8, 32), target=target, dialect="nki",
                                          trials=30), package)
    for bucket in next(iter(exported["groups"].values()))["buckets"]:  # one group: every layer has the same ranks
        print(f"bucket {bucket['tokens']:>3} tokens: {bucket['predicted']['total_us']:.1f} us predicted, launch "
              f"{exported['launch']['call']}")
    report = verify_dir(package)
    print("\n".join(report.lines(str(package))))

    # How the factor files map onto the kernels' arguments (the package's weights.py does this per rank):
    u_name, v_name = factor_names(0, "gate")
    print(f"layer 0: {layer_file(0)} {u_name} -> u_gate, {v_name} -> v_gate (no transpose: [in, r] and [r, out])")

    sys.path.insert(0, str(package.parent))
    pkg = importlib.import_module(package.name)
    reference = LlamaForCausalLM.from_pretrained(model)
    svd_reference = LlamaForCausalLM.from_pretrained(model)
    from safetensors.torch import load_file

    for layer, block in enumerate(svd_reference.model.layers):
        stored = load_file(str(factors / layer_file(layer)))
        for proj in ("gate", "up", "down"):
            u, v = (stored[name].double() for name in factor_names(layer, proj))
            getattr(block.mlp, f"{proj}_proj").weight.data = (u @ v).T.float().contiguous()
    patched = LlamaForCausalLM.from_pretrained(model)
    print(f"patched layers {pkg.patch(patched, factors)} with {type(patched.model.layers[0].mlp).__name__}")
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))  # 18 tokens
    with torch.no_grad():
        dense, svd, got = reference(ids), svd_reference(ids), patched(ids)
    kernel_error = ((got - svd).abs().max() / svd.abs().max()).item()
    truncation = ((svd - dense).abs().max() / dense.abs().max()).item()
    total = ((got - dense).abs().max() / dense.abs().max()).item()
    print(f"logits, max error relative to their largest: patched vs SVD model {kernel_error:.2e} (the kernels' "
          f"bf16 rounding); SVD vs dense model {truncation:.2e} (the rank truncation); patched vs dense {total:.2e}")
    ok = report.ok and kernel_error < 2e-2 and total <= truncation + 2e-2
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
