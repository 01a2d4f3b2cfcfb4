"""Plumbing of the ``nmmc`` command line: error handling, the options several commands share, and the
workload those options describe."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import click

from ..errors import InputError, NmmcError
from ..frontends.prologue import NormPrologue
from ..frontends.shapes import A_LAYOUTS, dtype_request, fp8_request, parse_shape
from ..frontends.workloads import MlpWorkload, Workload, chain_workload, gemm_workload, mlp_workload
from ..schedule import PRESETS
from ..support import AUTO, KNOWN_SDKS, SUPPORT, check_sdk, resolve_dialect, sdk_summary, support_warning
from ..targets import (
    DEFAULT_TARGET,
    IN_GRAPH,
    LAUNCH_CONTEXTS,
    LAUNCH_SUFFIX,
    STANDALONE,
    TARGETS,
    Target,
    get_target,
    with_launch,
    with_lnc,
)
from ..vocab import Dialect

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 128 + 2  # as a shell reports a command killed by SIGINT (Ctrl-C)
EXIT_BROKEN_PIPE = 128 + 13  # as a shell reports a command killed by SIGPIPE (`nmmc targets | head -1`)


class NmmcGroup(click.Group):
    """Turn click's usage errors and nmmc's user errors into one line and exit code 2; Ctrl-C into
    exit code 130 and a reader that closed stdout (``| head``) into a quiet exit code 141, the
    codes a shell shows for a command killed by SIGINT and SIGPIPE."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
            return result
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except (BrokenPipeError, _BrokenPipe):
            _quiet_stdout()
            sys.exit(EXIT_BROKEN_PIPE)
        except (click.exceptions.Abort, KeyboardInterrupt) as exc:
            if isinstance(exc, click.exceptions.Abort) and not isinstance(exc.__cause__, KeyboardInterrupt):
                click.echo("nmmc: aborted", err=True)  # end of input at a prompt
                sys.exit(EXIT_FAILED)
            click.echo("nmmc: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except click.UsageError as exc:
            cmd = f" {exc.ctx.info_name}" if exc.ctx and exc.ctx.parent else ""
            click.echo(f"nmmc: error: {exc.format_message()} (see 'nmmc{cmd} --help')", err=True)
            sys.exit(EXIT_USAGE)
        except NmmcError as exc:
            click.echo(f"nmmc: error: {exc}", err=True)
            sys.exit(EXIT_USAGE)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:  # click's main would turn it into exit code 1
            raise _BrokenPipe() from exc


class _BrokenPipe(Exception):
    """A BrokenPipeError on its way out of click's main, which handles OSError itself."""


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush into a closed pipe is silent."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (a test runner's stream)
        pass


def parse_params(values: tuple[str, ...]) -> dict[str, str]:
    """The ``--param KEY=VALUE`` values as a mapping (InputError on an item without ``=``)."""
    params: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InputError(f"--param takes key=value (e.g. tiles_in_block_m=4); got {item!r}")
        if key.strip() in params:
            raise InputError(f"--param {key.strip()} is given twice ({params[key.strip()]} and {value.strip()}); "
                             "give each parameter once")
        params[key.strip()] = value.strip()
    return params


def lowercase_name(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Click callback for options naming something nmmc defines (a dtype, layout, preset, dialect,
    search method, stock target): such names are case-insensitive, so the value is lowercased.
    File paths are left as they are (``--target`` also takes a calibrated target file)."""
    if not isinstance(value, str):
        return value
    if param.name == "target" and value.lower() not in TARGETS:
        return value
    return value.lower()


def finite_seconds(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Click callback: a duration must be a finite number of seconds (click's FloatRange lets nan and
    inf through)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds", ctx=ctx, param=param)
    return value


def choice(value: str, accepted: dict[str, Any] | tuple[str, ...], what: str) -> str:
    """``value`` when it is one of ``accepted``, else an InputError naming ``what`` and the choices."""
    if value not in accepted:
        raise InputError(f"unknown {what} {value!r}; accepted: {', '.join(accepted)}")
    return value


WORKLOAD_KEYS = ("graph", "dims", "shape", "rank", "keep_ratio", "mlp", "tokens", "hidden", "intermediate", "ranks",
                 "dense", "dtype", "a_layout", "fuse_norm", "residual", "norm_eps", "fold_gamma", "act_scale")
#: The MLP prologue's options (frontends/prologue.py), which only --mlp takes.
PROLOGUE_KEYS = ("fuse_norm", "residual", "norm_eps", "fold_gamma")


def workload_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """What to compile: a GEMM (--shape), an SVD chain (--shape with --rank or --keep-ratio), a
    gated MLP (--mlp with --tokens/--hidden/--intermediate and ranks, or --dense), or a graph file
    (--graph, with --dim bindings)."""
    options = [
        click.option("--graph", metavar="FILE",
                     help="A graph file (YAML or JSON; see docs/graph-format.md) describing the matmul graph to "
                          "compile, e.g. examples/graphs/lora.yaml."),
        click.option("--dim", "dims", multiple=True, metavar="NAME=N",
                     help="--graph: bind a named dimension of the graph file (e.g. --dim tokens=512); repeatable. "
                          "Overrides the file's default."),
        click.option("--shape", metavar="MxNxK",
                     help="GEMM C[M,N] = A[M,K] @ B[K,N] (e.g. 1024x2048x512); with --rank or --keep-ratio, the "
                          "SVD chain Y = X[M,K] @ U[K,R] @ V[R,N]."),
        click.option("--rank", type=int, default=None, help="SVD rank R (chain), or every projection's rank (--mlp)."),
        click.option("--keep-ratio", type=float, default=None,
                     help="Fraction of parameters kept; the block-aligned rank follows (NeuronMM's formula)."),
        click.option("--mlp", is_flag=True, help="Compile the gated MLP silu(x Wg) * (x Wu) Wd."),
        click.option("--tokens", default=None, metavar="T",
                     help="--mlp: tokens T (rows of x); with tune --model, the token buckets, e.g. 1,32,128."),
        click.option("--hidden", type=int, default=None, help="--mlp: hidden size H."),
        click.option("--intermediate", type=int, default=None, help="--mlp: intermediate size I."),
        click.option("--ranks", default=None, metavar="G,U,D", help="--mlp: ranks of gate, up and down."),
        click.option("--dense", is_flag=True, help="--mlp: the uncompressed MLP (no SVD)."),
        click.option("--fuse-norm", default=None, type=click.Choice(["rmsnorm", "layernorm"]),
                     help="--mlp: fuse RMSNorm or LayerNorm of x (times gamma [H]) before the projections, as AWS "
                          "nki-library's mlp kernel does (docs/fusion.md, 'The norm prologue')."),
        click.option("--residual", is_flag=True,
                     help="--mlp with --fuse-norm: add the input 'residual' [T, H] to x first, normalize the sum and "
                          "store it as the output 'residual_sum'."),
        click.option("--norm-eps", type=float, default=None, help="--fuse-norm: the norm's epsilon (default 1e-06)."),
        click.option("--fold-gamma", is_flag=True,
                     help="--fuse-norm: take no gamma; the gate and up weights (U factors of an SVD MLP) are given "
                          "with gamma folded in, diag(gamma) W (frontends.prologue.fold_gamma computes them)."),
        click.option("--dtype", default="bf16", show_default=True, callback=lowercase_name,
                     help="Element type: bf16 (bfloat16) or fp32 (float32); for --mlp also fp8 (= fp8_e4m3), "
                          "fp8_e5m2 or (trn3) fp8_e4m3fn: FP8 weights (docs/quantization.md); on trn3 also mxfp8_e4m3, "
                          "mxfp8_e5m2, mxfp4: OCP MX weights, for --shape too (docs/mx.md). With tune --model: the "
                          "formats to choose among, e.g. bf16,fp8 ({dense, SVD} x those; docs/quantization.md)."),
        click.option("--act-scale", default=None, callback=lowercase_name, metavar="static|row", help="FP8 activation "
                     "scales: static (default: one per tensor, an input) or row (per token, in-kernel; "
                          "docs/quantization.md)."),
        click.option("--a-layout", default="mk", show_default=True, callback=lowercase_name,
                     help="How A (or X) is stored in HBM: mk = row-major [M,K] (activations), km = transposed "
                          "[K,M]."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def workload_from(options: dict[str, Any], target: str | None = None) -> Workload:
    """Build the workload from :func:`workload_options` values (popped from ``options``).

    ``target`` (a --target value) is where a graph file's inputs and outputs must fit in HBM."""
    o = {key: options.pop(key) for key in WORKLOAD_KEYS}
    if o["graph"] is not None:
        return _graph_workload(o, target)
    workload = _builtin_workload(o)
    if target is not None:
        from ..frontends.graph_file import check_fits_hbm
        from ..targets import get_target

        check_fits_hbm(workload.graph(), get_target(target), "--mlp" if o["mlp"] else f"--shape {o['shape']}")
    return workload


def _builtin_workload(o: dict[str, Any]) -> Workload:
    """A GEMM, chain or MLP from the workload options (not a graph file)."""
    if o["dims"]:
        raise InputError("--dim binds dimensions of a --graph file")
    dtype, mx = dtype_request(o)  # an MX --dtype: MxWeights on bf16 activations (docs/mx.md)
    layout = choice(o["a_layout"], A_LAYOUTS, "A layout")
    fp8 = fp8_request(o["dtype"], dtype, o["mlp"], o["act_scale"] or "static")
    dtype = "bfloat16" if fp8 else dtype
    if o["mlp"]:
        if o["shape"]:
            raise InputError("--mlp takes --tokens/--hidden/--intermediate, not --shape")
        missing = [name for name in ("tokens", "hidden", "intermediate") if o[name] is None]
        if missing:
            raise InputError("--mlp needs " + ", ".join(f"--{m}" for m in missing))
        if layout != "mk":
            raise InputError("--a-layout applies to GEMMs and chains; an MLP's x is row-major [tokens, hidden]")
        try:
            o["tokens"] = int(o["tokens"])
        except ValueError:
            raise InputError(f"--tokens takes one positive integer with --mlp; got {o['tokens']!r}") from None
        ranks = None
        if o["ranks"] is not None:
            try:
                ranks = tuple(int(r) for r in o["ranks"].split(","))
            except ValueError:
                raise InputError(f"--ranks takes three integers G,U,D; got {o['ranks']!r}") from None
        return mlp_workload(o["tokens"], o["hidden"], o["intermediate"], rank=o["rank"], ranks=ranks,  # type: ignore[arg-type]
                            keep_ratio=o["keep_ratio"], dense=o["dense"], dtype=dtype, prologue=prologue_from(o),
                            fp8=fp8, mx=mx)
    for name in ("tokens", "hidden", "intermediate", "ranks", *PROLOGUE_KEYS):
        if o[name] not in (None, False):
            raise InputError(f"--{name} goes with --mlp")
    if o["dense"]:
        raise InputError("--dense goes with --mlp")
    if not o["shape"]:
        raise InputError("give --shape MxNxK (a GEMM, or an SVD chain with --rank/--keep-ratio) or --mlp")
    m, n, k = parse_shape(o["shape"])
    if o["rank"] is not None or o["keep_ratio"] is not None:
        return chain_workload(m, n, k, rank=o["rank"], keep_ratio=o["keep_ratio"], dtype=dtype, a_layout=layout)
    return gemm_workload(m, n, k, dtype=dtype, a_layout=layout, mx=mx)


def prologue_from(o: dict[str, Any]) -> NormPrologue | None:
    """The MLP prologue the options ask for (--fuse-norm, --residual, --norm-eps, --fold-gamma), or None."""
    from ..frontends.prologue import DEFAULT_EPS

    if o["fuse_norm"] is None:
        given = [f"--{key.replace('_', '-')}" for key in PROLOGUE_KEYS[1:] if o[key] not in (None, False)]
        if given:
            raise InputError(f"{', '.join(given)} go(es) with --fuse-norm rmsnorm|layernorm (the residual add is "
                             "fused as the norm's prologue)")
        return None
    eps = DEFAULT_EPS if o["norm_eps"] is None else o["norm_eps"]
    return NormPrologue(o["fuse_norm"], residual=o["residual"], eps=eps, fold_gamma=o["fold_gamma"])


def _graph_workload(o: dict[str, Any], target: str | None) -> Workload:
    from ..frontends.graph_file import check_fits_hbm, load_graph_spec, parse_dim_bindings
    from ..frontends.graph_fp8 import dtype_flag
    from ..frontends.workloads import graph_workload

    others = [f"--{key.replace('_', '-')}" for key in WORKLOAD_KEYS
              if key not in ("graph", "dims", "dtype", "a_layout") and o[key] not in (None, False)]
    if o["a_layout"] != "mk":
        others.append("--a-layout")
    if o["dtype"] != "bf16":
        others.append(dtype_flag(o["dtype"]))  # an FP8 --dtype is refused with how a file declares FP8 weights
    if others:
        raise InputError(f"--graph describes the whole workload (shapes, dtypes, layouts are in the file); "
                         f"drop {', '.join(others)}")
    spec = load_graph_spec(o["graph"])
    graph = spec.graph(parse_dim_bindings(o["dims"]))
    if target is not None:
        check_fits_hbm(graph, get_target(target), spec.source)
    return graph_workload(graph, spec.source)


def schedule_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--schedule PRESET, --param KEY=VALUE (repeatable) and --pipeline SPEC."""
    fn = click.option("--pipeline", default=None, metavar="SPEC",
                      help="Run this pass pipeline instead of the workload's own (see 'nmmc opt --help' for the "
                           "passes), e.g. 'canonicalize,fold-transposes,canonicalize,implicit-transpose,"
                           "fuse{mlp=split},place'.")(fn)
    fn = click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
                      help="Override one schedule parameter; repeatable. See 'nmmc schedules'.")(fn)
    fn = click.option("--schedule", "schedule_name", default=None, metavar="PRESET", callback=lowercase_name,
                      help=f"GEMM schedule preset: {', '.join(PRESETS)} (default aws-fully-optimized).")(fn)
    return fn


def _remember_lnc(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    ctx.meta["nmmc_lnc"] = value
    return value


def _remember_launch(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    ctx.meta["nmmc_launch"] = value
    return value


def _target_spec(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """--target resolved with --lnc and --launch (eager options, so read first) into the spec of one Target, e.g.
    ``trn2:lnc=2`` or ``trn2:lnc=2:launch=in-graph``: every command names the target, logical core and launch
    context included, by that one string. A --launch given is kept in the spec even when standalone
    (``:launch=standalone``, which resolves to the plain spec), so that :func:`resolve_target` can tell it from
    the workload's default."""
    spec = with_lnc(get_target(lowercase_name(ctx, param, value)), ctx.meta.get("nmmc_lnc")).spec
    launch = ctx.meta.get("nmmc_launch")
    return spec if launch is None else f"{spec}{LAUNCH_SUFFIX}{launch}"


def default_launch(workload: Workload | None) -> str:
    """The launch context of a workload whose command named none: in-graph for a gated MLP (``--mlp``; ``--model``
    and ``--tp`` pass None), which runs inside a model's compiled graph; standalone for GEMMs, chains and graph
    files, which nmmc cannot know to be part of a model and which AWS's published measurements (the cost model's
    fit) time standalone."""
    return IN_GRAPH if workload is None or isinstance(workload, MlpWorkload) else STANDALONE


def resolve_target(spec: str, workload: Workload | None) -> Target:
    """The Target of a --target spec (:func:`_target_spec`) for ``workload`` (None: a model or tensor-parallel
    MLP): the launch context the spec names, else the workload's default (:func:`default_launch`)."""
    target = get_target(spec)
    return target if LAUNCH_SUFFIX in spec else with_launch(target, default_launch(workload))


LAUNCH_HELP = ("Launch context the latencies and speedups are predicted in: standalone (the kernel run on its own, "
               "as nki.benchmark times it: one ~45 us launch per workload) or in-graph (inside a model's compiled "
               "graph: no launch of its own, an assumed 2 us per kernel, so a baseline of five kernels pays it five "
               "times; docs/cost_model.md 2a) [default: in-graph for --mlp, --model and --tp, which run inside a "
               "model; standalone for --shape and --graph].")


def target_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--target NAME_OR_FILE (default trn2), --lnc 1|2 (default: the target's platform degree) and --launch
    standalone|in-graph (default: the workload's, :func:`resolve_target`)."""
    fn = click.option("--target", default=DEFAULT_TARGET, show_default=True, callback=_target_spec,
                      help=f"Hardware: {', '.join(TARGETS)}, or a calibrated target file written by "
                           "'nmmc calibrate'.")(fn)
    fn = click.option("--launch", type=click.Choice(LAUNCH_CONTEXTS, case_sensitive=False), default=None,
                      is_eager=True, expose_value=False, callback=_remember_launch, help=LAUNCH_HELP)(fn)
    return click.option("--lnc", type=click.IntRange(1, 2), default=None, is_eager=True, expose_value=False,
                        callback=_remember_lnc,
                        help="Logical NeuronCore degree: how many physical cores one kernel launch spans. 2 (the "
                             "trn2/trn3 default, as neuronx-cc and the Neuron runtime use it): the kernel splits its "
                             "work between the two cores by nl.program_id; 1: one physical core (trn1 has only 1). "
                             "See docs/logical-cores.md [default: the target's platform degree].")(fn)


DIALECT_HELP = ("NKI dialect: nki (NKI 0.3+, import nki), neuronxcc (NKI 0.1, import neuronxcc.nki), or auto: the "
                "one the Neuron docs support for the target (and --sdk): " + "; ".join(
                    f"{e.dialect} on {'/'.join(e.targets)} (SDK {e.sdk_min}-{e.sdk_max})" for e in SUPPORT)
                + ". See docs/nki-rules.md, 'Support matrix'.")


def dialect_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--dialect auto|nki|neuronxcc and --sdk VERSION (resolved by :func:`chosen_dialect`)."""
    fn = click.option("--sdk", default=None, metavar="VERSION", callback=lowercase_name,
                      help=f"Neuron SDK release the kernel is for ({', '.join(KNOWN_SDKS)}): --dialect auto picks the "
                           "dialect documented for it; a dialect not documented for the target on that release is "
                           f"a warning; {sdk_summary()} [default: the newest release supporting the dialect on the "
                           "target: "
                           + "; ".join(f"{e.dialect} on {'/'.join(e.targets)} {e.sdk_max}" for e in SUPPORT)
                           + "].")(fn)
    return click.option("--dialect", default=AUTO, show_default=True, callback=lowercase_name, help=DIALECT_HELP)(fn)


def chosen_dialect(dialect: str, sdk: str | None, target: Target) -> Dialect:
    """The concrete dialect of --dialect/--sdk on ``target``, with a warning on stderr when the docs do not
    support that dialect there (the kernel is still written: the simulator and other releases may take it)."""
    resolved = resolve_dialect(dialect, target.name, sdk)
    if sdk is not None:
        check_sdk(sdk, resolved)
    warning = support_warning(resolved, target.name, sdk)
    if warning:
        click.echo(f"nmmc: warning: {warning}", err=True)
    return resolved


def progress_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--progress/--no-progress (default: when stderr is a terminal; see :func:`show_progress`)."""
    return click.option("--progress/--no-progress", default=None,
                        help="Progress bar on stderr [default: when stderr is a terminal].")(fn)


def show_progress(progress: bool | None, as_json: bool) -> bool:
    """Whether to draw a progress bar: as --progress/--no-progress say, else when stderr is a
    terminal and the output is not JSON."""
    return progress if progress is not None else (sys.stderr.isatty() and not as_json)


def compile_inputs(options: dict[str, Any], target: str) -> tuple[Workload, Target]:
    """The workload (popped from ``options``, see :func:`workload_from`) and Target of a compile
    command's options."""
    workload = workload_from(options, target)
    return workload, resolve_target(target, workload)
