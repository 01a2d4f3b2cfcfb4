"""nmmc export with OCP MX kernels (trn3, ``--dtype mxfp8_e4m3|mxfp8_e5m2|mxfp4``): the runtime's torch quantization of
a float weight into packed elements and E8M0 scales is nmmc's (ir/mx.py) bit for bit; a dense MX export of a Hugging
Face style checkpoint (weights quantized when patching) and of an ``nmmc compress --dtype mxfp8`` output (float32 layer
files, quantized when patching) patched into a tiny Llama match nmmc's MX emulation of the same kernels
(compression/mx_layers.py) eagerly and under ``torch.compile(fullgraph=True)``, and the unquantized model within the
format's error; ``nmmc verify`` passes the packages; what is not built is refused in one line.

The model is the smallest an MX kernel takes (hidden 512, intermediate 1024: contractions of one and two 512-position
nc_matmul_mx tiles); kernels are compiled at their default schedule (no search) except in the CLI test."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.compression.mx_layers import mx_layer, mx_mlp
from neuronmm_compiler.driver import compile_workload
from neuronmm_compiler.export import ExportRequest, export_model
from neuronmm_compiler.export.manifest import schema
from neuronmm_compiler.export.verify import verify_export
from neuronmm_compiler.ir import mx as ir_mx
from neuronmm_compiler.targets import get_target, with_launch

torch = pytest.importorskip("torch", reason="the export runtime needs the 'torch' extra")

from neuronmm_compiler.export.runtime import mx as runtime_mx  # noqa: E402 - needs torch
from neuronmm_compiler.export.runtime.llama import LlamaForCausalLM  # noqa: E402
from test_export import _import  # noqa: E402
from test_export_fp8 import _errors  # noqa: E402 - the same vocabulary (128) and prompts

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 512, "intermediate_size": 1024,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32", "tie_word_embeddings": False,
          "_name_or_path": "tiny-llama-mx"}
TARGET = with_launch(get_target("trn3"), "in-graph")
#: Patched vs nmmc's MX emulation: both quantize the same bf16 activations with quantize_mx's rule and the same
#: weights, so they may differ by fp32 accumulation order (moving a value of h across an MX rounding boundary) and bf16
#: output rounding; measured 0 (equal logits) on these prompts.
EMULATION_TOLERANCE = 1e-2
#: Patched vs the unquantized model, per format (E2M1 weights keep 1 mantissa bit, E4M3 3; the activations MXFP8 E4M3
#: with quantize_mx's doubled scale, one bit less): of the largest logit, through two layers of Gaussian weights (no
#: decaying spectrum, so no structure the blocks could follow), measured 0.29 (mxfp4) and 0.14 (mxfp8_e4m3); the bounds
#: leave 1.5-1.8x. A trained model loses far less (docs/quantization.md, "What each format costs the model").
FORMAT_TOLERANCE = {"mxfp4": 0.45, "mxfp8_e4m3": 0.25}

pytestmark = pytest.mark.usefixtures("one_blas_thread", "one_polish_start")  # small matrices (conftest.py)


def _kernel(workload):
    return compile_workload(workload, target=TARGET, dialect="nki")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A 2-layer Llama checkpoint (config.json, model.safetensors) whose MLP contractions MX tiles."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    directory = tmp_path_factory.mktemp("mxmodel")
    torch.manual_seed(0)
    state = {k: v.detach().contiguous() for k, v in LlamaForCausalLM(CONFIG).state_dict().items()}
    generator = torch.Generator().manual_seed(1)
    for layer in range(CONFIG["num_hidden_layers"]):
        for proj, (rows, cols) in {"gate": (1024, 512), "up": (1024, 512), "down": (512, 1024)}.items():
            state[f"model.layers.{layer}.mlp.{proj}_proj.weight"] = torch.randn(rows, cols, generator=generator) * (
                3 / cols ** 0.5)
    (directory / "config.json").write_text(json.dumps(CONFIG))
    save_file(state, str(directory / "model.safetensors"))
    return directory


@pytest.fixture(scope="module")
def mxfp4_package(checkpoint, tmp_path_factory):
    """A dense mxfp4 export of the checkpoint (buckets 4 and 16) and its manifest."""
    out = tmp_path_factory.mktemp("pkgs") / "nmmc_mxfp4"
    manifest = export_model(ExportRequest(model=str(checkpoint), buckets=(4, 16), target=TARGET, dialect="nki",
                                          dtype="mxfp4"), out, kernel_fn=_kernel)
    return out, manifest


class _Emulated(torch.nn.Module):
    """One layer's MLP as nmmc's NumPy emulation of its MX kernel computes it (compression/mx_layers.mx_mlp)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).float().numpy()
        return torch.from_numpy(np.asarray(mx_mlp(self.layer, rows), np.float32)).reshape(x.shape)


def _emulated_model(directory, weights, fmt: str) -> LlamaForCausalLM:
    """The unpatched model with each MLP the emulation of its MX kernel; ``weights(layer)``: {proj: W [in, out]}."""
    model = LlamaForCausalLM.from_pretrained(directory)
    for layer, block in enumerate(model.model.layers):
        block.mlp = _Emulated(mx_layer(weights(layer), fmt))
    return model


def _checkpoint_weights(directory):
    reference = LlamaForCausalLM.from_pretrained(directory)
    return lambda layer: {p: getattr(reference.model.layers[layer].mlp, f"{p}_proj").weight.detach().t().numpy()
                          for p in ("gate", "up", "down")}


@pytest.mark.parametrize("element", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"])
def test_runtime_quantization_is_nmmcs_bit_for_bit(element):
    """The package's torch quantization (no nmmc on a Neuron host) gives ir/mx.py's packed words and E8M0 scales on
    random weights of a wide range and on the edges: an all-zero block (scale 2^-127), a block of values whose scale
    clips at 2^-127 (subnormal in float32), -0.0, a saturating element, ties of the grid; its dequantization is
    ir/mx.py's unpack."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((1024, 24)) * np.exp2(rng.integers(-30, 30, (1, 24)))
    w[:, 0] = 0.0  # every block all zero
    w[:, 1] = 2.0 ** -140  # every block's scale clipped to 2^-127
    w[64:, 2] = -0.0
    w[96, 3], w[97, 3] = 1e30, 1.0  # a block whose largest element sets a scale the others underflow in
    w[128:136, 4] = [0.75, 1.25, 2.5, -0.25, 5.0, -5.0, 3.5, 7.0]  # ties of the FP4/FP8 grids at the block's scale
    data, scales = ir_mx.pack(w, element)
    words, stored = runtime_mx.quantize_weight(torch.from_numpy(w), element)
    assert words.dtype == (torch.int16 if element == "float4_e2m1fn" else torch.int32)
    assert words.shape == (256, 24) and stored.shape == (16, 2, 24) and stored.dtype == torch.uint8
    assert np.array_equal(words.numpy().view(data.dtype), data)
    assert np.array_equal(stored.numpy(), scales)
    assert not scales[:, :, 0].any() and not scales[:, :, 1].any()  # 2^-127: the all-zero and the clipped blocks
    assert np.array_equal(runtime_mx.dequantize(words, stored, ir_mx.MX_ELEMENTS[element].packed).numpy(),
                          ir_mx.unpack(data, scales))
    with pytest.raises(ValueError, match="multiple of 512"):
        runtime_mx.quantize_weight(torch.zeros(256, 4), element)


def test_mx_export_of_a_checkpoint_matches_the_mx_emulation(checkpoint, mxfp4_package):
    """--dtype mxfp4 of a dense checkpoint: the manifest states each weight's two arguments (packed elements
    [K/4, N] float4_e2m1fn_x4 and E8M0 scales [16, K/512, N] uint8, with their layouts, the real matrix they come
    from and each other); patched (weights quantized on the fly), the model matches nmmc's MX emulation of those
    kernels and the unquantized model within MXFP4's error, eagerly and under torch.compile(fullgraph=True) with each
    kernel call one graph node."""
    import jsonschema

    out, manifest = mxfp4_package
    jsonschema.validate(manifest, schema())
    group = manifest["groups"]["dense-mxfp4"]
    assert manifest["layers"] == ["dense-mxfp4"] * 2 and group["activation_scales"] == "quantize_mx"
    assert manifest["weights"]["from"] == "checkpoint" and manifest["weights"]["activation_scales"] is None
    assert group["tensors"]["w_down"] == {
        "shape": [256, 512], "dtype": "float4_e2m1fn_x4", "layout": "mx_packed", "from": "checkpoint",
        "name": "model.layers.{layer}.mlp.down_proj.weight", "transform": "mx_quantize",
        "mx": {"format": "mxfp4", "element": "float4_e2m1fn", "block": 32, "logical_shape": [1024, 512],
               "scale": "w_down_scale"}}
    assert group["tensors"]["w_down_scale"]["shape"] == [16, 2, 512]
    assert group["tensors"]["w_down_scale"]["mx"]["of"] == "w_down"
    assert (group["tensors"]["w_down_scale"]["dtype"], group["tensors"]["w_down_scale"]["layout"]) == ("uint8",
                                                                                                      "mx_scales")
    arguments = group["buckets"][0]["kernels"]["mlp"]["functions"][0]["arguments"]
    assert {a["name"]: a["layout"] for a in arguments}["w_gate_scale"] == "mx_scales"
    pkg = _import(out)
    loaded = pkg.weights.layer_arguments(manifest, checkpoint, 1)
    w_up = LlamaForCausalLM.from_pretrained(checkpoint).model.layers[1].mlp.up_proj.weight.detach().t().double()
    data, scales = ir_mx.pack(w_up.numpy(), "float4_e2m1fn")
    assert np.array_equal(loaded["w_up"].numpy().view(data.dtype), data)
    assert np.array_equal(loaded["w_up_scale"].numpy(), scales)

    patched = LlamaForCausalLM.from_pretrained(checkpoint)
    assert pkg.patch(patched, checkpoint, backend="interpreter") == [0, 1]
    assert patched.model.layers[0].mlp.w_gate.dtype == torch.int16
    reference = LlamaForCausalLM.from_pretrained(checkpoint)
    emulated = _emulated_model(checkpoint, _checkpoint_weights(checkpoint), "mxfp4")
    to_emulation, to_reference = _errors(patched, emulated, reference)
    assert to_emulation < EMULATION_TOLERANCE, to_emulation
    assert to_emulation * 5 < to_reference < FORMAT_TOLERANCE["mxfp4"], to_reference  # MX is on

    graphs: list = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    ids = torch.randint(0, CONFIG["vocab_size"], (1, 20), generator=torch.Generator().manual_seed(4))  # 16 + 4
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            compiled = torch.compile(patched, backend=backend, fullgraph=True, dynamic=False)
            assert torch.equal(compiled(ids), patched(ids))
    finally:
        torch._dynamo.reset()
    nodes = [str(n.target) for gm in graphs for n in gm.graph.nodes if getattr(n.target, "namespace", None) == "nmmc"]
    assert len(nodes) == 4 and sum("_t16_" in n for n in nodes) == 2, nodes


def test_verify_passes_an_mx_package_and_catches_a_wrong_layout(mxfp4_package, tmp_path):
    """`nmmc verify` runs every MX kernel of the package in the interpreter; a manifest whose argument dtypes
    contradict the kernel files is reported."""
    import shutil

    out, _ = mxfp4_package
    report = verify_export(out)
    assert report.ok and len(report.items) == 2, report.lines(str(out))
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    raw = json.loads((copy / "manifest.json").read_text())
    raw["groups"]["dense-mxfp4"]["tensors"]["w_up"]["dtype"] = "float8_e4m3fn_x4"
    (copy / "manifest.json").write_text(json.dumps(raw))
    assert any("dense-mxfp4" in (item.error or "") for item in verify_export(copy).items if not item.ok)


def test_mx_export_of_a_compress_output_reads_its_float32_files(checkpoint, tmp_path):
    """An `nmmc compress --dtype mxfp8` output (layers[i].mx, float32 dense weights: not pre-quantized) exports MX
    kernels without --dtype (the CLI, a short search, --verify passing); its layer files are quantized when patching,
    and the patched model matches the emulation of those files and the unquantized model within MXFP8's error."""
    from safetensors.torch import load_file

    factors = tmp_path / "f"
    run = CliRunner().invoke(main, ["compress", str(checkpoint), "--keep-ratio", "1.0", "--dtype", "mxfp8",
                                    "--sequence-length", "16", "-o", str(factors)])
    assert run.exit_code == 0, run.output
    out = tmp_path / "nmmc_mxfp8"
    done = CliRunner().invoke(main, ["export", str(factors), "--tokens", "8", "--target", "trn3", "--trials", "2",
                                     "--no-cache", "--no-progress", "--verify", "-o", str(out)])
    assert done.exit_code == 0 and "OK: every kernel verifies" in done.output, done.output + done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    tensors = manifest["groups"]["dense-mxfp8_e4m3"]["tensors"]
    assert tensors["w_gate"]["from"] == "factors" and tensors["w_gate"]["dtype"] == "float8_e4m3fn_x4"
    assert tensors["w_gate"]["name"] == "model.layers.{layer}.mlp.gate_proj.w"
    pkg = _import(out)
    patched = LlamaForCausalLM.from_pretrained(checkpoint)
    assert pkg.patch(patched, factors, backend="interpreter") == [0, 1]

    def stored(layer):
        files = load_file(str(factors / f"layer_{layer:03d}.safetensors"))
        return {p: files[f"model.layers.{layer}.mlp.{p}_proj.w"].numpy() for p in ("gate", "up", "down")}

    emulated = _emulated_model(checkpoint, stored, "mxfp8_e4m3")
    to_emulation, to_reference = _errors(patched, emulated, LlamaForCausalLM.from_pretrained(checkpoint),
                                         shapes=((1, 5),))
    assert to_emulation < EMULATION_TOLERANCE and to_emulation * 3 < to_reference < FORMAT_TOLERANCE["mxfp8_e4m3"], \
        (to_emulation, to_reference)
    assert stored(0)["gate"].dtype == np.float32 and not np.array_equal(
        ir_mx.unpack(*ir_mx.pack(stored(0)["gate"], "float8_e4m3fn")), stored(0)["gate"])


@pytest.mark.parametrize(("args", "says"), [
    (["--dtype", "mxfp4", "--target", "trn2"], "NKI-MX-TARGET"),
    (["--dtype", "mxfp8_e5m2", "--target", "trn3", "--tp", "2"], "MX kernels are exported unsharded"),
    (["--dtype", "mxfp4", "--target", "trn3", "--act-scale", "row"], "--act-scale row scales the activations of FP8"),
])
def test_what_mx_export_does_not_build_is_refused_in_one_line(checkpoint, tmp_path, args, says):
    result = CliRunner().invoke(main, ["export", str(checkpoint), "--tokens", "4", *args, "-o", str(tmp_path / "p")])
    assert result.exit_code == 2 and says in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "p").exists()


def test_serving_refuses_mx_saying_so(checkpoint, tmp_path):
    result = CliRunner().invoke(main, ["export", str(checkpoint), "--serving", "vllm-neuron", "--max-num-seqs", "4",
                                       "--max-num-batched-tokens", "128", "--dtype", "mxfp4", "--target", "trn3",
                                       "-o", str(tmp_path / "nmmc_srv")])
    assert result.exit_code == 2 and "MX weights and their E8M0 scales" in result.output, result.output

