"""FP8 weights through tensor parallelism (docs/tensor-parallel.md, "FP8"): the rank kernels are FP8, the scales are
sharded with their weights, the alternatives say their format, and verify checks the quantized computation across
ranks. Small shapes only (hidden 256, intermediate 512/640, tp 2-3)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.errors import InputError
from neuronmm_compiler.frontends.shapes import Fp8Weights
from neuronmm_compiler.frontends.workloads import MlpWorkload, mlp_workload
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.tensor_parallel.commands import _one_weight_format, default_kernels
from neuronmm_compiler.tensor_parallel.planner import plan_tp
from neuronmm_compiler.tensor_parallel.sharding import KernelStep, Strategy, shard_mlp
from neuronmm_compiler.tensor_parallel.verify import verify_plan

FP8 = Fp8Weights()


def _run(args, exit_code=0):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == exit_code, result.output
    return result


def _args(sharded, rank):
    step = sharded.ranks[rank].steps[0]
    assert isinstance(step, KernelStep)
    return step, {name: op.as_dict() for name, op in step.args.items()}


def test_dense_shards_carry_their_scales():
    sharded = shard_mlp(mlp_workload(4, 256, 640, dense=True, fp8=FP8), 3, Strategy("dense", "dense"))
    step, args = _args(sharded, 1)  # columns 214:427
    assert isinstance(step.workload, MlpWorkload) and step.workload.fp8 == FP8 and step.workload.intermediate == 213
    assert args["w_gate_scale"] == {"tensor": "w_gate_scale", "rows": [214, 427]}  # per channel: the shard's slice
    assert args["w_up_scale"] == {"tensor": "w_up_scale", "rows": [214, 427]}
    assert args["w_down_scale"] == {"tensor": "w_down_scale"}  # row-parallel: its output channels are not split
    assert args["h_scale"] == {"tensor": "h_scale"} and args["x_scale"] == {"tensor": "x_scale"}  # one per tensor
    shapes = {f.name: (f.shape, f.dtype) for f in sharded.factors.values()}
    assert shapes["w_gate"] == ((256, 640), "float8_e4m3") and shapes["w_gate_scale"] == ((640, 1), "float32")
    assert shapes["w_down_scale"] == ((256, 1), "float32") and shapes["h_scale"] == ((1, 1), "float32")


def test_svd_shards_own_scales_follow_their_values():
    workload = mlp_workload(4, 256, 640, keep_ratio=0.8, fp8=Fp8Weights(scales="tensor"))
    _, args = _args(shard_mlp(workload, 2, Strategy("factor-shard", "factor-shard")), 1)
    assert args["u_gate_scale"] == {"tensor": "u_gate_scale.r1"}
    assert args["v_down_scale"] == {"tensor": "v_down_scale.r1"}
    assert args["x_ug_scale"] == {"tensor": "x_ug_scale.r1"}  # x U_1: a value of rank 1's own
    assert args["h_scale"] == {"tensor": "h_scale"}  # the intermediate: one scale on every rank
    _, args = _args(shard_mlp(workload, 2, Strategy("replicate-u", "reduce-output")), 1)
    assert args["x_ug_scale"] == {"tensor": "x_ug_scale"}  # the replicated x U: the same value on every rank
    assert args["v_gate_scale"] == {"tensor": "v_gate_scale"}  # per tensor: whole, though V is sliced
    assert args["h_ud_scale"] == {"tensor": "h_ud_scale.r1"}  # the partial product h_1 U_down[rows]
    steps = shard_mlp(workload, 2, Strategy("replicate-u", "reduce-rank")).ranks[1].steps
    partial, down_v = steps[0], steps[2]
    assert isinstance(partial, KernelStep) and isinstance(down_v, KernelStep)
    assert partial.workload.graph().node("h_ud").attrs["act_scale"] == "static"  # h quantized for U_down
    assert "h_ud_scale" not in partial.args  # the partial h_1 U_down[rows] leaves in bf16: nothing of its own
    assert {n: op.as_dict() for n, op in down_v.args.items()} == {
        "h_ud": {"tensor": "z"}, "v_down": {"tensor": "v_down"},  # the all-reduced sum: the unsharded h U_down,
        "h_ud_scale": {"tensor": "h_ud_scale"}, "v_down_scale": {"tensor": "v_down_scale"}}  # its unsharded scale
    assert down_v.workload.graph().node("down").attrs["w_scale"] == "tensor"


def test_alternatives_say_their_format():
    target = get_target("trn2")
    result = plan_tp(mlp_workload(4, 256, 512, dense=True, fp8=FP8), 2, target, "nki", default_kernels(target, "nki"))
    assert list(result.alternatives) == [
        "dense fp8_e4m3 weights, nki-library MLP (its FP8 path) + all-reduce",
        "dense fp8_e4m3, nmmc fused MLP + all-reduce",
        "dense without FP8 (bfloat16), nmmc fused MLP + all-reduce",
        "dense bfloat16, AWS kernel per projection (no FP8) + all-reduce"]
    chosen = result.chosen
    assert result.alternatives["dense fp8_e4m3, nmmc fused MLP + all-reduce"]["total_us"] == chosen.total_us
    plain = result.alternatives["dense without FP8 (bfloat16), nmmc fused MLP + all-reduce"]["kernel_us"]
    assert plain != chosen.kernel_us  # a bf16 kernel of its own, costed alike


def test_fp8_tp_plan_verifies_and_a_wrong_scale_slice_fails(tmp_path):
    out = tmp_path / "plan"
    result = _run(["emit", "--mlp", "--dense", "--tokens", "4", "--hidden", "256", "--intermediate", "512",
                   "--dtype", "fp8", "--target", "trn2", "--tp", "2", "-o", str(out)])
    assert "float8_e4m3 weights" in result.output and "no FP8" in result.output
    kernel = (out / "mlp_256.py").read_text()
    assert "nl.float8_e4m3" in kernel and "double_row" in kernel
    plan = json.loads((out / "plan.json").read_text())
    assert plan["workload"]["fp8"] == {"format": "float8_e4m3", "scales": "row"}
    assert plan["tensors"]["w_down"]["dtype"] == "float8_e4m3" and plan["tensors"]["h_scale"]["dtype"] == "float32"
    verified = _run(["verify", "--json", str(out)])  # the directory, as tune -o wrote it
    report = json.loads(verified.output)
    assert report["ok"] and report["rel_error"] < 1e-2 and report["unquantized_rel_error"] > report["rel_error"]
    plan["ranks"][1]["steps"][0]["args"]["w_gate_scale"]["rows"] = [0, 256]  # rank 1 scales by rank 0's channels
    (out / "plan.json").write_text(json.dumps(plan))
    assert not verify_plan(out).ok


@pytest.mark.parametrize(("strategy", "tp"), [("replicate-u/reduce-output", 2), ("factor-shard/factor-shard", 2)])
def test_fp8_svd_strategies_verify(tmp_path, strategy, tp):
    out = tmp_path / "plan"
    _run(["emit", "--mlp", "--tokens", "4", "--hidden", "256", "--intermediate", "640", "--keep-ratio", "0.8",
          "--dtype", "fp8", "--target", "trn2", "--tp", str(tp), "--tp-strategy", strategy, "-o", str(out)])
    report = verify_plan(out, seed=2)
    assert report.ok, report.lines(None)
    assert report.unquantized_rel_error is not None and "FP8" in report.reference
    assert report.unquantized_rel_error < 0.2  # FP8's error (docs/quantization.md), not a wrongly bound scale's


def test_fp8_reduce_rank_quantizes_the_all_reduced_sum(tmp_path):
    """reduce-rank's down_v quantizes the bf16 all-reduced z with h_ud's static scale: verify follows the plan kernel
    by kernel (each handed-on value rounded as stored); a rank bound to the wrong slice fails (the plan's ranks,
    unquantized, against the unsharded MLP), and so does a down_v that clamps at the wrong bound."""
    out = tmp_path / "plan"
    _run(["emit", "--mlp", "--tokens", "4", "--hidden", "256", "--intermediate", "640", "--keep-ratio", "0.8",
          "--dtype", "fp8", "--target", "trn2", "--tp", "2", "--tp-strategy", "replicate-u/reduce-rank",
          "-o", str(out)])
    report = verify_plan(out, seed=2)  # 320 intermediate columns per rank: a ragged last tile
    assert report.ok and "kernel by kernel" in report.reference, report.lines(None)
    assert report.unquantized_rel_error is not None and report.unquantized_rel_error < 0.2
    plan = json.loads((out / "plan.json").read_text())
    wrong = json.loads(json.dumps(plan))
    wrong["ranks"][1]["steps"][0]["args"]["u_down"]["rows"] = [0, 320]  # rank 1 reads rank 0's rows of U_down
    (out / "plan.json").write_text(json.dumps(wrong))
    report = verify_plan(out, seed=2)
    assert not report.ok and "wrong tensor or slice" in str(report.error), report.lines(None)
    (out / "plan.json").write_text(json.dumps(plan))
    source = (out / "down_v.py").read_text()
    assert source.count("operand1=240.0)") == 1
    (out / "down_v.py").write_text(source.replace("operand1=240.0)", "operand1=24.0)"))
    assert not verify_plan(out, seed=2).ok


def test_model_tp_takes_one_weight_format(tmp_path):
    assert _one_weight_format("bf16") is None and _one_weight_format("fp8_e5m2") == Fp8Weights("float8_e5m2")
    with pytest.raises(InputError, match="give one format"):
        _one_weight_format("bf16,fp8")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                                  "num_hidden_layers": 1, "torch_dtype": "bfloat16"}))
    out = tmp_path / "kernels"
    result = _run(["tune", "--model", str(config), "--dense", "--tokens", "1", "--tp", "2", "--dtype", "fp8",
                   "--target", "trn2", "--no-cache", "--trials", "2", "--method", "optuna", "-o", str(out)])
    assert "float8_e4m3 weights" in result.output and "dense bf16 nmmc MLP + all-reduce" in result.output
    assert json.loads((out / "index.json").read_text())["fp8"] == {"format": "float8_e4m3", "scales": "row"}
    assert "nl.float8_e4m3" in (out / "t1" / "mlp_256.py").read_text()
