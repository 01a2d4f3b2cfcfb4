"""The launch context (issue 24, item 2) and the order of the baselines (item 3).

``--launch standalone|in-graph`` resolves into the target spec (``trn2:lnc=2:launch=in-graph``): standalone, a
workload pays one measured launch; in-graph, every kernel pays an assumed per-kernel cost, so a baseline of several
kernels pays it several times. MLP, model and tensor-parallel workloads default to in-graph, GEMMs, chains and graph
files to standalone. Every printed speedup names its context; nmmc's own fused dense MLP is the first baseline of an
SVD MLP; a speedup below 1 says it is a slowdown; ``tune --model`` recommends the dense MLP where the SVD one does
not win. Small shapes and few trials: these run in seconds.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from neuronmm_compiler.checkpoints.config import read_config
from neuronmm_compiler.cli import main
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.lowerings import lowering_for
from neuronmm_compiler.model_tuning.pipeline import ModelSource, tune_model
from neuronmm_compiler.model_tuning.report import model_lines
from neuronmm_compiler.targets import IN_GRAPH, STANDALONE, get_target, with_launch
from neuronmm_compiler.tuning.speedups import latency_at, launches, speedup_text

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)

MLP = ("--mlp", "--tokens", "16", "--hidden", "256", "--intermediate", "512")


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_target_spec_carries_the_launch_context():
    target = get_target("trn2:lnc=2:launch=in-graph")
    assert (target.launch, target.lnc, target.spec) == (IN_GRAPH, 2, "trn2:lnc=2:launch=in-graph")
    assert target.label == "trn2 LNC=2 in-graph"
    assert get_target("trn2:lnc=2:launch=standalone").spec == "trn2:lnc=2"  # a spec without it is standalone
    assert get_target("trn1").launch == STANDALONE
    # standalone predictions do not read the in-graph fields: the dict (and the cache's fingerprint) leave them out
    assert "launch" not in get_target("trn2").as_dict() and "in_graph_kernel_us" not in get_target("trn2").as_dict()
    assert get_target("trn2:launch=in-graph").model_fingerprint() != get_target("trn2").model_fingerprint()


def test_in_graph_baselines_pay_the_per_kernel_cost_per_kernel():
    """The AWS dense baseline of an MLP is five kernels (three GEMMs, SiLU, multiply): standalone it pays one 45.3 us
    launch, in-graph five times 2 us."""
    workload = mlp_workload(16, 256, 512, dense=True)
    standalone, in_graph = (with_launch(get_target("trn2:lnc=1"), launch) for launch in (STANDALONE, IN_GRAPH))
    sa = lowering_for(workload).baselines(workload, standalone)["dense"].cost
    ig = lowering_for(workload).baselines(workload, in_graph)["dense"].cost
    assert (launches(sa), launches(ig)) == (1, 5)
    assert ig.latency_us == pytest.approx(sa.latency_us - 45.3 + 5 * 2.0)
    assert latency_at(ig, 0.0) == pytest.approx(sa.latency_us - 45.3)  # the sensitivity re-reads the same report


@pytest.mark.parametrize(("args", "context"), [
    ((*MLP, "--rank", "128"), "in-graph"),  # an MLP runs inside a model graph
    ((*MLP, "--rank", "128", "--launch", "standalone"), "standalone"),
    (("--shape", "128x256x256"), "standalone"),  # a GEMM, as AWS's published measurements time it
    (("--shape", "128x256x256", "--launch", "in-graph"), "in-graph"),
    (("--graph", "examples/graphs/lora.yaml", "--dim", "tokens=16"), "standalone"),
])
def test_default_launch_context_follows_the_workload(args, context):
    first = run("cost", *args).splitlines()[0]
    assert first.endswith(" in-graph") == (context == "in-graph"), first
    header = next(line for line in run("emit", *args, "-o", "-").splitlines() if line.startswith("# predicted"))
    assert ("in-graph: 2 us per kernel, assumed" if context == "in-graph" else
            "standalone launch: 45.3 us once per workload") in header, header


def test_tune_names_the_launch_context_and_leads_with_nkilib(tmp_path):
    out = run("tune", *MLP, "--rank", "128", "--trials", "3", "-o", str(tmp_path / "k.py")).splitlines()
    speedups = [line for line in out if line.startswith("speedup vs")]
    # AWS's LNC=1 kernels cannot run in an LNC=2 model graph (NCC_EVRF066): references, no speedup over them
    assert [line.split(" (")[0] for line in speedups] == [
        "speedup vs nki-library's fused MLP", "speedup vs nmmc's fused dense MLP"]
    assert [line.split(" (")[0] for line in out if line.startswith("not compared with")] == [
        "not compared with dense", "not compared with unfused SVD"]
    assert all("(in-graph):" in line and "at 0 us, " in line and "at 5 us per kernel" in line for line in speedups)
    assert any(line.strip().startswith("launch context: in-graph: every kernel pays 2 us") for line in out)
    data = json.loads(run("tune", *MLP, "--rank", "128", "--trials", "3", "--json", "-o", str(tmp_path / "k.py")))
    assert list(data["baselines"]) == ["nkilib-mlp", "nmmc-dense", "dense", "unfused"]
    assert data["launch"]["context"] == "in-graph" and data["launch"]["per_kernel_us"] == 2.0
    gemm = run("tune", "--shape", "128x256x256", "--trials", "3", "-o", str(tmp_path / "g.py"))
    assert "speedup vs aws-fully-optimized (standalone): " in gemm and "launch context: standalone" in gemm


def test_a_speedup_below_one_says_slower():
    assert speedup_text(0.8312) == "0.83x (slower)" and speedup_text(1.84) == "1.84x"


def test_tune_model_recommends_dense_where_svd_does_not_win(tmp_path):
    """Ranks as large as the hidden size: the SVD factors hold more bytes than the dense weights, so nmmc's dense MLP
    is faster; the bucket recommends it, writes its kernel, and the table says so with the slowdown."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 256,
                                                      "intermediate_size": 512, "num_hidden_layers": 2}))
    source = ModelSource(read_config(tmp_path / "config.json"), (256, 256, 256), None, "manifest")
    target = with_launch(get_target("trn2:lnc=2"), IN_GRAPH)
    index = tune_model(source, [4], tmp_path / "out", target=target, dialect="nki", trials=3)
    bucket = index["buckets"][0]
    assert bucket["speedup_vs_fused_dense"] < 1
    assert (bucket["recommended"], bucket["recommended_file"]) == ("dense", "mlp_t4_dense.py")
    assert (tmp_path / "out" / "mlp_t4_dense.py").is_file()
    assert [b["name"] for b in bucket["baselines"]] == ["nkilib-mlp", "nmmc-dense", "dense", "unfused"]
    assert index["launch"]["context"] == "in-graph"
    text = "\n".join(model_lines(source, index, target, str(tmp_path / "out")))
    assert "(slower)" in text and "recommended: nmmc's dense MLP (mlp_t4_dense.py)" in text
    assert "launch context: in-graph" in text and "wrote 2 kernel files" in text


def test_tensor_parallel_leads_with_nkilib_in_graph():
    out = run("cost", *MLP, "--rank", "128", "--tp", "2")
    versus = [line.split(" vs ", 1)[1] for line in out.splitlines() if " vs dense, " in line]
    assert versus[0].startswith("dense, nki-library MLP + all-reduce (in-graph): ")
    assert versus[1].startswith("dense, nmmc fused MLP + all-reduce (in-graph): ")
    assert len(versus) == 2  # AWS's LNC=1 kernels cannot run in the LNC=2 graph: no alternative, no ratio
    assert "dense, AWS kernel per projection + all-reduce" in out and "cannot run in this launch context" in out
    assert "launch context: in-graph" in out


def test_help_documents_launch():
    text = " ".join(run("tune", "--help").split())
    assert "--launch [standalone|in-graph]" in text and "in-graph for --mlp, --model and --tp" in text
