"""The GEMM search space: fixed candidate lists per schedule parameter.

Optuna samples an index into each list; a point decodes to a :class:`GemmSchedule`, which is then
normalized to the problem (tiles clipped to the dimensions, tiles-in-block to the tile counts), so
many points of a small problem collapse onto one schedule. The search evaluates each distinct
normalized schedule once.

Left out on purpose: ``tile_order`` (it changes no count the model sees, only the order of
independent tiles) and ``accumulator_dtype`` (partial sums stay in fp32: trading accuracy for
speed is the user's call, via ``--param``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..schedule.gemm import LOOP_ORDERS, GemmProblem, GemmSchedule, normalize, preset


def _gemm_schedule(point: dict) -> GemmSchedule:
    return GemmSchedule(**point, accumulator_dtype="float32")


@dataclass(frozen=True)
class SearchSpace:
    """Candidate values per parameter (the order is the Optuna index order) and how a point
    becomes a schedule object (whose attributes carry the same names)."""

    candidates: dict[str, tuple]
    build: Callable[[dict], Any] = _gemm_schedule

    @property
    def size(self) -> int:
        size = 1
        for values in self.candidates.values():
            size *= len(values)
        return size

    def decode(self, point: dict[str, int | str]) -> Any:
        return self.build(point)

    def points(self) -> Iterator[dict]:
        names = list(self.candidates)
        for values in itertools.product(*(self.candidates[n] for n in names)):
            yield dict(zip(names, values, strict=True))

    def distinct(self, problem: GemmProblem) -> dict[GemmSchedule, dict]:
        """Every distinct normalized schedule of the space, with one point that produces it."""
        out: dict[GemmSchedule, dict] = {}
        for point in self.points():
            out.setdefault(normalize(problem, self.decode(point)), point)
        return out

    def point_of(self, schedule: Any) -> dict | None:
        """The point of ``schedule``'s parameters, if every one is a candidate."""
        point = {name: getattr(schedule, name) for name in self.candidates}
        if all(point[name] in values for name, values in self.candidates.items()):
            return point
        return None


def gemm_space(problem: GemmProblem) -> SearchSpace:
    """The default candidate lists for a GEMM problem."""
    candidates: dict[str, tuple] = {
        "tile_m": (128, 64),
        "tile_n": (512, 256),
        "tile_k": (128,),
        "tiles_in_block_m": (1, 2, 4, 8, 16, 32),
        "tiles_in_block_n": (1, 2, 4, 8),
        "tiles_in_block_k": (1, 2, 4, 8, 16, 32),
        "loop_order": LOOP_ORDERS,
        "tile_order": ("mn",),
        "accumulate": ("psum", "sbuf"),
        "dma": ("row", "tile"),
        "a_transpose": ("dma", "pe") if problem.a_layout == "mk" else ("dma",),
    }
    return SearchSpace(candidates)


def heuristic_guesses(problem: GemmProblem, space: SearchSpace) -> list[GemmSchedule]:
    """Closed-form starting points, enqueued as the first trials.

    NeuronMM's rule for a cached strip: make the stationary block (M) large so the moving operand
    (B) is streamed from HBM once, with K blocked to bound SBUF and rows coalesced into long DMAs;
    for decode-sized M, transpose A on the TensorEngine from one long row load rather than with
    many 2-byte-per-partition DMAs. Around that rule, a small grid of the structures that win in
    practice (PSUM accumulation with K inside, SBUF partial sums with K outside M; moderate and
    large M blocks; both A^T strategies), then AWS's fully optimized parameters. The grid costs a
    few dozen evaluations and keeps TPE from settling in a poor basin on large shapes.
    """
    transposes = ("pe", "dma") if problem.a_layout == "mk" else ("dma",)
    grid = [
        GemmSchedule(tiles_in_block_m=bm, tiles_in_block_n=bn, tiles_in_block_k=bk, loop_order=order,
                     accumulate=acc, dma="row", a_transpose=a_t)
        for a_t in transposes
        for order, acc in (("kmn", "psum"), ("mnk", "psum"), ("nkm", "sbuf"))
        for bm, bn, bk in ((4, 4, 16), (16, 2, 8), (4, 2, 8))
    ]
    guesses = []
    for sched in (*grid, preset("aws-fully-optimized", problem)):
        point = space.point_of(sched)
        if point is not None:
            decoded = space.decode(point)
            if decoded not in guesses:
                guesses.append(decoded)
    return guesses
