"""``nmmc compress --dtype mxfp8|mxfp4`` and ``--act-scale row`` on a tiny random Llama (issue 55): the NumPy
emulation is the MX kernel's graph (ir/mx.py's arithmetic, evaluated as ``nmmc verify`` evaluates it) and the FP8
per-token kernel's graph; the manifest records the format; ``tune --model`` and ``export`` refuse what they cannot
build (MX on trn2, contractions MX does not tile, scales that contradict the manifest), in one line."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors import safe_open

from neuronmm_compiler.cli import main
from neuronmm_compiler.compression import mx_layers, read_manifest
from neuronmm_compiler.compression.compress_steps import compressed_mlp
from neuronmm_compiler.compression.formats import emulated_mlp, fp8_layer
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.mx_layers import mx_layer
from neuronmm_compiler.compression.quality import evaluate as measure
from neuronmm_compiler.frontends.mx import MxWeights
from neuronmm_compiler.frontends.shapes import Fp8Weights, mlp_graph
from neuronmm_compiler.ir.evaluate import evaluate
from neuronmm_compiler.ir.mx_quantized import calibrate_mx, unquantized_mx
from neuronmm_compiler.ir.quantized import calibrate, unquantized
from neuronmm_compiler.passes.quantize_fp8 import quantize_fp8
from neuronmm_compiler.passes.quantize_mx import quantize_mx
from test_compress_calibrated import make_llama, token_file

pytestmark = pytest.mark.usefixtures("one_blas_thread")  # small matrices (conftest.py)
PROJ = ("gate", "up", "down")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("mx")
    return make_llama(root / "m"), token_file(root / "cal.npy", 256, 1), token_file(root / "ev.npy", 128, 2), root


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def _bf16_inputs(graph, rng, hidden: int | None = None) -> dict[str, np.ndarray]:
    """bf16-exact inputs (x standard normal, weights 0.05); ``hidden``: only that many rows of x's columns and of the
    gate/up weights, and columns of down, nonzero (a zero-padded contraction)."""
    out = {}
    for n in graph.inputs():
        a = rng.standard_normal(n.shape) * (1.0 if n.name == "x" else 0.05)
        if hidden is not None:
            if n.name == "x":
                a[:, hidden:] = 0
            elif n.name in ("w_gate", "w_up"):
                a[hidden:] = 0
            else:
                a[:, hidden:] = 0
        out[n.name] = a.astype(ml_dtypes.bfloat16).astype(np.float32)
    return out


def _factors(inputs, ranks) -> dict:
    return {p: inputs[f"w_{p}"] if ranks is None else (inputs[f"u_{p}"], inputs[f"v_{p}"]) for p in PROJ}


@pytest.mark.parametrize(("fmt", "ranks"), [("mxfp4", None), ("mxfp8_e4m3", None), ("mxfp8_e5m2", (512, 512, 512))])
def test_mx_emulation_is_the_mx_kernels_graph(fmt, ranks, monkeypatch):
    """The forward's MX MLP is the float64 evaluation of the MX graph nmmc verify checks MX kernels against (the same
    ir/mx.py arithmetic) up to the bf16 output, once its bf16 strips (which the kernel stages quantize_mx's input in
    and the graph evaluation does not) are taken out; with them it stays nearer that graph than the unquantized one."""
    graph = quantize_mx(mlp_graph(4, 512, 512, ranks, mx=MxWeights(fmt)))
    plain = unquantized_mx(graph)
    inputs = _bf16_inputs(plain, np.random.default_rng(0))
    want, exact = evaluate(graph, calibrate_mx(graph, inputs))["out"], evaluate(plain, inputs)["out"]
    f = _factors(inputs, ranks)
    got = emulated_mlp({0: f}, mx={0: mx_layer(f, fmt)})(0, inputs["x"])
    assert _rel(got, want) < 0.5 * _rel(want, exact)  # the bf16 strips move some elements by one MX step
    monkeypatch.setattr(mx_layers, "_strip", lambda v: np.asarray(v, dtype=np.float64))
    got = emulated_mlp({0: f}, mx={0: mx_layer(f, fmt)})(0, inputs["x"])
    assert _rel(got, want) < 2e-3  # the bf16 output rounding (2^-9) and fp32 accumulation
    assert _rel(got, exact) > 2e-2  # the check above can fail: MX is far coarser
    assert _rel(emulated_mlp({0: f})(0, inputs["x"]), exact) < 1e-2  # bf16


def test_mx_contraction_not_a_multiple_of_512_is_the_zero_padded_kernels(monkeypatch):
    """A hidden size of 96 (SmolLM2-135M's 576 likewise) is emulated as the kernel over operands zero-padded to 512."""
    graph = quantize_mx(mlp_graph(4, 512, 512, None, mx=MxWeights("mxfp4")))
    plain = unquantized_mx(graph)
    inputs = _bf16_inputs(plain, np.random.default_rng(1), hidden=96)
    want = evaluate(graph, calibrate_mx(graph, inputs))["out"][:, :96]
    f = {"gate": inputs["w_gate"][:96], "up": inputs["w_up"][:96], "down": inputs["w_down"][:, :96]}
    monkeypatch.setattr(mx_layers, "_strip", lambda v: np.asarray(v, dtype=np.float64))  # as the graph evaluates
    got = emulated_mlp({0: f}, mx={0: mx_layer(f, "mxfp4")})(0, inputs["x"][:, :96])
    assert got.shape == (4, 96) and _rel(got, want) < 2e-3


@pytest.mark.parametrize("ranks", [None, (32, 32, 48)])
def test_fp8_row_emulation_is_the_row_kernels_graph(ranks):
    """``--act-scale row``: the emulation equals the float64 evaluation of the FP8 graph with per-token scales, the
    graph ``nmmc tune --dtype fp8 --act-scale row`` kernels are verified against."""
    rng = np.random.default_rng(0)
    graph = quantize_fp8(mlp_graph(16, 64, 192, ranks, fp8=Fp8Weights(act_scale="row")))
    plain = unquantized(graph)
    inputs = {n.name: (rng.standard_normal(n.shape) * (1.0 if n.name == "x" else 0.1)).astype(np.float32)
              for n in plain.inputs()}
    inputs["x"] *= np.exp(1.5 * rng.standard_normal((16, 1))).astype(np.float32)  # tokens of very different sizes
    want = evaluate(graph, calibrate(graph, inputs))["out"]
    f = _factors(inputs, ranks)
    got = emulated_mlp({0: f}, fp8={0: fp8_layer(f, {}, "float8_e4m3", "row")})(0, inputs["x"])
    assert _rel(got, want) < 4e-3
    token = np.argmin(np.abs(inputs["x"]).max(axis=1))  # the smallest token: a static scale flushes it, a row keeps it
    static = {p: float(np.abs(inputs["x"]).max()) if p == "x" else 1e3 for p in ("x", "h", "x_ug", "x_uu", "h_ud")}
    flat = emulated_mlp({0: f}, fp8={0: fp8_layer(f, static, "float8_e4m3")})(0, inputs["x"])
    assert _rel(got[token], want[token]) < 1e-2 < _rel(flat[token], want[token])


def _compress(model_dir, out, *extra):
    return CliRunner().invoke(main, ["compress", str(model_dir), "--keep-ratio", "1.0", "--sequence-length", "64",
                                     "-o", str(out), *extra])


def test_compress_dtype_mx_records_the_format_measures_it_and_is_refused_downstream(tiny):
    model_dir, _, ev, root = tiny
    out = root / "mxfp4"
    run = _compress(model_dir, out, "--dtype", "MXFP4", "--eval", str(ev))
    assert run.exit_code == 0, run.output
    raw = json.loads((out / "manifest.json").read_text())
    assert raw["format_version"] == 4 and raw["dtype"] == "float32" and raw["mx"]["format"] == "mxfp4"
    assert raw["mx"]["activations"] == "float8_e4m3fn" and "NOT pre-quantized" in raw["mx"]["stored"]
    assert raw["mx"]["padded_contractions"] == {"gate": [64, 512], "up": [64, 512], "down": [192, 512]}
    assert [layer["mx"] for layer in raw["layers"]] == ["mxfp4"] * 2
    with safe_open(str(out / "layer_000.safetensors"), framework="np") as h:
        assert str(h.get_slice("model.layers.0.mlp.gate_proj.w").get_dtype()) == "F32"
    manifest = read_manifest(out)
    assert manifest.layer_formats() == ["mxfp4"] * 2
    q = measure(CausalLM(model_dir), np.load(ev), compressed_mlp(out, manifest), length=64, per_layer=False)
    assert q.ppl_compressed == pytest.approx(manifest.quality["perplexity_compressed"], rel=1e-6)
    assert manifest.quality["perplexity_compressed"] != pytest.approx(manifest.quality["perplexity_original"],
                                                                      rel=1e-3)
    for cmd, says in ((["tune", "--model", str(out), "--tokens", "1", "-o", str(root / "k")], "NKI-MX-TARGET"),
                      (["export", str(out), "--tokens", "1", "--target", "trn3", "-o", str(root / "pkg")],
                       "not a multiple of 512")):  # 64/192 wide: exported where MX tiles them (test_export_mx)
        refused = CliRunner().invoke(main, cmd)  # tune --model tunes MX on trn3 only (test_model_formats)
        assert refused.exit_code == 2 and says in refused.output, refused.output
        assert len(refused.output.strip().splitlines()) == 1


def test_compress_dtype_mx_refuses_what_it_does_not_do(tiny):
    model_dir, cal, _, root = tiny
    for extra, words in ((["--dtype", "mxfp8", "--target-speedup", "2", "--calibration", str(cal)],
                          "with --target-speedup is not supported"),  # --choose-ranks: test_compress_joint
                         (["--dtype", "mxfp8", "--act-scale", "row"], "MX activations get quantize_mx's"),
                         (["--act-scale", "row"], "--act-scale row scales FP8 activations")):
        run = _compress(model_dir, root / "refused", *extra)
        assert run.exit_code == 2 and words in run.output, run.output


def test_compress_fp8_row_scales_need_no_calibration_and_store_none(tiny):
    model_dir, _, ev, root = tiny
    out = root / "fp8-row"
    run = _compress(model_dir, out, "--dtype", "fp8", "--act-scale", "row", "--eval", str(ev))
    assert run.exit_code == 0, run.output
    manifest = read_manifest(out)
    assert manifest.act_scale == "row" and manifest.layer_formats() == ["float8_e4m3"] * 2
    with safe_open(str(out / "layer_000.safetensors"), framework="np") as h:
        names = set(h.keys())
    assert "model.layers.0.mlp.gate_proj.w_scale" in names and not any(n.endswith(("x_scale", "h_scale"))
                                                                       for n in names)
    q = measure(CausalLM(model_dir), np.load(ev), compressed_mlp(out, manifest), length=64, per_layer=False)
    assert q.ppl_compressed == pytest.approx(manifest.quality["perplexity_compressed"], rel=1e-6)
    assert _compress(model_dir, out, "--dtype", "fp8", "--act-scale", "row").exit_code == 0  # resumed
    refused = CliRunner().invoke(main, ["export", str(out), "--tokens", "1", "--act-scale", "static", "-o",
                                        str(root / "pkg-row")])  # exported with its row scales: test_export_row
    assert refused.exit_code == 2 and "FP8 layers with row activation scales" in refused.output, refused.output
