"""Work a search shares with worker processes changes nothing: the polish's schedules costed in two processes
(search/prefetch.py) and an SVD MLP's dense baseline searched beside it (tuning/dense_baseline.py) give what one process
gives, to every report."""

from __future__ import annotations

import pytest

from neuronmm_compiler.frontends.workloads import gemm_workload, mlp_workload
from neuronmm_compiler.lowerings import lowering_for
from neuronmm_compiler.search import prefetch, search, tuner
from neuronmm_compiler.targets import IN_GRAPH, get_target, with_launch, with_lnc

pytestmark = pytest.mark.skipif(not prefetch.can_fork(), reason="worker processes are forked where no thread runs")
TARGET = with_launch(with_lnc(get_target("trn2"), 2), IN_GRAPH)


def test_the_polish_in_two_processes_is_the_polish_in_one(monkeypatch):
    monkeypatch.setattr(tuner, "idle_core", lambda: True)  # on a busy machine the worker would not start
    workload = gemm_workload(200, 700, 300)
    runs = []
    for processes in (1, 2):
        spec, evaluate = lowering_for(workload).search_setup(workload, TARGET, 1000)
        result = search(spec, evaluate, what="parallel", trials=12, processes=processes)
        runs.append([(c.schedule, c.cost.as_dict()) for c in result.candidates] + [result.history, result.best.order])
    assert runs[0] == runs[1]


def test_prefetched_forms_are_the_forms_the_evaluator_costs():
    """A fused schedule's variant (weight_dma=block) and late forms are costed with it, in the same process (which
    lowers the row form once for them); taken in turn, they are the reports of costing one by one."""
    workload = mlp_workload(8, 256, 640, keep_ratio=0.8)
    spec, evaluate = lowering_for(workload).search_setup(workload, TARGET, 200)
    _, alone = lowering_for(workload).search_setup(workload, TARGET, 200)
    schedules = [spec.space.decode(point) for point in list(spec.space.points())[:3]]
    evaluate.late = alone.late = True
    evaluate.worker = prefetch.CostWorker(evaluate.cost)
    try:
        evaluate.prefetch(schedules)
        assert len(evaluate._ready) > len(schedules)  # the forms too
        shared = [evaluate(schedule) for schedule in schedules]
    finally:
        evaluate.worker.close()
    assert not evaluate._ready
    assert [(c.schedule, c.cost.as_dict()) for c in shared] == [(c.schedule, c.cost.as_dict())
                                                                for c in map(alone, schedules)]
    assert list(evaluate.memo) == list(alone.memo) and evaluate.history == alone.history


def test_a_cost_that_raises_raises_in_its_turn():
    def cost(schedule: int) -> int:
        if schedule == 3:
            raise ValueError("no such schedule")
        return schedule * 10

    worker = prefetch.CostWorker(cost)
    try:
        done = worker.cost([[1, 2], [3], [4, 5]])
    finally:
        worker.close()
    assert {s: value for s, (ok, value) in done.items() if ok} == {1: 10, 2: 20, 4: 40, 5: 50}
    assert not done[3][0] and isinstance(done[3][1], ValueError)


def search_dense(workload, req, echo):  # module level: a worker started otherwise than by fork pickles it
    assert req.jobs == 1 and not workload.svd  # the worker's search runs in its one process
    return {"tokens": workload.tokens}, None, None


def failing(workload, req, echo):
    raise ValueError("dense search failed")


def test_the_dense_baseline_beside_the_svd_search_comes_back_and_is_stored(monkeypatch):
    """Searched in a worker (forked: the search function need not pickle), its tuned comes back whole and is stored
    with the other outputs unless the cache answered it; an exception there is raised here."""
    from neuronmm_compiler.tuning import dense_baseline
    from neuronmm_compiler.tuning.request import TuneRequest

    monkeypatch.setattr(dense_baseline, "idle_core", lambda: True)
    request = TuneRequest(target=TARGET, dialect="nki", jobs=2)
    stored = []

    with dense_baseline.dense_baseline(mlp_workload(8, 256, 640, keep_ratio=0.8), request, print, search_dense,
                                       lambda searches, req, echo: stored.extend(searches)) as dense:
        tuned, commit = dense()
        commit()
    assert tuned == {"tokens": 8} and len(stored) == 1

    with pytest.raises(ValueError, match="dense search failed"), dense_baseline.dense_baseline(
            mlp_workload(8, 256, 640, keep_ratio=0.8), request, print, failing, lambda *a: None) as dense:
        dense()
