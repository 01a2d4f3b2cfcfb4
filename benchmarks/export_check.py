#!/usr/bin/env python3
"""An exported package patched into a real model on the CPU (nmmc's interpreter), against nmmc's NumPy emulation of
the same kernels and against the unpatched model: what tests/test_export_fp8.py checks on a two-layer toy, on a real
checkpoint (too slow for the suite: every MLP call of every layer runs in the interpreter).

``--dtype fp8`` (default): a dense FP8 export of MODEL (weights quantized per output channel on the fly, static
activation scales calibrated on ``--calibration`` token ids through the unpatched model), one bucket. Printed:
perplexity on ``--eval`` of the unpatched model, nmmc's FP8 emulation (compression/formats.py, what ``nmmc compress
--eval`` measures), the same emulation with every MLP input perturbed by a relative 1e-6 (how sensitive the FP8
model is to the last bits: an accumulation-order difference is of that size), and the patched model; the largest
logit difference of the patched model from each (of the largest logit) and top-1 agreement; per layer (a few), the
kernel's output against the emulation's on the same inputs. ``--compressed DIR``: also export an ``nmmc compress``
output (its per-layer formats and ranks: one kernel group each) and logit-match it against the model whose MLPs are
that output as ``nmmc compress --eval`` computes them; ``--tp N`` exports it at that degree (every rank's module in
one process, all-reduced as ``emulate_tp=True`` does: FP8 SVD layers then run replicate-u/reduce-rank, which differs
from the single-core FP8 emulation by the bf16 rounding of h U_down before its quantization), ``--only-compressed``
skips the dense FP8 check. Usage:

  python benchmarks/export_check.py MODEL_DIR --calibration ids.npy --eval text.txt [--compressed DIR [--tp N]]
      [--only-compressed] [--json F]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from neuronmm_compiler.compression import read_manifest
from neuronmm_compiler.compression.compress_steps import compressed_mlp
from neuronmm_compiler.compression.formats import Fp8Layer, emulated_mlp, reduce_rank_mlp
from neuronmm_compiler.compression.fp8_files import read_fp8_layer
from neuronmm_compiler.driver import compile_workload
from neuronmm_compiler.export import ExportRequest, export_model
from neuronmm_compiler.export.runtime.llama import LlamaForCausalLM
from neuronmm_compiler.export.verify import verify_export
from neuronmm_compiler.ir.quantized import quantize_weight
from neuronmm_compiler.targets import get_target, with_launch

FMT = "float8_e4m3"


class Emulated(torch.nn.Module):
    """A layer's MLP as ``mlp(layer, rows)`` computes it, on the bf16 rows the exported module hands its kernel
    (``eps``: each input element first multiplied by 1 + eps * N(0, 1))."""

    def __init__(self, mlp, layer: int, eps: float = 0.0):
        super().__init__()
        self.mlp, self.layer, self.eps, self.rng = mlp, layer, eps, np.random.default_rng(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float().numpy()
        if self.eps:
            rows = (rows * (1 + self.eps * self.rng.standard_normal(rows.shape))).astype(np.float32)
        rows = torch.from_numpy(rows).to(torch.bfloat16).float().numpy()
        return torch.from_numpy(np.asarray(self.mlp(self.layer, rows), np.float32)).reshape(x.shape)


def _tokens(path: Path, model: Path, count: int) -> torch.Tensor:
    if path.suffix == ".npy":
        ids = np.load(path)[:count]
    else:
        from tokenizers import Tokenizer

        ids = np.array(Tokenizer.from_file(str(model / "tokenizer.json")).encode(path.read_text()).ids[:count])
    return torch.from_numpy(ids.astype(np.int64))


def _import(package: Path):
    sys.path.insert(0, str(package.parent))
    return importlib.import_module(package.name)


def _export(model: str, out: Path, bucket: int, dtype: str | None, trials: int, tp: int = 1) -> float:
    target = with_launch(get_target("trn2:lnc=2"), "in-graph")
    kernel_fn = None if trials else (lambda w: compile_workload(w, target=target, dialect="nki"))
    start = time.time()
    export_model(ExportRequest(model=model, buckets=(bucket,), target=target, dialect="nki", dtype=dtype, tp=tp,
                               trials=max(trials, 1)), out, kernel_fn=kernel_fn)
    return time.time() - start


def _nll(logits: torch.Tensor, ids: torch.Tensor) -> float:
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             ids[:, 1:].reshape(-1)).item()


def _compare(name: str, got: torch.Tensor, other: torch.Tensor, scale: float) -> dict:
    return {f"max_logit_error_vs_{name}": (got - other).abs().max().item() / scale,
            f"top1_vs_{name}": (got.argmax(-1) == other.argmax(-1)).float().mean().item()}


def fp8_check(model: Path, work: Path, cal: torch.Tensor, ev: torch.Tensor, bucket: int, trials: int) -> dict:
    out: dict = {"export_s": _export(str(model), work / "nmmc_fp8", bucket, FMT, trials)}
    pkg = _import(work / "nmmc_fp8")
    ref = LlamaForCausalLM.from_pretrained(model)
    logits = {"unpatched": ref(ev)}
    scales = pkg.fp8.calibrate(ref, cal, FMT)
    inputs: dict[int, torch.Tensor] = {}
    layers = sorted({0, 1, len(ref.model.layers) // 2, len(ref.model.layers) - 1})
    hooks = [ref.model.layers[i].mlp.register_forward_pre_hook(
        lambda _m, a, i=i: inputs.__setitem__(i, a[0].reshape(-1, a[0].shape[-1]).clone())) for i in layers]
    ref(ev[:1])
    for hook in hooks:
        hook.remove()
    fp8 = {i: Fp8Layer(FMT, {p: quantize_weight(getattr(b.mlp, f"{p}_proj").weight.detach().t().numpy(), FMT)
                             for p in ("gate", "up", "down")}, scales[i]) for i, b in enumerate(ref.model.layers)}
    mlp = emulated_mlp({}, fp8=fp8)
    out["per_layer_kernel_vs_emulation"] = {}
    for i in layers:
        rows = inputs[i].to(torch.bfloat16).float()
        kernel = pkg.mlp(model, i, activation_scales=scales, backend="interpreter")(rows).double().numpy()
        emulation = np.asarray(mlp(i, rows.numpy()), np.float64)
        out["per_layer_kernel_vs_emulation"][i] = float(np.linalg.norm(kernel - emulation) / np.linalg.norm(emulation))
    patched = LlamaForCausalLM.from_pretrained(model)
    pkg.patch(patched, model, activation_scales=scales, backend="interpreter")
    start = time.time()
    logits["patched"] = patched(ev)
    out["patched_forward_s"] = time.time() - start
    del patched
    for eps, name in ((0.0, "emulation"), (1e-6, "emulation_perturbed")):
        for i, block in enumerate(ref.model.layers):
            block.mlp = Emulated(mlp, i, eps)
        logits[name] = ref(ev)
    scale = logits["unpatched"].abs().max().item()
    out["perplexity"] = {k: float(np.exp(_nll(v, ev))) for k, v in logits.items()}
    for name in ("unpatched", "emulation", "emulation_perturbed"):
        out.update(_compare(name, logits["patched"], logits[name], scale))
    out.update({f"emulation_{k}": v for k, v in _compare(
        "emulation_perturbed", logits["emulation"], logits["emulation_perturbed"], scale).items()})
    return out


def compressed_check(model: Path, compressed: Path, work: Path, ev: torch.Tensor, bucket: int, trials: int,
                     tp: int = 1) -> dict:
    package = work / "nmmc_compressed"
    out: dict = {"tp": tp, "export_s": _export(str(compressed), package, bucket, None, trials, tp)}
    manifest = json.loads((package / "manifest.json").read_text())
    out["groups"] = {name: g["layers"] for name, g in manifest["groups"].items()}
    out["strategies"] = {name: [b["strategy"] for b in g["buckets"]] for name, g in manifest["groups"].items()}
    report = verify_export(package)
    out["verify"] = {item.path: item.rel_error for item in report.items}
    out["verify_ok"] = report.ok
    pkg = _import(package)
    reference = LlamaForCausalLM.from_pretrained(model)
    mlp = compressed_mlp(compressed, read_manifest(compressed))  # as nmmc compress --eval computes it
    for i, block in enumerate(reference.model.layers):
        block.mlp = Emulated(mlp, i)
    expected = reference(ev)
    del reference
    patched = LlamaForCausalLM.from_pretrained(model)
    pkg.patch(patched, compressed, backend="interpreter", emulate_tp=tp > 1)
    start = time.time()
    got = patched(ev)
    out["patched_forward_s"] = time.time() - start
    out["perplexity"] = {"compress_eval_forward": float(np.exp(_nll(expected, ev))),
                         "patched": float(np.exp(_nll(got, ev)))}
    out.update(_compare("compress_eval_forward", got, expected, expected.abs().max().item()))
    if tp > 1:  # the FP8 SVD layers as their reduce-rank ranks compute them (the others as compress --eval does)
        out.update(_tp_emulation(model, compressed, manifest, mlp, ev, got))
        out["per_layer_ranks_vs_reduce_rank_emulation"] = _tp_layers(pkg, model, compressed, manifest, ev, tp)
    return out


def _tp_layers(pkg, model: Path, compressed: Path, manifest: dict, ev: torch.Tensor, tp: int) -> dict[int, float]:
    """A few FP8 SVD layers' rank modules all-reduced (``EmulatedGroup``) against :func:`reduce_rank_mlp` on the same
    bf16 rows (the layer's inputs in the unpatched model): relative error of the output."""
    group_of = importlib.import_module(f"{pkg.__name__}.patch").EmulatedGroup
    ref = LlamaForCausalLM.from_pretrained(model)
    count = len(ref.model.layers)
    layers = [i for i in sorted({0, count // 2, count - 1}) if manifest["groups"][manifest["layers"][i]]["mlp"] == "svd"
              and manifest["groups"][manifest["layers"][i]]["weights_dtype"].startswith("float8")]
    inputs: dict[int, torch.Tensor] = {}
    hooks = [ref.model.layers[i].mlp.register_forward_pre_hook(
        lambda _m, a, i=i: inputs.__setitem__(i, a[0].reshape(-1, a[0].shape[-1]).clone())) for i in layers]
    ref(ev[:1])
    for hook in hooks:
        hook.remove()
    out = {}
    for i in layers:
        group = manifest["groups"][manifest["layers"][i]]
        spans = [(s["start"], s["stop"]) for s in group["buckets"][0]["intermediate_shards"]]
        fp8 = read_fp8_layer(compressed / f"layer_{i:03d}.safetensors", i, group["ranks"], group["weights_dtype"])[0]
        rows = inputs[i].to(torch.bfloat16).float()
        modules = group_of([pkg.mlp(compressed, i, rank=r, backend="interpreter") for r in range(tp)])
        kernel = modules(rows).double().numpy()
        emulation = np.asarray(reduce_rank_mlp({i: fp8}, spans)(i, rows.numpy()), np.float64)
        out[i] = float(np.linalg.norm(kernel - emulation) / np.linalg.norm(emulation))
    return out


def _tp_emulation(model: Path, compressed: Path, manifest: dict, mlp, ev: torch.Tensor, got: torch.Tensor) -> dict:
    ranks_of = {layer: g["ranks"] for g in manifest["groups"].values() for layer in g["layers"]
                if g["mlp"] == "svd" and g["weights_dtype"].startswith("float8")}
    shards = {layer: [(s["start"], s["stop"]) for s in g["buckets"][0]["intermediate_shards"]]
              for g in manifest["groups"].values() for layer in g["layers"]}
    fp8 = {layer: read_fp8_layer(compressed / f"layer_{layer:03d}.safetensors", layer, ranks,
                                 manifest["groups"][manifest["layers"][layer]]["weights_dtype"])[0]
           for layer, ranks in ranks_of.items()}
    split = {layer: reduce_rank_mlp({layer: f}, shards[layer]) for layer, f in fp8.items()}
    reference = LlamaForCausalLM.from_pretrained(model)
    for i, block in enumerate(reference.model.layers):
        block.mlp = Emulated(split.get(i, mlp), i)
    expected = reference(ev)
    return {"perplexity_reduce_rank_emulation": float(np.exp(_nll(expected, ev))),
            **_compare("reduce_rank_emulation", got, expected, expected.abs().max().item())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--calibration", type=Path, required=True, help="token ids (.npy) or text")
    parser.add_argument("--eval", type=Path, required=True, help="token ids (.npy) or text")
    parser.add_argument("--bucket", type=int, default=128, help="the one token bucket (= eval sequence length)")
    parser.add_argument("--calibration-tokens", type=int, default=512)
    parser.add_argument("--eval-sequences", type=int, default=2)
    parser.add_argument("--trials", type=int, default=20, help="search trials per kernel (0: default schedule)")
    parser.add_argument("--compressed", type=Path, default=None, help="an nmmc compress output of MODEL")
    parser.add_argument("--tp", type=int, default=1, help="--compressed: the export's tensor-parallel degree")
    parser.add_argument("--only-compressed", action="store_true", help="skip the dense FP8 export check")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cal = _tokens(args.calibration, args.model, args.calibration_tokens).reshape(-1, args.bucket)
    ev = _tokens(args.eval, args.model, args.eval_sequences * args.bucket).reshape(args.eval_sequences, args.bucket)
    result: dict = {"model": str(args.model), "bucket": args.bucket, "calibration_tokens": int(cal.numel()),
                    "eval_tokens": int(ev.numel())}
    with torch.no_grad(), threadpool_limits(1), tempfile.TemporaryDirectory() as tmp:
        if not args.only_compressed:
            result["fp8"] = fp8_check(args.model, Path(tmp), cal, ev, args.bucket, args.trials)
            print(json.dumps(result["fp8"], indent=1), flush=True)
        if args.compressed is not None:
            result["compressed"] = compressed_check(args.model, args.compressed, Path(tmp), ev, args.bucket,
                                                    args.trials, args.tp)
            print(json.dumps(result["compressed"], indent=1), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
