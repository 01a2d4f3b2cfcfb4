"""Issue 26 item 5: kernels a kernel engineer would accept. Loops stay rolled (no tile spelled out by name), tile
sizes are named constants, and every on-chip tile is allocated at the size its accesses use."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from helpers import compile_gemm, compile_graph
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.kernel_ir.expr import Named, literal, named, naming
from neuronmm_compiler.kernel_ir.program import Alloc, Span, instruction_counts, refs_of, walk
from neuronmm_compiler.kernel_ir.psum_banks import split_psum_banks
from neuronmm_compiler.targets import get_target

GOLDEN = Path(__file__).parent / "golden" / "kernels"
LNC2 = replace(get_target("trn2"), lnc=2)
#: The decode schedule of tests/golden/kernels/tuned-mlp-1-dense-trn2.py and the K-blocked SVD one of
#: tuned-mlp-128-rank1280.py (both with multi-bank PSUM accumulators).
DECODE = {"tokens_per_block": 1, "token_tile": 1, "k_tiles_per_block": 8, "weight_block_kib": 64, "out_tile": 512,
          "x_transpose": "pe", "lnc_split": "features"}
SVD_128 = {"tokens_per_block": 128, "k_tiles_per_block": 16, "weight_block_kib": 64, "out_tile": 256,
           "cache_weights": "stage1", "x_transpose": "pe"}


def test_the_svd_mlp_kernel_that_was_849_lines_is_rolled():
    source = (GOLDEN / "tuned-mlp-128-rank1280.py").read_text()
    assert len(source.splitlines()) < 200
    assert "__b" not in source and "unrolled" not in source


def _oversized(compiled) -> list[str]:
    """On-chip allocations of the printed programs (PSUM lists split) larger on some axis than every access."""
    found = []
    for program in compiled.programs:
        program = split_psum_banks(program, compiled.target.psum_bank_bytes)
        allocs = {s.buffer.name: s.buffer for s, _ in walk(program.body) if isinstance(s, Alloc)}
        used = {name: [0] * len(buf.shape) for name, buf in allocs.items()}
        for stmt, env, _ in instruction_counts(program.body, {"pid": 0}):  # first and last iterations: the extremes
            for ref in refs_of(stmt):
                if ref.buffer.name in used:
                    stops = [ix.stop.evaluate(env) if isinstance(ix, Span) else ix.index.evaluate(env) + 1
                             for ix in ref.index]
                    used[ref.buffer.name] = [max(a, b) for a, b in zip(used[ref.buffer.name], stops, strict=True)]
        found += [f"{name} {buf.shape} used {tuple(used[name])}" for name, buf in allocs.items()
                  if tuple(used[name]) != buf.shape]
    return found


@pytest.mark.parametrize("case", ["decode", "svd128", "gemm-psum-buffers", "gemm-block-free"])
def test_tiles_are_allocated_at_the_size_used(case):
    compiled = {
        "decode": lambda: compile_graph(mlp_workload(1, 2048, 8192, dense=True), target=LNC2, dialect="nki",
                                        params=DECODE),
        "svd128": lambda: compile_graph(mlp_workload(128, 2048, 8192, rank=1280), target="trn1",
                                        dialect="neuronxcc", params=SVD_128),
        "gemm-psum-buffers": lambda: compile_gemm(700, 1500, 300, target="trn2", dialect="nki",
                                                  schedule="aws-block-free", params={"psum_buffers": 2}),
        "gemm-block-free": lambda: compile_gemm(1024, 2048, 1024, schedule="aws-block-free", dialect="nki",
                                                target="trn2", params={"tiles_in_block_k": 2, "loop_order": "mnk"}),
    }[case]()
    assert _oversized(compiled) == []


def test_named_sizes_print_by_name_and_compute_as_numbers():
    tile = named(128, "P", "partitions")
    assert isinstance(tile, Named) and tile == 128 and hash(tile) == hash(128) and str(tile) == "128"
    assert isinstance(-tile, Named) and -tile == -128
    assert not isinstance(tile * 2, Named) and named(0, "Z") == 0 and not isinstance(named(0, "Z"), Named)
    with naming() as names:
        assert literal(tile) == "P" and literal(-tile) == "-P" and literal(128) == "128"
    assert names.used == {"P": ({128}, "partitions", "")}
    assert literal(tile) == "128"  # outside a printer: digits


def test_a_name_given_two_values_or_taken_by_the_kernel_prints_as_numbers():
    from neuronmm_compiler.codegen.printer import NkiPrinter
    from neuronmm_compiler.kernel_ir.program import Buffer, Program

    def kernel(*shapes):
        allocs = [Alloc(Buffer(f"t{i}", shape, "float32", "sbuf")) for i, shape in enumerate(shapes)]
        return "\n".join(NkiPrinter().kernel(Program("k", [Buffer("x", (4, 4), "float32", "hbm")], [], allocs)))

    assert "W = 64" in kernel((named(64, "W"), 2)) and "nl.ndarray((W, 2)" in kernel((named(64, "W"), 2))
    clash = kernel((named(64, "W"), 2), (named(32, "W"), 2))
    assert "W =" not in clash and "nl.ndarray((64, 2)" in clash and "nl.ndarray((32, 2)" in clash
    taken = kernel((named(64, "x"), 2))
    assert "x = 64" not in taken and "nl.ndarray((64, 2)" in taken


def test_every_kernel_declares_its_names_once():
    source = compile_graph(mlp_workload(1, 2048, 8192, dense=True), target=LNC2, dialect="nki",
                           params=DECODE).kernel.source
    for line in ("P = 128  # partitions per tile (nl.tile_size.pmax)", "TOKEN_TILE = 1", "OUT_TILE = 512",
                 "F_TILE = 128"):
        assert source.count(f"    {line}") == 1, line
    assert "nl.ndarray((P, " in source and "0:OUT_TILE]" in source
    # two feature blocks of different widths, each named after its group: no clash
    svd = (GOLDEN / "tuned-mlp-128-rank1280.py").read_text()
    assert "    H_BLOCK = 3072  # 12 tiles of 256" in svd and "    H_UD_BLOCK = 1280  # 5 tiles of 256" in svd


@pytest.mark.parametrize(("dialect", "target", "rank"), [("nki", "trn2", None), ("neuronxcc", "trn1", 64)])
def test_one_kernel_takes_every_token_count_up_to_its_bucket(dialect, target, rank):
    """A kernel built for 128 tokens in one token tile reads its count from x (T = x.shape[0]); run at several counts
    in the interpreter, it computes the MLP of just those rows."""
    import numpy as np

    from neuronmm_compiler.codegen.metadata import TensorSpec
    from neuronmm_compiler.interpreter.loader import run_kernel
    from neuronmm_compiler.verification import random_inputs

    workload = mlp_workload(128, 256, 512, dense=rank is None, rank=rank)
    compiled = compile_graph(workload, target=target, dialect=dialect)
    source, (spec,) = compiled.kernel.source, compiled.kernel.metadata.kernels
    assert "    T = x.shape[0]" in source and "assert 1 <= T <= 128" in source
    weights = list(random_inputs(spec.inputs[1:], seed=1).values())
    f64 = [w.astype(np.float64) / np.sqrt(w.shape[0]) for w in weights]
    weights = [w.astype(weights[0].dtype) for w in f64]
    f64 = [w.astype(np.float64) for w in weights]  # the values the kernel reads
    for tokens in (1, 37, 128):
        x = random_inputs([TensorSpec("x", (tokens, 256), spec.inputs[0].dtype)], seed=tokens)["x"]
        run = run_kernel(source, filename="mlp", kernel_name=spec.name, args=[x, *weights], target=compiled.target)
        (out,) = run.outputs
        assert out.shape == (tokens, 256)
        x64 = x.astype(np.float64)
        if rank is None:
            gate, up, down = f64
            g = x64 @ gate
            want = (g / (1 + np.exp(-g)) * (x64 @ up)) @ down
        else:
            ug, vg, uu, vu, ud, vd = f64
            g = x64 @ ug @ vg
            want = (g / (1 + np.exp(-g)) * (x64 @ uu @ vu)) @ ud @ vd
        assert np.abs(out.astype(np.float64) - want).max() <= 3e-2 * np.abs(want).max(), tokens
