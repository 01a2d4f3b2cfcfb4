"""Calibrated compression end to end on a tiny randomly initialised Llama (no download): the NumPy
forward pass, Gram accumulation, whitened factors in the files, measured quality, joint ranks, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.numpy import save_file

from neuronmm_compiler.cli import main
from neuronmm_compiler.compression import compress_model, read_manifest
from neuronmm_compiler.compression.calibration import ACTIVATION_NAMES, calibrate, calibration_from_activations
from neuronmm_compiler.compression.forward import CausalLM, log_softmax
from neuronmm_compiler.compression.quality import evaluate, factored_mlp, original_predictions, spread_note, worst_share
from neuronmm_compiler.compression.whitening import whitened_svd
from neuronmm_compiler.compression.workflow import CompressRequest, load_factors, run_compress
from neuronmm_compiler.errors import InputError

HIDDEN, INTER, LAYERS, HEADS, KV, VOCAB = 64, 192, 2, 4, 2, 101


pytestmark = pytest.mark.usefixtures("one_blas_thread", "one_polish_start")  # tiny matrices (conftest.py)


def make_llama(root: Path, seed: int = 0, model_type: str = "llama") -> Path:
    """A tiny Llama/Qwen2/Qwen3 with random weights, stored as Hugging Face does."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    head_dim = HIDDEN // HEADS
    config = {"model_type": model_type, "hidden_size": HIDDEN, "intermediate_size": INTER,
              "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV,
              "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
              "torch_dtype": "float32", "_name_or_path": f"tiny-{model_type}"}
    (root / "config.json").write_text(json.dumps(config))

    def mat(out: int, inp: int) -> np.ndarray:
        # low-rank-ish plus noise so truncation at a small rank is meaningful
        return (rng.standard_normal((out, 8)) @ rng.standard_normal((8, inp)) / 8
                + 0.3 * rng.standard_normal((out, inp))).astype(np.float32) / np.sqrt(inp)

    t = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32),
         "model.norm.weight": np.ones(HIDDEN, np.float32)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
        t[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
        for name, out in (("q_proj", HEADS * head_dim), ("k_proj", KV * head_dim), ("v_proj", KV * head_dim)):
            t[f"{p}self_attn.{name}.weight"] = mat(out, HIDDEN)
            if model_type == "qwen2":
                t[f"{p}self_attn.{name}.bias"] = (0.1 * rng.standard_normal(out)).astype(np.float32)
        if model_type == "qwen3":
            t[p + "self_attn.q_norm.weight"] = np.ones(head_dim, np.float32)
            t[p + "self_attn.k_norm.weight"] = np.ones(head_dim, np.float32)
        t[p + "self_attn.o_proj.weight"] = mat(HIDDEN, HEADS * head_dim)
        t[p + "mlp.gate_proj.weight"] = 3 * mat(INTER, HIDDEN)
        t[p + "mlp.up_proj.weight"] = 3 * mat(INTER, HIDDEN)
        t[p + "mlp.down_proj.weight"] = 3 * mat(HIDDEN, INTER)
    save_file(t, str(root / "model.safetensors"))
    return root


def token_file(path: Path, count: int, seed: int) -> Path:
    np.save(path, np.random.default_rng(seed).integers(0, VOCAB, count))
    return path


def reference_logits(model_dir: Path, ids: np.ndarray) -> np.ndarray:
    """A float64 Llama forward pass written independently (loops over heads, explicit RoPE angles)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    with safe_open(str(model_dir / "model.safetensors"), framework="np") as f:
        w = {k: f.get_tensor(k).astype(np.float64) for k in f.keys()}  # noqa: SIM118
    d = HIDDEN // HEADS
    norm = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg["rms_norm_eps"]) * g  # noqa: E731
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, d, 2) / d)
    ang = np.arange(len(ids))[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(v):  # v [tokens, d]: pairs (i, i + d/2) rotated by the position's angle
        a, b = v[:, : d // 2], v[:, d // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=1)

    h = w["model.embed_tokens.weight"][ids]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        x = norm(h, w[p + "input_layernorm.weight"])
        q, k, v = (x @ w[f"{p}self_attn.{n}_proj.weight"].T for n in "qkv")
        heads = []
        for head in range(HEADS):
            kv = head // (HEADS // KV)
            qh, kh = rope(q[:, head * d:(head + 1) * d]), rope(k[:, kv * d:(kv + 1) * d])
            s = qh @ kh.T / np.sqrt(d) + np.triu(np.full((len(ids), len(ids)), -np.inf), 1)
            a = np.exp(s - s.max(1, keepdims=True))
            heads.append((a / a.sum(1, keepdims=True)) @ v[:, kv * d:(kv + 1) * d])
        h = h + np.concatenate(heads, 1) @ w[p + "self_attn.o_proj.weight"].T
        x = norm(h, w[p + "post_attention_layernorm.weight"])
        g, u = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    return norm(h, w["model.norm.weight"]) @ w["model.embed_tokens.weight"].T


def test_forward_pass_matches_an_independent_float64_reference(tmp_path):
    model_dir = make_llama(tmp_path / "m")
    ids = np.random.default_rng(1).integers(0, VOCAB, 37)
    ours = CausalLM(model_dir).forward(ids)
    ref = reference_logits(model_dir, ids)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=2e-4 * np.abs(ref).max())


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_variants_run_and_differ_from_llama(tmp_path, model_type):
    ids = np.arange(20) % VOCAB
    llama = CausalLM(make_llama(tmp_path / "l", model_type="llama")).forward(ids)
    other = CausalLM(make_llama(tmp_path / model_type, model_type=model_type)).forward(ids)
    assert np.isfinite(other).all() and not np.allclose(llama, other)


def test_gram_accumulation_equals_the_captured_activations(tmp_path):
    model_dir = make_llama(tmp_path / "m")
    model = CausalLM(model_dir)
    ids = np.random.default_rng(2).integers(0, VOCAB, 50)
    captured: dict[int, list] = {i: [] for i in range(LAYERS)}
    model.forward(ids[:32], observe=lambda layer, x, h: captured[layer].append((x, h)), logits=False)
    model.forward(ids[32:], observe=lambda layer, x, h: captured[layer].append((x, h)), logits=False)
    cal = calibrate(model, ids, source="test", length=32)
    assert cal.tokens == 50
    for layer in range(LAYERS):
        x = np.concatenate([c[0] for c in captured[layer]]).astype(np.float64)
        h = np.concatenate([c[1] for c in captured[layer]]).astype(np.float64)
        # each sequence's products are summed in float32 (batch_gram), the sequences in float64
        for got, want in ((cal.gram(layer, "gate"), x.T @ x), (cal.gram(layer, "down"), h.T @ h)):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
    # pre-captured activations give the same Grams; without down's input it is recomputed from x
    acts = {ACTIVATION_NAMES["input"].format(layer=i): np.concatenate([c[0] for c in captured[i]])
            for i in range(LAYERS)}
    save_file(acts, str(tmp_path / "acts.safetensors"))
    again = calibration_from_activations(tmp_path / "acts.safetensors", model_dir,
                                         inner_from=lambda layer, x: model.mlp(layer, x)[1])
    for layer in range(LAYERS):
        # h recomputed in float32 from all 50 tokens at once (the capture ran 32 + 18): float32 rounding of h, so
        # entries that nearly cancel may differ by ~1e-3 relatively; bounded against the Gram's scale instead
        expected = cal.gram(layer, "down")
        np.testing.assert_allclose(again.gram(layer, "down"), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_whitened_compression_writes_whitened_factors_and_beats_plain_svd(tmp_path):
    model_dir = make_llama(tmp_path / "m")
    model = CausalLM(model_dir)
    cal = calibrate(model, np.random.default_rng(3).integers(0, VOCAB, 256), source="test", length=64)
    manifest = compress_model(model_dir, tmp_path / "w", 0.5, align=16, calibration=cal)
    assert manifest.method == "whitened" and manifest.calibration["tokens"] == 256
    rank = manifest.ranks["gate"]
    expected = whitened_svd(model.mlp_weight(1, "up"), cal.gram(1, "up"), rank)
    factors = load_factors(tmp_path / "w", manifest)
    np.testing.assert_allclose(factors[1]["up"][0] @ factors[1]["up"][1], expected.u @ expected.v, atol=1e-5)
    plain = compress_model(model_dir, tmp_path / "p", 0.5, align=16)
    held_out = np.random.default_rng(4).integers(0, VOCAB, 128)
    original = original_predictions(model, held_out, length=64)
    q_white = evaluate(model, held_out, factored_mlp(factors), length=64, original=original)
    q_plain = evaluate(model, held_out, factored_mlp(load_factors(tmp_path / "p", plain)), length=64,
                       original=original)
    assert max(q_white.layer_errors) < max(q_plain.layer_errors)
    assert abs(q_white.ppl_increase) < abs(q_plain.ppl_increase)
    assert q_white.top1_agreement >= q_plain.top1_agreement
    # the perplexity is the real one: recompute it from the logits of the compressed model
    mlp = factored_mlp(factors)
    nll = []
    for start in (0, 64):
        chunk = held_out[start:start + 64]
        logp = log_softmax(model.forward(chunk, override=mlp).astype(np.float64))
        nll += list(-logp[np.arange(63), chunk[1:]])
    assert q_white.ppl_compressed == pytest.approx(np.exp(np.mean(nll)), rel=1e-4)
    # each sequence's own increase, from its own NLL before and after; with equal lengths their geometric
    # mean is the whole text's
    each = [np.exp(np.mean(nll[i * 63:(i + 1) * 63]) - original.sequence_nll[i]) - 1 for i in range(2)]
    np.testing.assert_allclose(q_white.sequence_increases, each, rtol=1e-4)
    assert np.exp(np.mean(np.log1p(q_white.sequence_increases))) - 1 == pytest.approx(q_white.ppl_increase, rel=1e-6)
    # the share of the rise the worst tenth of tokens carry, from each token's NLL under the original model
    before = []
    for start in (0, 64):
        chunk = held_out[start:start + 64]
        before += list(-log_softmax(model.forward(chunk).astype(np.float64))[np.arange(63), chunk[1:]])
    rise = np.array(nll) - np.array(before)
    assert rise.sum() > 0
    share = np.sort(rise)[-12:].sum() / rise.sum()  # 12 of 126 tokens
    assert q_white.worst_share == pytest.approx(share, rel=1e-3)
    offset = "; the other tokens improved, offsetting the rest" if share > 1 else ""
    assert spread_note(q_white.to_dict()) == (f"; its 2 sequences {min(each):+.1%} to {max(each):+.1%}; "
                                              f"10% of its tokens carry {share:.0%} of the rise{offset}")
    assert spread_note({"perplexity_increase_by_sequence": each[:1]}) == spread_note({}) == ""
    assert worst_share(np.array([1.0, -2.0])) is None and worst_share(np.array([0.5] * 5)) is None  # fell; too few
    assert worst_share(np.r_[np.full(10, 2.0), np.full(90, -0.1)]) == pytest.approx(20 / 11)  # the rest improved


def test_identical_factors_give_identical_quality(tmp_path):
    model_dir = make_llama(tmp_path / "m")
    model = CausalLM(model_dir)
    dense = {layer: {p: model.mlp_weight(layer, p) for p in ("gate", "up", "down")} for layer in range(LAYERS)}
    q = evaluate(model, np.arange(60) % VOCAB, factored_mlp(dense), length=30)
    assert q.ppl_compressed == pytest.approx(q.ppl_original, rel=1e-5) and q.top1_agreement == 1.0
    assert max(q.layer_errors) < 1e-6


def test_cli_calibrated_eval_and_warnings(tmp_path):
    model_dir = make_llama(tmp_path / "m")
    cal, ev = token_file(tmp_path / "cal.npy", 256, 5), token_file(tmp_path / "ev.npy", 128, 6)
    runner = CliRunner()
    result = runner.invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.3", "--align", "16",
                                  "--calibration", str(cal), "--eval", str(ev), "--sequence-length", "64",
                                  "--max-ppl-increase", "0", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "whitened (activation-aware) SVD" in result.output and "perplexity" in result.output
    assert "PERPLEXITY ROSE" in result.stderr  # any rise is over a 0% threshold
    manifest = read_manifest(tmp_path / "out")
    assert manifest.quality["tokens"] == 126 and len(manifest.quality["mlp_output_error"]) == LAYERS
    assert len(manifest.quality["perplexity_increase_by_sequence"]) == 2 and "its 2 sequences" in result.output
    share = manifest.quality["increase_share_of_worst_tenth_tokens"]  # one eval file: the overall record has it
    assert share > 0 and f"10% of its tokens carry {share:.0%} of the rise" in result.output
    plain = runner.invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.3", "--align", "16",
                                 "-o", str(tmp_path / "plain")])
    assert plain.exit_code == 0 and "plain SVD (no --calibration)" in plain.stderr
    far = runner.invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.05", "--align", "64",
                               "-o", str(tmp_path / "far")])
    assert far.exit_code == 0 and "kept fraction" in far.stderr and "requested keep ratio 0.05" in far.stderr


def test_cli_user_errors_are_one_line(tmp_path):
    model_dir = make_llama(tmp_path / "m")
    runner = CliRunner()
    cases = [
        (["--choose-ranks", "--tokens", "1"], "needs --calibration"),
        (["--choose-ranks", "--calibration", str(token_file(tmp_path / "c.npy", 64, 0))], "at least 256"),
        (["--calibration", str(tmp_path / "missing.txt")], "not found"),
        (["--eval", str(tmp_path / "x.npy")], "not found"),
        (["--calibration", str(tmp_path / "acts.safetensors")], "not found"),
        (["--calibration", str(tmp_path)], f"--calibration '{tmp_path}' is a directory, not a file"),
        (["--eval", str(tmp_path)], f"--eval '{tmp_path}' is a directory, not a file"),
    ]
    np.save(tmp_path / "floats.npy", np.ones(10))
    cases.append((["--calibration", str(tmp_path / "floats.npy")], "must be integers"))
    np.save(tmp_path / "oob.npy", np.array([0] * 299 + [VOCAB + 5]))
    cases.append((["--calibration", str(tmp_path / "oob.npy")], "vocabulary"))
    for extra, message in cases:
        result = runner.invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.5", "--align", "16", *extra,
                                      "-o", str(tmp_path / "o")])
        assert result.exit_code == 2, (extra, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("nmmc: error: ") and message in lines[0], lines


def test_joint_rank_choice_end_to_end(tmp_path):
    """Ranks chosen from the cost model's predictions; every layer's variant is on the menu, the chosen
    point is no slower and no less accurate (proxy) than uniform ranks, and the manifest records it."""
    from neuronmm_compiler.targets import get_target

    model_dir = make_llama(tmp_path / "m")
    token_file(tmp_path / "cal.npy", 256, 7)
    request = CompressRequest(model_dir=str(model_dir), out_dir=str(tmp_path / "j"), keep_ratio=0.3, align=32,
                              calibration=str(tmp_path / "cal.npy"), sequence_length=64, choose_ranks=True,
                              buckets=(1,), target=get_target("trn1"))
    result = run_compress(request)
    record = result.manifest.rank_choice
    assert record["chosen"]["predicted_us"] <= record["uniform"]["predicted_us"] + 1e-9
    assert record["chosen"]["loss"] <= record["uniform"]["loss"] * (1 + 1e-9)
    front = [p["predicted_us"] for p in record["front"]]
    assert front == sorted(front)
    again = read_manifest(tmp_path / "j")
    assert again.rank_choice == record and len(again.layer_ranks()) == LAYERS
    # this tiny MLP at one token: the SVD MLP is predicted slower than dense, so every layer stays dense, and
    # the run says so (it wrote the original weights back) with the reason
    assert all(r["gate"] is None for r in again.layer_ranks())
    said = [w for w in result.warnings if "kept every layer dense" in w]
    assert len(said) == 1 and "original weights" in said[0]
    assert "predicted slower than the fused dense MLP at token bucket 1 on trn1" in said[0]
    with pytest.raises(InputError, match="no choice of ranks"):
        run_compress(CompressRequest(**{**request.__dict__, "choose_ranks": False, "target_speedup": 1e6,
                                        "out_dir": str(tmp_path / "k")}))


def test_text_calibration_uses_the_models_tokenizer(tmp_path):
    """Text is tokenized with the model's tokenizer.json (a word-level one here) and gives the same
    Grams as its token ids passed as .npy."""
    pytest.importorskip("tokenizers")
    from neuronmm_compiler.compression.calibration import load_tokens

    model_dir = make_llama(tmp_path / "m")
    words = [f"w{i}" for i in range(VOCAB - 1)]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    (model_dir / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}))
    rng = np.random.default_rng(8)
    ids = rng.integers(1, VOCAB, 150)
    (tmp_path / "cal.txt").write_text(" ".join(words[i - 1] for i in ids) + " unknownword")
    loaded = load_tokens(tmp_path / "cal.txt", model_dir)
    np.testing.assert_array_equal(loaded, np.concatenate([ids, [0]]))
    np.save(tmp_path / "cal.npy", loaded)
    model = CausalLM(model_dir)
    a = calibrate(model, load_tokens(tmp_path / "cal.txt", model_dir, limit=100), source="t", length=50)
    b = calibrate(model, load_tokens(tmp_path / "cal.npy", model_dir, limit=100), source="n", length=50)
    assert a.tokens == 100 and a.digest() == b.digest()
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(InputError, match="no tokenizer"):
        load_tokens(tmp_path / "cal.txt", model_dir)


def test_svd_accuracy_takes_model_directories_and_reports_bad_names_in_one_line(tmp_path, capsys):
    from neuronmm_compiler.compression import svd_accuracy

    model_dir = make_llama(tmp_path / "m")
    svd_accuracy.main(["--models", str(model_dir), "--keep-ratio", "0.5"])
    out = capsys.readouterr().out
    assert "tiny-llama" in out and "(real, layer 1 W)" in out and f"{HIDDEN}x{INTER}" in out
    with pytest.raises(SystemExit) as exit_info:
        svd_accuracy.main(["--models", str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("svd_accuracy: error: unknown model")


def test_compress_progress_names_its_stages(tmp_path):
    model_dir = make_llama(tmp_path / "m")
    token_file(tmp_path / "cal.npy", 256, 9)
    result = CliRunner().invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.5", "--align", "16",
                                       "--calibration", str(tmp_path / "cal.npy"), "--sequence-length", "64",
                                       "--progress", "-o", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "calibrating" in result.stderr and "factoring" in result.stderr
    assert "trial" not in result.stderr and "no fit yet" not in result.stderr


def test_report_of_a_compress_output(tmp_path):
    from neuronmm_compiler.targets import get_target

    model_dir = make_llama(tmp_path / "m")
    token_file(tmp_path / "cal.npy", 256, 10)
    token_file(tmp_path / "ev.npy", 64, 11)
    joint = run_compress(CompressRequest(model_dir=str(model_dir), out_dir=str(tmp_path / "j"), keep_ratio=0.3,
                                         align=32, calibration=str(tmp_path / "cal.npy"), eval=str(tmp_path / "ev.npy"),
                                         sequence_length=64, choose_ranks=True, buckets=(1,),
                                         target=get_target("trn1")))
    from neuronmm_compiler.compression.rank_choice import BUDGET_NOT_APPLIED

    assert BUDGET_NOT_APPLIED in joint.warnings  # bf16 --tokens: the proxy choice does not spend the budget
    result = CliRunner().invoke(main, ["report", str(tmp_path / "j"), "-o", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    summary = (tmp_path / "rep" / "summary.md").read_text()
    assert "cost-model prediction" in summary and "measured on 63 held-out tokens" in summary
    assert "typically within x" in summary and "published trn1 measurements" in summary  # the model's error
    assert (tmp_path / "rep" / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    missing = CliRunner().invoke(main, ["report", str(tmp_path), "-o", str(tmp_path / "rep2")])
    assert missing.exit_code == 2 and "manifest not found" in missing.stderr


def test_layer_costs_interpolate_the_measured_nll_increases(tmp_path):
    from neuronmm_compiler.compression.calibration import sequences
    from neuronmm_compiler.compression.rank_choice import variants
    from neuronmm_compiler.compression.sensitivity import _interpolate, mean_nll, scaled_losses

    model = CausalLM(make_llama(tmp_path / "m"))
    ids = np.random.default_rng(12).integers(0, VOCAB, 256)
    cal = calibrate(model, ids, source="t", length=64)
    options = variants(HIDDEN, INTER, 16)
    chunks = sequences(ids[:128], 64)
    raw, none, _ = scaled_losses(model, cal, options, 1e-4, None)
    assert none.shape == (LAYERS, 0)
    costs, measured, _ = scaled_losses(model, cal, options, 1e-4, chunks, [(32, 32)])
    assert measured.shape == (LAYERS, 2)  # the smallest ranks (16, 16) and the reference
    # recompute layer 1's increase at (32, 32) by hand: only its MLP replaced by the whitened factors
    factors = {p: whitened_svd(model.mlp_weight(1, p), cal.gram(1, p), 32) for p in ("gate", "up", "down")}
    mlp = factored_mlp({1: {p: (f.u, f.v) for p, f in factors.items()}})
    delta = mean_nll(model, chunks, lambda layer, x: mlp(layer, x) if layer == 1 else None) - mean_nll(model, chunks)
    assert measured[1, 1] == pytest.approx(delta, rel=1e-5, abs=1e-9)
    for layer in range(LAYERS):
        assert costs[layer][0] == 0.0  # dense costs nothing
        for j, point in enumerate([(16, 16), (32, 32)]):
            assert costs[layer][options.index(point)] == pytest.approx(max(measured[layer, j], 0.0), abs=1e-9) or \
                measured[layer].max() > measured[layer, j]  # made non-decreasing in the loss
        order = np.argsort(raw[layer])
        assert np.all(np.diff(costs[layer][order]) >= -1e-12)  # more loss never predicts less damage
    np.testing.assert_allclose(_interpolate(np.array([0.0, 1.0, 2.0, 4.0]), [(2.0, 1.0), (1.0, 3.0)]),
                               [0.0, 3.0, 3.0, 3.0])
    np.testing.assert_allclose(_interpolate(np.array([0.5, 3.0]), [(1.0, 1.0), (2.0, 3.0)]), [0.5, 5.0])


def test_tune_model_quotes_the_measured_perplexity_change_next_to_its_speedups(tmp_path):
    """An SVD MLP's speedup over dense is a lossy approximation against exact kernels: tune --model on a
    compress output measured with --eval says so with the measured perplexity change (issue 28)."""
    model_dir = make_llama(tmp_path / "m")
    cal, ev = token_file(tmp_path / "cal.npy", 256, 5), token_file(tmp_path / "ev.npy", 128, 6)
    runner = CliRunner()
    compressed = runner.invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.5", "--align", "16",
                                      "--calibration", str(cal), "--eval", str(ev), "--sequence-length", "64",
                                      "-o", str(tmp_path / "out")])
    assert compressed.exit_code == 0, compressed.output
    q = read_manifest(tmp_path / "out").quality
    tuned = runner.invoke(main, ["tune", "--model", str(tmp_path / "out"), "--tokens", "1", "--trials", "3",
                                 "-o", str(tmp_path / "k")])
    assert tuned.exit_code == 0, tuned.output
    assert (f"speedups over the dense MLPs: the SVD changes the model's outputs: measured perplexity "
            f"{q['perplexity_original']:.2f} -> {q['perplexity_compressed']:.2f} ({q['perplexity_increase']:+.1%})"
            in tuned.output)
    assert json.loads((tmp_path / "k" / "index.json").read_text())["quality"] == q
