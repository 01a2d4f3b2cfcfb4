"""Damaged or odd packages and inputs end in one line (exit 2 for a user error, 1 for a failed check) with nothing
half-written: a kernel file deleted from an export package, a truncated manifest or checkpoint, an uneven --tp, a
token bucket no serving stack runs, --max-memory on a directory, and a second export into the same directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from neuronmm_compiler.cli import main

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)

CONFIG = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1,
          "torch_dtype": "bfloat16"}


def _checkpoint(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIG))
    rng = np.random.default_rng(0)
    h, i = CONFIG["hidden_size"], CONFIG["intermediate_size"]
    save_file({"model.layers.0.mlp.gate_proj.weight": rng.standard_normal((i, h), dtype=np.float32),
               "model.layers.0.mlp.up_proj.weight": rng.standard_normal((i, h), dtype=np.float32),
               "model.layers.0.mlp.down_proj.weight": rng.standard_normal((h, i), dtype=np.float32)},
              str(directory / "model.safetensors"))
    return directory


def _nmmc(*args: str):
    return CliRunner().invoke(main, list(args))


def _one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("damaged")
    model = _checkpoint(root / "model")
    out = root / "pkg"
    result = _nmmc("export", str(model), "--tokens", "1", "--trials", "8", "--no-cache", "-o", str(out))
    assert result.exit_code == 0, result.output
    return out


def test_verify_of_a_package_with_a_kernel_file_deleted_says_it_is_damaged(package, tmp_path):
    damaged = tmp_path / "pkg"
    shutil.copytree(package, damaged)
    kernel = next(damaged.glob("kernels/*/t1/mlp.py"))
    kernel.unlink()
    result = _nmmc("verify", str(damaged))
    assert result.exit_code == 2
    line = _one_line(result)
    assert "damaged export package" in line and "mlp.py" in line and "missing" in line


def test_verify_of_a_truncated_manifest_says_it_is_damaged_not_that_it_is_no_package(package, tmp_path):
    damaged = tmp_path / "pkg"
    shutil.copytree(package, damaged)
    text = (damaged / "manifest.json").read_text()
    (damaged / "manifest.json").write_text(text[: len(text) // 3])
    result = _nmmc("verify", str(damaged))
    assert result.exit_code == 2
    line = _one_line(result)
    assert "damaged export package: manifest.json is not valid UTF-8 JSON" in line


def test_verify_takes_max_memory_for_a_directory(package):
    refused = _nmmc("verify", str(package), "--max-memory", "1M")
    assert refused.exit_code == 2
    assert "more than --max-memory 1 MiB" in _one_line(refused)
    assert _nmmc("verify", str(package), "--max-memory", "2G").exit_code == 0


def test_a_truncated_checkpoint_is_refused_at_export(tmp_path):
    model = _checkpoint(tmp_path / "model")
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) - 1000])
    out = tmp_path / "pkg"
    result = _nmmc("export", str(model), "--tokens", "1", "-o", str(out))
    assert result.exit_code == 2
    assert "not a readable safetensors file" in _one_line(result)
    assert not out.exists()


def test_a_checkpoint_tensor_of_the_wrong_shape_is_refused_at_export(tmp_path):
    model = _checkpoint(tmp_path / "model")
    rng = np.random.default_rng(1)
    save_file({"model.layers.0.mlp.gate_proj.weight": rng.standard_normal((256, 128), dtype=np.float32),
               "model.layers.0.mlp.up_proj.weight": rng.standard_normal((128, 256), dtype=np.float32),
               "model.layers.0.mlp.down_proj.weight": rng.standard_normal((128, 256), dtype=np.float32)},
              str(model / "model.safetensors"))
    result = _nmmc("export", str(model), "--tokens", "1", "-o", str(tmp_path / "pkg"))
    assert result.exit_code == 2
    assert "'model.layers.0.mlp.up_proj.weight' has shape [128, 256]; the config implies [256, 128]" in \
        _one_line(result)


def test_an_uneven_tp_is_refused_before_any_work(tmp_path):
    result = _nmmc("export", str(_checkpoint(tmp_path / "model")), "--tokens", "1", "--tp", "3",
                   "-o", str(tmp_path / "pkg"))
    assert result.exit_code == 2
    assert "--tp 3 does not divide the intermediate size 256" in _one_line(result)
    assert not (tmp_path / "pkg").exists()


@pytest.mark.parametrize("command", ["export", "tune"])
def test_a_bucket_beyond_the_limit_is_refused(tmp_path, command):
    model = str(_checkpoint(tmp_path / "model"))
    args = ["export", model, "--tokens", "10000000", "-o", str(tmp_path / "pkg")] if command == "export" else \
        ["tune", "--model", model, "--dense", "--tokens", "1,10000000", "-o", str(tmp_path / "pkg")]
    result = _nmmc(*args)
    assert result.exit_code == 2
    assert "token bucket 10000000 is above nmmc's limit of 65536" in _one_line(result)
    assert not (tmp_path / "pkg").exists()


def test_a_second_export_replaces_the_package_as_a_whole(package, tmp_path):
    out = tmp_path / "pkg"
    shutil.copytree(package, out)
    stale = out / "kernels" / "stale-group" / "t7" / "mlp.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("# a previous run's kernel\n")
    model = _checkpoint(tmp_path / "model")
    result = _nmmc("export", str(model), "--tokens", "1", "--trials", "8", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert not stale.exists()
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == sorted(p.relative_to(package)
                                                                         for p in package.rglob("*"))
    assert not list(tmp_path.glob(".pkg.*.tmp"))


def test_export_into_a_directory_that_is_not_a_package_is_refused(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me\n")
    result = _nmmc("export", str(_checkpoint(tmp_path / "model")), "--tokens", "1", "-o", str(out))
    assert result.exit_code == 2
    assert "neither empty nor an nmmc export package" in _one_line(result)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("param", ["k_tiles_per_block", "row_k_tiles"])
def test_a_contraction_block_beyond_the_contraction_is_refused(tmp_path, param):
    """A block of 100000 contraction tiles was accepted and silently taken as the whole contraction."""
    out = tmp_path / "k.py"
    result = _nmmc("emit", "--mlp", "--tokens", "128", "--hidden", "512", "--intermediate", "1024", "--dense",
                   "--param", f"{param}=100000", "-o", str(out))
    assert result.exit_code == 2
    assert f"{param}=100000 exceeds this workload's longest contraction, 8 tiles of 128 rows (1024)" in \
        _one_line(result)
    assert not out.exists()


def _bad_inputs(root: Path) -> dict[str, tuple[list[str], str]]:
    """The trial's other bad inputs: (nmmc arguments, what the one line says)."""
    model = _checkpoint(root / "model")
    (root / "no-config").mkdir()
    (root / "gpt2").mkdir()
    (root / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2}))
    (root / "truncated").mkdir()
    (root / "truncated" / "config.json").write_text(json.dumps(CONFIG)[:40])
    (root / "empty").mkdir()
    (root / "existing.txt").write_text("mine\n")
    out = str(root / "out")
    return {
        "nonexistent model": (["export", str(root / "nowhere"), "--tokens", "1", "-o", out], "model not found"),
        "missing config.json": (["export", str(root / "no-config"), "--tokens", "1", "-o", out],
                                "model config not found"),
        "GPT-2 config": (["export", str(root / "gpt2"), "--tokens", "1", "-o", out], "unsupported architecture"),
        "tokens 0": (["export", str(model), "--tokens", "0", "-o", out], "must be positive; got 0"),
        "tokens -8": (["export", str(model), "--tokens", "-8", "-o", out], "must be positive; got -8"),
        "tokens 1.5": (["export", str(model), "--tokens", "1.5", "-o", out], "positive integers"),
        "tokens empty": (["export", str(model), "--tokens", "", "-o", out], "positive integers"),
        "existing file as -o": (["export", str(model), "--tokens", "1", "-o", str(root / "existing.txt")],
                                "exists and is not a directory"),
        "truncated config.json": (["export", str(root / "truncated"), "--tokens", "1", "-o", out], "malformed JSON"),
        "verify an empty directory": (["verify", str(root / "empty")], "neither an 'nmmc export' package"),
        "verify a checkpoint directory": (["verify", str(model)], "neither an 'nmmc export' package"),
    }


@pytest.mark.parametrize("case", ["nonexistent model", "missing config.json", "GPT-2 config", "tokens 0", "tokens -8",
                                  "tokens 1.5", "tokens empty", "existing file as -o", "truncated config.json",
                                  "verify an empty directory", "verify a checkpoint directory"])
def test_bad_inputs_end_in_one_line_with_nothing_written(tmp_path, case):
    args, says = _bad_inputs(tmp_path)[case]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = _nmmc(*args)
    assert result.exit_code == 2
    line = _one_line(result)
    assert line.startswith("nmmc: error: ") and says in line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "existing.txt").read_text() == "mine\n"


def test_patching_a_gelu_model_with_a_silu_package_is_refused(package, tmp_path):
    """The package's patch checks each MLP's activation too (a model built from another config than the export's)."""
    import importlib
    import sys

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=64,
                                      hidden_act="gelu")
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    copy = tmp_path / "gelu_pkg"
    shutil.copytree(package, copy)
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.invalidate_caches()
        pkg = importlib.import_module(copy.name)
    finally:
        sys.path.pop(0)
    with pytest.raises(ValueError, match="activation is GELUActivation; the package's kernels compute silu"):
        pkg.patch(model, tmp_path / "model-not-read")
