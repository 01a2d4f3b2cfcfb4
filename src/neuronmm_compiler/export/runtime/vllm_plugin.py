"""vLLM general plugin: routes vLLM Neuron's dense MLP calls to this package's kernels.

``nmmc export --serving vllm-neuron`` writes ``pyproject.toml`` beside this file with the entry point
``[project.entry-points."vllm.general_plugins"] nmmc_<package> = "<package>.vllm_plugin:register"``; after
``pip install PACKAGE_DIR`` vLLM calls :func:`register` in every process it starts (API server, engine core,
each tensor-parallel worker), unless ``VLLM_PLUGINS`` is set and does not name the plugin
(vllm-project/vllm@01425553bdbed63400efa72ff14a8f4ffe20bada:vllm/plugins/__init__.py, ``load_general_plugins``:
"plugins can be loaded for multiple times in different processes"). :func:`register` is idempotent.

What it replaces. vLLM Neuron's Llama and Qwen3 models compute every dense MLP by one call,
``NF.mlp(hidden_states, gate_proj_weight, up_proj_weight, down_proj_weight)`` with ``import vllm_neuron.functional
as NF`` (jinhuang12/vllm-neuron@ed3580d01e8632897b29986ab7532d8c5925846f: vllm_neuron/model/llama3/model.py
``LlamaMLP.forward``, vllm_neuron/model/qwen3/model.py ``Qwen3MLP.forward``; vllm_neuron/functional/__init__.py
``from .mlp import mlp``); other callers import the function from its module at call time
(``from vllm_neuron.functional.mlp import mlp``). Each worker re-registers vLLM Neuron's own model classes when it
starts (vllm_neuron/vllm/worker/neuron_worker.py, ``NeuronWorker.__init__``), so a replaced model class would be
lost: the plugin replaces the *function*, as the attribute ``mlp`` of both modules (and of any vllm_neuron module
that bound it by name before). vllm_neuron is not imported here: the plugin patches the module when it is imported
(an import hook), or at once if it already is.

The router. A call goes to this package's kernels only when all of these hold, else to the original function,
unchanged: the function's signature is the one recorded below (:data:`SIGNATURE`, compared with
``inspect.signature`` at load; a mismatch logs one warning and leaves the original in place); only ``hidden``,
``gate_w``, ``up_w`` and ``down_w`` are given (every other argument at its default: no fused normalization,
residual add, biases, FP8 quantization, other activation, clamping, output dtype or weight layout; ``eps`` only
feeds the normalization, off by default, so any value is accepted); the four are 2-D bf16 tensors on one device
with ``hidden`` [T, H], ``gate_w``/``up_w`` [H, I_r], ``down_w`` [I_r, H]; and (T, H, I_r) is a bucket and
per-rank slice this package exported. The result is the rank's partial output ``silu(x gate_w) * (x up_w)
down_w``, as the original returns it: the model all-reduces (decode) or reduce-scatters (prefill) after the call.

``NMMC_VLLM_NEURON=off`` (or 0, false, no) leaves vLLM Neuron's function in place.

Part of a package written by ``nmmc export --serving vllm-neuron``.
"""

from __future__ import annotations

import enum
import importlib
import importlib.abc
import inspect
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent
#: A child of vLLM's "vllm" logger, whose handler prints INFO and up to the server's log
#: (vllm-project/vllm@00656a8e7442dec75d69881cee20ffe38f46f606:vllm/logger.py), so
#: the one line per process saying whether the router is in place is seen.
logger = logging.getLogger(f"vllm.nmmc.{ROOT.name}")
#: Where the recorded signature and the call sites come from.
SOURCE = "jinhuang12/vllm-neuron@ed3580d01e8632897b29986ab7532d8c5925846f:vllm_neuron/functional/mlp.py"
TARGET_MODULE = "vllm_neuron.functional"
TARGET_SUBMODULE = "vllm_neuron.functional.mlp"
OFF_ENV = "NMMC_VLLM_NEURON"
REQUIRED = "<required>"
#: ``vllm_neuron.functional.mlp.mlp`` as of :data:`SOURCE`: (name, kind, default) of every parameter, defaults as
#: :func:`describe_default` prints them (an enum member as ``Class.MEMBER``, nkilib's ``common_types`` enums).
SIGNATURE: tuple[tuple[str, str, str], ...] = (
    ("hidden", "POSITIONAL_OR_KEYWORD", REQUIRED),
    ("gate_w", "POSITIONAL_OR_KEYWORD", REQUIRED),
    ("up_w", "POSITIONAL_OR_KEYWORD", REQUIRED),
    ("down_w", "POSITIONAL_OR_KEYWORD", REQUIRED),
    ("eps", "POSITIONAL_OR_KEYWORD", "1e-06"),
    ("ln_w", "POSITIONAL_OR_KEYWORD", "None"),
    ("skip_gate", "POSITIONAL_OR_KEYWORD", "False"),
    ("act_fn", "POSITIONAL_OR_KEYWORD", "ActFnType.SiLU"),
    ("gate_b", "POSITIONAL_OR_KEYWORD", "None"),
    ("up_b", "POSITIONAL_OR_KEYWORD", "None"),
    ("down_b", "POSITIONAL_OR_KEYWORD", "None"),
    ("norm_b", "POSITIONAL_OR_KEYWORD", "None"),
    ("norm_type", "POSITIONAL_OR_KEYWORD", "NormType.NO_NORM"),
    ("fused_add_tensor", "POSITIONAL_OR_KEYWORD", "None"),
    ("store_fused_add_result", "POSITIONAL_OR_KEYWORD", "False"),
    ("quantization_type", "POSITIONAL_OR_KEYWORD", "QuantizationType.NONE"),
    ("gate_w_scale", "POSITIONAL_OR_KEYWORD", "None"),
    ("up_w_scale", "POSITIONAL_OR_KEYWORD", "None"),
    ("down_w_scale", "POSITIONAL_OR_KEYWORD", "None"),
    ("gate_up_in_scale", "POSITIONAL_OR_KEYWORD", "None"),
    ("down_in_scale", "POSITIONAL_OR_KEYWORD", "None"),
    ("quant_clipping_bound", "POSITIONAL_OR_KEYWORD", "0.0"),
    ("output_dtype", "POSITIONAL_OR_KEYWORD", "None"),
    ("gate_clamp_upper_limit", "POSITIONAL_OR_KEYWORD", "None"),
    ("gate_clamp_lower_limit", "POSITIONAL_OR_KEYWORD", "None"),
    ("up_clamp_upper_limit", "POSITIONAL_OR_KEYWORD", "None"),
    ("up_clamp_lower_limit", "POSITIONAL_OR_KEYWORD", "None"),
    ("gate_up_w_layout", "POSITIONAL_OR_KEYWORD", "None"),
)
#: The arguments the router passes on to the kernels, in order; every other must keep its default.
ROUTED = ("hidden", "gate_w", "up_w", "down_w")
#: Arguments whose value cannot change the result while every other is at its default: ``eps`` is the
#: normalization's epsilon and the default ``norm_type`` (``NO_NORM``) normalizes nothing (mlp.py, the kernel call
#: and ``_torch_mlp_impl`` read ``eps`` only for normalization).
INERT = ("eps",)
#: The kernels' argument names of gate, up and down (the manifest's tensors of a dense group).
KERNEL_ARGS = {"gate_w": "w_gate", "up_w": "w_up", "down_w": "w_down"}

_LOCK = threading.RLock()
_STATE: dict[str, Any] = {"warned": False, "installed": None}


def describe_default(default: Any) -> str:
    """A parameter default as :data:`SIGNATURE` records it."""
    if default is inspect.Parameter.empty:
        return REQUIRED
    if isinstance(default, enum.Enum):
        return f"{type(default).__name__}.{default.name}"
    return repr(default)


def signature_of(function: Callable[..., Any]) -> tuple[tuple[str, str, str], ...]:
    """``function``'s parameters as (name, kind, default) triples, comparable with :data:`SIGNATURE`."""
    return tuple((p.name, p.kind.name, describe_default(p.default))
                 for p in inspect.signature(function).parameters.values())


def enabled() -> bool:
    return os.environ.get(OFF_ENV, "").strip().lower() not in ("0", "off", "false", "no")


def register() -> None:
    """The ``vllm.general_plugins`` entry point: route ``vllm_neuron.functional.mlp`` now if vllm_neuron's
    functional module is loaded, else as soon as it is. Idempotent; never raises (a failure leaves vLLM Neuron's
    function in place and is logged)."""
    if not enabled():
        logger.info("nmmc: %s=%s, vLLM Neuron's MLP left in place", OFF_ENV, os.environ.get(OFF_ENV))
        return
    with _LOCK:
        module = sys.modules.get(TARGET_MODULE)
        if module is not None and hasattr(module, "mlp"):
            install(module)
        elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
            sys.meta_path.insert(0, _PatchOnImport())


def install(module: Any, runner: Callable[..., Any] | None = None) -> bool:
    """Replace ``module.mlp`` (and the function's other names in loaded vllm_neuron modules) by the router; True
    when the router is in place. ``runner(group, tokens, rank, x, weights)`` runs a bucket's kernels (default:
    ``run_rank`` of this package's operators, ``ops.package_ops()``)."""
    with _LOCK:
        try:
            return _install(module, runner)
        except Exception:  # the plugin must never break the server: the original stays
            logger.exception("nmmc: could not route %s.mlp; vLLM Neuron's MLP left in place", TARGET_MODULE)
            return False


def _install(module: Any, runner: Callable[..., Any] | None) -> bool:
    current = module.mlp
    if getattr(current, "nmmc_router", False):
        return True
    found = signature_of(current)
    if found != SIGNATURE:
        if not _STATE["warned"]:
            _STATE["warned"] = True
            logger.warning("nmmc: %s.mlp's signature differs from the one this package was built against (%s): "
                           "vLLM Neuron's MLP left in place; %s", TARGET_MODULE, SOURCE, _difference(found))
        return False
    routes = routes_of(manifest())
    if runner is None:  # this package's kernels as PyTorch operators (ops.py), only buckets it can run per rank
        # ops.package_ops() (the operators, registered once) is resolved here, not in the traced call: under
        # torch.compile the cached lookup would be traced into (Path.resolve, a graph break)
        operators = importlib.import_module(f"{__package__}.ops").package_ops()
        runner = operators.run_rank
        routes = {shape: target for shape, target in routes.items() if operators.routable(*target)}
    router = make_router(current, routes, runner)
    _rebind(module, current, router)
    _STATE["installed"] = router
    logger.info("nmmc: %s.mlp routed to %s for %d shape(s) (tokens, hidden, intermediate per rank): %s",
                TARGET_MODULE, ROOT.name, len(routes), ", ".join(f"{t}x{h}x{i}" for t, h, i in sorted(routes)))
    return True


def _difference(found: tuple[tuple[str, str, str], ...]) -> str:
    recorded = dict((name, (kind, default)) for name, kind, default in SIGNATURE)
    actual = dict((name, (kind, default)) for name, kind, default in found)
    missing = [name for name in recorded if name not in actual]
    added = [name for name in actual if name not in recorded]
    changed = [name for name in recorded if name in actual and recorded[name] != actual[name]]
    moved = [] if missing or added else [name for (name, *_), (other, *_) in zip(SIGNATURE, found, strict=True)
                                         if name != other]
    parts = [f"{label}: {', '.join(names)}" for label, names in
             (("missing", missing), ("new", added), ("kind or default changed", changed), ("reordered", moved))
             if names]
    return "; ".join(parts) or "parameters differ"


def manifest() -> dict[str, Any]:
    return json.loads((ROOT / "manifest.json").read_text(encoding="utf-8"))


def routes_of(manifest: dict[str, Any]) -> dict[tuple[int, int, int], tuple[str, int, int]]:
    """(tokens, hidden, intermediate per rank) -> (group, tokens, rank) of every bucket the router may run: a dense
    bf16 group (one format for every layer, since vLLM passes no layer index), every rank of the bucket in one role
    whose steps are one kernel on ``x``, ``w_gate``, ``w_up``, ``w_down`` (slices of the layer's weights) and at
    most an all-reduce of its output after it. Any rank's program is then every rank's, with its own slices, which
    vLLM passes as the weights."""
    groups = manifest["groups"]
    if len(groups) != 1 or manifest["activation_dtype"] != "bfloat16":
        return {}
    (name, group), = groups.items()
    if group["mlp"] != "dense" or group["weights_dtype"] != "bfloat16":
        return {}
    hidden = manifest["model"]["hidden_size"]
    routes: dict[tuple[int, int, int], tuple[str, int, int]] = {}
    for bucket in group["buckets"]:
        ranks = bucket["ranks"]
        if len({r["role"] for r in ranks}) != 1:
            continue
        widths = {_kernel_width(bucket, r, hidden) for r in ranks}
        if len(widths) == 1 and None not in widths:
            tokens = bucket["tokens"]
            routes[(tokens, hidden, widths.pop())] = (name, tokens, ranks[0]["rank"])
    return routes


def _kernel_width(bucket: dict[str, Any], program: dict[str, Any], hidden: int) -> int | None:
    """The intermediate width of the rank's one kernel step when its program is that kernel (then at most the
    final all-reduce of its output), on x [T, H] and w_gate/w_up [H, I_r], w_down [I_r, H] in bf16; else None."""
    steps = program["steps"]
    kernels = [s for s in steps if "kernel" in s]
    if len(kernels) != 1 or steps[0] is not kernels[0]:
        return None
    step = kernels[0]
    if set(step["args"]) != {"x", *KERNEL_ARGS.values()} or step["args"]["x"] != {"tensor": "x"} or \
            len(step["outputs"]) != 1:
        return None
    (produced,) = step["outputs"].values()
    rest = steps[1:]
    if rest and not (len(rest) == 1 and rest[0].get("collective") == "all_reduce" and rest[0]["tensor"] == produced
                     and rest[0]["result"] == bucket["output"]):
        return None
    if not rest and produced != bucket["output"]:
        return None
    arguments = {a["name"]: a for f in bucket["kernels"][step["kernel"]]["functions"] for a in f["arguments"]}
    try:
        x, gate, up, down = (arguments[n] for n in ("x", "w_gate", "w_up", "w_down"))
    except KeyError:
        return None
    width = gate["shape"][1]
    shapes_ok = (x["shape"] == [bucket["tokens"], hidden] and gate["shape"] == [hidden, width] and
                 up["shape"] == [hidden, width] and down["shape"] == [width, hidden])
    dtypes_ok = all(a["dtype"] == "bfloat16" for a in (x, gate, up, down))
    return width if shapes_ok and dtypes_ok else None


def make_router(original: Callable[..., Any], routes: dict[tuple[int, int, int], tuple[str, int, int]],
                runner: Callable[..., Any]) -> Callable[..., Any]:
    """The function put in place of ``original`` (see the module docstring for when it calls ``runner``)."""
    parameters = list(inspect.signature(original).parameters.values())
    names = [p.name for p in parameters]
    defaults = {p.name: p.default for p in parameters if p.name not in ROUTED and p.name not in INERT}

    def at_default(name: str, value: Any) -> bool:
        default = defaults[name]
        if default is None:
            return value is None
        return type(value) is type(default) and value == default

    def route(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[str, int, int], dict[str, Any]] | None:
        if len(args) > len(names):
            return None
        bound = dict(zip(names, args, strict=False))  # fewer args than names: the rest by keyword
        for name, value in kwargs.items():
            if name in bound or name not in names:
                return None
            bound[name] = value
        if any(name not in bound for name in ROUTED):
            return None
        if any(not at_default(name, value) for name, value in bound.items() if name in defaults):
            return None
        x, gate, up, down = (bound[name] for name in ROUTED)
        tensors = (x, gate, up, down)
        if not all(isinstance(t, torch.Tensor) and t.dim() == 2 and t.dtype == torch.bfloat16 for t in tensors):
            return None
        if not all(t.device == x.device for t in tensors):
            return None
        tokens, hidden = x.shape
        width = gate.shape[1]
        if tuple(gate.shape) != (hidden, width) or tuple(up.shape) != (hidden, width) or \
                tuple(down.shape) != (width, hidden):
            return None
        target = routes.get((int(tokens), int(hidden), int(width)))
        if target is None:
            return None
        return target, {KERNEL_ARGS[name]: bound[name] for name in ("gate_w", "up_w", "down_w")}

    def mlp(*args: Any, **kwargs: Any) -> Any:
        decided = route(args, kwargs)
        if decided is None:
            return original(*args, **kwargs)
        (group, tokens, rank), weights = decided
        return runner(group, tokens, rank, args[0] if args else kwargs["hidden"], weights)

    mlp.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    mlp.__doc__ = f"nmmc's router in front of {TARGET_MODULE}.mlp (package {ROOT.name}); see {__name__}."
    mlp.nmmc_router = True  # type: ignore[attr-defined]
    mlp.original = original  # type: ignore[attr-defined]
    mlp.routes = dict(routes)  # type: ignore[attr-defined]
    return mlp


def _rebind(module: Any, original: Callable[..., Any], router: Callable[..., Any]) -> None:
    """``router`` under every name ``original`` has in a loaded vllm_neuron module: ``vllm_neuron.functional.mlp``
    (the package attribute models read as ``NF.mlp``), the function in its own module (``from
    vllm_neuron.functional.mlp import mlp`` at call time) and any module-level ``from ... import mlp`` made
    before the plugin ran."""
    module.mlp = router
    for name, loaded in list(sys.modules.items()):
        if loaded is None or not (name == "vllm_neuron" or name.startswith("vllm_neuron.")):
            continue
        namespace = getattr(loaded, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attribute, value in list(namespace.items()):
            if value is original:
                setattr(loaded, attribute, router)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``vllm_neuron.functional`` with the other finders and installs the router right after the module
    has run (its ``__init__`` imports ``.mlp`` first)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _InstallAfter(spec.loader)
        return spec


class _InstallAfter(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        if hasattr(module, "mlp"):
            install(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
