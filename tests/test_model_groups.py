"""tune --model on an `nmmc compress` output whose layers differ in ranks and format (--choose-ranks [--dtype fp8];
model_tuning/groups.py, docs/quantization.md "Choosing a format"): one kernel set per layer group in its recorded
format,
index.json per group and the model's total per bucket, a lock entry per (group, bucket). The manifest is written as
compress writes it (tune --model reads nothing else), each format compiled under its default schedule: a few
seconds."""

from __future__ import annotations

import functools
import json

import pytest
from click.testing import CliRunner

from neuronmm_compiler.artifacts.lockfile import Lockfile, kernel_sha256
from neuronmm_compiler.checkpoints.config import ModelConfig
from neuronmm_compiler.cli import main
from neuronmm_compiler.compression import LayerEntry, Manifest, ProjectionEntry
from neuronmm_compiler.errors import InputError
from neuronmm_compiler.model_tuning.formats import FormatRequest, written_files
from neuronmm_compiler.model_tuning.pipeline import resolve_model, tune_model
from neuronmm_compiler.model_tuning.report import model_lines
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.tuning.request import TuneRequest, _lock_chosen
from test_model_formats import _compile_default

HIDDEN, INTER = 256, 640
SVD, FP8 = "svd-bf16-r128-128-128", "svd-fp8-r128-128-128"


def _layer(layer: int, rank: int | None, fp8: str | None) -> LayerEntry:
    shapes = {"gate": (HIDDEN, INTER), "up": (HIDDEN, INTER), "down": (INTER, HIDDEN)}
    projections = {p: ProjectionEntry(min(s) if rank is None else rank, s, 0.0 if rank is None else 0.3,
                                      "dense" if rank is None else "lapack") for p, s in shapes.items()}
    return LayerEntry(layer, f"layer_{layer:03d}.safetensors", projections, fp8)


@pytest.fixture
def mixed(tmp_path):
    """Layer 0 dense FP8, layers 1 and 3 SVD bf16 at rank 128, layer 2 SVD FP8 at rank 128 (three groups)."""
    config = ModelConfig("LlamaForCausalLM", HIDDEN, INTER, 4, "float32", "tiny-llama")
    layers = (_layer(0, None, "float8_e4m3"), _layer(1, 128, None), _layer(2, 128, "float8_e4m3"),
              _layer(3, 128, None))
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "manifest.json").write_text(Manifest(config, 0.8, 128, "float32", layers).to_json())
    return tmp_path / "f"


def test_tune_model_tunes_every_layer_group_and_totals_the_model(mixed, tmp_path) -> None:
    target = get_target("trn2")
    source = resolve_model(mixed, None)
    assert source.ranks is None and [g.name for g in source.groups] == ["dense-fp8", SVD, FP8]
    out, searched = tmp_path / "out", []
    index = tune_model(source, [1, 128], out, target=target, dialect="nki", on_written=searched.extend,
                       tune_bucket=functools.partial(_compile_default, target=target))
    assert index["layer_groups"] == ["dense-fp8", SVD, FP8, SVD] and index["formats_from"] == "manifest"
    assert index["layer_formats"] == ["float8_e4m3", "bfloat16", "float8_e4m3", "bfloat16"]
    groups = {g["name"]: g for g in index["groups"]}
    assert [groups[n]["layers"] for n in ("dense-fp8", SVD, FP8)] == [[0], [1, 3], [2]]
    assert groups["dense-fp8"]["ranks"] is None and groups[FP8]["ranks"] == {"gate": 128, "up": 128, "down": 128}
    assert [g["format"] for g in index["groups"]] == ["dense-fp8", "svd-bf16", "svd-fp8"]
    for group in index["groups"]:
        assert [b["tokens"] for b in group["buckets"]] == [1, 128]
        for bucket in group["buckets"]:
            # the recorded format, whatever its latency against its dense twin
            assert bucket["chosen_by"] == "manifest" and bucket["chosen_format"] == group["format"]
            assert bucket["file"] == f"{group['dir']}/mlp_t{bucket['tokens']}.py" and (out / bucket["file"]).is_file()
    assert written_files(index) == 6 == len(list(out.rglob("mlp_t*.py")))
    # each distinct workload searched once: the FP8 group's dense twin is the dense-fp8 group's kernel, the bf16
    # group's the baseline
    keys = [json.dumps(w.to_dict(), sort_keys=True) for w, _ in searched]
    assert len(keys) == len(set(keys)) == 8
    for b, total in enumerate(index["buckets"]):
        chosen = {g["name"]: next(f for f in g["buckets"][b]["formats"] if f["chosen"]) for g in index["groups"]}
        per_layer = [chosen[name]["predicted_us"] for name in index["layer_groups"]]
        assert total["predicted_us"] == pytest.approx(sum(per_layer))
        dense = next(f for f in groups[SVD]["buckets"][b]["formats"] if f["name"] == "dense-bf16")
        assert total["dense_bf16_us"] == pytest.approx(4 * dense["predicted_us"])
        assert total["speedup_vs_dense_bf16"] == pytest.approx(total["dense_bf16_us"] / total["predicted_us"])
        assert {p["group"]: p["layers"] for p in total["groups"]} == {"dense-fp8": 1, SVD: 2, FP8: 1}
    text = "\n".join(model_lines(source, index, target, str(out)))
    for fragment in ("ranks and formats per layer (from the manifest): 3 layer groups", f"group {SVD}: layers 1,3",
                     "predicted by nmmc's cost model (not measured)", "nmmc's fused dense MLP in bf16 for every layer",
                     "in-graph", f"{SVD}/mlp_t128.py", f"{index['buckets'][1]['predicted_us']:.1f}",
                     "wrote 6 kernel files",
                     "speedups over the dense MLPs: the SVD and FP8 change the model's outputs; not measured"):
        assert fragment in text, fragment
    from neuronmm_compiler.model_tuning.report import _approximations

    only_fp8 = {**index, "groups": [g for g in index["groups"] if g["ranks"] is None]}
    assert _approximations(only_fp8).startswith("FP8 changes the model's outputs")  # not "the SVD"
    assert _approximations({**index, "groups": [{**g, "weights": "bfloat16"} for g in only_fp8["groups"]]}) == (
        "exact (every layer dense, bf16 weights)")
    lock = tmp_path / "lock.json"
    _lock_chosen(str(lock), index, searched, TuneRequest(target=target, dialect="nki"))
    entries = list(Lockfile.load(lock))
    formats = {(e.workload["tokens"], tuple(e.workload["ranks"]) if e.workload.get("ranks") else None,
                (e.workload.get("fp8") or {}).get("format")) for e in entries}
    assert len(entries) == 6 and formats == {(t, r, f) for t in (1, 128) for r, f in
                                             ((None, "float8_e4m3"), ((128,) * 3, None), ((128,) * 3, "float8_e4m3"))}


def test_other_formats_are_tuned_for_comparison_and_a_dtype_without_a_recorded_one_is_refused(mixed,
                                                                                            tmp_path) -> None:
    target = get_target("trn2")
    source = resolve_model(mixed, None)
    tune = functools.partial(_compile_default, target=target)
    index = tune_model(source, [1], tmp_path / "out", target=target, dialect="nki", tune_bucket=tune,
                       formats=FormatRequest.parse("bf16,fp8"))
    front = {g["name"]: [f["name"] for f in g["buckets"][0]["formats"]] for g in index["groups"]}
    assert front == {"dense-fp8": ["dense-fp8", "dense-bf16"], SVD: ["svd-bf16", "dense-bf16", "svd-fp8", "dense-fp8"],
                     FP8: ["svd-fp8", "dense-fp8", "svd-bf16", "dense-bf16"]}
    assert [g["buckets"][0]["chosen_format"] for g in index["groups"]] == ["dense-fp8", "svd-bf16", "svd-fp8"]
    assert written_files(index) == 3  # the recorded kernel is each group's primary: nothing else is written
    with pytest.raises(InputError, match=r"layers 1,3 are bfloat16.*add it to --dtype"):
        tune_model(source, [1], tmp_path / "x", target=target, dialect="nki", tune_bucket=tune,
                   formats=FormatRequest.parse("fp8"))
    assert not (tmp_path / "x").exists()


def test_the_cli_no_longer_refuses_it_but_tp_does(mixed, tmp_path) -> None:
    """The refusal of tune --model (ranks or formats differing by layer) is gone; --tp plans one MLP for every layer
    and still refuses, pointing to nmmc export; both refusals come before any search."""
    result = CliRunner().invoke(main, ["tune", "--model", str(mixed), "--tokens", "1", "--tp", "2", "-o",
                                       str(tmp_path / "tp")])
    assert result.exit_code == 2 and "nmmc export --tp N" in result.stderr, result.output
    result = CliRunner().invoke(main, ["tune", "--model", str(mixed), "--tokens", "1", "--dtype", "fp8_e5m2", "-o",
                                       str(tmp_path / "o")])
    assert result.exit_code == 2 and "add it to --dtype" in result.stderr and "differ" not in result.stderr


def test_the_cli_tunes_verifies_and_locks_each_group(mixed, tmp_path, monkeypatch) -> None:
    """nmmc tune --model on the mixed output (each search answered with the default schedule, in this process): the
    table, index.json, --verify running every group's kernel, a lock entry per group of the file written."""
    from neuronmm_compiler.tuning import request as tuning

    target = get_target("trn2")
    monkeypatch.setattr(tuning, "search_uncommitted",
                        lambda workload, request, echo: (_compile_default(workload, 0, target=target), None, None))
    out, lock = tmp_path / "out", tmp_path / "lock.json"
    result = CliRunner().invoke(main, ["tune", "--model", str(mixed), "--tokens", "1", "--target", "trn2", "--jobs",
                                       "1", "--verify", "-o", str(out), "--lock", str(lock), "--no-progress"])
    assert result.exit_code == 0, result.output
    index = json.loads((out / "index.json").read_text())
    files = [b["file"] for g in index["groups"] for b in g["buckets"]]
    assert files == ["dense-fp8/mlp_t1.py", f"{SVD}/mlp_t1.py", f"{FP8}/mlp_t1.py"]
    assert all(b["verified"] is True for g in index["groups"] for b in g["buckets"])
    assert "model MLP per bucket" in result.output
    assert all(f"{file}  verified" in result.output for file in files), result.output
    assert sorted(e.kernel_sha256 for e in Lockfile.load(lock)) == sorted(  # the files written, one entry each (the
        kernel_sha256((out / file).read_text()) for file in files)      # lock orders its entries by key)
    # nmmc verify DIR reads every group's files; a bucket that recommends nki-library's MLP names no file of its own
    # (recommended_file null), which crashed it before
    index["groups"][1]["buckets"][0].update(recommended="nkilib", recommended_file=None)
    (out / "index.json").write_text(json.dumps(index))
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 0 and "3 kernel file(s)" in result.output, result.output
