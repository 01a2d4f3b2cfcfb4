"""A baseline that cannot run in the launch context is a reference, never a speedup (lowerings/base.py,
Baseline.runnable): AWS's LNC=1 kernels inside an LNC=2 model graph (NCC_EVRF066), nki-library's MLP where it asserts
or where vLLM Neuron does not call it. Every printer honours it: tune's table and --json, tune --model's tables."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.lowerings.base import aws_baseline
from neuronmm_compiler.lowerings.nkilib_cte import slab_buffers
from neuronmm_compiler.lowerings.nkilib_mlp import nkilib_baseline, vllm_refusal
from neuronmm_compiler.model_tuning.report import _dense_table
from neuronmm_compiler.targets import IN_GRAPH, STANDALONE, get_target, with_launch, with_lnc

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)

TRN2 = get_target("trn2")
#: The Llama-3.1-8B decode MLP on one LNC=2 logical core, in a model graph: the command of the headline.
LLAMA8B_DECODE = ["tune", "--mlp", "--tokens", "1", "--hidden", "4096", "--intermediate", "14336", "--dense",
                  "--trials", "12"]


def _target(lnc: int, launch: str):
    return with_launch(with_lnc(TRN2, lnc), launch)


def test_llama8b_decode_prints_no_speedup_over_a_baseline_that_cannot_run_in_graph(tmp_path):
    result = CliRunner().invoke(main, [*LLAMA8B_DECODE, "-o", str(tmp_path / "k.py")])
    assert result.exit_code == 0, result.output
    assert "speedup vs" not in result.output  # neither AWS's LNC=1 kernels nor nki-library's MLP runs here
    assert "ref: dense (AWS kernels, LNC=1)" in result.output
    assert "not compared with dense (in-graph): cannot run here" in result.output and "NCC_EVRF066" in result.output
    assert "not compared with nki-library's fused MLP" in result.output and "_can_use_kernel" in result.output
    assert "@d2ad3a57" in result.output  # the label names the nki-library commit its model is read from


def test_llama8b_decode_json_says_per_baseline_whether_it_runs_and_why_not(tmp_path):
    result = CliRunner().invoke(main, [*LLAMA8B_DECODE, "--json", "-o", str(tmp_path / "k.py")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    dense, nkilib = data["baselines"]["dense"], data["baselines"]["nkilib-mlp"]
    assert dense["runnable"] is False and "NCC_EVRF066" in dense["not_runnable"]
    assert dense["latency_us"] > 0  # still shown, as a reference
    assert nkilib["runnable"] is False and "Stack out of memory" in nkilib["not_runnable"]
    assert nkilib["source"].startswith("aws-neuron/nki-library@d2ad3a57")
    assert data["speedups"] == {"nkilib-mlp": None, "dense": None}


def test_standalone_the_one_core_baseline_runs_and_is_compared():
    workload = mlp_workload(8, 512, 1024, dense=True)
    standalone = aws_baseline("dense (AWS kernels)", "dense", None, _target(2, STANDALONE))
    assert standalone.runnable and standalone.label == "dense (AWS kernels, LNC=1)"
    assert aws_baseline("dense (AWS kernels)", "dense", None, _target(1, IN_GRAPH)).runnable  # an LNC=1 graph
    in_graph = aws_baseline("dense (AWS kernels)", "dense", None, _target(2, IN_GRAPH))
    assert not in_graph.runnable and "NCC_EVRF066" in in_graph.not_runnable
    assert in_graph.context_dict() == {"runnable": False, "not_runnable": in_graph.not_runnable}
    runs = nkilib_baseline(workload, _target(2, IN_GRAPH))
    assert runs.runnable and runs.speedup(runs.cost) == 1.0


def test_vllm_neurons_gate_and_what_runs_instead():
    assert vllm_refusal(1, 4096, 14336) is None  # decode: H a multiple of 256, the kernel is called
    assert "256" in vllm_refusal(8, 2944, 8192)
    assert "PSUM banks" in vllm_refusal(512, 2048, 8192)  # 16 tiles of I: PyTorch fallback
    assert vllm_refusal(256, 8192, 8192) is None  # I/2 sharded on its two cores: 8 tiles of 512
    assert "PSUM banks" in vllm_refusal(256, 8192, 14336)  # 14 tiles of I/2
    # the kernel itself runs Llama-3.2-1B's prefill at 512 tokens, but vLLM Neuron does not call it there
    baseline = nkilib_baseline(mlp_workload(512, 2048, 8192, dense=True), _target(2, IN_GRAPH))
    assert baseline.cost is not None and not baseline.runnable and baseline.speedup(baseline.cost) is None
    assert "PyTorch fallback" in baseline.not_runnable and "not called by vLLM Neuron" in baseline.label


def test_prefill_ring_takes_as_many_slabs_as_fit():
    # 092a49dc: min(free // slab, 4) gate/up slabs; d2ad3a57 always allocated 4 and did not fit at I_c = 4096
    assert slab_buffers(2048, 4096, 1) == 3
    assert slab_buffers(512, 1024, 4) == 4
    baseline = nkilib_baseline(mlp_workload(128, 2048, 8192, dense=True), _target(2, IN_GRAPH))
    assert baseline.runnable and baseline.cost is not None and baseline.cost.feasible
    assert baseline.label.endswith("@092a49dc)")


def test_model_table_marks_references_and_states_no_ratio():
    entry = {"tokens": 1, "predicted_us": 500.0, "nkilib_us": None, "speedup_vs_nkilib": None, "baseline_us": 1662.2,
             "speedup_vs_baseline": None, "kernels": [{}], "file": "mlp_t1.py",
             "baselines": [{"name": "nkilib-mlp", "computation": "nki-library MLP", "runnable": False,
                            "not_runnable": "its decode kernel asserts"},
                           {"name": "dense", "computation": "dense (AWS kernels, LNC=1)", "runnable": False,
                            "not_runnable": "NCC_EVRF066"}]}
    text = "\n".join(_dense_table([entry]))
    row = next(line for line in text.splitlines() if "mlp_t1.py" in line).split()
    assert row[:7] == ["1", "500.0", "n/a", "-", "ref", "1662.2", "-"]  # no ratio over either reference
    assert "dense (AWS kernels, LNC=1): NCC_EVRF066" in text
