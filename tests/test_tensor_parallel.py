"""Tensor parallelism (docs/tensor-parallel.md): sharding, the collective model, the plan, multi-rank verify.

Small shapes only (hidden 256, intermediate 640 or ragged ones, tp 2-4, tokens 1/32); the big shapes are
benchmarks/tensor_parallel.py's."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.cost_model.collectives import collective_cost
from neuronmm_compiler.errors import InputError
from neuronmm_compiler.frontends.workloads import gemm_workload, mlp_workload
from neuronmm_compiler.targets import INTERCONNECTS, TARGETS, interconnect_of
from neuronmm_compiler.tensor_parallel.commands import default_kernels
from neuronmm_compiler.tensor_parallel.planner import plan_tp
from neuronmm_compiler.tensor_parallel.sharding import (
    CollectiveStep,
    KernelStep,
    Strategy,
    check_tp,
    shard_mlp,
    shard_rank,
    shard_sizes,
    strategies,
)
from neuronmm_compiler.tensor_parallel.verify import verify_plan

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)

TRN1 = TARGETS["trn1"]
SMALL = ["--mlp", "--hidden", "256", "--intermediate", "640", "--keep-ratio", "0.8"]


def _run(args, exit_code=0):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == exit_code, result.output
    return result


def test_shards_are_even_and_ragged_ones_differ_by_one():
    assert shard_sizes(640, 2) == [320, 320]
    assert shard_sizes(640, 3) == [214, 213, 213]
    assert shard_sizes(14336, 32) == [448] * 32
    assert sum(shard_sizes(14335, 8)) == 14335


@pytest.mark.parametrize(("tp", "message"), [(0, "positive integer"), (-2, "positive integer"),
                                             (641, "exceeds the intermediate size 640")])
def test_bad_group_sizes_are_refused(tp, message):
    with pytest.raises(InputError, match=message):
        check_tp(tp, 640)


def test_per_shard_ranks_are_block_aligned_or_the_strategy_does_not_apply():
    # Llama-3.1-8B at tp 8: the shard keeps the unsharded factors' fraction (0.80) in whole 128-tiles.
    rank = shard_rank(4096, 1792, 2560 * (4096 + 14336) / (4096 * 14336))
    assert rank == 1024 and rank % 128 == 0
    assert shard_rank(256, 160, 0.7) is None  # 128 (256 + 160) > 256 * 160: no compression left
    assert shard_rank(256, 80, 0.7) is None  # narrower than a tile


def test_sharding_follows_megatron_and_each_strategy_slices_its_factors():
    workload = mlp_workload(32, 256, 640, keep_ratio=0.8)
    assert len(strategies(workload)) == 6
    sharded = shard_mlp(workload, 2, Strategy("replicate-u", "reduce-output"))
    step = sharded.ranks[1].steps[0]
    assert isinstance(step, KernelStep)
    assert step.args["u_gate"].cols is None and step.args["v_gate"].cols == (320, 640)
    assert step.args["u_down"].rows == (320, 640) and step.args["v_down"].rows is None
    collective = sharded.ranks[1].steps[1]
    assert isinstance(collective, CollectiveStep) and collective.shape == (32, 256)
    reduce_rank = shard_mlp(workload, 2, Strategy("replicate-u", "reduce-rank"))
    ops = [type(s).__name__ for s in reduce_rank.ranks[0].steps]
    assert ops == ["KernelStep", "CollectiveStep", "KernelStep"]
    assert reduce_rank.ranks[0].steps[1].shape == (32, 128)  # tokens x r, not tokens x hidden
    own = shard_mlp(workload, 2, Strategy("factor-shard", "factor-shard"))
    assert own.ranks[0].steps[0].args["u_gate"].tensor == "u_gate.r0"
    assert {s.role for s in shard_mlp(workload, 3, Strategy("replicate-u", "reduce-output")).ranks} == {0, 1}


def test_collective_model_follows_the_ring_formula_with_the_tables_constants():
    assert collective_cost("all_reduce", 8192, 1, TRN1).total_us == 0
    cost = collective_cost("all_reduce", 1 << 20, 8, TRN1)
    fabric = interconnect_of(TRN1)
    assert cost.bytes_sent_per_rank == pytest.approx(2 * 7 / 8 * (1 << 20))
    assert cost.latency_us == pytest.approx(14 * fabric.step_latency_us)
    per_rank = fabric.gbytes_per_s_per_rank(TRN1.cores_per_chip) * 1e3
    assert cost.bandwidth_us == pytest.approx(cost.bytes_sent_per_rank / per_rank)
    gather = collective_cost("all_gather", 1 << 20, 8, TRN1)
    assert gather.bytes_sent_per_rank == pytest.approx(cost.bytes_sent_per_rank / 2)
    with pytest.raises(InputError, match=r"more than one trn1\.32xlarge"):
        collective_cost("all_reduce", 1024, 64, TRN1)
    assert all(entry.source for entry in INTERCONNECTS.values())


def test_reduce_rank_moves_r_over_hidden_of_the_bytes():
    workload = mlp_workload(32, 256, 640, ranks=(128, 128, 128))
    result = plan_tp(workload, 2, TRN1, "neuronxcc", default_kernels(TRN1, "neuronxcc"))
    by_name = {r.strategy.name: r for r in result.applicable}
    ratio = by_name["replicate-u/reduce-rank"].comm_bytes / by_name["replicate-u/reduce-output"].comm_bytes
    assert ratio == pytest.approx(128 / 256)
    assert result.chosen.total_us == min(r.total_us for r in result.applicable)
    assert list(result.alternatives) == ["dense, nki-library MLP + all-reduce", "dense, nmmc fused MLP + all-reduce",
                                         "dense, AWS kernel per projection + all-reduce"]
    assert result.alternatives["dense, nki-library MLP + all-reduce"] is None  # no NKI kernels on trn1


def test_only_mlps_shard():
    with pytest.raises(InputError, match="--tp shards a gated MLP"):
        plan_tp(gemm_workload(64, 64, 64), 2, TRN1, "neuronxcc", default_kernels(TRN1, "neuronxcc"))


@pytest.mark.parametrize(("strategy", "tokens", "tp", "intermediate"), [
    ("replicate-u/reduce-output", 32, 2, 640),
    ("replicate-u/reduce-rank", 1, 2, 640),
    ("factor-shard/factor-shard", 32, 2, 640),
    ("factor-shard/reduce-rank", 1, 2, 640),
    ("replicate-u/reduce-output", 1, 3, 640),  # ragged: 214, 213, 213 columns, two roles
    ("replicate-u/reduce-rank", 32, 4, 600),  # ragged: 150 columns per rank
])
def test_every_strategy_verifies_across_ranks(tmp_path, strategy, tokens, tp, intermediate):
    out = tmp_path / "plan"
    args = ["emit", "--mlp", "--tokens", str(tokens), "--hidden", "256", "--intermediate", str(intermediate),
            "--keep-ratio", "0.8", "--tp", str(tp), "--tp-strategy", strategy, "-o", str(out)]
    _run(args)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["strategy"]["name"] == strategy and len(plan["ranks"]) == tp
    assert all((out / entry["file"]).is_file() for entry in plan["kernels"].values())
    report = verify_plan(out / "plan.json", seed=3)
    assert report.ok, report.lines(None)
    assert len(report.per_rank) == tp
    assert report.totals["total_hbm_bytes_read"] == sum(r["total_hbm_bytes_read"] for r in report.per_rank)


def test_verify_fails_when_a_rank_reads_the_wrong_slice(tmp_path):
    out = tmp_path / "plan"
    _run(["emit", *SMALL, "--tokens", "32", "--tp", "2", "--tp-strategy", "replicate-u/reduce-output", "-o", str(out)])
    plan = json.loads((out / "plan.json").read_text())
    plan["ranks"][1]["steps"][0]["args"]["v_gate"]["cols"] = [0, 320]  # rank 1 reads rank 0's columns
    (out / "plan.json").write_text(json.dumps(plan))
    result = _run(["verify", str(out / "plan.json")], exit_code=1)
    assert "FAILED" in result.output


def test_tune_tp_writes_the_chosen_plan_and_verifies(tmp_path):
    out = tmp_path / "tuned"
    result = _run(["tune", *SMALL, "--tokens", "1", "--tp", "2", "--no-cache", "--trials", "5", "--method", "optuna",
                   "--verify", "-o", str(out)])
    assert "<- chosen" in result.output and "not validated against measurements" in result.output
    assert "model error" in result.output or "typically within" in result.output
    assert "OK: relative error" in result.output
    plan = json.loads((out / "plan.json").read_text())
    assert plan["predicted"]["total_us"] == pytest.approx(plan["predicted"]["kernel_us"] + plan["predicted"]["comm_us"])


def test_tp_1_is_todays_output(tmp_path):
    base = ["tune", "--mlp", "--tokens", "1", "--hidden", "256", "--intermediate", "640", "--keep-ratio", "0.8",
            "--trials", "30", "--no-cache"]
    plain = _run([*base, "-o", str(tmp_path / "a.py")])
    with_tp = _run([*base, "--tp", "1", "-o", str(tmp_path / "b.py")])
    assert (tmp_path / "a.py").read_bytes() == (tmp_path / "b.py").read_bytes()
    def same(text: str, name: str) -> str:  # the search's wall time differs from run to run
        return re.sub(r"[0-9.]+ s\b", "T s", text.replace(name, "X"))

    assert same(plain.output, "a.py") == same(with_tp.output, "b.py")


@pytest.mark.parametrize(("args", "message"), [
    (["cost", "--shape", "64x64x64", "--tp", "2"], "--tp shards a gated MLP"),
    (["cost", *SMALL, "--tokens", "1", "--tp", "0"], "must be a positive integer"),
    (["cost", *SMALL, "--tokens", "1", "--tp", "1000"], "exceeds the intermediate size 640"),
    (["cost", *SMALL, "--tokens", "1", "--tp-strategy", "replicate-u/reduce-rank"], "give --tp N with N > 1"),
    (["cost", *SMALL, "--tokens", "1", "--tp", "2", "--tp-strategy", "bogus"], "unknown tensor-parallel strategy"),
    (["emit", *SMALL, "--tokens", "1", "--tp", "2", "-o", "-"], "give -o DIR"),
])
def test_bad_tp_requests_get_one_line(args, message):
    result = _run(args, exit_code=2)
    assert message in result.output


def test_cost_and_explain_tp_print_every_strategy():
    cost = _run(["cost", *SMALL, "--tokens", "32", "--tp", "2", "--json"])
    data = json.loads(cost.output)
    assert len(data["strategies"]) == 6 and data["written_to"] is None
    explain = _run(["explain", *SMALL, "--tokens", "32", "--tp", "2"])
    assert "=== kernel" in explain.output and "reduce-rank" in explain.output


def test_tune_model_tp_writes_one_plan_per_bucket(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "intermediate_size": 640,
                                  "num_hidden_layers": 2, "torch_dtype": "bfloat16"}))
    out = tmp_path / "kernels"
    # buckets 1 and 2 (was 1 and 32): one plan per bucket, each verified across its ranks, at ~2 CPU s less (the
    # 32-token searches' spaces are larger); test_every_strategy_verifies_across_ranks verifies 32-token plans
    result = _run(["tune", "--model", str(config), "--keep-ratio", "0.8", "--tokens", "1,2", "--tp", "2",
                   "--no-cache", "--trials", "5", "--method", "optuna", "--verify", "-o", str(out)])
    index = json.loads((out / "index.json").read_text())
    assert [b["tokens"] for b in index["buckets"]] == [1, 2] and index["tp"] == 2
    assert all(b["verified"] for b in index["buckets"])
    assert all((out / b["plan"]).is_file() for b in index["buckets"])
    assert "not validated against measurements" in result.output
    for b in index["buckets"]:  # what the chosen strategy keeps, and a more accurate one when there is one
        assert f"kept {b['kept_fraction']:.3f}" in result.output
        assert ("more_accurate" in b) == (b["kept_fraction"] < 0.9 - 1e-9)  # factor-shard/factor-shard keeps 0.9
    assert result.output.count("ACCURACY:") == sum("more_accurate" in b for b in index["buckets"])


def test_compress_tp_writes_each_ranks_own_factors_in_the_plans_layout(tmp_path):
    import numpy as np
    from safetensors.numpy import load_file, save_file

    hidden, inter = 256, 768
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": hidden,
                                                   "intermediate_size": inter, "num_hidden_layers": 1,
                                                   "torch_dtype": "float32"}))
    rng = np.random.default_rng(0)
    weights = {"gate": rng.standard_normal((inter, hidden)), "up": rng.standard_normal((inter, hidden)),
               "down": rng.standard_normal((hidden, inter))}
    save_file({f"model.layers.0.mlp.{p}_proj.weight": w.astype(np.float32) for p, w in weights.items()},
              str(model / "model.safetensors"))
    out = tmp_path / "factors"
    _run(["compress", str(model), "--keep-ratio", "0.8", "--tp", "2", "-o", str(out)])
    shards = json.loads((out / "tp2" / "shards.json").read_text())
    assert shards["intermediate_shards"] == [{"rank": 0, "start": 0, "stop": 384},
                                             {"rank": 1, "start": 384, "stop": 768}]
    assert shards["factor_shard"]["layers"][0]["factor_shard_ranks"] == {"gate": [128, 128], "up": [128, 128],
                                                                         "down": [128, 128]}
    assert shards["factor_shard"]["kept_fraction"] == pytest.approx(128 * (256 + 384) / (256 * 384))
    rank1 = load_file(str(out / "tp2" / "layer_000.rank1.safetensors"))
    u, v = rank1["model.layers.0.mlp.gate_proj.u"], rank1["model.layers.0.mlp.gate_proj.v"]
    block = weights["gate"].T[:, 384:]
    optimal = np.linalg.svd(block, compute_uv=False)
    best = np.sqrt(np.sum(optimal[128:] ** 2)) / np.linalg.norm(block)
    assert np.linalg.norm(block - u.astype(np.float64) @ v) / np.linalg.norm(block) == pytest.approx(best, rel=1e-4)
    # the same shapes as the plan of that MLP's factor-shard strategy names
    sharded = shard_mlp(mlp_workload(1, hidden, inter, ranks=(128, 128, 128)), 2, Strategy("factor-shard",
                                                                                         "factor-shard"))
    assert sharded.factors["u_gate.r1"].shape == u.shape and sharded.factors["v_gate.r1"].shape == v.shape
    down = rank1["model.layers.0.mlp.down_proj.u"]
    assert sharded.factors["u_down.r1"].shape == down.shape


def test_each_ranks_counted_bytes_equal_the_cost_models(tmp_path):
    workload = mlp_workload(32, 256, 640, keep_ratio=0.8)
    result = plan_tp(workload, 3, TRN1, "neuronxcc", default_kernels(TRN1, "neuronxcc"),
                     only="replicate-u/reduce-rank")
    from neuronmm_compiler.tensor_parallel.plan import write_plan

    write_plan(result, "neuronxcc", tmp_path)
    report = verify_plan(tmp_path / "plan.json")
    assert report.ok
    for program, counted in zip(result.chosen.sharded.ranks, report.per_rank, strict=True):
        kernels = [result.chosen.kernels[s.key].cost for s in program.steps if isinstance(s, KernelStep)]
        assert counted["total_hbm_bytes_read"] == sum(c.hbm_bytes_read for c in kernels)
        assert counted["total_hbm_bytes_written"] == sum(c.hbm_bytes_written for c in kernels)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_the_plan_says_what_each_strategy_keeps_and_when_the_choice_is_less_accurate(dtype):
    # SmolLM2-135M's MLP at rank 384: a [576, 768] shard cannot keep the unsharded 0.917 at an aligned rank that
    # compresses it, so factor-shard's blocks get rank 256 (compress --tp measured this fraction: 0.778)
    args = ["cost", "--mlp", "--tokens", "32", "--hidden", "576", "--intermediate", "1536", "--ranks", "384,384,384",
            "--target", "trn2", "--dtype", dtype, "--tp", "2"]
    data = json.loads(_run([*args, "--json"]).output)
    kept = {s["strategy"]: s["kept_fraction"] for s in data["strategies"] if s["applies"]}
    dense = 3 * 576 * 1536
    unsharded, block = 3 * 384 * (576 + 1536) / dense, 2 * 256 * (576 + 768) / (576 * 1536)
    assert kept["replicate-u/reduce-output"] == pytest.approx(unsharded)  # scales (FP8) not counted
    assert kept["factor-shard/factor-shard"] == pytest.approx(block) and round(block, 3) == 0.778
    assert kept["replicate-u/factor-shard"] == pytest.approx((2 * unsharded + block) / 3)
    text = _run(args).output
    chosen = data["strategy"]["name"]
    best = min((s for s in data["strategies"] if s["applies"] and s["kept_fraction"] == pytest.approx(unsharded)),
               key=lambda s: s["total_us"])["strategy"]
    assert ("ACCURACY:" in text) == (kept[chosen] < unsharded - 1e-9)
    if kept[chosen] < unsharded - 1e-9:
        assert f"ACCURACY: {chosen} keeps {kept[chosen]:.3f} of the parameters against {unsharded:.3f}" in text
        assert f"--tp-strategy {best}' takes it" in text
    # a shard's aligned rank can also keep more than the unsharded factors (hidden 256, intermediate 640, rank 128:
    # [256, 320] shards at rank 128 keep 0.9 against 0.7; gate and up are two thirds of the parameters, down one);
    # one strategy asked for needs no comparison
    small = json.loads(_run(["cost", *SMALL, "--tokens", "32", "--tp", "2", "--json"]).output)
    assert {s["strategy"]: round(s["kept_fraction"], 3) for s in small["strategies"] if s["applies"]} == {
        "replicate-u/reduce-output": 0.7, "replicate-u/reduce-rank": 0.7, "replicate-u/factor-shard": 0.767,
        "factor-shard/reduce-output": 0.833, "factor-shard/reduce-rank": 0.833, "factor-shard/factor-shard": 0.9}
    assert "kept:" not in _run([*args, "--tp-strategy", "factor-shard/factor-shard"]).output
