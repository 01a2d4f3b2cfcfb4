"""Model configs: reading config.json, the shipped configs, MLP weight names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from neuronmm_compiler.checkpoints.config import (
    KNOWN_MODELS,
    ModelConfig,
    known_config,
    mlp_weight_names,
    projection_shape,
    read_config,
)
from neuronmm_compiler.errors import InputError, UnknownNameError
from neuronmm_compiler.frontends.shapes import block_aligned_rank

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "configs"
ROOT = Path(__file__).resolve().parent.parent

# name -> (architecture, hidden, intermediate, layers, block_aligned_rank(hidden, intermediate, 0.8))
SHIPPED = {
    "llama-3.2-1b": ("llama", 2048, 8192, 16, 1280),
    "llama-3.2-3b": ("llama", 3072, 8192, 28, 1792),
    "llama-3.1-8b": ("llama", 4096, 14336, 32, 2560),
    "qwen3-1.7b": ("qwen3", 2048, 6144, 28, 1280),
    "qwen3-4b": ("qwen3", 2560, 9728, 36, 1664),
}


@pytest.mark.parametrize("name", list(SHIPPED))
def test_shipped_configs_have_the_published_sizes_and_paper_ranks(name):
    architecture, hidden, intermediate, layers, rank = SHIPPED[name]
    config = read_config(known_config(name))
    assert (config.architecture, config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (
        architecture, hidden, intermediate, layers)
    assert config.torch_dtype == "bfloat16"
    assert block_aligned_rank(config.hidden_size, config.intermediate_size, 0.8) == rank


def test_known_models_are_exactly_the_shipped_files_and_declared_package_data():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    assert set(KNOWN_MODELS) == set(SHIPPED)
    shipped = {path.stem for path in known_config("llama-3.2-1b").parent.glob("*.json")}
    assert shipped == set(SHIPPED)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["package-data"]["neuronmm_compiler.checkpoints"] == ["configs/*.json"]
    assert any(dep.startswith("safetensors") for dep in pyproject["project"]["dependencies"])


def test_known_config_accepts_hub_names_and_rejects_unknown_ones():
    assert known_config("Llama-3.2-1B") == known_config("meta-llama/Llama-3.2-1B") == known_config("llama-3.2-1b")
    assert read_config(known_config("Qwen/Qwen3-4B")).name == "Qwen/Qwen3-4B"
    with pytest.raises(UnknownNameError, match=r"unknown model 'gpt2'.*llama-3\.2-1b"):
        known_config("gpt2")


def test_read_config_from_file_and_from_directory(tmp_path):
    config = read_config(FIXTURES / "tiny-llama.json")
    assert config == ModelConfig("llama", 256, 768, 3, "bfloat16", "nmmc/tiny-llama")
    model = tmp_path / "my-model"
    model.mkdir()
    raw = json.loads((FIXTURES / "tiny-llama.json").read_text())
    del raw["_name_or_path"]
    (model / "config.json").write_text(json.dumps(raw))
    config = read_config(model)
    assert config.name == "my-model" and config.hidden_size == 256
    assert "my-model (llama): hidden 256, intermediate 768, 3 layers" in config.describe()


def test_architecture_from_architectures_list_and_dtype_spelling():
    qwen2 = read_config(FIXTURES / "tiny-qwen2-architectures-only.json")
    assert (qwen2.architecture, qwen2.torch_dtype, qwen2.name) == ("qwen2", "float32", "configs")
    qwen3 = read_config(FIXTURES / "tiny-qwen3.json")
    assert (qwen3.architecture, qwen3.torch_dtype) == ("qwen3", "bfloat16")  # newer configs say "dtype"


def test_unknown_architecture_names_what_was_found_and_what_is_accepted():
    with pytest.raises(InputError) as info:
        read_config(FIXTURES / "unknown-architecture.json")
    message = str(info.value)
    assert "unknown-architecture.json" in message
    assert "'mistral'" in message and "MistralForCausalLM" in message
    for accepted in ("llama", "qwen2", "qwen3", "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert accepted in message


def test_missing_field_names_the_field_and_the_file():
    with pytest.raises(InputError, match=r"missing-field\.json: missing field 'intermediate_size'"):
        read_config(FIXTURES / "missing-field.json")


@pytest.mark.parametrize("value", [0, -4, 2.5, "256", True, None])
def test_non_positive_integer_sizes_are_rejected(tmp_path, value):
    raw = json.loads((FIXTURES / "tiny-llama.json").read_text())
    raw["hidden_size"] = value
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(InputError, match=r"config\.json: field 'hidden_size' must be a positive integer"):
        read_config(tmp_path)


def test_zero_size_in_fixture():
    with pytest.raises(InputError, match=r"bad-size\.json: field 'intermediate_size' must be a positive .*got 0"):
        read_config(FIXTURES / "bad-size.json")


def test_malformed_json_and_missing_file_are_input_errors(tmp_path):
    with pytest.raises(InputError, match=r"bad-json\.json: malformed JSON"):
        read_config(FIXTURES / "bad-json.json")
    with pytest.raises(InputError, match=r"model config not found: .*config\.json"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="expected a JSON object"):
        read_config(tmp_path)


def test_mlp_weight_names_are_the_same_for_every_architecture(tmp_path):
    for fixture in ("tiny-llama.json", "tiny-qwen2-architectures-only.json", "tiny-qwen3.json"):
        config = read_config(FIXTURES / fixture)
        assert mlp_weight_names(config, 1) == {
            "gate": "model.layers.1.mlp.gate_proj.weight",
            "up": "model.layers.1.mlp.up_proj.weight",
            "down": "model.layers.1.mlp.down_proj.weight",
        }
    config = read_config(FIXTURES / "tiny-llama.json")
    for bad in (-1, 3, "0", True):
        with pytest.raises(InputError, match=r"layer must be an integer in \[0, 3\)"):
            mlp_weight_names(config, bad)


def test_projection_shapes_are_nmmc_in_out_layout():
    config = read_config(known_config("llama-3.2-1b"))
    assert projection_shape(config, "gate") == projection_shape(config, "up") == (2048, 8192)
    assert projection_shape(config, "down") == (8192, 2048)
    with pytest.raises(UnknownNameError, match="unknown projection 'o'"):
        projection_shape(config, "o")


def test_fixture_model_directory_copy(tmp_path):
    """A model directory is found by its config.json whatever else it holds."""
    shutil.copy(FIXTURES / "tiny-qwen3.json", tmp_path / "config.json")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert read_config(tmp_path).name == "nmmc/tiny-qwen3"


@pytest.mark.parametrize(("field", "name"), [("hidden_act", "gelu"), ("hidden_act", "gelu_pytorch_tanh"),
                                             ("hidden_activation", "gelu_pytorch_tanh"), ("hidden_act", "relu")])
def test_an_activation_other_than_silu_is_refused_in_one_line(tmp_path, field, name):
    """Every kernel computes silu(gate) * up: a GELU (or any other) config would be silently wrong, so it is refused,
    naming the field and the value."""
    raw = json.loads((FIXTURES / "tiny-llama.json").read_text())
    raw[field] = name
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(InputError, match=rf"config\.json: {field} '{name}' is not supported: .*silu\(gate\) \* up"):
        read_config(tmp_path)


@pytest.mark.parametrize("name", ["silu", "SiLU", "swish", None])
def test_silu_spellings_and_an_absent_activation_are_accepted(tmp_path, name):
    raw = json.loads((FIXTURES / "tiny-llama.json").read_text())
    raw["hidden_act"] = name
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert read_config(tmp_path).hidden_size == raw["hidden_size"]


def test_mlp_bias_is_refused(tmp_path):
    raw = json.loads((FIXTURES / "tiny-llama.json").read_text())
    raw["mlp_bias"] = True
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(InputError, match="mlp_bias true is not supported"):
        read_config(tmp_path)


def test_export_of_a_gelu_checkpoint_is_refused_with_nothing_written(tmp_path):
    """The trial that found the silent error: a Llama checkpoint whose config says gelu exported, verified and patched
    with kernels computing SiLU. Now `nmmc export` refuses it in one line, exit 2, and writes nothing."""
    from click.testing import CliRunner

    from neuronmm_compiler.cli import main

    raw = json.loads((FIXTURES / "tiny-llama.json").read_text())
    raw["hidden_act"] = "gelu"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(raw))
    out = tmp_path / "pkg"
    result = CliRunner().invoke(main, ["export", str(model), "--tokens", "1", "-o", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "hidden_act 'gelu' is not supported" in lines[0], result.output
    assert not out.exists()
