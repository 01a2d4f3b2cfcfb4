"""Short fine-tuning runs (``--heal finetune``'s distillation) from the rank-384 closed form, for choosing
its settings (issue 27); perplexity measured with the torch forward pass on the heal study's texts.

    python benchmarks/finetune_sweep.py MODEL_DIR --texts WORK/texts [--steps 40 --lr 1e-5 --dtype float32]
        [--extra samples.npy --extra-tokens N] [--json runs.jsonl]

``WORK/texts`` is what ``benchmarks/compression.py --heal-study --work WORK`` wrote (docs-cal, man,
samples.npy, docs-eval, licences, code, changelogs). The first run computes the calibration (2048
tokens each of docs, man pages and model samples), whitened SVD and the closed form with the prior at
rank 384, as the heal study does, and caches them in ``--cache``; later runs reuse them. Each run
prints the KL every 10 steps, wall and CPU seconds, peak RSS, and the perplexity of the result on the
first 1024 tokens of each evaluation text (sequences of 512, as the heal study; the torch pass gives
the NumPy pass's figures for the whitened and closed-form factors to 0.01); ``--eval-slices K`` measures
the first K consecutive 1024-token slices, each and together (the first slice alone is not representative:
benchmarks/results/compression-runs.md, "Seventh run"). ``--length`` and ``--batch`` set the fine-tuning sequences.
"""

from __future__ import annotations

import argparse
import pickle
import resource
import time
from pathlib import Path

import numpy as np

from neuronmm_compiler.compression.calibration import calibrate, load_tokens
from neuronmm_compiler.compression.finetune import FinetuneSettings, finetune_heal, import_torch
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.heal import DEFAULT_HEAL_DAMPING, closed_form_heal
from neuronmm_compiler.compression.torch_lm import TorchLM
from neuronmm_compiler.compression.whitening import DEFAULT_DAMPING
from neuronmm_compiler.compression.workflow import whitened_factors

EVALS = {"docs": "docs-eval.txt", "licences": "licences.txt", "code": "code.txt", "changelogs": "changelogs.txt"}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def starting_points(model, texts: Path, cache: Path, rank: int) -> dict:
    if cache.is_file():
        with open(cache, "rb") as f:
            return pickle.load(f)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        ids = np.concatenate([load_tokens(texts / f, model.model_dir, 2048)
                              for f in ("docs-cal.txt", "man.txt", "samples.npy")])
        cal = calibrate(model, ids, source="docs+man+samples", length=512)
        plan = [{"gate": rank, "up": rank, "down": rank}] * model.arch.num_hidden_layers
        white = whitened_factors(model, cal, plan, DEFAULT_DAMPING)
        healed = closed_form_heal(model, ids, white, length=512, damping=DEFAULT_HEAL_DAMPING, prior=cal.grams,
                                  prior_weight=1.0)[0]
    out = {"ids": ids, "white": white, "healed": healed}
    with open(cache, "wb") as f:
        pickle.dump(out, f)
    return out


def perplexities(lm, torch, evals: dict, factors, slice_tokens: int = 1024, top1: dict | None = None
                 ) -> dict[str, list[float]]:
    """Per text, the perplexity of each consecutive ``slice_tokens`` slice (sequences of 512). ``top1``: per text,
    a list that gets each predicted position's most likely token (for the top-1 agreement with the original)."""
    silu = torch.nn.functional.silu

    def mlp(layer, x):
        f = factors[layer]

        def proj(p, inp):
            return (inp @ torch.from_numpy(f[p][0])) @ torch.from_numpy(f[p][1]) if isinstance(f[p], tuple) \
                else inp @ torch.from_numpy(f[p])
        return proj("down", silu(proj("gate", x)) * proj("up", x))

    out = {}
    with torch.no_grad():
        for name, ids in evals.items():
            out[name] = []
            for start in range(0, len(ids), slice_tokens):
                nll, count = 0.0, 0
                for i in range(start, min(start + slice_tokens, len(ids)), 512):  # slice_tokens: a multiple of 512
                    chunk = ids[i:i + 512]
                    if len(chunk) < 2:
                        continue
                    logits = lm.logits(torch.from_numpy(chunk[None].astype(np.int64)), None if factors is None else mlp)
                    logp = torch.log_softmax(logits[0], -1)[:-1]
                    if top1 is not None:
                        top1.setdefault(name, []).append(logp.argmax(-1).numpy())
                    nll -= float(logp.gather(-1, torch.from_numpy(chunk[1:, None].astype(np.int64))).sum())
                    count += len(chunk) - 1
                out[name].append(float(np.exp(nll / count)))
    return out


def overall(slices: list[float]) -> float:
    """The perplexity of equal-sized slices together (geometric mean)."""
    return float(np.exp(np.mean(np.log(slices))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--texts", required=True)
    ap.add_argument("--cache", default="/tmp/nmmc-finetune-sweep-start.pkl")
    ap.add_argument("--rank", type=int, default=384)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--length", type=int, default=FinetuneSettings.length, help="tokens per fine-tuning sequence")
    ap.add_argument("--batch", type=int, default=FinetuneSettings.batch, help="sequences per step")
    ap.add_argument("--layer-weight", type=float, default=0.0)
    ap.add_argument("--label-weight", type=float, default=FinetuneSettings.label_weight,
                    help="weight of the data's own next-token cross-entropy beside the KL (0: distillation alone)")
    ap.add_argument("--top-k", type=int, default=FinetuneSettings.top_k, help="teacher log-probs kept per token")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--extra", default=None, metavar="IDS.npy",
                    help="more distillation tokens (e.g. samples from the model), after the calibration's")
    ap.add_argument("--extra-tokens", type=int, default=None, help="use this many of --extra's tokens")
    ap.add_argument("--json", default=None, help="append the run's settings and perplexities here (JSON lines)")
    ap.add_argument("--eval-start", action="store_true", help="also measure the whitened and closed-form factors")
    ap.add_argument("--start-dir", default=None, metavar="OUT",
                    help="start from the factors of this compress output (e.g. a closed form on more tokens) "
                         "instead of the cached closed form")
    ap.add_argument("--ids", action="append", default=None, metavar="FILE[:N]",
                    help="distillation tokens (text or .npy; first N), repeatable; replaces the cached calibration")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--eval-slices", type=int, default=1,
                    help="measure this many consecutive 1024-token slices of each text, each and together")
    a = ap.parse_args()
    torch = import_torch()
    torch.set_num_threads(a.threads)
    texts = Path(a.texts)
    model = CausalLM(a.model_dir)
    lm = TorchLM(model, torch)
    start = starting_points(model, texts, Path(a.cache), a.rank) if a.start_dir is None or a.ids is None else {}
    if a.start_dir is not None:
        from neuronmm_compiler.compression.compress_steps import load_factors
        from neuronmm_compiler.compression.manifest import read_manifest

        start["healed"] = load_factors(a.start_dir, read_manifest(Path(a.start_dir) / "manifest.json"))
    if a.ids:
        parts = [spec.rsplit(":", 1) if ":" in spec else (spec, None) for spec in a.ids]
        start["ids"] = np.concatenate([load_tokens(f, a.model_dir, None if n is None else int(n)) for f, n in parts])
    evals = {n: load_tokens(texts / f, a.model_dir, 1024 * a.eval_slices) for n, f in EVALS.items()}
    original_top1: dict[str, list] = {}
    original = perplexities(lm, torch, evals, None, top1=original_top1)
    agreements: dict[str, dict[str, float]] = {}

    def show(tag: str, factors) -> dict[str, float]:
        top1: dict[str, list] = {}
        slices = perplexities(lm, torch, evals, factors, top1=top1)
        ppl = {n: overall(v) for n, v in slices.items()}
        agreements[tag] = {n: float(np.mean(np.concatenate(top1[n]) == np.concatenate(original_top1[n])))
                           for n in top1}
        print(tag, " ".join(f"{n} {v:.2f} ({v / overall(original[n]) - 1:+.1%})" for n, v in ppl.items()), flush=True)
        print("  top-1 agreement with the original:", " ".join(f"{n} {v:.3f}" for n, v in agreements[tag].items()),
              flush=True)
        if a.eval_slices > 1:
            for n, v in slices.items():
                pairs = zip(v, original[n], strict=True)
                print(f"  {n} by slice:", " ".join(f"{p:.2f} ({p / o - 1:+.1%})" for p, o in pairs), flush=True)
        return ppl

    print("original", " ".join(f"{n} {overall(v):.2f}" for n, v in original.items()), flush=True)
    if a.eval_start:
        if "white" in start:  # not with --start-dir and --ids: the cached starting points were not made
            show("whitened", start["white"])
        show("closed-form", start["healed"])
    ids = start["ids"]
    if a.extra:
        extra = np.load(a.extra)[:a.extra_tokens]
        ids = np.concatenate([ids, extra])
        print(f"distillation tokens: {start['ids'].size} calibration + {extra.size} from {a.extra}", flush=True)
    settings = FinetuneSettings(steps=a.steps, learning_rate=a.lr, warmup=a.warmup, layer_weight=a.layer_weight,
                                label_weight=a.label_weight,
                                top_k=a.top_k, length=a.length, batch=a.batch,
                                dtype=a.dtype, samples=0, threads=a.threads, checkpoint_seconds=1e9)  # data: --extra
    t0, c0 = time.time(), _cpu()

    def on_step(step: int, steps: int, kl: float) -> None:
        if step % 10 == 0 or step <= 2:
            print(f"  step {step} KL {kl:.4f} wall {time.time() - t0:.0f} cpu {_cpu() - c0:.0f}", flush=True)
    tuned, record = finetune_heal(model, ids, start["healed"], settings=settings, on_step=on_step)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    wall, cpu = time.time() - t0, _cpu() - c0
    print(f"done: {settings}: wall {wall:.0f} s, CPU {cpu:.0f} s, peak RSS {peak:.0f} MiB "
          f"(process); KL first {record['kl_first']:.4f}, mean of the last 10 {record['kl_last_10']:.4f}", flush=True)
    ppl = show("tuned", tuned)
    if a.json:
        import json

        with open(a.json, "a") as f:
            f.write(json.dumps({"settings": {**vars(a)}, "distill_tokens": int(ids.size), "wall_s": round(wall),
                                "cpu_s": round(cpu), "peak_mib": round(peak), "kl_first": record["kl_first"],
                                "kl_last_10": record["kl_last_10"], "perplexity": ppl,
                                "top1_agreement": agreements["tuned"], "original_slices": original,
                                "original": {n: overall(v) for n, v in original.items()}}) + "\n")


if __name__ == "__main__":
    main()
