"""``--tp N`` on ``nmmc tune``, ``emit``, ``cost`` and ``explain``, and ``nmmc verify`` of a tensor-parallel
plan. Each is a decorator around the command: with ``--tp 1`` (the default) or a kernel file, the command
runs exactly as it does without it; otherwise the tensor-parallel orchestration
(:mod:`neuronmm_compiler.tensor_parallel.commands`) takes over."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from ..errors import InputError
from ..ir.mx import mx_format
from .options import EXIT_FAILED, PROLOGUE_KEYS, WORKLOAD_KEYS, chosen_dialect, workload_from

TP_HELP = ("Tensor parallelism: shard the --mlp over N NeuronCores (Megatron-style: gate/up split by columns of "
           "the intermediate dimension, down by rows, partial sums all-reduced), choose the sharding of the SVD "
           "factors with the cost model plus the collectives, and write one kernel per rank role and plan.json "
           "into the -o directory. 1 (the default) compiles the whole MLP on one core, as without --tp.")
STRATEGY_HELP = ("With --tp: use this sharding instead of searching them all: GATE_UP/DOWN with GATE_UP one of "
                 "replicate-u, factor-shard and DOWN one of reduce-output, reduce-rank, factor-shard "
                 "(docs/tensor-parallel.md); 'megatron' for a --dense MLP.")
#: Options of ``tune`` that take one kernel on one core (they have no meaning for a sharded MLP yet).
SINGLE_KERNEL = ("storage", "lock_path", "report_dir", "timeout")


def tp_options(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add ``--tp`` and ``--tp-strategy`` to ``command`` (tune, emit, cost, explain)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, tp: int, tp_strategy: str | None, **kwargs: Any) -> Any:
            if tp == 1:
                if tp_strategy is not None:
                    raise InputError("--tp-strategy chooses how an MLP is sharded: give --tp N with N > 1 too")
                return fn(*args, **kwargs)
            return _tensor_parallel(command, tp, tp_strategy, kwargs)

        run = click.option("--tp-strategy", default=None, metavar="GATE_UP/DOWN", help=STRATEGY_HELP)(run)
        return click.option("--tp", default=1, show_default=True, type=int, metavar="N", help=TP_HELP)(run)

    return decorate


def _tensor_parallel(command: str, tp: int, strategy: str | None, kw: dict[str, Any]) -> None:
    from ..tensor_parallel import commands
    from .options import resolve_target

    given = [f"--{name.replace('_path', '').replace('_dir', '').replace('_', '-')}" for name in SINGLE_KERNEL
             if kw.get(name)]
    if given:
        raise InputError(f"{', '.join(given)} take(s) one kernel on one core; not available with --tp yet")
    if kw.get("schedule_name") or kw.get("params") or kw.get("pipeline"):
        raise InputError("--tp compiles every rank's kernel under its default schedule (emit, cost, explain) or "
                         "tunes it (tune); drop --schedule/--param/--pipeline")
    target = resolve_target(kw["target"], None)  # a sharded MLP runs inside a model: in-graph unless --launch
    dialect = chosen_dialect(kw.get("dialect", "auto"), kw.get("sdk"), target)
    if command == "tune":
        kernel_fn = commands.tuned_kernels(target, dialect, trials=kw["trials"] or 150, seed=kw["seed"],
                                           method=None if kw["method"] == "auto" else kw["method"],
                                           exhaustive_threshold=kw["exhaustive_threshold"],
                                           cache_dir=kw["cache_dir"], use_cache=not kw["no_cache"],
                                           sdk=kw.get("sdk"))
    else:
        kernel_fn = commands.default_kernels(target, dialect, kw.get("sdk"))
    if any(kw.get(key) not in (None, False) for key in PROLOGUE_KEYS):
        raise InputError("--fuse-norm/--residual are not sharded by --tp yet (docs/fusion.md, 'The norm prologue'); "
                         "drop them or --tp")
    if kw.get("act_scale") not in (None, "static"):
        raise InputError("--act-scale row is not sharded by --tp yet: a rank's shard of h holds part of each token's "
                         "values, so its maximum is not the token's (docs/quantization.md); drop one of them")
    if mx_format(str(kw.get("dtype") or "")) is not None:
        raise InputError(f"--dtype {kw['dtype']} is not sharded by --tp yet: the strategies and their baselines are "
                         "bf16/FP8 ones (docs/mx.md, 'What is not done'); drop one of them")
    if kw.get("model"):
        options = {key: kw[key] for key in WORKLOAD_KEYS}
        ok = commands.run_model_tp(kw["model"], options, tp, target, dialect, kernel_fn, strategy=strategy,
                                   output=kw["output"], verify=kw["run_verify"], as_json=kw["as_json"],
                                   echo=click.echo)
        _commit(kernel_fn)  # the files are written: store the searches in the result cache
        if not ok:
            sys.exit(EXIT_FAILED)
        return
    workload = workload_from(kw, kw["target"])
    if command == "explain":
        if kw.get("tuned"):
            raise InputError("explain --tp shows the default schedules; tune --tp searches")
        commands.explain_tp(workload, tp, target, dialect, kernel_fn, strategy, click.echo)
        return
    output = kw.get("output") if command != "cost" else None
    commands.run_tp(workload, tp, target, dialect, kernel_fn, strategy=strategy, output=output,
                    as_json=bool(kw.get("as_json")), echo=click.echo)
    _commit(kernel_fn)
    if command == "tune" and kw.get("run_verify"):
        from ..tensor_parallel.verify import verify_plan

        report = verify_plan(output)
        for line in report.lines(output):
            click.echo(line)
        if not report.ok:
            sys.exit(EXIT_FAILED)


def _commit(kernel_fn: Any) -> None:
    """Store the searches of a tuning kernel function in the result cache (emit/cost/explain compile only)."""
    commit = getattr(kernel_fn, "commit", None)
    if commit is not None:
        commit()


def tp_verify(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Let ``nmmc verify`` take a tensor-parallel plan (plan.json, or its directory) as well as a kernel file."""

    @functools.wraps(fn)
    def run(file: str, seed: int, target: str | None, backend: str, sdk: str | None, as_json: bool,
            max_memory: str | None = None) -> Any:
        from ..tensor_parallel.plan import is_plan

        if not is_plan(file):
            return fn(file=file, seed=seed, target=target, backend=backend, sdk=sdk, as_json=as_json,
                      max_memory=max_memory)
        import json

        from ..tensor_parallel.verify import verify_plan

        if backend != "interpreter" or target or sdk or max_memory:
            raise InputError("verify of a tensor-parallel plan runs nmmc's interpreter on the plan's target; "
                             "drop --backend/--target/--sdk/--max-memory")
        report = verify_plan(file, seed=seed)
        if as_json:
            click.echo(json.dumps(report.as_dict(), indent=2, sort_keys=True))
        else:
            for line in report.lines(file):
                click.echo(line)
        sys.exit(0 if report.ok else EXIT_FAILED)

    return run


def tp_compress(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--tp`` to ``nmmc compress``: after the compression, the factor shards of a tensor-parallel
    deployment (``OUT/tp<N>/``, :mod:`neuronmm_compiler.tensor_parallel.shard_factors`), written by the
    command itself with the same whitening and healing as the unsharded factors."""

    @functools.wraps(fn)
    def run(*args: Any, tp: int, **kwargs: Any) -> Any:
        if tp != 1:
            from ..tensor_parallel.shard_factors import check_model_tp

            check_model_tp(kwargs["model_dir"], tp)
        return fn(*args, tp=tp, **kwargs)

    return click.option("--tp", default=1, show_default=True, type=int, metavar="N",
                        help="Also write the factor shards of a tensor-parallel deployment over N NeuronCores "
                             "into OUT/tpN/: each rank's own factorisation of its block of every projection (with "
                             "--calibration/--heal whitened and healed like the unsharded factors; --eval measures "
                             "the sharded model too), and shards.json mapping the unsharded factors to each rank's "
                             "slices (docs/tensor-parallel.md).")(run)
