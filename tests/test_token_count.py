"""Issue 26 item 5: a fused kernel of several token tiles reads its token count from its arguments (T = x.shape[0]):
ceil-division trip counts, a ragged last tile, and on two programs dividing the tokens each its share of T. Run in
the interpreter at several counts, it computes the MLP of just those rows (lowerings/fused_tokens.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from helpers import compile_graph
from neuronmm_compiler.codegen.metadata import TensorSpec
from neuronmm_compiler.errors import KernelError
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.interpreter.loader import run_kernel
from neuronmm_compiler.kernel_ir.expr import CeilDiv, Lin, ceil_div, code, minimum, named, naming, scale, sub, var
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import random_inputs

BUCKET, HIDDEN, INTERMEDIATE, RANK = 512, 128, 256, 32


def _mlp(x: np.ndarray, weights: list[np.ndarray], rank: int | None) -> np.ndarray:
    x = x.astype(np.float64)
    if rank is None:
        gate, up, down = weights
        g, u = x @ gate, x @ up
        return (g / (1 + np.exp(-g)) * u) @ down
    ug, vg, uu, vu, ud, vd = weights
    g, u = x @ ug @ vg, x @ uu @ vu
    return (g / (1 + np.exp(-g)) * u) @ ud @ vd


#: each dialect runs a dense and an SVD MLP, one on one core and one on two programs dividing the tokens
@pytest.mark.parametrize(("rank", "lnc", "dialect", "params"), [
    (None, 1, "nki", {"tokens_per_block": 256}),
    (None, 2, "neuronxcc", {"lnc_split": "tokens", "tokens_per_block": 128}),
    (RANK, 1, "neuronxcc", {"tokens_per_block": 128}),
    (RANK, 2, "nki", {"lnc_split": "tokens", "tokens_per_block": 256}),
])
def test_a_multi_tile_kernel_takes_every_token_count_up_to_its_bucket(rank, lnc, dialect, params):
    target = replace(get_target("trn2"), lnc=lnc)
    compiled = compile_graph(mlp_workload(BUCKET, HIDDEN, INTERMEDIATE, dense=rank is None, rank=rank),
                             target=target, dialect=dialect, params=params)
    source, (spec,) = compiled.kernel.source, compiled.kernel.metadata.kernels
    assert "    T = x.shape[0]" in source and f"assert 1 <= T <= {BUCKET}" in source
    assert "- 1) // TOKEN" in source and "min(TOKEN_TILE, T" in source  # ceil-div trips, a ragged last tile
    if lnc == 2:
        assert "    T_HALF = (T + 1) // 2" in source and "    T_MINE = (T - pid + 1) // 2" in source
    weights = list(random_inputs(spec.inputs[1:], seed=1).values())
    weights = [(w.astype(np.float64) / np.sqrt(w.shape[0])).astype(w.dtype) for w in weights]
    f64 = [w.astype(np.float64) for w in weights]  # the values the kernel reads
    for tokens in (1, 129, 300, BUCKET):
        x = random_inputs([TensorSpec("x", (tokens, HIDDEN), spec.inputs[0].dtype)], seed=tokens)["x"]
        args = [x, *weights]
        if lnc == 2 and tokens % 256 == 1:  # two programs cannot share 1 or 257 tokens in as many tiles
            with pytest.raises(KernelError, match="pad T by one token"):
                run_kernel(source, filename="mlp", kernel_name=spec.name, args=args, target=compiled.target)
            continue
        (out,) = run_kernel(source, filename="mlp", kernel_name=spec.name, args=args, target=compiled.target).outputs
        assert out.shape == (tokens, HIDDEN)
        want = _mlp(x, f64, rank)
        assert np.abs(out.astype(np.float64) - want).max() <= 3e-2 * np.abs(want).max(), tokens


def test_a_bucket_the_programs_cannot_share_in_whole_blocks_keeps_its_count():
    """lnc_split=tokens over 640 tokens: not a whole number of token blocks per program (five 128-token tiles; the
    normalization narrows the tile to 107 tokens to make the tile count even), so the count stays fixed and the
    kernel asserts the shape."""
    target = replace(get_target("trn2"), lnc=2)
    compiled = compile_graph(mlp_workload(640, HIDDEN, INTERMEDIATE, dense=True), target=target, dialect="nki",
                             params={"lnc_split": "tokens", "tokens_per_block": 256})
    source = compiled.kernel.source
    assert "T = x.shape[0]" not in source and "assert tuple(x.shape) == (640, " in source


def test_counts_read_from_the_arguments_print_by_name_and_evaluate_at_the_built_size():
    t = named(512, "T", "tokens", source="x.shape[0]")
    tile = named(128, "TOKEN_TILE", "tokens per tile")
    trips = ceil_div(t, tile)
    assert isinstance(trips, CeilDiv) and trips.evaluate({}) == 4 and ceil_div(512, 128) == Lin(4)
    last = minimum(tile, sub(t, scale(var("t"), tile)))
    assert last.evaluate({"t": 3}) == 128
    assert minimum(tile, t) != Lin(128)  # never folded: a smaller T wins
    shifted = scale(Lin(t, ()), 2)  # 2 * T cannot be a constant: it becomes a term that keeps the name
    assert shifted.evaluate({}) == 1024 and shifted.evaluate({"T": 3}) == 6
    half = named(256, "T_HALF", source=ceil_div(t, 2))
    with naming() as names:
        assert code(trips) == "(T + TOKEN_TILE - 1) // TOKEN_TILE"
        assert code(last) == "min(TOKEN_TILE, T - TOKEN_TILE * t)"
        assert code(shifted) == "2 * T" and code(Lin(half)) == "T_HALF"
    assert names.used["T_HALF"][2] == "(T + 1) // 2" and names.derived == ["T_HALF"]
    with pytest.raises(ValueError, match="not its source"):
        named(255, "T_HALF", source=ceil_div(t, 2))


def test_a_one_tile_kernel_with_pe_column_tiles_reads_each_tiles_rows_at_the_count():
    """PE column tiles put a decode matmul's partial sums on PSUM partitions 32 * c onward; with the count read from
    x, the rows read there are 32 * c to T + 32 * c (they were printed 32:40 for an 8-token bucket, wrong below 8)."""
    target = replace(get_target("trn2"), lnc=2)
    compiled = compile_graph(mlp_workload(8, 512, 1024, dense=True), target=target, dialect="nki",
                             params={"column_tiles": 4, "lnc_split": "features"})
    source, (spec,) = compiled.kernel.source, compiled.kernel.metadata.kernels
    assert "down_psum[32:T + 32, " in source
    weights = [(w.astype(np.float64) / np.sqrt(w.shape[0])).astype(w.dtype)
               for w in random_inputs(spec.inputs[1:], seed=1).values()]
    x = random_inputs([TensorSpec("x", (3, 512), spec.inputs[0].dtype)], seed=3)["x"]
    (out,) = run_kernel(source, filename="mlp", kernel_name=spec.name, args=[x, *weights],
                        target=compiled.target).outputs
    want = _mlp(x, [w.astype(np.float64) for w in weights], None)
    assert out.shape == (3, 512) and np.abs(out.astype(np.float64) - want).max() <= 3e-2 * np.abs(want).max()
