"""``nmmc export --serving vllm-neuron``: the token buckets and per-rank MLP shapes vLLM Neuron compiles for a server
command line, and the files that make the package a vLLM plugin (docs/integration.md, "vLLM Neuron").

Every rule here is vLLM Neuron's, read at one commit, :data:`PIN` (``cite(path)`` names a file of it):

- decode (``num_seqs_buckets``): powers of two from 1 below ``--max-num-seqs``, then ``--max-num-seqs``
  (vllm_neuron/utils/bucket_utils.py ``get_default_num_seqs_buckets``, chosen by vllm_neuron/vllm/core/scheduler.py
  ``NeuronScheduler.__init__`` when ``neuron_config`` sets no ``num_seqs_buckets``); a decode step of B requests pads
  to the smallest bucket holding B (bucket_utils ``get_decode_padded_batch_size``), one token per request without
  speculative decoding, so the MLP sees T = bucket rows;
- prefill (``num_batched_tokens_buckets``): with ``M = min(--max-num-batched-tokens, --max-model-len)``
  (bucket_utils ``get_max_num_batched_tokens``), single-shot prefill when ``M >= --max-model-len``, allowed up to
  a ``--max-model-len`` of 16384, buckets the powers of two from 128 below M, then M
  (``get_default_num_batched_tokens_buckets``); chunked prefill otherwise, which vLLM Neuron runs as segmented
  prefill with the one bucket [M], M one of the segment sizes 512 ... 8192 (``resolve_segmented_prefill_config``,
  ``SUPPORTED_KV_SEGMENT_SIZES``, ``MAX_MODEL_LEN_SINGLE_SHOT``). A prefill runs sequence parallel: the model
  refuses a prompt bucket T unless T > TP and TP divides T (vllm_neuron/model/llama3/model.py and
  vllm_neuron/model/qwen3/model.py, ``forward``), each rank embeds T/TP tokens, and the MLP all-gathers them
  before ``NF.mlp`` (``LlamaMLP.forward``/``Qwen3MLP.forward``), so the MLP of every rank sees the whole bucket T
  and returns its partial sum, which is reduce-scattered;
- per rank: gate/up [H, I/TP] and down [I/TP, H], slices of the intermediate dimension (``sharding_weight_loader``
  with ``shard_size = intermediate_size // world_size`` in the MLP classes), in the checkpoint's ``torch_dtype``
  (the models' configs keep it: vllm_neuron/model/qwen3/config.py, vllm_neuron/model/llama3/config.py); decode
  calls ``NF.mlp`` before its all-reduce, so the call returns the rank's partial sum there too.

nmmc's Megatron sharding gives every rank of a TP that divides I exactly those slices (tensor_parallel/sharding.py),
so one kernel per bucket serves every rank (docs/tensor-parallel.md).
"""

from __future__ import annotations

import json
import keyword
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import InputError

__all__ = ["PIN", "ServingPlan", "cite", "decode_buckets", "plan_serving", "prefill_buckets", "serving_files"]

SERVING = "vllm-neuron"
PIN = "jinhuang12/vllm-neuron@ed3580d01e8632897b29986ab7532d8c5925846f"
#: Where the plugin's entry point group and its per-process loading are defined.
VLLM_PLUGINS = "vllm-project/vllm@01425553bdbed63400efa72ff14a8f4ffe20bada:vllm/plugins/__init__.py"
PLUGIN_GROUP = "vllm.general_plugins"
#: vLLM Neuron's first prefill bucket (bucket_utils ``get_default_num_batched_tokens_buckets``).
FIRST_PREFILL_BUCKET = 128
#: Segment sizes of vLLM Neuron's segmented-prefill attention kernel (bucket_utils ``SUPPORTED_KV_SEGMENT_SIZES``).
SEGMENT_SIZES = (512, 1024, 2048, 4096, 8192)
#: The largest --max-model-len vLLM Neuron prefills in one shot (bucket_utils ``MAX_MODEL_LEN_SINGLE_SHOT``).
MAX_MODEL_LEN_SINGLE_SHOT = 16 * 1024
#: Architectures vLLM Neuron registers whose dense MLP is ``NF.mlp`` on bf16 weights (vllm_neuron/model/registry.py
#: ``get_models``; the MLP classes in vllm_neuron/model/llama3/model.py and vllm_neuron/model/qwen3/model.py).
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
#: vLLM Neuron launches its MLP kernel on a grid of 2 (LNC=2): ``wrapped_mlp[2](...)`` in mlp.py.
LNC = 2
SERVING_FILE = "serving.json"
GUIDE_FILE = "SERVING.md"
PYPROJECT_FILE = "pyproject.toml"
PLUGIN_MODULE = "vllm_plugin"


def cite(path: str) -> str:
    """``repo@commit:path`` of a vLLM Neuron file at :data:`PIN`."""
    return f"{PIN}:{path}"


def decode_buckets(max_num_seqs: int) -> list[int]:
    """vLLM Neuron's default ``num_seqs_buckets`` (bucket_utils ``get_default_num_seqs_buckets``)."""
    buckets, size = [], 1
    while size < max_num_seqs:
        buckets.append(size)
        size *= 2
    return [*buckets, max_num_seqs]


def prefill_buckets(max_num_batched_tokens: int, max_model_len: int) -> tuple[list[int], str]:
    """(vLLM Neuron's default ``num_batched_tokens_buckets``, ``single-shot`` or ``segmented``) for these flags
    (bucket_utils ``get_max_num_batched_tokens``, ``resolve_segmented_prefill_config``,
    ``get_default_num_batched_tokens_buckets``); InputError where vLLM Neuron refuses the combination."""
    largest = min(max_num_batched_tokens, max_model_len)
    if largest >= max_model_len:
        if max_model_len > MAX_MODEL_LEN_SINGLE_SHOT:
            raise InputError(f"--max-model-len {max_model_len} with --max-num-batched-tokens {max_num_batched_tokens}: "
                             f"vLLM Neuron prefills in one shot only up to a --max-model-len of "
                             f"{MAX_MODEL_LEN_SINGLE_SHOT}; give --max-num-batched-tokens one of "
                             f"{', '.join(map(str, SEGMENT_SIZES))} for chunked prefill "
                             f"({cite('vllm_neuron/utils/bucket_utils.py')})")
        buckets, bucket = [], FIRST_PREFILL_BUCKET
        while bucket < largest:
            buckets.append(bucket)
            bucket *= 2
        return [*buckets, largest], "single-shot"
    if largest not in SEGMENT_SIZES:
        raise InputError(f"--max-num-batched-tokens {max_num_batched_tokens} below --max-model-len {max_model_len} "
                         f"means chunked prefill, which vLLM Neuron runs only in segments of "
                         f"{', '.join(map(str, SEGMENT_SIZES))} tokens; pick one, or --max-num-batched-tokens >= "
                         f"--max-model-len ({cite('vllm_neuron/utils/bucket_utils.py')})")
    return [largest], "segmented"


@dataclass(frozen=True)
class ServingPlan:
    """What a vLLM Neuron server with these flags runs in each rank's MLP: the decode and prefill buckets, the
    token counts the MLP sees (one kernel each) and the per-rank weight shapes."""

    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    decode: tuple[int, ...]
    prefill: tuple[int, ...]
    prefill_mode: str
    hidden: int
    intermediate: int
    architecture: str

    @property
    def intermediate_per_rank(self) -> int:
        return self.intermediate // self.tp

    @property
    def tokens(self) -> tuple[int, ...]:
        """The MLP token counts of a rank, decode and prefill (a count in both is one kernel)."""
        return tuple(sorted({*self.decode, *self.prefill}))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "intermediate_per_rank": self.intermediate_per_rank, "mlp_tokens": list(self.tokens),
                "source": PIN}


def plan_serving(architecture: str, hidden: int, intermediate: int, *, tp: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int) -> ServingPlan:
    """The :class:`ServingPlan` of these server flags for a model; InputError (one line) for a combination vLLM
    Neuron would refuse or that the exported kernels could not match."""
    if architecture not in ARCHITECTURES:
        raise InputError(f"--serving {SERVING}: vLLM Neuron routes the dense MLP of "
                         f"{', '.join(ARCHITECTURES.values())} through vllm_neuron.functional.mlp, not of "
                         f"{architecture} models ({cite('vllm_neuron/model/registry.py')})")
    for flag, value in (("--max-num-seqs", max_num_seqs), ("--max-num-batched-tokens", max_num_batched_tokens),
                        ("--max-model-len", max_model_len)):
        if value < 1:
            raise InputError(f"{flag} must be a positive integer; got {value}")
    if intermediate % tp:
        raise InputError(f"--tp {tp} does not divide the intermediate size {intermediate}: vLLM Neuron gives each rank "
                         f"intermediate_size // world_size columns ({cite('vllm_neuron/model/llama3/model.py')}), "
                         "dropping the rest; pick a --tp that divides it")
    prefill, mode = prefill_buckets(max_num_batched_tokens, max_model_len)
    refused = [t for t in prefill if t <= tp or t % tp]
    if refused:
        raise InputError(f"prefill bucket(s) {', '.join(map(str, refused))} with --tp {tp}: vLLM Neuron's sequence-"
                         f"parallel prefill needs each bucket above --tp and divisible by it "
                         f"({cite('vllm_neuron/model/llama3/model.py')}, LlamaForCausalLM.forward)")
    return ServingPlan(tp=tp, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                       max_model_len=max_model_len, decode=tuple(decode_buckets(max_num_seqs)), prefill=tuple(prefill),
                       prefill_mode=mode, hidden=hidden, intermediate=intermediate, architecture=architecture)


def check_package_name(out_dir: str | Path) -> str:
    """The import name of the package directory ``out_dir`` (its last component), which must be an identifier
    that is not a keyword: vLLM imports the plugin as ``<name>.vllm_plugin``."""
    name = Path(out_dir).resolve().name
    if not name.isidentifier() or keyword.iskeyword(name):
        raise InputError(f"--serving {SERVING}: the package directory's name {name!r} must be a Python identifier "
                         "(vLLM imports the plugin as NAME.vllm_plugin); name the output e.g. nmmc_llama8b")
    return name


def plugin_name(package: str) -> str:
    """The plugin's entry point name (what ``VLLM_PLUGINS`` lists)."""
    return f"nmmc_{package}"


def serving_files(plan: ServingPlan, package: str, package_dir: Path, model: str) -> dict[str, str]:
    """The files that make the package a vLLM plugin, written with it (``export_model(extra_files=...)``):
    ``vllm_plugin.py`` (the router), ``pyproject.toml`` (installable with ``pip install PACKAGE_DIR``, entry point in
    :data:`PLUGIN_GROUP`), ``serving.json`` (the plan) and ``SERVING.md`` (what to add to the server command
    line)."""
    runtime = Path(__file__).parent / "runtime"
    return {f"{PLUGIN_MODULE}.py": (runtime / f"{PLUGIN_MODULE}.py").read_text(encoding="utf-8"),
            PYPROJECT_FILE: pyproject_text(package, model),
            SERVING_FILE: json.dumps(plan.as_dict(), indent=2) + "\n",
            GUIDE_FILE: guide_text(plan, package, package_dir, model)}


def pyproject_text(package: str, model: str) -> str:
    """A pyproject.toml that installs the package directory as the import package ``package`` (its files, the
    kernels and the manifest as package data) and declares the vLLM plugin; no dependencies (torch, numpy and
    safetensors come with vLLM; the kernels' ``nki`` with the Neuron SDK)."""
    return f"""# Written by nmmc export --serving {SERVING}: pip install this directory into the vLLM environment.
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "nmmc-export-{package.replace('_', '-')}"
version = "{__version__}"
description = "nmmc's MLP kernels for {model} as a vLLM Neuron plugin"
requires-python = ">=3.10"
dependencies = []

[project.entry-points."{PLUGIN_GROUP}"]
{plugin_name(package)} = "{package}.{PLUGIN_MODULE}:register"

[tool.setuptools]
packages = ["{package}"]
package-dir = {{"{package}" = "."}}
include-package-data = false

[tool.setuptools.package-data]
"{package}" = ["*.json", "*.md", "kernels/**/*.py", "kernels/**/*.json"]
"""


def server_flags(plan: ServingPlan) -> str:
    return (f"--tensor-parallel-size {plan.tp} --max-num-seqs {plan.max_num_seqs} "
            f"--max-num-batched-tokens {plan.max_num_batched_tokens} --max-model-len {plan.max_model_len}")


def guide_lines(plan: ServingPlan, package: str, package_dir: Path) -> list[str]:
    """The short text printed after the export (also the head of SERVING.md)."""
    return [
        f"vLLM Neuron serving ({PIN}):",
        f"  pip install {package_dir}",
        f"  vllm serve MODEL_DIR {server_flags(plan)}",
        f"  decode buckets {list(plan.decode)}, prefill buckets {list(plan.prefill)} ({plan.prefill_mode}); per rank: "
        f"gate/up [{plan.hidden}, {plan.intermediate_per_rank}], down [{plan.intermediate_per_rank}, {plan.hidden}], "
        f"MLP tokens {list(plan.tokens)}",
        f"  the plugin ({plugin_name(package)}, group {PLUGIN_GROUP}) routes those calls of "
        "vllm_neuron.functional.mlp to these kernels, every other to vLLM Neuron's; NMMC_VLLM_NEURON=off disables it; "
        f"{GUIDE_FILE} in the package",
    ]


def guide_text(plan: ServingPlan, package: str, package_dir: Path, model: str) -> str:
    arch = ARCHITECTURES[plan.architecture]
    return f"""# Serving {model} with vLLM Neuron and nmmc's MLP kernels

Written by `nmmc export --serving {SERVING}`. This package holds nmmc's MLP kernels for {arch} at tensor-parallel
degree {plan.tp} and a vLLM general plugin that puts them in place of vLLM Neuron's MLP function,
`vllm_neuron.functional.mlp`, for exactly the shapes below; every other call goes to vLLM Neuron's own function.
Built against {PIN} (the function's signature is checked at start-up).

## Steps

1. Install the package into the environment vLLM runs in (vLLM Neuron and the Neuron SDK already there):

       pip install {package_dir}

   (pip builds in the directory and leaves `build/` and an `.egg-info` directory there; both are harmless. The
   import name is `{package}`, the directory's name at export: a moved or renamed directory installs under it.)

2. Start the server with these flags, exactly (they decide the buckets vLLM Neuron compiles):

       vllm serve MODEL_DIR {server_flags(plan)}

   - Do not set `num_seqs_buckets`, `num_batched_tokens_buckets` or `kv_segment_size_buckets` in
     `--additional-config`'s `neuron_config`, nor `mlp_dp_size`, nor speculative decoding: each changes the token
     counts or slices the MLP sees, and those calls then run vLLM Neuron's MLP (nothing wrong, nothing gained).
   - If `VLLM_PLUGINS` is set, it must name `{plugin_name(package)}` (vLLM loads only the plugins it lists).
   - `NMMC_VLLM_NEURON=off` leaves vLLM Neuron's MLP in place (for an A/B run).
   - The kernels are launched on LNC={LNC}, as vLLM Neuron launches its own MLP kernel; a
     `NEURON_LOGICAL_NC_CONFIG` other than {LNC} is refused when a kernel is first launched.

3. Each worker logs one line, `nmmc: vllm_neuron.functional.mlp routed to {package} for N shape(s)`, or one
   warning saying why it left vLLM Neuron's MLP in place (a vLLM Neuron whose function has another signature).

## What the server runs (derived from the flags, rules cited in nmmc's export/serving.py)

| phase | buckets | tokens the MLP sees on each rank |
|---|---|---|
| decode (`num_seqs_buckets`) | {list(plan.decode)} | the bucket (one token per request) |
| prefill (`num_batched_tokens_buckets`, {plan.prefill_mode}) | {list(plan.prefill)} | the whole bucket (all-gathered) |

A prefill is sequence parallel: each rank holds bucket/{plan.tp} tokens and the MLP all-gathers them before the call.
Per rank: gate and up [{plan.hidden}, {plan.intermediate_per_rank}], down [{plan.intermediate_per_rank}, {plan.hidden}],
bf16; the call returns the rank's partial sum, which vLLM Neuron all-reduces (decode) or reduce-scatters (prefill).
One kernel per token count: {list(plan.tokens)}.

## What runs vLLM Neuron's MLP instead

Any call with another shape, dtype or slice; any call with an argument other than the hidden states and the three
weights (fused normalization, residual add, biases, FP8 weights and scales, another activation, clamping, an output
dtype, a weight layout): the router passes it on unchanged. In vLLM Neuron's CPU mode the routed calls run nmmc's
NKI interpreter (slow): set `NMMC_VLLM_NEURON=off` there.

## Not verified

The kernels are checked by `nmmc verify {package_dir}` in nmmc's interpreter, against NKI's documented rules of the
Neuron SDK releases `manifest.json` names (`sdk`). Nothing of this package has been run inside vLLM or on a Neuron
device by nmmc.
"""
