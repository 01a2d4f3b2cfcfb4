"""The schedule space declared once: parameter specs, domains, and the search spaces derived from them."""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import socket

import optuna
import pytest

from neuronmm_compiler.errors import ScheduleError
from neuronmm_compiler.lowerings.fused import fused_space
from neuronmm_compiler.lowerings.gemm import gemm_space
from neuronmm_compiler.schedule import GemmProblem, GemmSchedule, check_schedule
from neuronmm_compiler.schedule.fused import NORMALIZED_PARAMS as FUSED_NORMALIZED
from neuronmm_compiler.schedule.fused import FusedSchedule, normalize_fused
from neuronmm_compiler.schedule.gemm import LOOP_ORDERS, normalize
from neuronmm_compiler.schedule.gemm import NORMALIZED_PARAMS as GEMM_NORMALIZED
from neuronmm_compiler.schedule.params import max_tiles_per_block
from neuronmm_compiler.search import SearchSpace
from neuronmm_compiler.search import trials as trials_module
from neuronmm_compiler.targets import TARGETS, get_target

SCHEDULES = (GemmSchedule, FusedSchedule)
STOCK = [get_target(name) for name in TARGETS]
TRN1 = get_target("trn1")


def _int_specs():
    return [(cls, spec) for cls in SCHEDULES for spec in cls.SPECS if spec.kind is int]


@pytest.mark.parametrize("cls", SCHEDULES, ids=lambda c: c.__name__)
def test_specs_name_the_dataclass_fields_in_order(cls):
    assert tuple(spec.name for spec in cls.SPECS) == tuple(f.name for f in dataclasses.fields(cls))
    for spec, field in zip(cls.SPECS, dataclasses.fields(cls), strict=True):
        assert isinstance(field.default, spec.kind), spec.name


@pytest.mark.parametrize("target", STOCK, ids=lambda t: t.name)
@pytest.mark.parametrize("cls", SCHEDULES, ids=lambda c: c.__name__)
def test_defaults_and_every_candidate_lie_in_the_domain(cls, target):
    check_schedule(cls(), target)
    for spec in cls.SPECS:
        for value in spec.candidates:
            spec.check(value, target)


@pytest.mark.parametrize("target", [STOCK[0], STOCK[-1]], ids=lambda t: t.name)
@pytest.mark.parametrize(("cls", "spec"), _int_specs(), ids=lambda x: getattr(x, "name", getattr(x, "__name__", "")))
def test_every_integer_parameter_rejects_values_outside_its_domain(cls, spec, target):
    high = spec.upper(target)
    assert spec.low <= high
    # tokens_per_block's bounds are multiples of token_tile only with a 1-token tile
    base = cls(token_tile=1) if cls is FusedSchedule else cls()
    for ok in (spec.low, high):
        check_schedule(dataclasses.replace(base, **{spec.name: ok}), target)
    for bad in (spec.low - 1, high + 1, 10**9):
        with pytest.raises(ScheduleError, match=f"{spec.name}={bad} is outside {spec.low}..{high}"):
            check_schedule(dataclasses.replace(base, **{spec.name: bad}), target)


def test_blocks_of_tiles_are_capped_by_sbuf_per_partition():
    assert max_tiles_per_block(TRN1) == 192 * 1024 // 2
    with pytest.raises(ScheduleError, match=r"k_tiles_per_block=100000 is outside 0\.\.98304"):
        check_schedule(FusedSchedule().with_params({"k_tiles_per_block": "100000"}), TRN1)
    check_schedule(FusedSchedule(k_tiles_per_block=100000), get_target("trn3"))  # 128 KiB of 2-byte tiles
    with pytest.raises(ScheduleError, match="tiles_in_block_m=98305"):
        check_schedule(GemmSchedule(tiles_in_block_m=98305), TRN1)


def test_range_errors_keep_their_documented_wording():
    with pytest.raises(ScheduleError) as err:
        check_schedule(GemmSchedule(tile_m=256), TRN1)
    assert str(err.value) == "tile_m=256 is outside 1..128 (the TensorEngine's stationary free size limit)"
    with pytest.raises(ScheduleError, match=r"tokens_per_block=1024 is outside 1\.\.512 \(the strip is the moving"):
        check_schedule(FusedSchedule(tokens_per_block=1024), TRN1)


@pytest.mark.parametrize(("schedule", "fragment"), [
    (GemmSchedule(tile_k="128"), "tile_k='128' is not an integer"),  # type: ignore[arg-type]
    (GemmSchedule(tiles_in_block_n=True), "is not an integer"),
    (GemmSchedule(tiles_in_block_n=2.0), "is not an integer"),  # type: ignore[arg-type]
    (GemmSchedule(loop_order="mmk"), "loop_order='mmk' is not one of mnk, "),
    (FusedSchedule(mlp="halves"), "mlp='halves' is not one of whole, split"),
    (FusedSchedule(tokens_per_block=192), "tokens_per_block=192 must be a multiple of token_tile=128"),
])
def test_check_schedule_rejects_wrong_types_choices_and_relations(schedule, fragment):
    with pytest.raises(ScheduleError, match=fragment.replace(".", r"\.")):
        check_schedule(schedule, TRN1)


# ----------------------------------------------------------------------------- search spaces

# The candidate lists the search has always sampled; the golden tuned kernels depend on them.
GEMM_CANDIDATES = {
    "tile_m": (128, 64), "tile_n": (512, 256), "tile_k": (128,), "tiles_in_block_m": (1, 2, 4, 8, 16, 32),
    "tiles_in_block_n": (1, 2, 4, 8), "tiles_in_block_k": (1, 2, 4, 8, 16, 32), "loop_order": LOOP_ORDERS,
    "tile_order": ("mn",), "accumulate": ("psum", "sbuf"), "dma": ("row", "tile"), "a_transpose": ("dma", "pe"),
    "lnc_split": ("none", "m", "n"), "column_tiles": (1, 2, 4),
}
FUSED_CANDIDATES = {
    "tokens_per_block": (32, 64, 128, 256, 512), "token_tile": (128,), "weight_block_kib": (4, 8, 16, 32, 64, 128, 192),
    "k_tiles_per_block": (0, 8, 16, 32), "out_tile": (512, 256), "weight_dma": ("row", "tile"),
    "cache_weights": ("none", "stage1", "all"), "x_transpose": ("dma", "pe"), "mlp": ("whole", "split"),
    "lnc_split": ("none", "tokens", "features", "gather", "hidden", "intermediate"), "column_tiles": (1, 2, 4),
}


def test_gemm_space_is_derived_from_the_specs():
    space = SearchSpace.for_schedule(GemmSchedule)
    assert list(space.candidates.items()) == list(GEMM_CANDIDATES.items())
    assert space.ordinal == ("tile_m", "tile_n", "tile_k", "tiles_in_block_m", "tiles_in_block_n",
                             "tiles_in_block_k", "column_tiles")
    assert space.exchange == ("tiles_in_block_m", "tiles_in_block_n", "tiles_in_block_k")
    assert space.classes == ("accumulate", "dma", "a_transpose", "lnc_split")
    # a split needs a logical core of two programs; PE column tiles a stationary of at most 64 columns
    one_core = {**GEMM_CANDIDATES, "lnc_split": ("none",), "column_tiles": (1,)}
    assert gemm_space(GemmProblem(128, 512, 128)).candidates == one_core
    assert gemm_space(GemmProblem(128, 512, 128), lnc=2).candidates["lnc_split"] == ("m", "n")
    transposed = gemm_space(GemmProblem(128, 512, 128, a_layout="km"))
    assert transposed.candidates == {**one_core, "a_transpose": ("dma",)}
    schedule = space.decode({"tile_m": 64, "loop_order": "kmn"})
    assert schedule == GemmSchedule(tile_m=64, loop_order="kmn")  # the rest at the dataclass defaults


@pytest.mark.parametrize(("row_major_x", "splittable"), [(True, True), (False, False), (True, False)])
def test_fused_space_is_derived_from_the_specs(row_major_x, splittable):
    space = fused_space(row_major_x, splittable)
    expected = {**FUSED_CANDIDATES, "x_transpose": ("dma", "pe") if row_major_x else ("dma",),
                "mlp": ("whole", "split") if splittable else ("whole",), "lnc_split": ("none",), "column_tiles": (1,)}
    assert list(space.candidates.items()) == list(expected.items())
    assert space.ordinal == ("tokens_per_block", "token_tile", "weight_block_kib", "k_tiles_per_block", "out_tile",
                             "column_tiles")
    assert space.exchange == ("tokens_per_block", "weight_block_kib", "k_tiles_per_block")
    assert space.classes == ("cache_weights", "x_transpose", "mlp", "lnc_split")
    assert isinstance(space.decode(next(space.points())), FusedSchedule)
    assert fused_space(row_major_x, splittable, lnc=2).candidates["lnc_split"] == ("tokens", "features", "gather",
                                                                                  "hidden", "intermediate")
    assert fused_space(row_major_x, splittable, lnc=2, exchange=False).candidates["lnc_split"] == ("tokens",
                                                                                                  "features")


def test_restrictions_narrow_in_declared_order_and_are_checked():
    space = SearchSpace.for_schedule(GemmSchedule, {"tile_m": (64, 128), "dma": ("tile",)})
    assert space.candidates["tile_m"] == (128, 64) and space.candidates["dma"] == ("tile",)
    with pytest.raises(ValueError, match="accumulator_dtype"):
        SearchSpace.for_schedule(GemmSchedule, {"accumulator_dtype": ("float32",)})  # not searched
    with pytest.raises(ValueError, match="no candidate"):
        SearchSpace.for_schedule(GemmSchedule, {"tile_m": (96,)})
    with pytest.raises(ValueError, match="no parameter 'mlp'"):
        SearchSpace(GemmSchedule, {"mlp": ("whole",)})
    with pytest.raises(TypeError):
        SearchSpace({"tile_m": (128,)})  # type: ignore[call-arg]  # no default schedule class


def test_distinct_normalizes_with_the_schedule_class():
    problem = GemmProblem(100, 300, 50)
    space = SearchSpace(GemmSchedule, {"tile_m": (128, 64), "tiles_in_block_m": (1, 2)})
    assert set(space.distinct(lambda s: normalize(problem, s))) == {
        GemmSchedule(tile_m=100, tile_n=300, tile_k=50), GemmSchedule(tile_m=64, tile_n=300, tile_k=50),
        GemmSchedule(tile_m=64, tile_n=300, tile_k=50, tiles_in_block_m=2)}
    fused = SearchSpace(FusedSchedule, {"tokens_per_block": (32, 512)})
    assert {s.tokens_per_block for s in fused.distinct(lambda s: normalize_fused(s, 40))} == {32, 40}


@pytest.mark.parametrize(("kind", "lnc"), [("gemm", 1), ("gemm", 2), ("fused", 1), ("fused", 2)])
def test_walking_the_coupled_parameters_gives_the_whole_walks_schedules_in_its_order(kind, lnc):
    """SearchSpace.distinct with a normalization's coupled parameters returns exactly what walking every point
    returns (the same schedules, the same first points, the same order), on spaces that keep every parameter
    with a few candidates each, and the normalizations pass the other parameters through unchanged."""
    if kind == "gemm":
        problem = GemmProblem(40, 700, 300)
        whole = gemm_space(problem, lnc=lnc)
        normalized, coupled = (lambda s: normalize(problem, s, lnc)), GEMM_NORMALIZED
    else:
        whole = fused_space(True, True, True, lnc, True, (1, 2))
        normalized, coupled = (lambda s: normalize_fused(s, 20, lnc)), FUSED_NORMALIZED
    space = SearchSpace(whole.schedule, {name: values if name == "lnc_split" else values[:2]
                                         for name, values in whole.candidates.items()})
    assert len(list(space.points())) > len(space.distinct(normalized, coupled)) > 0  # points collapse
    assert list(space.distinct(normalized, coupled).items()) == list(space.distinct(normalized).items())
    for point in itertools.islice(space.points(), 0, None, 7):
        schedule = space.decode(point)
        passed = {name for name in space.candidates if name not in coupled}
        assert all(getattr(normalized(schedule), name) == point[name] for name in passed)


# ----------------------------------------------------------------------------- Optuna


def _dead_pid() -> int:
    proc = multiprocessing.get_context("spawn").Process(target=int)
    proc.start()
    proc.join()
    return proc.pid


def test_trials_of_dead_processes_are_failed_through_the_public_api():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    dead = study.ask()
    dead.set_user_attr(trials_module._OWNER_ATTR, f"{socket.gethostname()}:{_dead_pid()}")
    finished = study.ask()
    finished.set_user_attr(trials_module._OWNER_ATTR, f"{socket.gethostname()}:{_dead_pid()}")
    study.tell(finished, 1.0)
    assert trials_module._fail_dead_trials(study) == 1
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE]


@pytest.mark.parametrize("tokens, ranks, lnc", [(1, None, 2), (300, (512, 512, 512), 2), (96, None, 1)])
def test_the_counted_fused_space_is_the_enumerated_one(tokens, ranks, lnc):
    """The search counts distinct fused schedules from the parameters normalization touches alone; walking every
    point must give the same number (and the walk is what an exhaustive search evaluates)."""
    from neuronmm_compiler.frontends.workloads import MlpWorkload
    from neuronmm_compiler.lowerings import lowering_for
    from neuronmm_compiler.targets import with_lnc

    workload = MlpWorkload(tokens=tokens, hidden=1024, intermediate=2048, ranks=ranks)
    target = with_lnc(get_target("trn2"), lnc)
    spec, _ = lowering_for(workload).search_setup(workload, target, 0)
    assert spec.size == len(spec.distinct()) > 0


@pytest.mark.parametrize(("shape", "lnc"), [((3, 700, 300), 1), ((3, 700, 300), 2), ((128, 512, 256), 2)])
def test_the_counted_gemm_space_is_the_enumerated_one(shape, lnc):
    """The GEMM search's count of distinct schedules (which picks exhaustive search and is printed as the space's
    size) is what its exhaustive walk yields; it counted PE column tiles the walk collapses under SBUF accumulation
    (the 840 of 3x700x300 on one core were counted as 960)."""
    from neuronmm_compiler.frontends.workloads import GemmWorkload
    from neuronmm_compiler.lowerings import lowering_for
    from neuronmm_compiler.targets import with_lnc

    workload = GemmWorkload(*shape)
    spec, _ = lowering_for(workload).search_setup(workload, with_lnc(get_target("trn2"), lnc), 1000)
    assert spec.size == len(list(spec.distinct())) > 0


def test_the_gemm_walk_and_count_are_those_of_the_target_the_evaluator_compares_on():
    """On a logical core the walk and the count normalize as the evaluator does (the split divides tiles and blocks),
    so the space's size is what the target distinguishes and the walk yields each such schedule once (they
    normalized on one core: 3x700x300 at LNC=2 counted 1680 where the target tells 1344 apart)."""
    from neuronmm_compiler.lowerings.gemm import gemm_search_setup
    from neuronmm_compiler.targets import with_lnc

    problem, target = GemmProblem(300, 700, 300), with_lnc(get_target("trn2"), 2)
    whole = gemm_space(problem, lnc=2, max_column_tiles=target.max_column_tiles)
    space = SearchSpace(GemmSchedule, {name: values[:3] if name.startswith("tiles_in_block") else values
                                       for name, values in whole.candidates.items()})
    spec, _ = gemm_search_setup(problem, target, 1000, space=space)
    every = {normalize(problem, space.decode(point), 2, target.gemm_stationary_fmax, target.max_column_tiles)
             for point in space.points()}
    walked = list(spec.distinct())
    assert len(walked) == len(set(walked)) == spec.size == len(every) and set(walked) == every
    assert len({normalize(problem, space.decode(point)) for point in space.points()}) > len(every)  # one core: more
