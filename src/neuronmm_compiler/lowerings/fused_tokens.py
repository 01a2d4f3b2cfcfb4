"""The token dimension of a fused kernel: the count it was built for, or any count up to it read from the arguments.

A kernel whose activations are all stored row-major (tokens on the first axis) reads its token count from the
first of them at trace time (``T = x.shape[0]``, a :class:`~neuronmm_compiler.kernel_ir.expr.Named` with a source)
and asserts ``1 <= T <= bucket``: a loop bound computed from an argument's shape is what NKI's own examples write
(NKI API reference, latest: ``nki.language.affine_range`` and ``nki.language.static_range``,
``for i in nl.affine_range(input_tensor.shape[1] // 512)``; ``nki.language.sequential_range``: a Python ``range``
in a kernel is that), so trips and slice bounds computed from ``T`` are as static at trace time as literal ones
(``nl.dynamic_range``, bounds in registers, is not used). The program is built and costed at the bucket; every
decision taken there (SBUF fit of the token blocks and strips, PSUM banks, blocking, the LNC split) holds for
fewer tokens: a smaller count uses part of the same tiles in fewer or shorter iterations, so the bucket's
footprint is an upper bound and its cost an upper bound of the work.

- One token tile (buckets up to ``token_tile``): ``T`` is the tile, the block and every token extent.
- Several tiles: ``(T + TOKENS_PER_BLOCK - 1) // TOKENS_PER_BLOCK`` blocks, ``ceil`` of a block's tokens over
  ``TOKEN_TILE`` tiles in it, the last tile ragged (``min(TOKEN_TILE, T - TOKEN_TILE * t)``; :class:`Dim` with a
  traced size).
- Several tiles on a logical core of two programs dividing the tokens (``lnc_split=tokens``): both programs run
  the trips of ``T_HALF = (T + 1) // 2`` tokens (the LNC page asks for the same control flow on both cores,
  docs/logical-cores.md); program ``pid`` owns ``T_MINE = (T - pid + 1) // 2`` tokens from ``T_HALF * pid``, its
  extents stop there. Both programs need as many tiles, which every count allows but one more than a multiple of
  two tiles (1, 257 for 128-token tiles: program 1 would own one tile fewer, an empty tile); the kernel asserts it.
  Built only where the bucket is a whole number of token blocks per program, where this is exactly the program
  ``distribute`` builds at the bucket (kernel_ir/lnc.py); other buckets keep their count fixed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..ir import Graph
from ..kernel_ir.dims import Dim
from ..kernel_ir.expr import Expr, ceil_div, named, scale, sub, var
from ..kernel_ir.lnc import PROGRAM_ID
from ..schedule.fused import FusedSchedule
from ..vocab import Layout, NodeKind

__all__ = ["TokenDim", "token_dim", "token_rows"]


@dataclass(frozen=True)
class TokenDim:
    """The schedule with its token sizes named, the token dimension, and (``lnc_split=tokens`` over a read count)
    the kernel's checks and whether the lowering divided the tokens itself (``distribute`` then leaves them)."""

    schedule: FusedSchedule
    dim: Dim
    count: int  # the count as the kernel spells it: T, or the bucket
    divided: bool = False
    checks: tuple[tuple[Expr, Expr, str], ...] = ()


def token_rows(graph: Graph, tokens: int, weights: set[str], aliases: dict[str, str]) -> list[str]:
    """The HBM arguments and outputs with a row per token, the one the kernel reads its token count from first,
    when it may take any count up to its own: every activation stored row-major; else none (the count is a
    constant)."""
    if tokens < 2:
        return []
    inputs, outputs = graph.inputs(), graph.outputs()
    rows = []
    for n in [*inputs, *outputs]:
        if n.id in weights and n.kind == NodeKind.INPUT:
            continue
        if n.storage_shape[0] != tokens or n.layout != Layout.ROW_MAJOR:
            if n.kind == NodeKind.OUTPUT or n.shape[0] == tokens:
                return []  # an activation stored transposed: its token axis is not the first
            continue  # a parameter (a norm's gamma)
        rows.append(aliases.get(n.id, n.attrs["name"]) if n.kind == NodeKind.INPUT else n.attrs["name"])
    return rows if rows and rows[0] not in {n.attrs["name"] for n in outputs} else []


def token_dim(tokens: int, s: FusedSchedule, rows: list[str], lnc: int, copies: bool) -> TokenDim:
    """The token dimension of a kernel over ``tokens`` (the bucket) under the normalized schedule ``s``, reading its
    count from ``rows[0]`` when ``rows`` names the row arguments (:func:`token_rows`; the module docstring).
    ``copies``: the kernel copies an input to an output (in row tiles of its own, over the bucket's rows), which
    keeps a count of several tiles fixed."""
    tile, block = s.token_tile, s.tokens_per_block
    per_block = max(1, block // tile)
    divided = lnc > 1 and s.lnc_split == "tokens"
    if rows and tile == block == tokens:  # one token tile
        count = named(tokens, "T", f"tokens: 1 to {tokens}, read from the arguments", source=f"{rows[0]}.shape[0]")
        s = replace(s, token_tile=count, tokens_per_block=count, out_tile=_out_tile(s))
        return TokenDim(s, Dim("t", tokens, count, 1, 1), count)
    s = replace(s, token_tile=named(tile, "TOKEN_TILE", "tokens per tile"),
                tokens_per_block=named(block, "TOKENS_PER_BLOCK", "tokens per block"), out_tile=_out_tile(s))
    tile, block = s.token_tile, s.tokens_per_block
    if not rows or copies or (divided and tokens % (lnc * block)):
        return TokenDim(s, Dim("t", tokens, tile, -(-tokens // tile), per_block, block_name="TOKENS_PER_BLOCK"),
                        tokens)
    count = named(tokens, "T", f"tokens: 1 to {tokens}, read from the arguments", source=f"{rows[0]}.shape[0]")
    if not divided:
        return TokenDim(s, Dim("t", count, tile, -(-tokens // tile), per_block, block_name="TOKENS_PER_BLOCK"),
                        count)
    half = named(tokens // 2, "T_HALF", "tokens per program (the larger half): both programs' trips",
                 source=ceil_div(count, 2))
    mine = named(tokens // 2, "T_MINE", "this program's tokens, from T_HALF * pid",
                 source=ceil_div(sub(count, var(PROGRAM_ID)), 2))
    dim = Dim("t", half, tile, -(-half // tile), per_block, block_name="TOKENS_PER_BLOCK", own=mine,
              start=scale(var(PROGRAM_ID), half))
    same = (ceil_div(half, tile), ceil_div(mine, tile),
            "T = {T}: the two programs' shares of T take different numbers of token tiles (T is 1 more than a "
            "multiple of 2 * TOKEN_TILE); pad T by one token")
    return TokenDim(s, dim, count, divided=True, checks=(same,))


def _out_tile(s: FusedSchedule) -> int:
    return named(s.out_tile, "OUT_TILE", "output columns per row-major matmul")
