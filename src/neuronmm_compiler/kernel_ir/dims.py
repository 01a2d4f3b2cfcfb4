"""Tiled dimensions and loop helpers shared by the lowerings."""

from __future__ import annotations

from dataclasses import dataclass

from .expr import Expr, Lin, add, ceil_div, minimum, named, scale, sub, traced, var
from .program import Loop, Stmt

_ZERO = Lin(0)


@dataclass(frozen=True)
class Dim:
    """One GEMM dimension under a schedule: size, tile, tiles per block, block count. ``tile`` may be a
    :class:`~.expr.Named` size (the printed kernel then spells tile offsets and sizes by its name); ``block_name``
    names the block's width the same way (several tiles per block only)."""

    name: str
    size: int
    tile: int
    tiles: int
    tiles_in_block: int
    block_name: str = ""
    #: a count read from the arguments (``size`` a :class:`~.expr.Named` with a source, the count the program was
    #: built for): the elements this program's extents stop at (0: ``size``; the program's share of a split, whose
    #: trips ``size`` gives), and where its first element sits in the arrays (``start``)
    own: int = 0
    start: Expr = _ZERO
    #: the dimension split into shares of ``share_tiles`` whole tiles before it is blocked (0: not): a share loop
    #: (variable :attr:`share_var`) around the block loop, whose first tile every tile index adds (:attr:`share`); the
    #: blocks (:attr:`blocks`, per share) end ragged within each share, so programs dividing the share loop of a
    #: logical core walk the same blocks of their own tiles whatever ``tiles_in_block`` (kernel_ir/lnc.py)
    share_tiles: int = 0
    #: tiles from one share's first tile to the next's (0: ``share_tiles``, shares side by side). Fewer than
    #: ``share_tiles`` makes neighbouring shares overlap: an odd tile count divided between two programs as two
    #: shares of ``ceil(tiles / 2)`` whose middle tile both compute (:meth:`overlapping_shares`)
    share_step: int = 0

    @property
    def share_var(self) -> str:
        """The variable of the share loop."""
        return f"{self.name}_share"

    @property
    def share(self) -> Expr:
        """The first tile of the current share (0 without shares)."""
        return scale(var(self.share_var), self.share_step or self.share_tiles) if self.share_tiles else _ZERO

    @staticmethod
    def overlapping_shares(tiles: int, shares: int) -> tuple[int, int]:
        """(tiles per share, tiles between share starts) covering ``tiles`` with ``shares`` shares of one size:
        side by side when they divide evenly, else overlapping by as little as whole shares of one size allow (13
        tiles in two shares: tiles 0-6 and 6-12). (0, 0) where no such cover exists."""
        size = -(-tiles // shares)
        if shares < 2 or tiles - size < shares - 1 or (tiles - size) % (shares - 1):
            return 0, 0
        return size, (tiles - size) // (shares - 1)

    @property
    def traced(self) -> bool:
        """Whether the size is read from the arguments: trips are then ceil-divisions and every last tile ragged."""
        return traced(self.size)

    def block_trip(self) -> Expr:
        """How many blocks the loop over the dimension runs."""
        return ceil_div(self.size, self.block_elems) if self.traced else Lin(self.blocks)

    @property
    def blocks(self) -> int:
        """Blocks of the dimension (of one share, when shared)."""
        return -(-(self.share_tiles or self.tiles) // self.tiles_in_block)

    @property
    def block_elems(self) -> int:
        if self.tiles_in_block == 1:
            return self.tile  # a block of one tile: the tile's size, and its name
        elems = self.tile * self.tiles_in_block
        if not self.block_name:
            return elems
        return named(elems, self.block_name, f"{self.tiles_in_block} tiles of {self.tile}")

    def tiles_in(self, blk: Expr) -> Expr:
        if self.traced:
            if self.tiles_in_block == 1:
                return Lin(1)
            return ceil_div(minimum(self.block_elems, sub(self.size, scale(blk, self.block_elems))), self.tile)
        tiles = self.share_tiles or self.tiles
        if tiles % self.tiles_in_block == 0:
            return Lin(self.tiles_in_block)
        return minimum(self.tiles_in_block, sub(tiles, scale(blk, self.tiles_in_block)))

    def tile_index(self, blk: Expr, t: Expr) -> Expr:
        return add(self.share, scale(blk, self.tiles_in_block), t)

    def tile_start(self, g: Expr) -> Expr:
        return add(self.start, scale(g, self.tile)) if self.traced else scale(g, self.tile)

    def tile_size(self, g: Expr) -> Expr:
        if self.traced:
            return minimum(self.tile, sub(self.own or self.size, scale(g, self.tile)))
        if self.size % self.tile == 0:
            return Lin(self.tile)
        return minimum(self.tile, sub(self.size, scale(g, self.tile)))

    def block_start(self, blk: Expr) -> Expr:
        if self.share_tiles:
            return add(scale(self.share, self.tile), scale(blk, self.block_elems))
        return add(self.start, scale(blk, self.block_elems)) if self.traced else scale(blk, self.block_elems)

    def block_size(self, blk: Expr) -> Expr:
        if self.traced:
            return minimum(self.block_elems, sub(self.own or self.size, scale(blk, self.block_elems)))
        size = self.share_tiles * self.tile if self.share_tiles else self.size
        if size % self.block_elems == 0:
            return Lin(self.block_elems)
        return minimum(self.block_elems, sub(size, scale(blk, self.block_elems)))


def balanced_block(tiles: int, per_block: int) -> int:
    """Tiles per block for ``tiles`` tiles in blocks of at most ``per_block``: ``per_block``, or, where that leaves a
    last block of less than half a block, the same number of blocks as even as whole tiles make them.

    A weight block's DMA moves rows of its columns, and the DMA efficiency curve falls steeply below about 2 KiB per
    partition (targets.py, DMA_EFFICIENCY_CURVE): the tp 8 rank of Llama-3.1-8B's 14 intermediate tiles in blocks of 6
    left a last block of 2, rows of 512 bytes at about 73% efficiency, where blocks of 5, 5 and 4 move rows of 1280
    and 1024 bytes (140.0 -> 137.1 us at 96 tokens on trn2). A last block of at least half a block is kept: its rows
    lose little, and a short last block shortens the compute left after the last load (a compute-bound SVD chain on
    trn1 measured 202.6 us with blocks of 9, 9, 9, 5 against 203.2 with four of 8; docs/fusion.md, "Balanced
    blocks")."""
    per_block = max(1, per_block)
    last = tiles % per_block
    if not last or 2 * last >= per_block:
        return per_block
    blocks = -(-tiles // per_block)
    return -(-tiles // blocks)


def loop(var_name: str, trip: Expr, max_trip: int, body: list[Stmt], *, sequential: bool = False,
          comment: str = "", split: tuple[str, ...] = ()) -> list[Stmt]:
    """A loop, or its body alone when it can only ever run once (its variable is then 0). ``split``: the
    work-split family of the loop (:class:`~.program.Loop`)."""
    if max_trip <= 1:
        return body
    return [Loop(var_name, trip, body, sequential=sequential, comment=comment, split=split)]


def iv(name: str, max_trip: int) -> Expr:
    """The induction variable of a loop, or 0 for a loop that is not emitted."""
    return var(name) if max_trip > 1 else Lin(0)


