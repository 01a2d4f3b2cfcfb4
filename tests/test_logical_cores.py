"""Logical cores (LNC=2 on trn2/trn3): the target's degree, the split transformation every lowering shares
(kernel_ir/lnc.py), kernels of every kind verified with both programs run against one HBM, the interpreter's
race and exchange checks on mutated kernels, and the cost model per program."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import compile_graph
from neuronmm_compiler.cost_model import estimate
from neuronmm_compiler.errors import InputError, ScheduleError
from neuronmm_compiler.frontends.graph_file import load_graph_spec
from neuronmm_compiler.frontends.workloads import chain_workload, gemm_workload, graph_workload, mlp_workload
from neuronmm_compiler.kernel_ir.lnc import PROGRAM_ID, divisible_blocking
from neuronmm_compiler.kernel_ir.program import Loop, SendRecv, refs_of, walk
from neuronmm_compiler.lowerings.lower_gemm import lower_gemm
from neuronmm_compiler.schedule.gemm import GemmProblem, GemmSchedule
from neuronmm_compiler.targets import TARGETS, get_target, with_lnc
from neuronmm_compiler.verification import verify_source

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "graphs"


def lnc2(name: str = "trn2"):
    return with_lnc(get_target(name), 2)


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


def verified(compiled, **options):
    report = verify_source(compiled.kernel.source, filename="<lnc kernel>", **options)
    assert report.ok, report.error
    return report


# ----------------------------------------------------------------------------- the target


def test_target_degrees_and_specs():
    trn1, trn2 = get_target("trn1"), get_target("trn2")
    assert (trn1.max_lnc, trn1.default_lnc, trn2.max_lnc, trn2.default_lnc) == (1, 1, 2, 2)
    assert trn2.lnc == 1 and trn2.spec == "trn2"  # a stored "trn2" keeps meaning one physical core
    two = with_lnc(trn2, None)
    assert two.lnc == 2 and two.spec == "trn2:lnc=2" and two.label == "trn2 LNC=2"
    assert get_target(two.spec) == two and with_lnc(two, 1) == trn2
    assert two.model_fingerprint() != trn2.model_fingerprint()
    assert "lnc" not in trn2.as_dict()  # one core: the dict (and the cache keys of old records) as before
    with pytest.raises(InputError, match="supports LNC 1"):
        with_lnc(trn1, 2)
    assert "LNC=2" in dict(two.summary_rows())["logical core"]


# ----------------------------------------------------------------------------- the transformation


def test_divisible_blocking():
    assert divisible_blocking(20, 7, 2) == 5  # 10 tiles a program: blocks of 5, two blocks each
    assert divisible_blocking(112, 16, 2) == 14
    assert divisible_blocking(7, 4, 2) == 4  # odd: not divisible, left as it was
    assert divisible_blocking(8, 3, 1) == 3


def test_distribute_halves_the_block_loop_and_offsets_by_the_program_id():
    problem = GemmProblem(512, 1024, 256)
    schedule = GemmSchedule(tiles_in_block_m=1, loop_order="mnk", lnc_split="m")
    program = lower_gemm(problem, schedule, lnc2())
    assert program.programs == 2 and program.split == "m" and program.split_error is None
    (m_blk,) = [s for s, _ in walk(program.body) if isinstance(s, Loop) and s.var == "m_blk"]
    assert m_blk.trip.code() == "2"  # 4 blocks of M, 2 for each program
    starts = {ix.code() for s, _ in walk(m_blk.body) for r in refs_of(s) for ix in r.index}
    assert any(f"128 * m_blk + 256 * {PROGRAM_ID}" in start for start in starts)


@pytest.mark.parametrize(("m", "tile_m", "per_block"), [(384, 96, 2), (128, 64, 1), (1024, 128, 4)])
def test_the_divided_dimension_is_blocked_so_the_programs_share_it(m, tile_m, per_block):
    """3 tiles become 4 narrower ones (2 a block), 1 tile 2; 8 tiles in blocks of 5 become blocks of 4."""
    from neuronmm_compiler.schedule.gemm import normalize

    schedule = normalize(GemmProblem(m, 512, 256), GemmSchedule(tiles_in_block_m=5, loop_order="mnk",
                                                                lnc_split="m"), 2)
    assert (schedule.tile_m, schedule.tiles_in_block_m) == (tile_m, per_block)
    assert lower_gemm(GemmProblem(m, 512, 256), schedule, lnc2()).split_error is None


@pytest.mark.parametrize(("m", "schedule", "reason"), [
    (1, GemmSchedule(loop_order="mnk", lnc_split="m"), "divides by the 'm' split"),  # one row cannot be divided
    # M inside the K loop with SBUF partial sums: the M block loop does not own its outputs
    (512, GemmSchedule(tiles_in_block_k=1, loop_order="kmn", accumulate="sbuf", lnc_split="m"), "nothing in"),
])
def test_a_split_that_does_not_divide_is_infeasible_with_the_reason(m, schedule, reason):
    program = lower_gemm(GemmProblem(m, 512, 256), schedule, lnc2())
    assert reason in program.split_error
    assert not estimate(program, lnc2()).feasible


def test_lnc_split_on_one_core_is_refused_and_resolved_to_none():
    from neuronmm_compiler.driver import compile_workload

    with pytest.raises(ScheduleError, match="runs one program"):
        compile_workload(gemm_workload(256, 512, 128), target=get_target("trn2"), params={"lnc_split": "m"})
    compiled = compile_workload(gemm_workload(256, 512, 128), target=get_target("trn2"))
    assert compiled.schedule.lnc_split == "none" and "program_id" not in compiled.kernel.source


# ----------------------------------------------------------------------------- kernels of every kind, both programs run


@pytest.mark.parametrize("target", ["trn2", "trn3"])
@pytest.mark.parametrize(("shape", "params"), [
    ((500, 1024, 200), {"lnc_split": "m", "tiles_in_block_m": 1, "loop_order": "mnk"}),  # ragged last M tile
    ((256, 1500, 300), {"lnc_split": "n", "tile_n": 375}),  # ragged K, N in 4 tiles
    ((1, 4096, 512), {"lnc_split": "n"}),  # decode
])
def test_gemm_verifies_with_both_programs(target, shape, params):
    from neuronmm_compiler.driver import compile_workload

    compiled = compile_workload(gemm_workload(*shape), target=lnc2(target), dialect="nki", params=params)
    report = verified(compiled)
    assert "nl.program_id(0)" in compiled.kernel.source
    assert report.counters["hbm_bytes_written"]["c"] == shape[0] * shape[1] * 2  # every element once
    cost = compiled.cost
    assert nonzero(report.counters["hbm_bytes_read"]) == nonzero(cost.hbm_bytes_read_by_tensor)  # both programs
    assert report.counters["dma_transfers"] == cost.dma_transfers
    assert report.counters["matmul_instructions"] == cost.matmul_instructions
    assert len(cost.program_latency_us) == 2
    programs = report.counters["programs"]  # each program's own counts, besides their sums
    assert len(programs) == 2 and sum(p["matmul_instructions"] for p in programs) == cost.matmul_instructions
    assert programs[0]["matmul_instructions"] == programs[1]["matmul_instructions"]  # an even split


@pytest.mark.parametrize(("workload", "params"), [
    (chain_workload(256, 1024, 512, rank=256), {"lnc_split": "tokens", "tokens_per_block": 128}),
    (chain_workload(77, 1000, 600, rank=256), {"lnc_split": "features", "out_tile": 250}),  # ragged tokens
    (chain_workload(1, 1024, 1024, rank=256), {"lnc_split": "gather"}),
    (mlp_workload(1, 512, 1024, dense=True), {"lnc_split": "gather"}),
    (mlp_workload(8, 512, 1024, keep_ratio=0.8), {"lnc_split": "gather", "mlp": "split"}),
    (mlp_workload(256, 512, 1024, rank=256), {"lnc_split": "tokens", "tokens_per_block": 128}),
    (mlp_workload(96, 512, 1024, rank=256), {"lnc_split": "features"}),
    (mlp_workload(1, 512, 1024, dense=True), {"lnc_split": "intermediate"}),  # partial down projections, reduced
    (mlp_workload(8, 512, 1024, keep_ratio=0.8), {"lnc_split": "intermediate"}),  # partial h U_d, all-reduced
    (chain_workload(4, 1024, 512, rank=256), {"lnc_split": "intermediate"}),  # partial (X U) V, reduced
    (mlp_workload(1, 512, 1024, dense=True), {"lnc_split": "hidden"}),  # AWS's decode MLP: gate/up over half of H
    (mlp_workload(8, 512, 1024, keep_ratio=0.8), {"lnc_split": "hidden", "x_transpose": "pe"}),
    (mlp_workload(4, 512, 1024, dense=True), {"lnc_split": "hidden", "mlp": "split"}),  # h^T streamed, halves stored
    (chain_workload(4, 1024, 512, rank=256), {"lnc_split": "hidden"}),
    # 3 rank tiles, which two programs cannot share: h U_d divides its contraction (I) instead, so U_d is still
    # streamed once over the two programs
    (mlp_workload(3, 512, 1024, rank=384), {"lnc_split": "hidden"}),
])
def test_fused_kernels_verify_with_both_programs(workload, params):
    compiled = compile_graph(workload, target=lnc2(), dialect="nki", params=params)
    report = verified(compiled)
    assert compiled.schedule.lnc_split == params["lnc_split"]
    assert nonzero(report.counters["hbm_bytes_read"]) == nonzero(compiled.cost.hbm_bytes_read_by_tensor)
    assert report.counters["dma_transfers"] == compiled.cost.dma_transfers
    if params["lnc_split"] in ("gather", "hidden", "intermediate"):
        assert "nki.lnc.sendrecv(" in compiled.kernel.source
        # every weight crosses HBM once over both programs: each streamed its half
        inputs = {n.attrs["name"] for n in workload.graph().inputs()} - {"x"}
        weights = {k: v for k, v in report.counters["hbm_bytes_read"].items() if k in inputs}
        assert all(v == n for k, v in weights.items() for n in [_bytes(workload, k)])


@pytest.mark.parametrize("split", ["gather", "intermediate"])
def test_a_share_of_prime_tiles_is_blocked_within_each_programs_share(split):
    """14 feature tiles are a share of 7 per program, which whole blocks divide only into blocks of 1: the tiles are
    split into the programs' shares first and each share blocked as the schedule asks (4 + 3 tiles), so a weight
    block moves 512 columns, not 128; both programs verify and every weight crosses HBM once."""
    workload = mlp_workload(8, 512, 1792, dense=True)
    params = {"lnc_split": split, "weight_block_kib": 4, "k_tiles_per_block": 0, "weight_dma": "row"}
    compiled = compile_graph(workload, target=lnc2(), dialect="nki", params=params)
    report = verified(compiled)
    source = compiled.kernel.source
    assert "f_share" not in source and "min(4, 7 - 4 * f_blk)" in source  # a share of 1 iteration is folded
    assert report.counters["dma_transfers"] == compiled.cost.dma_transfers
    assert report.counters["hbm_bytes_read"]["w_gate"] == _bytes(workload, "w_gate")
    assert 1024 in compiled.cost.dma_bytes_per_partition  # 512-column weight rows


def _bytes(workload, name: str) -> int:
    node = next(n for n in workload.graph().inputs() if n.attrs["name"] == name)
    size = 2
    for extent in node.shape:
        size *= extent
    return size


def test_a_programs_own_slots_are_cut_to_its_share():
    """The X^T strip and the weight blocks of a divided contraction hold only this program's K slots (indexed by
    its own iteration), while h^T, which both programs hold whole after the reduction, keeps its extent."""
    compiled = compile_graph(mlp_workload(1, 512, 1024, dense=True), target=lnc2(), dialect="nki",
                             params={"lnc_split": "hidden"})
    source = compiled.kernel.source
    assert "x_strip = nl.ndarray((P, 2, TOKENS_PER_BLOCK)" in source  # 4 K tiles of 128, 2 per program
    assert "x_strip[0:P, kt, 0:TOKEN_TILE]" in source and "kt + 2 * pid" not in source
    assert "h_strip = nl.ndarray((P, 8, TOKENS_PER_BLOCK)" in source
    report = verified(compiled)
    one_core = compile_graph(mlp_workload(1, 512, 1024, dense=True), target=get_target("trn2"), dialect="nki")
    assert report.counters["sbuf_peak_bytes"] == compiled.cost.sbuf_bytes_per_partition
    assert compiled.cost.sbuf_bytes_per_partition < 2 * one_core.cost.sbuf_bytes_per_partition


def test_user_graph_verifies_with_both_programs():
    spec = load_graph_spec(EXAMPLES / "lora.yaml")
    workload = graph_workload(spec.graph({"tokens": 256}), "lora")
    compiled = compile_graph(workload, target=lnc2("trn3"), dialect="nki",
                             params={"tokens_per_block": 128, "lnc_split": "tokens"})
    verified(compiled)


def test_default_split_is_one_that_divides():
    compiled = compile_graph(mlp_workload(1, 512, 1024, keep_ratio=0.8), target=lnc2(), dialect="nki")
    assert compiled.schedule.lnc_split != "none"
    verified(compiled)


def test_gather_is_refused_in_the_legacy_dialect():
    with pytest.raises(ScheduleError, match="nki dialect"):
        compile_graph(mlp_workload(1, 512, 1024, dense=True), target=lnc2(), dialect="neuronxcc",
                      params={"lnc_split": "gather"})


def test_legacy_dialect_kernel_verifies_with_both_programs():
    compiled = compile_graph(mlp_workload(256, 512, 1024, rank=256), target=lnc2(), dialect="neuronxcc",
                             params={"lnc_split": "tokens", "tokens_per_block": 128})
    assert "import neuronxcc.nki as nki" in compiled.kernel.source
    verified(compiled)


# ----------------------------------------------------------------------------- mutations the interpreter must catch


def _gemm_source() -> str:
    from neuronmm_compiler.driver import compile_workload

    return compile_workload(gemm_workload(512, 1024, 256), target=lnc2(), dialect="nki",
                            params={"lnc_split": "m", "tiles_in_block_m": 1, "loop_order": "mnk"}).kernel.source


def test_overlapping_split_fails_with_the_overlap_id():
    source = _gemm_source().replace("pid = nl.program_id(0)", "pid = nl.program_id(0) * 0")
    report = verify_source(source)
    assert not report.ok and "LNC-HBM-WRITE-OVERLAP" in report.error


def test_reading_the_other_programs_output_fails_with_the_unsynced_read_id():
    source = _gemm_source()
    kernel_end = source.index("    return c")
    source = source[:kernel_end] + ("    probe = nl.ndarray((1, 1), dtype=nl.bfloat16, buffer=nl.sbuf)\n"
                                    "    nisa.dma_copy(dst=probe[0:1, 0:1], src=c[0:1, 0:1])\n") + source[kernel_end:]
    report = verify_source(source)
    assert not report.ok and "LNC-HBM-UNSYNCED-READ" in report.error


@pytest.fixture(scope="module")
def gather_source() -> str:
    compiled = compile_graph(mlp_workload(1, 512, 1024, dense=True), target=lnc2(), dialect="nki",
                             params={"lnc_split": "gather"})
    assert any(isinstance(s, SendRecv) for p in compiled.programs for s, _ in walk(p.body))
    return compiled.kernel.source


def test_removed_exchange_fails_with_the_unwritten_read_id(gather_source):
    lines = [line for line in gather_source.splitlines() if "sendrecv(" not in line]
    report = verify_source("\n".join(lines) + "\n")
    assert not report.ok and "KERNEL-UNWRITTEN-READ" in report.error


def test_both_exchange_spellings_run_in_the_interpreter(gather_source):
    """SDK 2.34's nki.lnc.sendrecv (the default) and 2.29-2.33's nisa.sendrecv(..., pipe_id=0) exchange alike with
    both programs run; nki.lnc.sendrecv has no pipe_id (the nki.lnc API page), so a call with one is refused."""
    old = compile_graph(mlp_workload(1, 512, 1024, dense=True), target=lnc2(), dialect="nki", sdk="2.33",
                        params={"lnc_split": "gather"}).kernel.source
    assert "nki.lnc.sendrecv(" in gather_source and "nisa.sendrecv(" in old and "nki.lnc" not in old
    for source in (gather_source, old):
        report = verify_source(source, rules=True)
        assert report.ok and report.lnc == 2, report.error
    bad = verify_source(gather_source.replace("recv_from_rank=1 - pid)", "recv_from_rank=1 - pid, pipe_id=0)", 1))
    assert not bad.ok and "nki.lnc.sendrecv" in bad.error and "pipe_id" in bad.error


def test_mismatched_exchange_fails_with_the_exchange_id(gather_source):
    source = gather_source.replace("send_to_rank=1 - pid, recv_from_rank=1 - pid",
                                   "send_to_rank=pid, recv_from_rank=pid", 1)
    report = verify_source(source)
    assert not report.ok and "LNC-EXCHANGE-MISMATCH" in report.error


@pytest.mark.parametrize("split", ["intermediate", "hidden"])
def test_a_partial_sum_left_unreduced_fails_verify(split):
    compiled = compile_graph(mlp_workload(1, 512, 1024, dense=True), target=lnc2(), dialect="nki",
                             params={"lnc_split": split})
    source = compiled.kernel.source
    assert "_partial" in source or "rows_other" in source  # partial sums, then the other program's added
    lines = [line for line in source.splitlines() if "op=nl.add" not in line]  # the partial sums never added
    report = verify_source("\n".join(lines) + "\n")
    assert not report.ok and report.rel_error is not None and report.rel_error > 0.1


def test_a_contraction_of_one_tile_is_not_divided():
    """Found by scripts/fuzz.py: x @ U over 120 rows is one contraction tile, no loop to divide, so under the hidden
    split both programs summed the whole product and the exchange doubled it (the kernel failed verify with a
    relative error of 1.0). Such a group is not reduced; with nothing else to divide, the split is a user error."""
    with pytest.raises(ScheduleError, match="nothing in kernel svd_chain_k0 divides by the 'hidden' split"):
        compile_graph(chain_workload(64, 256, 120, rank=256), target=lnc2(), dialect="nki",
                      params={"lnc_split": "hidden"})


def test_a_reduced_value_without_epilogue_is_added_into_its_strip_in_one_instruction():
    """x @ U_gate, x @ U_up and h @ U_down of an SVD MLP under the hidden split: the sum of the two programs' partial
    strips is cast into the bf16 strip by the add itself, not copied tile by tile afterwards."""
    compiled = compile_graph(mlp_workload(1, 512, 1024, rank=384), target=lnc2(), dialect="nki",
                             params={"lnc_split": "hidden"})
    source = compiled.kernel.source
    for value in ("x_ug", "x_uu", "h_ud"):
        assert f"nisa.tensor_tensor(dst={value}_strip[0:F_TILE, 0:3, " in source
        assert f"tensor_copy(dst={value}_strip" not in source
    verified(compiled)

def test_sibling_reductions_share_one_exchange():
    """x @ U_gate and x @ U_up of an SVD MLP under the hidden split read none of each other's values: their partial
    strips travel in one sendrecv (as a dense MLP's gate and up terms do), then h @ U_down's in a second."""
    compiled = compile_graph(mlp_workload(1, 512, 1024, rank=384), target=lnc2(), dialect="nki",
                             params={"lnc_split": "hidden"})
    source = compiled.kernel.source
    assert source.count("nki.lnc.sendrecv(") == 2
    assert "x_ug_x_uu_partials = nl.ndarray((F_TILE, 6, TOKENS_PER_BLOCK)" in source
    assert "data1=x_ug_x_uu_partials[0:F_TILE, 3:6, 0:TOKEN_TILE]" in source  # x_uu's sums, after x_ug's
    assert sum(isinstance(s, SendRecv) for p in compiled.programs for s, _ in walk(p.body)) == 2
    verified(compiled)



def test_an_lnc2_kernel_launched_on_one_core_fails_its_assertion():
    """A kernel written for both programs, run as one (an LNC=1 launch): its own assertion stops it, instead of
    it computing half of the output."""
    import ml_dtypes
    import numpy as np

    from neuronmm_compiler.errors import KernelError
    from neuronmm_compiler.interpreter import run_kernel

    source = _gemm_source()
    args = [np.zeros(shape, dtype=ml_dtypes.bfloat16) for shape in ((512, 256), (256, 1024))]
    with pytest.raises(KernelError, match="launched with 1 program"):
        run_kernel(source, filename="k.py", kernel_name="gemm_kernel", args=args, target=get_target("trn2"))


# ----------------------------------------------------------------------------- the cost model


def test_lnc2_halves_a_large_gemm_and_the_decode_mlp():
    from neuronmm_compiler.driver import tune

    gemm = {lnc: tune(gemm_workload(4096, 4096, 4096), target=with_lnc(get_target("trn2"), lnc), dialect="nki")
            for lnc in (1, 2)}
    assert gemm[2].compiled.cost.latency_us <= 0.55 * gemm[1].compiled.cost.latency_us
    assert gemm[2].baselines["aws-fully-optimized"].label == "aws-fully-optimized (LNC=1)"
    mlp = {lnc: tune(mlp_workload(1, 4096, 14336, keep_ratio=0.8), target=with_lnc(get_target("trn2"), lnc),
                     dialect="nki") for lnc in (1, 2)}
    assert mlp[2].compiled.cost.latency_us <= 0.6 * mlp[1].compiled.cost.latency_us


def test_the_hbm_share_assumption_moves_a_memory_bound_kernel():
    from dataclasses import replace

    from neuronmm_compiler.cost_model.params import params_of

    target = lnc2()
    program = lower_gemm(GemmProblem(1, 8192, 4096), GemmSchedule(lnc_split="n", tiles_in_block_n=2), target)
    full = estimate(program, target)
    half = estimate(program, target, replace(params_of(target), lnc_hbm_share=0.5))
    assert half.latency_us > full.latency_us
    assert TARGETS["trn2"].params.lnc_hbm_share == 1.0
