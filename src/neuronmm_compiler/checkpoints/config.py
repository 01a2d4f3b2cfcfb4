"""Model shapes: read a Hugging Face ``config.json`` into a :class:`ModelConfig`, and name its MLP weights.

nmmc compresses only the MLP of a decoder layer (gate, up and down projections), so a model is
described by the three sizes that fix those shapes plus its architecture and dtype. Llama, Qwen2
and Qwen3 checkpoints all store the MLP the same way::

    model.layers.{i}.mlp.gate_proj.weight   [intermediate, hidden]
    model.layers.{i}.mlp.up_proj.weight     [intermediate, hidden]
    model.layers.{i}.mlp.down_proj.weight   [hidden, intermediate]

**Layout.** Hugging Face stores a ``Linear`` weight as ``[out_features, in_features]`` and computes
``y = x @ weight.T``. nmmc's convention is ``y = x @ W`` with ``W [in, out]``, so
``W = weight.T``: gate and up are ``W [hidden, intermediate]``, down is ``W [intermediate, hidden]``
(:func:`projection_shape`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, UnknownNameError

__all__ = [
    "ARCHITECTURES",
    "KNOWN_MODELS",
    "PROJECTIONS",
    "ModelConfig",
    "known_config",
    "mlp_weight_names",
    "projection_shape",
    "read_config",
]

#: The MLP projections nmmc compresses, in the order they are processed and stored.
PROJECTIONS: tuple[str, ...] = ("gate", "up", "down")

#: model_type -> the Hugging Face class name of the same architecture.
ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_BY_CLASS = {cls: arch for arch, cls in ARCHITECTURES.items()}

_CONFIG_DIR = Path(__file__).resolve().parent / "configs"

#: The models nmmc is measured on; their configs ship as package data (``checkpoints/configs/*.json``).
KNOWN_MODELS: tuple[str, ...] = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen3-1.7b", "qwen3-4b")

_SIZE_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers")
#: The gated MLP's activation names nmmc's kernels compute: SiLU, ``act(gate) * up`` with ``act = x * sigmoid(x)``.
#: Hugging Face's ``ACT2FN`` maps both "silu" and "swish" to ``nn.SiLU`` (transformers ``activations.py``); Llama,
#: Qwen2 and Qwen3 configs name it in ``hidden_act`` (Gemma's in ``hidden_activation``). Any other activation (GELU
#: exact or tanh-approximated, ReLU, ...) would be computed as SiLU by every kernel, so it is refused.
SILU_NAMES = ("silu", "swish")
_ACTIVATION_FIELDS = ("hidden_act", "hidden_activation")
#: Upper bounds of a config's sizes: far beyond any released model (Llama-3.1-405B has 126 layers,
#: hidden 16384, intermediate 53248), low enough that a corrupt config cannot make nmmc loop for hours.
SIZE_LIMITS = {"hidden_size": 2**20, "intermediate_size": 2**22, "num_hidden_layers": 4096}


@dataclass(frozen=True)
class ModelConfig:
    """The shapes of a decoder-only model that nmmc's MLP compression needs."""

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    torch_dtype: str = "bfloat16"
    name: str = ""

    def describe(self) -> str:
        return (f"{self.name or '<unnamed>'} ({self.architecture}): hidden {self.hidden_size}, intermediate "
                f"{self.intermediate_size}, {self.num_hidden_layers} layers, {self.torch_dtype}")


def _config_file(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InputError(f"model config not found: {path} (give a model directory holding config.json, "
                         f"or the path of a config.json)")
    return path


def _architecture(raw: dict, where: Path) -> str:
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type in ARCHITECTURES:
        return model_type
    classes = raw.get("architectures")
    if isinstance(classes, list):
        for cls in classes:
            if isinstance(cls, str) and cls in _BY_CLASS:
                return _BY_CLASS[cls]
    accepted = ", ".join(f"{arch} ({cls})" for arch, cls in ARCHITECTURES.items())
    raise InputError(f"{where}: unsupported architecture (model_type {model_type!r}, architectures {classes!r}); "
                     f"accepted model_type (architectures): {accepted}")


def _positive_int(raw: dict, field: str, where: Path) -> int:
    if field not in raw:
        raise InputError(f"{where}: missing field {field!r} (a positive integer)")
    value = raw[field]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{where}: field {field!r} must be a positive integer; got {value!r}")
    if value > SIZE_LIMITS.get(field, value):
        raise InputError(f"{where}: field {field!r} is {value}; nmmc accepts at most {SIZE_LIMITS[field]}")
    return value


def _check_mlp_form(raw: dict, where: Path) -> None:
    """Refuse a config whose gated MLP is not the one nmmc's kernels compute: an activation other than SiLU
    (absent means the architecture's default, SiLU for Llama/Qwen) or biases on the MLP projections
    (``mlp_bias``, a Llama config field)."""
    for field in _ACTIVATION_FIELDS:
        if field not in raw or raw[field] is None:
            continue
        name = raw[field]
        if not isinstance(name, str) or name.strip().lower() not in SILU_NAMES:
            raise InputError(f"{where}: {field} {name!r} is not supported: nmmc's MLP kernels compute "
                             f"silu(gate) * up (accepted: {', '.join(SILU_NAMES)})")
    if raw.get("mlp_bias"):
        raise InputError(f"{where}: mlp_bias true is not supported: nmmc's MLP kernels have no projection biases")


def read_config(path: str | Path) -> ModelConfig:
    """Read a model's ``config.json`` (``path`` is the model directory or the file itself).

    The architecture comes from ``model_type`` ("llama", "qwen2", "qwen3") or, failing that, from
    ``architectures`` (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``). The dtype is
    ``torch_dtype`` (or ``dtype``, as newer configs spell it), default "bfloat16"; the name is
    ``_name_or_path`` or the name of the directory holding the file. A missing file, malformed JSON,
    an unknown architecture or a missing or non-positive size raises InputError naming the file.
    """
    where = _config_file(path)
    try:
        raw = json.loads(where.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: malformed JSON: {exc}") from None
    except OSError as exc:
        raise InputError(f"{where}: cannot read: {exc}") from None
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    architecture = _architecture(raw, where)
    _check_mlp_form(raw, where)
    sizes = {field: _positive_int(raw, field, where) for field in _SIZE_FIELDS}
    dtype = raw.get("torch_dtype", raw.get("dtype", "bfloat16"))
    if not isinstance(dtype, str) or not dtype:
        raise InputError(f"{where}: field 'torch_dtype' must be a dtype name such as 'bfloat16'; got {dtype!r}")
    name = raw.get("_name_or_path")
    if not isinstance(name, str) or not name:
        name = where.resolve().parent.name
    return ModelConfig(architecture=architecture, torch_dtype=dtype, name=name, **sizes)


def known_config(name: str) -> Path:
    """The path of a shipped config: "llama-3.2-1b", "Llama-3.2-1B" or "meta-llama/Llama-3.2-1B" all work.

    Unknown names raise UnknownNameError listing :data:`KNOWN_MODELS`.
    """
    key = str(name).strip().lower().rsplit("/", 1)[-1]
    if key.endswith(".json"):
        key = key[: -len(".json")]
    if key not in KNOWN_MODELS:
        raise UnknownNameError(f"unknown model {name!r}; known: {', '.join(KNOWN_MODELS)}")
    return _CONFIG_DIR / f"{key}.json"


def _check_layer(config: ModelConfig, layer: int) -> int:
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < config.num_hidden_layers:
        raise InputError(f"layer must be an integer in [0, {config.num_hidden_layers}) "
                         f"for {config.name or 'the model'}; "
                         f"got {layer!r}")
    return layer


def mlp_weight_names(config: ModelConfig, layer: int) -> dict[str, str]:
    """The safetensors names of layer ``layer``'s MLP weights: ``{"gate": ..., "up": ..., "down": ...}``.

    The tensors are stored as Hugging Face does, ``[out_features, in_features]``; nmmc's ``W`` is their
    transpose (see the module docstring). The names are the same for llama, qwen2 and qwen3.
    """
    layer = _check_layer(config, layer)
    return {proj: f"model.layers.{layer}.mlp.{proj}_proj.weight" for proj in PROJECTIONS}


def projection_shape(config: ModelConfig, projection: str) -> tuple[int, int]:
    """``(in, out)`` of nmmc's ``W = weight.T`` for "gate", "up" or "down"."""
    if projection in ("gate", "up"):
        return config.hidden_size, config.intermediate_size
    if projection == "down":
        return config.intermediate_size, config.hidden_size
    raise UnknownNameError(f"unknown projection {projection!r}; accepted: {', '.join(PROJECTIONS)}")
