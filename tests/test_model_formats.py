"""tune --model's joint choice of {dense, SVD} x {bf16, FP8, MX} per bucket (model_tuning/formats.py,
docs/quantization.md "Choosing a format"): the request, the tie-break, and one small model's buckets (front in
index.json and the table, the chosen kernel written and locked), each format compiled under its default schedule: a
few seconds."""

from __future__ import annotations

import functools
import json

import pytest

from neuronmm_compiler.artifacts.lockfile import Lockfile
from neuronmm_compiler.checkpoints.config import known_config
from neuronmm_compiler.driver import Tuned, compile_workload, lowering_for
from neuronmm_compiler.errors import InputError, NmmcError
from neuronmm_compiler.model_tuning.formats import FormatRequest, MlpFormat, choose
from neuronmm_compiler.model_tuning.pipeline import resolve_model, tune_model
from neuronmm_compiler.model_tuning.report import model_lines
from neuronmm_compiler.search.candidates import TuneResult
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.tuning.request import TuneRequest, _lock_chosen


def test_the_request_parses_formats_in_order_and_lists_svd_then_dense_per_format() -> None:
    request = FormatRequest.parse("bf16, fp8,bfloat16")
    assert request.weights == ("bfloat16", "float8_e4m3")
    assert [f.name for f in request.candidates(svd=True)] == ["svd-bf16", "dense-bf16", "svd-fp8", "dense-fp8"]
    assert [f.name for f in request.candidates(svd=False)] == ["dense-bf16", "dense-fp8"]
    assert FormatRequest.parse(None).weights == ("bfloat16",)
    primary = MlpFormat(True)
    assert [f.file(8, primary) for f in request.candidates(svd=True)] == [
        "mlp_t8.py", "mlp_t8_dense.py", "mlp_t8_svd_fp8.py", "mlp_t8_dense_fp8.py"]
    with pytest.raises(InputError, match=r"bf16, FP8 .* and MX weights"):
        FormatRequest.parse("fp32")


def test_the_fastest_format_wins_and_a_tie_goes_to_the_more_exact_one() -> None:
    order = FormatRequest(("bfloat16", "float8_e4m3")).candidates(svd=True)
    latencies = dict(zip(order, (10.0, 10.0, 7.0, 7.0), strict=True))
    assert choose(latencies, order) == MlpFormat(False, "float8_e4m3")  # dense-fp8: as fast as svd-fp8, exact weights
    assert choose({**latencies, MlpFormat(True, "float8_e4m3"): 6.0}, order).name == "svd-fp8"
    assert choose(dict(zip(order, (5.0, 5.0, 5.0, 5.0), strict=True)), order).name == "dense-bf16"


def _compile_default(workload, bucket, *, target):
    """A bucket's "search": the default schedule, compiled and costed with its baselines (a real search enumerates
    the whole schedule space first, seconds per workload; the choice between formats is what is tested here)."""
    compiled = compile_workload(workload, target=target)
    return Tuned(compiled, TuneResult(None, [], "exhaustive", 0, 1, 1, 1, 0.0),
                 lowering_for(workload).baselines(workload, target))


def test_tune_model_chooses_among_the_allowed_formats_and_records_the_front_and_the_lock(tmp_path) -> None:
    target = get_target("trn2")
    config = json.loads(known_config("llama-3.2-1b").read_text())
    config.update(hidden_size=256, intermediate_size=512, num_hidden_layers=2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    source = resolve_model(tmp_path / "config.json", 0.8)
    out, lock, searched = tmp_path / "out", tmp_path / "nmmc.lock.json", []
    index = tune_model(source, [1], out, target=target, dialect="nki", formats=FormatRequest.parse("bf16,fp8"),
                       tune_bucket=functools.partial(_compile_default, target=target), on_written=searched.extend)
    assert index["formats_allowed"] == ["svd-bf16", "dense-bf16", "svd-fp8", "dense-fp8"]
    (bucket,) = index["buckets"]
    front = {f["name"]: f for f in bucket["formats"]}
    assert list(front) == index["formats_allowed"] and bucket["format"] == "svd-bf16"
    fastest = min(front.values(), key=lambda f: f["predicted_us"])
    assert bucket["chosen_format"] == fastest["name"] and fastest["chosen"]
    assert front["svd-fp8"]["workload"]["fp8"] == {"format": "float8_e4m3", "scales": "row"}
    assert (out / bucket["file"]).is_file() and (out / fastest["file"]).is_file()
    assert bucket["recommended_file"] in (fastest["file"], None)
    lines = "\n".join(model_lines(source, index, target, str(out)))
    assert f"{fastest['name']} {fastest['predicted_us']:.1f} us (chosen)" in lines
    _lock_chosen(str(lock), index, searched, TuneRequest(target=target, dialect="nki"))
    (entry,) = list(Lockfile.load(lock))
    assert entry.workload == fastest["workload"]
    assert entry.label.endswith(" fp8_e4m3") == (fastest["weights"] == "float8_e4m3")
    assert entry.latency_us == pytest.approx(fastest["predicted_us"])


def test_tune_model_uses_the_format_a_compress_output_records(tmp_path) -> None:
    """A compress output whose layers are FP8 (manifest layers[i].fp8): tune --model tunes and chooses that format in
    every bucket, not the fastest predicted; other --dtype formats are tuned for comparison only; a --dtype that
    excludes the recorded one is refused with what to do instead (layers of different formats: test_model_groups.py)."""
    from dataclasses import replace

    target = get_target("trn2")
    config = json.loads(known_config("llama-3.2-1b").read_text())
    config.update(hidden_size=256, intermediate_size=512, num_hidden_layers=2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    source = replace(resolve_model(tmp_path / "config.json", 0.8), layer_formats=("float8_e4m3",) * 2)
    tune = functools.partial(_compile_default, target=target)
    index = tune_model(source, [1], tmp_path / "a", target=target, dialect="nki", tune_bucket=tune)
    assert index["formats_from"] == "manifest" and index["layer_formats"] == ["float8_e4m3"] * 2
    assert index["formats_allowed"] == ["svd-fp8", "dense-fp8"]
    (bucket,) = index["buckets"]
    assert bucket["chosen_format"] == "svd-fp8" and bucket["chosen_by"] == "manifest"
    searched = []
    index = tune_model(source, [1], tmp_path / "b", target=target, dialect="nki", tune_bucket=tune,
                       formats=FormatRequest.parse("bf16,fp8"), on_written=searched.extend)
    (bucket,) = index["buckets"]
    front = {f["name"]: f["predicted_us"] for f in bucket["formats"]}
    assert bucket["chosen_format"] == "svd-fp8" and min(front, key=front.get) != "svd-fp8"  # recorded, not fastest
    lines = "\n".join(model_lines(source, index, target, str(tmp_path / "b")))
    assert "as the compress output records" in lines and "whatever the latencies" in lines
    _lock_chosen(str(tmp_path / "lock.json"), index, searched, TuneRequest(target=target, dialect="nki"))
    (entry,) = list(Lockfile.load(tmp_path / "lock.json"))
    assert entry.workload["fp8"]["format"] == "float8_e4m3" and entry.workload.get("ranks")
    with pytest.raises(InputError, match="add it to --dtype"):
        tune_model(source, [1], tmp_path / "c", target=target, dialect="nki", tune_bucket=tune,
                   formats=FormatRequest.parse("fp8_e5m2"))


def test_mx_formats_are_candidates_on_trn3_and_refused_on_trn2(tmp_path) -> None:
    """--dtype bf16,mxfp8,mxfp4 (OCP MX weights, docs/mx.md): each an MlpFormat of its canonical name, an MX workload
    (packed weights, quantize_mx marks), lossier than bf16 on a tie; tuned on trn3, a one-line rule error on trn2."""
    request = FormatRequest.parse("bf16,MXFP8,mxfp4_e2m1")
    assert request.weights == ("bfloat16", "mxfp8_e4m3", "mxfp4")
    assert [f.name for f in request.candidates(svd=False)] == ["dense-bf16", "dense-mxfp8_e4m3", "dense-mxfp4"]
    mx4 = MlpFormat(False, "mxfp4")
    assert mx4.quantized and mx4.lossiness == 1 and not MlpFormat(False).quantized
    assert mx4.file(1, MlpFormat(False)) == "mlp_t1_dense_mxfp4.py"
    assert choose(dict.fromkeys(request.candidates(svd=False), 5.0), request.candidates(svd=False)).name == "dense-bf16"
    workload = mx4.workload(1, 512, 1024, None)
    assert workload.to_dict()["mx"] == {"format": "mxfp4"}
    config = json.loads(known_config("llama-3.2-1b").read_text())
    config.update(hidden_size=512, intermediate_size=1024, num_hidden_layers=2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    source = resolve_model(tmp_path / "config.json", None, dense=True)
    for name in ("trn3", "trn2"):
        target = get_target(name)
        run = functools.partial(tune_model, source, [1], tmp_path / name, target=target, dialect="nki",
                                formats=request, tune_bucket=functools.partial(_compile_default, target=target))
        if name == "trn2":
            with pytest.raises(NmmcError, match=r"^NKI-MX-TARGET: "):
                run()
            assert not (tmp_path / name).exists()  # refused before any search: nothing written
            continue
        (bucket,) = run()["buckets"]
        front = {f["name"]: f for f in bucket["formats"]}
        assert front["dense-mxfp4"]["predicted_us"] < front["dense-mxfp8_e4m3"]["predicted_us"] < front[
            "dense-bf16"]["predicted_us"]
        assert bucket["chosen_format"] == "dense-mxfp4"
        source_text = (tmp_path / name / front["dense-mxfp4"]["file"]).read_text()
        assert "nisa.nc_matmul_mx(" in source_text and "nisa.quantize_mx(" in source_text


def test_tune_model_tunes_the_mx_format_a_compress_output_records(tmp_path) -> None:
    """An ``nmmc compress --dtype mxfp4`` output (layers[i].mx) is tuned in its recorded MX format on trn3 (the
    kernels need only the format and the shapes; an export also quantizes the weights: test_export_mx), and refused
    in one line on trn2. The tiny model's sizes are raised in its manifest to a contraction MX tiles (512)."""
    from click.testing import CliRunner

    from neuronmm_compiler.cli import main
    from test_compress_calibrated import make_llama

    out = tmp_path / "mx"
    run = CliRunner().invoke(main, ["compress", str(make_llama(tmp_path / "m")), "--keep-ratio", "1.0", "--dtype",
                                    "mxfp4", "--sequence-length", "64", "-o", str(out)])
    assert run.exit_code == 0, run.output
    raw = json.loads((out / "manifest.json").read_text())
    raw["model"].update(hidden_size=512, intermediate_size=1024)
    (out / "manifest.json").write_text(json.dumps(raw))
    source = resolve_model(out, None)
    assert source.layer_formats == ("mxfp4", "mxfp4")
    target = get_target("trn3")
    index = tune_model(source, [1], tmp_path / "k", target=target, dialect="nki",
                       tune_bucket=functools.partial(_compile_default, target=target))
    (group,) = index["groups"]
    assert group["weights"] == "mxfp4" and group["format"] == "dense-mxfp4"
    kernel = next((tmp_path / "k").rglob("mlp_t1.py")).read_text()
    assert "nisa.nc_matmul_mx(" in kernel and "nisa.quantize_mx(" in kernel
    refused = CliRunner().invoke(main, ["tune", "--model", str(out), "--tokens", "1", "-o", str(tmp_path / "k2")])
    assert refused.exit_code == 2 and refused.output.startswith("nmmc: error: NKI-MX-TARGET: "), refused.output
    assert len(refused.output.strip().splitlines()) == 1 and not (tmp_path / "k2").exists()


def test_a_format_the_shapes_do_not_take_is_refused_before_any_search(tmp_path) -> None:
    """An MX SVD MLP whose rank is not a multiple of 512 (an MX matmul's contraction) is refused in one line naming
    the format, before any bucket is tuned (it used to fail after the bf16 searches) and with nothing written."""
    config = json.loads(known_config("llama-3.2-1b").read_text())
    config.update(hidden_size=512, intermediate_size=1024, num_hidden_layers=2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    source = resolve_model(tmp_path / "config.json", 0.8)
    assert source.ranks is not None and source.ranks[0] % 512

    def never(*_args):
        raise AssertionError("searched before the formats were checked")

    with pytest.raises(InputError, match=r"^format svd-mxfp4 at this model's shapes: .* not a multiple of 512"):
        tune_model(source, [1], tmp_path / "k", target=get_target("trn3"), dialect="nki",
                   formats=FormatRequest.parse("bf16,mxfp4"), tune_bucket=never)
    assert not (tmp_path / "k").exists()
