"""``nmmc compress --choose-ranks --dtype bf16,fp8,mxfp8,mxfp4`` (the joint per-layer format choice on trn3), one MX
format with ``--choose-ranks``, and MX with ``--tp``, on tiny random Llamas whose MLP the MX kernel takes (hidden and
intermediate 512: dense MX candidates exist, SVD ranks of 128 do not)."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from neuronmm_compiler.cli import main
from neuronmm_compiler.compression import read_manifest
from neuronmm_compiler.compression.compress_steps import compressed_mlp
from neuronmm_compiler.compression.format_choice import (
    at_least_as_accurate,
    candidates,
    cost_record,
    measured_format_choice,
    supported,
    unsupported_notes,
    useful_candidates,
)
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.mx_layers import mx_layer, mx_mlp, mx_sharded_mlp, mx_weight
from neuronmm_compiler.compression.quality import evaluate as measure
from neuronmm_compiler.compression.workflow import CompressRequest, run_compress
from neuronmm_compiler.targets import get_target

pytestmark = pytest.mark.usefixtures("one_blas_thread", "one_polish_start")  # small matrices (conftest.py)
VOCAB, HEADS, KV = 64, 4, 2
ALL = ("bfloat16", "float8_e4m3", "mxfp8_e4m3", "mxfp4")


def _llama(root: Path, hidden: int, inter: int, layers: int = 2, seed: int = 0) -> Path:
    """A random Llama of the given MLP shape, stored as Hugging Face does."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    head = hidden // HEADS
    (root / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": True, "torch_dtype": "float32", "_name_or_path": "tiny-mx"}))

    def mat(out: int, inp: int, scale: float = 1.0) -> np.ndarray:
        low = rng.standard_normal((out, 16)) @ rng.standard_normal((16, inp)) / 4  # a low-rank part SVD keeps
        return (scale * (low + 0.3 * rng.standard_normal((out, inp))) / np.sqrt(inp)).astype(np.float32)

    t = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, hidden)).astype(np.float32),
         "model.norm.weight": np.ones(hidden, np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(hidden, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
        for name, out in (("q_proj", hidden), ("k_proj", KV * head), ("v_proj", KV * head)):
            t[f"{p}self_attn.{name}.weight"] = mat(out, hidden)
        t[p + "self_attn.o_proj.weight"] = mat(hidden, hidden)
        t[p + "mlp.gate_proj.weight"] = mat(inter, hidden, 3)
        t[p + "mlp.up_proj.weight"] = mat(inter, hidden, 3)
        t[p + "mlp.down_proj.weight"] = mat(hidden, inter, 3)
    save_file(t, str(root / "model.safetensors"))
    return root


def _tokens(path: Path, count: int, seed: int) -> Path:
    np.save(path, np.random.default_rng(seed).integers(0, VOCAB, count))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("joint")
    return (_llama(root / "m", 512, 512, layers=1), _tokens(root / "cal.npy", 512, 1), _tokens(root / "ev.npy", 128, 2),
            root)


def test_the_orderings_claimed_by_construction_hold_element_by_element():
    """MXFP8 E4M3 rounds every weight at least as close as MXFP4 (E2M1's scaled grid lies in E4M3's), bf16 at least as
    close as any MX format; FP8 with per-channel scales is not ordered against bf16 that way, so it is not claimed."""
    w = np.random.default_rng(0).standard_normal((512, 64)).astype(np.float32) * np.float32(0.05)
    err = {e: np.abs(mx_weight(w, e) - w) for e in ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn")}
    bf16 = np.abs(w.astype(ml_dtypes.bfloat16).astype(np.float32) - w)
    assert np.all(err["float8_e4m3fn"] <= err["float4_e2m1fn"]) and err["float8_e4m3fn"].sum() < err[
        "float4_e2m1fn"].sum() / 2
    assert all(np.all(bf16 <= e) for e in err.values())
    assert not np.all(err["float8_e5m2"] <= err["float8_e4m3fn"])  # e5m2 vs e4m3: not ordered, measured
    assert at_least_as_accurate((256, "mxfp8_e4m3"), (128, "mxfp4"))
    assert at_least_as_accurate((128, "bfloat16"), (128, "mxfp4"))
    assert not at_least_as_accurate((128, "mxfp4"), (128, "mxfp8_e4m3"))
    assert not at_least_as_accurate((None, "mxfp8_e5m2"), (None, "mxfp4"))
    assert not at_least_as_accurate((None, "bfloat16"), (None, "float8_e4m3"))  # measured, not assumed
    assert not at_least_as_accurate((None, "float8_e4m3"), (None, "mxfp4"))


def test_unsupported_mx_shapes_are_dropped_with_one_note_per_format():
    options = candidates(512, 512, 128, ALL)
    assert options[0] == (None, "bfloat16") and len(options) == 8  # dense and rank 128, four formats each
    kept, dropped = supported(512, 512, options)
    assert {(d["rank"], d["format"]) for d in dropped} == {(128, "mxfp8_e4m3"), (128, "mxfp4")}
    assert (None, "mxfp4") in kept and (128, "float8_e4m3") in kept
    notes = unsupported_notes(dropped)
    assert len(notes) == 2 and all("rank 128" in n and "128 is not a multiple of 512" in n for n in notes)
    smol = supported(576, 1536, candidates(576, 1536, 128, ALL))  # SmolLM2-135M: no MX candidate at all
    assert not any(c[1].startswith("mx") for c in smol[0]) and len(unsupported_notes(smol[1])) == 2
    assert all("576 is not a multiple of 512" in d["reason"] for d in smol[1])


def test_dominance_among_mx_formats_follows_the_claims():
    options = [(None, "bfloat16"), (None, "float8_e4m3"), (None, "mxfp8_e4m3"), (None, "mxfp4")]
    cost = dict(zip(options, (10.0, 6.0, 5.0, 5.0), strict=True))
    kept, dropped = useful_candidates(options, cost)  # mxfp4 costs no less than mxfp8 e4m3, which refines it
    assert kept == [(None, "float8_e4m3"), (None, "mxfp8_e4m3")] and dropped == {(None, "mxfp4"): (None, "mxfp8_e4m3")}
    cost[(None, "mxfp4")] = 4.0
    assert useful_candidates(options, cost)[0] == options[1:]  # cheaper: measured


def _factor(model):
    def factor(layer, proj, rank):
        u, s, vt = np.linalg.svd(model.mlp_weight(layer, proj), full_matrices=False)
        return u[:, :rank] * s[:rank], vt[:rank]
    return factor


def test_the_choice_takes_mx_where_cheaper_and_within_budget_and_refuses_over_it(tiny):
    """Priced as at decode (dense MXFP4 the cheapest kernel), the greedy takes MXFP4 where it measures within the
    budget; with no budget at all, it takes nothing that changes the model."""
    model_dir, cal, _, _ = tiny
    model = CausalLM(model_dir)
    ids = np.load(cal)[:128]
    options, _ = supported(512, 512, candidates(512, 512, 128, ALL))
    cost = {c: 10.0 for c in options}
    cost.update({(None, "float8_e4m3"): 7.0, (None, "mxfp8_e4m3"): 6.0, (None, "mxfp4"): 4.0, (128, "bfloat16"): 8.0})
    chosen = measured_format_choice(model, ids, 0.5, _factor(model), ALL, length=64, align=128,
                                    costs=cost_record(options, cost, "us"))
    assert chosen.formats[0] in ("mxfp4", "mxfp8_e4m3") and chosen.choice == [None]
    assert all(s["ppl_increase"] <= 0.5 for s in chosen.steps if s["accepted"])
    assert {(s["rank"], s["format"]) for s in chosen.steps} <= {(None, "mxfp4"), (None, "mxfp8_e4m3"),
                                                                (None, "float8_e4m3"), (128, "bfloat16")}
    none = measured_format_choice(model, ids, -1.0, _factor(model), ALL, length=64, align=128,
                                  costs=cost_record(options, cost, "us"))
    assert none.formats == ["bfloat16"] and none.steps and not any(s["accepted"] for s in none.steps)


def test_joint_choice_end_to_end_writes_each_layers_format_within_the_measured_budget(tiny):
    model_dir, cal, ev, root = tiny
    out = root / "joint"
    notes: list[str] = []
    result = run_compress(CompressRequest(str(model_dir), str(out), 0.8, dtype="bf16,fp8,mxfp8,mxfp4",
                                          calibration=str(cal), eval=str(ev), sequence_length=64, choose_ranks=True,
                                          max_ppl_increase=0.2, target=get_target("trn3"), threads=1),
                          note=notes.append)
    assert sum("candidates dropped before measuring" in n for n in notes) == 2  # rank 128 mxfp8, mxfp4
    chosen = result.measured_choice
    assert chosen.formats == ["mxfp4"]  # by weight bytes MX pays; the eval check backed off the SVD FP8 step
    assert chosen.eval_check["kept_steps"] < chosen.eval_check["accepted_steps"]
    manifest = read_manifest(out)
    assert manifest.layer_formats() == chosen.formats
    assert [layer.mx for layer in manifest.layers] == [f if f.startswith("mx") else None for f in chosen.formats]
    assert manifest.mx is not None and manifest.mx["layers"] == [i for i, f in enumerate(chosen.formats)
                                                                 if f.startswith("mx")]
    assert manifest.rank_choice["cost"]["formats"] == list(ALL) and len(manifest.rank_choice["cost"]["unsupported"])
    assert manifest.quality["perplexity_increase"] <= 0.2  # the budget, measured on the eval file
    q = measure(CausalLM(model_dir), np.load(ev), compressed_mlp(out, manifest), length=64, per_layer=False)
    assert q.ppl_compressed == pytest.approx(manifest.quality["perplexity_compressed"], rel=1e-6)
    from neuronmm_compiler.compression.measured_choice import front_lines

    lines = front_lines(chosen)
    assert any("{dense, SVD} x {bf16, float8_e4m3, mxfp8_e4m3, mxfp4}" in line for line in lines)
    assert any(line.strip().startswith("all 1 layers:") and "saved" in line for line in lines)


def _compress(*args: str):
    return CliRunner().invoke(main, ["compress", *args, "--sequence-length", "64", "--threads", "1"])


def test_mx_candidates_are_refused_off_trn3_and_lists_need_choose_ranks(tiny):
    model_dir, cal, _, root = tiny
    base = [str(model_dir), "--keep-ratio", "0.8", "--calibration", str(cal)]
    for extra, says in ((["--dtype", "bf16,mxfp4", "--choose-ranks", "--target", "trn2"], "NKI-MX-TARGET"),
                        (["--dtype", "mxfp8", "--choose-ranks"], "trn2 is NeuronCore-v3"),
                        (["--dtype", "bf16,mxfp4"], "chosen among per layer by --choose-ranks"),
                        (["--dtype", "fp8,fp8_e5m2", "--choose-ranks", "--target", "trn3"], "one FP8 format")):
        out = root / "refused"
        run = _compress(*base, *extra, "-o", str(out))
        assert run.exit_code == 2 and says in run.output, run.output
        assert len(run.output.strip().splitlines()) == 1 and not out.exists()  # before any work


def test_mx_with_tp_keeps_blocks_whole_or_is_refused(tmp_path):
    """--tp 2 of intermediate 512 splits a 512-position MX tile (refused, with the reason); of 1024 it does not, and
    the sharded model is measured as each rank's MX kernel computes its blocks."""
    cal, ev = _tokens(tmp_path / "cal.npy", 1024, 1), _tokens(tmp_path / "ev.npy", 64, 2)
    narrow = _llama(tmp_path / "narrow", 512, 512, layers=1)
    run = _compress(str(narrow), "--keep-ratio", "0.8", "--dtype", "mxfp4", "--tp", "2", "-o", str(tmp_path / "n"))
    assert run.exit_code == 2 and "split at column 256" in run.output and "multiples of 512" in run.output, run.output
    wide = _llama(tmp_path / "wide", 512, 1024, layers=1)
    run = _compress(str(wide), "--keep-ratio", "0.8", "--dtype", "mxfp4", "--tp", "2", "--calibration", str(cal),
                    "--eval", str(ev), "-o", str(tmp_path / "w"))
    assert run.exit_code == 0, run.output
    sharded = read_manifest(tmp_path / "w").quality["tensor_parallel"]
    assert "MX layers as each rank's MX kernel computes" in sharded["method"]
    assert sharded["perplexity_compressed"] != pytest.approx(sharded["perplexity_original"], rel=1e-4)


def test_mx_shards_of_whole_tiles_compute_the_unsharded_layer():
    """Dense MX layer split over 2 ranks at a tile boundary: the blocks are the unsharded layer's, so the sum of the
    ranks' outputs is the unsharded kernel's up to the bf16 rounding of the partial outputs."""
    rng = np.random.default_rng(3)
    w = {"gate": rng.standard_normal((512, 1024)) * 0.05, "up": rng.standard_normal((512, 1024)) * 0.05,
         "down": rng.standard_normal((1024, 512)) * 0.05}

    class Model:
        def mlp_weight(self, layer, proj):
            return w[proj].astype(np.float32)

    x = rng.standard_normal((8, 512)).astype(np.float32)
    whole = mx_mlp(mx_layer({p: Model().mlp_weight(0, p) for p in w}, "mxfp4"), x)
    split = mx_sharded_mlp(Model(), {}, [(0, 512), (512, 1024)], {0: "mxfp4"}, lambda layer, v: v)(0, x)
    rel = np.linalg.norm(split - whole) / np.linalg.norm(whole)
    assert 0 < rel < 1e-2  # bf16 partial sums, no other difference
