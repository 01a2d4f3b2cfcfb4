"""Search spaces, derived from a schedule class's parameter declarations.

Each parameter of a schedule class is declared once, in the class's ``SPECS``
(:class:`~neuronmm_compiler.schedule.gemm.ParamSpec`): its candidate values in Optuna's index order
and its role in the search. :meth:`SearchSpace.for_schedule` takes the searched parameters from
there; the caller narrows them to the workload with ``restrict`` (e.g. a GEMM whose A is stored
[K, M] has no A^T to make on the TensorEngine).

Optuna samples an index into each ordinal parameter's candidates and a categorical parameter's
value itself; a point decodes to a schedule object, which is then normalized to the workload
(tiles clipped to the dimensions, tiles-in-block to the tile counts), so many points of a small
problem collapse onto one schedule. The search evaluates each distinct normalized schedule once.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..schedule.params import ParamSpec, ScheduleParams


@dataclass(frozen=True)
class SearchSpace:
    """Candidate values per parameter of ``schedule`` (the order is the Optuna index order); a
    point (parameter name -> value) decodes to ``schedule(**point)``, the parameters left out at
    their defaults. Roles (ordinal, exchange, structural class) come from ``schedule.SPECS``."""

    schedule: type[ScheduleParams]
    candidates: dict[str, tuple]
    #: per parameter, the values only the polish visits besides the candidates (ParamSpec.refine)
    refine: dict[str, tuple] = field(default_factory=dict)

    def __post_init__(self) -> None:
        specs = {spec.name: spec for spec in self.schedule.SPECS}
        for name, values in self.candidates.items():
            if name not in specs:
                raise ValueError(f"{self.schedule.__name__} has no parameter {name!r}")
            if not values:
                raise ValueError(f"search space parameter {name} has no candidate")

    @classmethod
    def for_schedule(cls, schedule: type[ScheduleParams],
                     restrict: Mapping[str, tuple] | None = None) -> SearchSpace:
        """The space of ``schedule``'s searched parameters, each with its declared candidates;
        ``restrict`` maps a parameter to the values allowed for this workload (the candidates keep
        their declared order)."""
        restrict = dict(restrict or {})
        candidates: dict[str, tuple] = {}
        refine: dict[str, tuple] = {}
        for spec in schedule.SPECS:
            if not spec.searched:
                continue
            allowed = restrict.pop(spec.name, spec.candidates + spec.refine)
            candidates[spec.name] = tuple(v for v in spec.candidates if v in allowed)
            if spec.refine:
                refine[spec.name] = tuple(v for v in spec.refine if v in allowed)
            if not candidates[spec.name]:
                raise ValueError(f"restricting {spec.name} to {allowed} leaves no candidate of {spec.candidates}")
        if restrict:
            raise ValueError(f"cannot restrict {', '.join(restrict)}: not searched parameters of "
                             f"{schedule.__name__}")
        return cls(schedule, candidates, refine)

    @cached_property
    def specs(self) -> tuple[ParamSpec, ...]:
        """The declarations of the parameters in the space, in candidate order."""
        by_name = {spec.name: spec for spec in self.schedule.SPECS}
        return tuple(by_name[name] for name in self.candidates)

    @cached_property
    def ordinal(self) -> tuple[str, ...]:
        """Parameters Optuna samples as indices into their candidates (the rest: categorically)."""
        return tuple(spec.name for spec in self.specs if spec.ordinal)

    @cached_property
    def exchange(self) -> tuple[str, ...]:
        """Block sizes the polish trades against each other."""
        return tuple(spec.name for spec in self.specs if spec.exchange)

    @cached_property
    def classes(self) -> tuple[str, ...]:
        """Structural parameters: the polish starts once per combination of their values."""
        return tuple(spec.name for spec in self.specs if spec.polish_class)

    @cached_property
    def rivals(self) -> tuple[str, ...]:
        """Structural parameters another value of which keeps a rival descent (:attr:`ParamSpec.rival`)."""
        return tuple(spec.name for spec in self.specs if spec.rival)

    @property
    def size(self) -> int:
        size = 1
        for values in self.candidates.values():
            size *= len(values)
        return size

    def decode(self, point: Mapping[str, int | str]) -> Any:
        """The schedule of a point."""
        return self.schedule(**point)

    def points(self) -> Iterator[dict]:
        names = list(self.candidates)
        for values in itertools.product(*(self.candidates[n] for n in names)):
            yield dict(zip(names, values, strict=True))

    def distinct(self, normalize: Callable[[Any], Any], coupled: Collection[str] | None = None) -> dict[Any, dict]:
        """Every distinct schedule of the space under ``normalize`` (schedule to normalized schedule), each with the
        first point of :meth:`points` that produces it, in the order that walk first meets them.

        ``coupled`` names the parameters ``normalize`` reads or changes, for one that passes every other one through
        unchanged (as :meth:`distinct_size`); None walks every point. With it, only the product of the coupled
        parameters is walked (the others at their first candidate): a point's normalized schedule is its coupled
        part's normalized values with its other parameters as they are, so the first point producing a schedule is
        the first producer of that coupled part combined with those other parameters. Those points, sorted in
        :meth:`points` order, give the same schedules in the same order as the whole walk, at a fraction of the
        normalizations (a GEMM space on a logical core of two: 165,888 points, a quarter of them walked)."""
        names = list(self.candidates)
        if coupled is None:
            out: dict[Any, dict] = {}
            for point in self.points():
                out.setdefault(normalize(self.decode(point)), point)
            return out
        walked = [i for i, name in enumerate(names) if name in coupled]
        free = [i for i, name in enumerate(names) if name not in coupled]
        current = [0] * len(names)  # the others stay at their first candidate
        leaders: dict[Any, tuple[int, ...]] = {}
        for indices in itertools.product(*(range(len(self.candidates[names[i]])) for i in walked)):
            for i, index in zip(walked, indices, strict=True):
                current[i] = index
            leaders.setdefault(normalize(self.decode(self._point(current))), tuple(current))
        starts = []
        for leader in leaders.values():
            for others in itertools.product(*(range(len(self.candidates[names[i]])) for i in free)):
                start = list(leader)
                for i, index in zip(free, others, strict=True):
                    start[i] = index
                starts.append(tuple(start))
        out = {}
        for start in sorted(starts):
            point = self._point(start)
            out.setdefault(normalize(self.decode(point)), point)
        return out

    def _point(self, indices: Collection[int]) -> dict:
        """The point of one candidate index per parameter, in candidate order."""
        return {name: self.candidates[name][i] for name, i in zip(self.candidates, indices, strict=True)}

    def distinct_size(self, normalize: Callable[[Any], Any], coupled: Collection[str]) -> int:
        """``len(distinct(...))`` without walking the whole space, for a normalization (``normalize``: schedule to
        normalized schedule) that reads and changes only the ``coupled`` parameters and passes every other one
        through: the distinct combinations of the coupled ones times the product of the others' candidate counts."""
        names = [name for name in self.candidates if name in coupled]
        others = math.prod(len(values) for name, values in self.candidates.items() if name not in coupled)
        first = {name: values[0] for name, values in self.candidates.items() if name not in coupled}
        coupled_part = operator.attrgetter(*names)  # a tuple of the coupled values (for one name: the value)
        seen = set()
        for values in itertools.product(*(self.candidates[name] for name in names)):
            seen.add(coupled_part(normalize(self.schedule(**first, **dict(zip(names, values, strict=True))))))
        return len(seen) * others

    @cached_property
    def fine(self) -> dict[str, tuple]:
        """Every parameter's values for the polish: its candidates with its refine values merged in, in the
        candidates' direction (ascending unless the candidates descend), so a step along the list is a step in
        size."""
        out: dict[str, tuple] = {}
        for name, values in self.candidates.items():
            extra = self.refine.get(name, ())
            if not extra:
                out[name] = values
                continue
            descending = len(values) > 1 and values[0] > values[-1]
            out[name] = tuple(sorted(set(values) | set(extra), reverse=descending))
        return out

    def point_of(self, schedule: Any, fine: bool = False) -> dict | None:
        """The point of ``schedule``'s parameters, if every one is a candidate (with ``fine``, a value of
        :attr:`fine`)."""
        point = {name: getattr(schedule, name) for name in self.candidates}
        if all(point[name] in values for name, values in (self.fine if fine else self.candidates).items()):
            return point
        return None
