"""``nmmc compress --dtype fp8`` on a tiny random Llama: the NumPy emulation is the FP8 kernel's graph, the layer files
hold what docs/compression.md says (FP8 bytes readable as float8_e4m3fn too), --eval measures the emulation, and
``--choose-ranks`` records the per-layer formats it chose."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors import safe_open

from neuronmm_compiler.cli import main
from neuronmm_compiler.compression import read_manifest
from neuronmm_compiler.compression.compress_steps import compressed_mlp
from neuronmm_compiler.compression.formats import activation_points, emulated_mlp, fp8_layer, traced_mlp
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.quality import evaluate as measure
from neuronmm_compiler.compression.workflow import CompressRequest, run_compress
from neuronmm_compiler.frontends.shapes import Fp8Weights, mlp_graph
from neuronmm_compiler.ir.evaluate import evaluate
from neuronmm_compiler.ir.quantized import calibrate, unquantized
from neuronmm_compiler.passes.quantize_fp8 import quantize_fp8
from test_compress_calibrated import make_llama, token_file

pytestmark = pytest.mark.usefixtures("one_blas_thread", "one_polish_start")  # tiny matrices (conftest.py)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    return make_llama(root / "m"), token_file(root / "cal.npy", 256, 1), token_file(root / "ev.npy", 128, 2), root


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


@pytest.mark.parametrize("ranks", [None, (32, 32, 48)])
def test_emulation_is_the_fp8_kernels_graph(ranks):
    """The forward's FP8 MLP equals the float64 evaluation of the FP8 graph the kernels are verified against (scales
    calibrated the same way), up to its bf16 output; it is far from the unquantized graph."""
    rng = np.random.default_rng(0)
    graph = quantize_fp8(mlp_graph(16, 64, 192, ranks, fp8=Fp8Weights()))
    plain = unquantized(graph)
    inputs = {n.name: (rng.standard_normal(n.shape) * (1.0 if n.name == "x" else 0.1)).astype(np.float32)
              for n in plain.inputs()}
    want, exact = evaluate(graph, calibrate(graph, inputs))["out"], evaluate(plain, inputs)["out"]
    f = {p: inputs[f"w_{p}"] if ranks is None else (inputs[f"u_{p}"], inputs[f"v_{p}"]) for p in ("gate", "up", "down")}
    ranges: dict[str, float] = {}
    traced_mlp(f, inputs["x"], lambda p, v: ranges.__setitem__(p, float(np.max(np.abs(v)))))
    assert sorted(ranges) == sorted(activation_points(f))
    got = emulated_mlp({0: f}, fp8={0: fp8_layer(f, ranges, "float8_e4m3")})(0, inputs["x"])
    assert _rel(got, want) < 4e-3  # the bf16 output rounding (2^-9) and fp32 accumulation
    assert _rel(got, exact) > 3e-2  # e4m3's 3 mantissa bits: the check above can fail
    assert _rel(emulated_mlp({0: f})(0, inputs["x"]), exact) < 1e-2  # bf16


def test_fp8_values_up_to_240_have_the_same_bits_in_e4m3fn():
    bits = np.arange(256, dtype=np.uint8)
    ieee, fn = bits.view(ml_dtypes.float8_e4m3).astype(np.float64), bits.view(ml_dtypes.float8_e4m3fn).astype(float)
    finite = np.isfinite(ieee) & (np.abs(ieee) <= 240)
    assert finite.sum() == 240 and np.array_equal(ieee[finite], fn[finite])


def test_compress_dtype_fp8_files_manifest_eval_and_resume(tiny):
    model_dir, cal, ev, root = tiny
    out = root / "out"
    args = ["compress", str(model_dir), "--keep-ratio", "0.8", "--align", "32", "--rank-down", "64", "--dtype", "fp8",
            "--calibration", str(cal), "--eval", str(ev), "--sequence-length", "64", "-o", str(out)]
    run = CliRunner().invoke(main, args)
    assert run.exit_code == 0, run.output
    assert "FP8 (float8_e4m3) kernels in every layer" in run.output
    raw = json.loads((out / "manifest.json").read_text())
    assert raw["format_version"] == 3 and raw["dtype"] == "bfloat16" and raw["fp8"]["format"] == "float8_e4m3"
    assert all(layer["fp8"] == "float8_e4m3" for layer in raw["layers"])
    with safe_open(str(out / "layer_000.safetensors"), framework="np") as h:
        kinds = {k: (str(h.get_slice(k).get_dtype()), h.get_slice(k).get_shape()) for k in h.keys()}  # noqa: SIM118
    assert kinds["model.layers.0.mlp.gate_proj.u"] == ("F8_E4M3", [64, 32])
    assert kinds["model.layers.0.mlp.down_proj.v_scale"] == ("F32", [64, 1])
    assert kinds["model.layers.0.mlp.h_ud_scale"] == ("F32", [1, 1]) and "model.layers.0.mlp.x_scale" in kinds
    manifest = read_manifest(out)
    assert manifest.layer_formats() == ["float8_e4m3"] * 2
    assert max(manifest.errors()) < 0.9  # the dequantized factors still approximate W
    model = CausalLM(model_dir)
    ids = np.load(ev)
    q = measure(model, ids, compressed_mlp(out, manifest), length=64, per_layer=False)
    assert q.ppl_compressed == pytest.approx(manifest.quality["perplexity_compressed"], rel=1e-6)
    before = {p.name: p.read_bytes() for p in sorted(out.glob("layer_*.safetensors"))}
    assert CliRunner().invoke(main, args).exit_code == 0  # resumed: the same files
    assert {p.name: p.read_bytes() for p in sorted(out.glob("layer_*.safetensors"))} == before


def test_compress_dtype_fp8_needs_token_calibration_and_one_dtype(tiny):
    model_dir, cal, _, root = tiny
    run = CliRunner().invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.8", "--dtype", "fp8", "-o",
                                    str(root / "x")])
    assert run.exit_code == 2 and "--dtype fp8 needs --calibration" in run.output
    run = CliRunner().invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.8", "--dtype", "fp8",
                                    "--factor-dtype", "bfloat16", "--calibration", str(cal), "-o", str(root / "y")])
    assert run.exit_code == 2 and "not both" in run.output


def test_choose_ranks_with_fp8_records_each_layers_format(tiny):
    model_dir, cal, ev, root = tiny
    result = run_compress(CompressRequest(str(model_dir), str(root / "chosen"), 0.8, align=32, dtype="fp8",
                                          calibration=str(cal), eval=str(ev), sequence_length=64, choose_ranks=True,
                                          max_ppl_increase=0.3))
    chosen = result.measured_choice
    assert chosen.formats is not None and set(chosen.formats) <= {"bfloat16", "float8_e4m3"}
    assert all(s["ppl_increase"] <= chosen.budget for s in chosen.steps if s["accepted"])
    assert any(not s["accepted"] for s in chosen.steps)  # the budget bound something
    manifest = read_manifest(root / "chosen")
    assert manifest.layer_formats() == chosen.formats
    assert [r["gate"] for r in manifest.layer_ranks()] == chosen.choice
    assert manifest.rank_choice["formats"] == chosen.formats
    assert (manifest.fp8 is not None) == ("float8_e4m3" in chosen.formats)
    from neuronmm_compiler.compression.compress_report import write_compression_report

    summary = write_compression_report(manifest, root / "report")[-1].read_text()
    assert "## Format choice" in summary and "Cost per layer: weight bytes." in summary
    assert summary.count("| float8_e4m3 |") + summary.count("| bfloat16 |") == len(chosen.steps)


def test_useful_candidates_drop_what_cannot_pay():
    from neuronmm_compiler.compression.format_choice import cost_record, useful_candidates

    options = [(None, "bfloat16"), (None, "float8_e4m3"), (256, "bfloat16"), (256, "float8_e4m3"),
               (128, "bfloat16"), (128, "float8_e4m3")]
    # decode-like: SVD bf16 slower than dense; SVD fp8 at 256 no faster than dense fp8; 128 fp8 the fastest
    cost = dict(zip(options, (10.0, 6.0, 11.0, 6.0, 8.0, 4.0), strict=True))
    kept, dropped = useful_candidates(options, cost)
    assert kept == [(None, "float8_e4m3"), (128, "bfloat16"), (128, "float8_e4m3")]
    assert dropped == {(256, "bfloat16"): (None, "bfloat16"), (256, "float8_e4m3"): (None, "float8_e4m3")}
    record = cost_record(options, cost, "us")
    assert [c.get("dropped") for c in record["candidates"]] == [
        None, None, "costs no less than dense bfloat16", "dominated by dense float8_e4m3", None, None]


def test_format_choice_spends_the_cost_it_is_given(tiny):
    """The greedy's moves follow the cost: made dense FP8 the one candidate cheaper than bf16 dense, it is the only
    one measured and accepted; made every candidate cost more, nothing is measured beyond the start."""
    from neuronmm_compiler.compression.format_choice import candidates, cost_record, measured_format_choice

    model_dir, cal, _, _ = tiny
    model = CausalLM(model_dir)
    ids = np.load(cal)[:128]

    def factor(layer, proj, rank):
        u, s, vt = np.linalg.svd(model.mlp_weight(layer, proj), full_matrices=False)
        return u[:, :rank] * s[:rank], vt[:rank]

    options = candidates(model.arch.hidden_size, model.arch.intermediate_size, 32, "float8_e4m3")
    cost = {c: 10.0 for c in options}
    cost[(None, "float8_e4m3")] = 5.0
    chosen = measured_format_choice(model, ids, 1.0, factor, "float8_e4m3", length=64, align=32,
                                    costs=cost_record(options, cost, "us"))
    assert chosen.candidates == [[None, "float8_e4m3"]]  # every SVD candidate is dominated (no cheaper than it)
    assert [(s["rank"], s["format"], s["accepted"]) for s in chosen.steps] == [(None, "float8_e4m3", True)] * 2
    assert [s["cost"] for s in chosen.steps] == [0.75, 0.5] and chosen.formats == ["float8_e4m3"] * 2
    nothing = measured_format_choice(model, ids, 1.0, factor, "float8_e4m3", length=64, align=32,
                                     costs=cost_record(options, dict.fromkeys(options, 10.0), "us"))
    assert nothing.candidates == [] and nothing.steps == [] and nothing.choice == [None, None]


def test_choose_ranks_fp8_with_tokens_records_predicted_latencies(tiny, monkeypatch):
    from neuronmm_compiler.cli.options import resolve_target
    from neuronmm_compiler.compression import latency

    monkeypatch.setattr(latency, "DEFAULT_TRIALS", 3)  # the tiny kernels' searches, short
    model_dir, cal, _, root = tiny
    result = run_compress(CompressRequest(str(model_dir), str(root / "latency"), 0.8, align=32, dtype="fp8",
                                          calibration=str(cal), sequence_length=64, choose_ranks=True,
                                          max_ppl_increase=0.3, buckets=(1,),
                                          target=resolve_target("trn2:lnc=2", None)))
    cost = result.measured_choice.cost
    assert cost["unit"].startswith("us of one layer's MLP kernel") and cost["buckets"] == [1]
    assert cost["target"] == "trn2" and cost["lnc"] == 2 and "in-graph" in cost["context"] and cost["trust"]
    by = {(c["rank"], c["format"]): c for c in cost["candidates"]}
    dense = by[(None, "bfloat16")]["cost"]
    # at these tiny shapes nothing is predicted faster than bf16 dense: all dropped, nothing measured, and said so
    assert all(c.get("dropped") == "costs no less than dense bfloat16" for k, c in by.items() if k[0:2] != (
        None, "bfloat16")) and all(c["cost"] >= dense for c in by.values())
    assert result.measured_choice.candidates == [] and any("no candidate is predicted faster" in w
                                                           for w in result.warnings)
    assert read_manifest(root / "latency").rank_choice["cost"]["unit"] == cost["unit"]


def test_keep_ratio_one_with_fp8_writes_dense_fp8_layers_and_says_so_first(tiny):
    """Keeping every parameter and quantizing to FP8 asks for dense FP8 layers: the parameter-equal rank (rounded
    down to the block) used to write lossy rank-r factors instead. The note comes before the work starts."""
    model_dir, cal, _, root = tiny
    out = root / "dense-fp8"
    run = CliRunner().invoke(main, ["compress", str(model_dir), "--keep-ratio", "1.0", "--dtype", "fp8",
                                    "--calibration", str(cal), "--sequence-length", "64", "-o", str(out)])
    assert run.exit_code == 0, run.output
    first = next(line for line in run.output.splitlines() if line.strip())
    assert first == ("nmmc: note: --keep-ratio 1.0 keeps every MLP weight dense in FP8: no factorization (the "
                     "parameter-equal rank would keep less)")
    manifest = read_manifest(out)
    assert manifest.layer_formats() == ["float8_e4m3"] * 2
    raw = json.loads((out / "manifest.json").read_text())
    assert all(entry["svd_method"] == "dense" and entry["params_after"] == entry["params_before"]
               for layer in raw["layers"] for entry in layer["projections"].values())
    with safe_open(str(out / "layer_000.safetensors"), framework="np") as h:
        assert str(h.get_slice("model.layers.0.mlp.gate_proj.w").get_dtype()) == "F8_E4M3"
