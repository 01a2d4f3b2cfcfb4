"""``nmmc tune --model --dtype fp8 --act-scale row`` of a checkpoint: FP8 kernels that compute each token's activation
scale themselves (no calibrated scale argument), the table saying the weights are quantized, not exact; ``--act-scale
row`` without an FP8 format refused in one line before any search. (A compress output's recorded row scales:
tests/test_export_row.py.) The bucket's search is the default schedule compiled and costed (test_model_formats.py's
``_compile_default``): what is tested is the way from the command line to the kernel's format, not the search."""

from __future__ import annotations

import json

from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.tuning import request as tune_request
from test_model_formats import _compile_default

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
          "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "_name_or_path": "tiny-llama"}


def _model(tmp_path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    return model


def test_tune_model_builds_row_scaled_fp8_kernels_for_a_checkpoint(tmp_path, monkeypatch):
    model, out = _model(tmp_path), tmp_path / "k"
    target = get_target("trn2")
    monkeypatch.setattr(tune_request, "_tune_bucket",
                        lambda workload, bucket, **_: _compile_default(workload, bucket, target=target))
    result = CliRunner().invoke(main, ["tune", "--model", str(model), "--dense", "--tokens", "4", "--dtype", "fp8",
                                       "--act-scale", "row", "--no-cache", "-o", str(out)])
    assert result.exit_code == 0, result.output
    index = json.loads((out / "index.json").read_text())
    assert index["formats_allowed"] == ["dense-fp8-row"]
    kernel = (out / index["buckets"][0]["file"]).read_text()
    assert "row activation scales" in kernel and '"x_scale"' not in kernel
    first = result.output.splitlines()[0]
    assert "weights dense-fp8-row" in first and "exact" not in first, first


def test_act_scale_row_without_fp8_is_refused_before_any_search(tmp_path):
    model = _model(tmp_path)
    for dtype in ("bf16", "bf16,mxfp4"):
        result = CliRunner().invoke(main, ["tune", "--model", str(model), "--dense", "--tokens", "4", "--dtype", dtype,
                                           "--target", "trn3", "--act-scale", "row", "-o", str(tmp_path / "k")])
        assert result.exit_code == 2 and "--act-scale row scales the activations of FP8 kernels" in result.output
        assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "k").exists()
