"""Calibration activations for whitened compression: ``X^T X`` of every MLP projection's input.

Three sources, one result (:class:`Calibration`, per layer the float64 Gram matrices of the MLP input
``x`` [tokens, hidden] -- shared by gate and up -- and of the down projection's input
``h = silu(x Wg) * (x Wu)`` [tokens, intermediate]):

- text: tokenized with the model's ``tokenizer.json`` (needs the ``tokenizers`` package,
  ``pip install 'nmmc[models]'``) and run through nmmc's NumPy forward pass (:mod:`.forward`);
- token ids: a ``.npy`` file of integers (no tokenizer needed), run the same way;
- pre-captured activations: a ``.safetensors`` file with ``model.layers.{i}.mlp.input`` [N, hidden] and
  optionally ``model.layers.{i}.mlp.down_proj.input`` [N, intermediate] per layer, for users who
  capture on their own hardware (without the latter, h is computed from x and the original weights).

Memory is bounded by the Gram matrices, ``8 * layers * (hidden^2 + intermediate^2)`` bytes, and one
block's activations (:data:`BLOCK_TOKENS` tokens of consecutive sequences): activations are folded into ``X^T X``
as they are produced, never stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..checkpoints.config import ModelConfig, read_config
from ..errors import InputError
from ..io import check_input_file
from .forward import rms_norm

__all__ = ["ACTIVATION_NAMES", "BLOCK_TOKENS", "Calibration", "GramAccumulator", "batch_gram", "calibrate",
           "calibration_from_activations", "load_tokens", "sequence_groups", "sequences"]

#: Names of the tensors of a pre-captured activations file.
ACTIVATION_NAMES = {"input": "model.layers.{layer}.mlp.input", "inner": "model.layers.{layer}.mlp.down_proj.input"}
DEFAULT_SEQUENCE = 512


#: Tokens per block of calibration's and healing's token-wise products (Grams, the MLPs): consecutive sequences
#: are concatenated after their attention. Measured on 2 cores (float32): a [2048, 1536] Gram took 33 ms against
#: 4 x 16 ms for four [512, 1536] ones; the closed form on 8192 tokens of SmolLM2-135M 115 -> 90 s
#: (benchmarks/results/compression-runs.md, "The healing study").
BLOCK_TOKENS = 2048


def batch_gram(act: np.ndarray) -> np.ndarray:
    """``A^T A`` of one batch of activations [tokens, features], as float64.

    The batch's products are summed in float32 (twice float64's rate) and widened; callers sum batches in
    float64. A batch is one calibration sequence (512 tokens by default): float32's relative rounding over
    such a sum, about ``sqrt(512) * 6e-8 = 1.4e-6``, is far below the ridge every solve adds (``1e-4`` of
    the mean diagonal, :data:`~.heal.DEFAULT_HEAL_DAMPING`). Measured on SmolLM2-135M's down input
    (512 x 1536), one core: 39 ms as a float64 GEMM, 22 ms this way including the float64 sum (a symmetric
    rank-k update computes half the products, but filling in the other triangle costs more than it saves)."""
    act32 = np.asarray(act, dtype=np.float32)
    return (act32.T @ act32).astype(np.float64)


@dataclass
class GramAccumulator:
    """``X^T X`` per layer of the MLP input and of down's input, accumulated in float64."""

    hidden: int
    intermediate: int
    layers: int
    tokens: int = 0
    grams: list[dict[str, np.ndarray]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.grams:
            self.grams = [{"input": np.zeros((self.hidden, self.hidden)),
                           "inner": np.zeros((self.intermediate, self.intermediate))} for _ in range(self.layers)]

    def observe(self, layer: int, x: np.ndarray, h: np.ndarray) -> None:
        """Fold one batch of activations of ``layer`` in (the :data:`~.forward.MlpObserver` signature)."""
        for name, act in (("input", x), ("inner", h)):
            gram = batch_gram(act)
            if not np.isfinite(gram.diagonal()).all():  # a column holding NaN or Inf has a NaN or Inf square sum
                raise InputError(f"layer {layer}: the MLP's {name} activations hold NaN or Inf values (or values "
                                 "whose squares overflow float32)")
            self.grams[layer][name] += gram
        if layer == 0:
            self.tokens += int(np.shape(x)[0])


@dataclass(frozen=True)
class Calibration:
    """Per layer ``{"input": X^T X [hidden, hidden], "inner": H^T H [intermediate, intermediate]}``."""

    grams: tuple[dict[str, np.ndarray], ...]
    tokens: int
    source: str
    #: Per calibration sequence, the original model's final normalised hidden state of its first ``keep_final``
    #: tokens (:func:`calibrate`; empty unless asked): what fine-tuning's teacher needs besides the LM head.
    final: tuple[np.ndarray, ...] = ()

    def gram(self, layer: int, projection: str) -> np.ndarray:
        """The Gram matrix of the input of ``projection`` ("gate", "up": x; "down": h) in ``layer``."""
        return self.grams[layer]["inner" if projection == "down" else "input"]

    def digest(self) -> str:
        """A hash of the Gram matrices: a resumed compression reuses layer files only for the same one."""
        sha = hashlib.sha256()
        for layer in self.grams:
            for name in ("input", "inner"):
                sha.update(np.ascontiguousarray(layer[name]).tobytes())
        return sha.hexdigest()[:16]

    def describe(self) -> dict:
        return {"source": self.source, "tokens": self.tokens, "digest": self.digest()}


def _tokenize(text: str, model_dir: Path) -> np.ndarray:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError("tokenizing calibration text needs the 'tokenizers' package: pip install 'nmmc[models]' "
                         "(or pass token ids as a .npy file)") from None
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise InputError(f"{model_dir}: no tokenizer.json to tokenize the text with (pass token ids as a .npy file)")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises its own exception type
        raise InputError(f"{path}: not a readable tokenizer: {exc}") from None
    return np.asarray(tokenizer.encode(text).ids, dtype=np.int64)


#: What ``--calibration`` and ``--eval`` take, said when the path is not a file.
TOKEN_FILES = ("one UTF-8 text file or a .npy file of token ids (to use a directory of texts, concatenate them "
               "into one file)")


def load_tokens(path: str | Path, model_dir: str | Path, limit: int | None = None,
                what: str = "calibration/eval") -> np.ndarray:
    """Token ids of a text file (tokenized with the model's tokenizer.json) or of a ``.npy`` file of
    integers; at most ``limit`` of them. ``what`` names the option in errors (a directory is refused as
    one, not as a missing file)."""
    path = check_input_file(path, what, TOKEN_FILES)
    if path.suffix == ".npy":
        try:
            ids = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise InputError(f"{path}: not a readable .npy file: {exc}") from None
        if not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"{path}: token ids must be integers; got dtype {ids.dtype}")
        ids = ids.reshape(-1).astype(np.int64)
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{path}: not UTF-8 text (give text, token ids as .npy, or activations as "
                             ".safetensors)") from None
        ids = _tokenize(text, Path(model_dir))
    if limit is not None:
        ids = ids[:limit]
    if ids.size < 2:
        raise InputError(f"{path}: fewer than 2 tokens")
    return ids


def sequences(ids: np.ndarray, length: int = DEFAULT_SEQUENCE) -> list[np.ndarray]:
    """``ids`` cut into consecutive sequences of ``length`` tokens (the last may be shorter, at least 2)."""
    if length < 2:
        raise InputError(f"sequence length must be at least 2; got {length}")
    return [ids[i:i + length] for i in range(0, len(ids), length) if len(ids[i:i + length]) >= 2]


def calibrate(model, ids: np.ndarray, *, source: str, length: int = DEFAULT_SEQUENCE,
              progress: Callable[[int, int], None] | None = None, keep_final: int = 0) -> Calibration:
    """Run ``model`` (:class:`~.forward.CausalLM`) on ``ids``, in sequences of ``length`` whose MLP activations
    are taken :data:`BLOCK_TOKENS` at a time (:func:`sequence_groups`); return the Grams, and with ``keep_final``
    each sequence's final normalised hidden state of its first ``keep_final`` tokens (``Calibration.final``; they
    attend to those tokens only, so they are also the hidden state of a sequence of those tokens alone)."""
    a = model.arch
    acc = GramAccumulator(a.hidden_size, a.intermediate_size, a.num_hidden_layers)
    chunks = sequences(ids, length)
    final: list[np.ndarray] = []
    for group in sequence_groups([len(c) for c in chunks]):
        hs = model.observe_mlps(chunks[group], acc.observe)
        if keep_final > 0:
            final += [rms_norm(h[:keep_final], model.norm, a.rms_norm_eps) for h in hs]
        if progress is not None:
            progress(group.stop, len(chunks))
    return Calibration(tuple(acc.grams), acc.tokens, source, tuple(final))


def sequence_groups(lengths: Sequence[int], tokens: int | None = None) -> list[slice]:
    """Runs of consecutive sequences of at least ``tokens`` (default :data:`BLOCK_TOKENS`) tokens each (the last
    may have fewer): the blocks whose token-wise products (Grams, MLPs) are taken together."""
    tokens = BLOCK_TOKENS if tokens is None else tokens
    out, start, count = [], 0, 0
    for i, n in enumerate(lengths):
        count += n
        if count >= tokens:
            out.append(slice(start, i + 1))
            start, count = i + 1, 0
    if start < len(lengths):
        out.append(slice(start, len(lengths)))
    return out


def calibration_from_activations(path: str | Path, model_dir: str | Path,
                                 inner_from: Callable[[int, np.ndarray], np.ndarray] | None = None) -> Calibration:
    """Grams from a pre-captured activations file (see the module docstring). ``inner_from(layer, x)``
    computes down's input from x where the file does not hold it."""
    from safetensors import SafetensorError, safe_open

    config: ModelConfig = read_config(model_dir)
    acc = GramAccumulator(config.hidden_size, config.intermediate_size, config.num_hidden_layers)
    try:
        with safe_open(str(path), framework="np") as handle:
            names = set(handle.keys())
            for layer in range(config.num_hidden_layers):
                x_name, h_name = (ACTIVATION_NAMES[k].format(layer=layer) for k in ("input", "inner"))
                if x_name not in names:
                    raise InputError(f"{path}: no tensor {x_name!r} (activations need one per layer, "
                                     f"[tokens, {config.hidden_size}])")
                x = handle.get_tensor(x_name).astype(np.float32)
                if x.ndim != 2 or x.shape[1] != config.hidden_size:
                    raise InputError(f"{path}: {x_name} has shape {list(x.shape)}; expected [tokens, "
                                     f"{config.hidden_size}]")
                if h_name in names:
                    h = handle.get_tensor(h_name).astype(np.float32)
                    if h.shape != (x.shape[0], config.intermediate_size):
                        raise InputError(f"{path}: {h_name} has shape {list(h.shape)}; expected "
                                         f"[{x.shape[0]}, {config.intermediate_size}]")
                elif inner_from is not None:
                    h = inner_from(layer, x)
                else:
                    raise InputError(f"{path}: no tensor {h_name!r}")
                acc.observe(layer, x, h)
    except (SafetensorError, OSError) as exc:
        raise InputError(f"{path}: not a readable safetensors file: {exc}") from None
    return Calibration(tuple(acc.grams), acc.tokens, f"activations {Path(path).name}")
