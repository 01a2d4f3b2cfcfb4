"""Reading model weights from safetensors one tensor at a time, and writing factor files.

A Hugging Face model directory holds either ``model.safetensors`` or shards listed in
``model.safetensors.index.json`` (``{"weight_map": {tensor name: shard file}}``). :class:`WeightReader`
opens the file that holds a tensor with ``safe_open(framework="np")`` (memory-mapped) and reads only
that tensor, so compressing a model never holds more than the tensors of the layer being worked on.

Every tensor is returned as float32. fp32 is read as is, fp16/fp64 are converted, bf16 is widened
exactly: safetensors returns it as an ``ml_dtypes.bfloat16`` array (recent versions) which is cast,
and where the installed safetensors cannot give a bf16 array to NumPy the raw bytes are read as
uint16 from the file's header offsets and shifted into the top half of a float32 (:func:`bf16_to_f32`).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ..errors import InputError
from ..io import atomic_path
from .config import ModelConfig

__all__ = [
    "WeightReader",
    "bf16_to_f32",
    "check_mlp_checkpoint",
    "read_raw_tensor",
    "valid_tensor_file",
    "write_tensor_file",
]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}
_READABLE = ("F32", "BF16", "F16", "F64")


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen bf16 values given as their uint16 bit patterns to float32 (exact: bf16 is fp32's top half)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length)), 8 + length


def read_raw_tensor(path: str | Path, name: str) -> np.ndarray:
    """Read one tensor of a safetensors file without safetensors' NumPy conversion, as float32.

    The fallback for bf16 when the installed safetensors cannot hand bf16 to NumPy; also used by the
    tests to check the primary path. Reads only that tensor's bytes.
    """
    path = Path(path)
    header, start = _header(path)
    info = header[name]
    dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == "BF16":
        bits = np.fromfile(path, dtype="<u2", count=count, offset=start + begin)
        return bf16_to_f32(bits).reshape(shape)
    if dtype in _NUMPY_DTYPES:
        item = np.dtype(_NUMPY_DTYPES[dtype]).newbyteorder("<")
        assert (end - begin) == count * item.itemsize
        return np.fromfile(path, dtype=item, count=count, offset=start + begin).astype(np.float32).reshape(shape)
    raise InputError(f"{path}: tensor {name!r} has dtype {dtype}; nmmc reads {', '.join(_READABLE)}")


class WeightReader:
    """The tensors of a model directory, read one at a time as float32 (see the module docstring)."""

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        index = self.model_dir / INDEX_FILE
        single = self.model_dir / SINGLE_FILE
        if index.is_file():
            self.files = self._read_index(index)
        elif single.is_file():
            with self._open(single) as handle:
                self.files = dict.fromkeys(handle.keys(), single)
        else:
            raise InputError(f"{self.model_dir}: no {SINGLE_FILE} or {INDEX_FILE} "
                             f"(nmmc reads safetensors weights only)")

    def _read_index(self, index: Path) -> dict[str, Path]:
        try:
            raw = json.loads(index.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{index}: malformed JSON: {exc}") from None
        weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise InputError(f"{index}: expected an object with a 'weight_map' of tensor name -> shard file")
        return {name: self.model_dir / shard for name, shard in weight_map.items()}

    @staticmethod
    def _open(path: Path):
        try:
            return safe_open(str(path), framework="np")
        except (SafetensorError, OSError) as exc:
            raise InputError(f"{path}: not a readable safetensors file: {exc}") from None

    def file_of(self, name: str) -> Path:
        if name not in self.files:
            raise InputError(f"{self.model_dir}: tensor {name!r} not found in the model's safetensors "
                             f"({len(self.files)} tensors)")
        path = self.files[name]
        if not path.is_file():
            raise InputError(f"{self.model_dir}: shard {path.name} (holding {name!r}) is missing")
        return path

    def info(self, name: str) -> tuple[str, tuple[int, ...]]:
        """``(safetensors dtype such as "BF16", shape)`` of a tensor, without reading its data."""
        path = self.file_of(name)
        with self._open(path) as handle:
            names = set(handle.keys())
            if name not in names:
                raise InputError(f"{path}: tensor {name!r} listed in the index is not in the shard")
            view = handle.get_slice(name)
            return str(view.get_dtype()), tuple(int(d) for d in view.get_shape())

    def digest(self, names: Iterable[str] | None = None) -> str:
        """A hash (16 hex digits) of the named tensors as stored, in the given order (every tensor, by name, when
        ``names`` is None): each one's name, dtype, shape and data bytes, read from the file in 16 MiB pieces. A
        resumed compression compares it with the one its earlier files recorded, so weights changed in between are
        not mixed with factors of the old ones (docs/compression.md, "Memory, atomicity, resuming")."""
        sha = hashlib.sha256()
        headers: dict[Path, tuple[dict, int]] = {}
        for name in (sorted(self.files) if names is None else names):
            path = self.file_of(name)
            if path not in headers:
                try:
                    headers[path] = _header(path)
                except (OSError, ValueError, struct.error) as exc:
                    raise InputError(f"{path}: not a readable safetensors file: {exc}") from None
            header, start = headers[path]
            if name not in header:
                raise InputError(f"{path}: tensor {name!r} listed in the index is not in the shard")
            info = header[name]
            begin, end = info["data_offsets"]
            sha.update(json.dumps([name, info["dtype"], info["shape"], end - begin]).encode())
            with open(path, "rb") as handle:
                handle.seek(start + begin)
                left = end - begin
                while left > 0:
                    chunk = handle.read(min(left, 1 << 24))
                    if not chunk:
                        raise InputError(f"{path}: tensor {name!r} is cut short ({left} bytes missing)")
                    sha.update(chunk)
                    left -= len(chunk)
        return sha.hexdigest()[:16]

    def read(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Tensor ``name`` as a float32 array in its stored layout; ``shape`` is checked if given."""
        dtype, stored = self.info(name)
        path = self.file_of(name)
        if shape is not None and stored != tuple(shape):
            raise InputError(f"{path}: tensor {name!r} has shape {list(stored)}; the config implies {list(shape)}")
        if dtype not in _READABLE:
            raise InputError(f"{path}: tensor {name!r} has dtype {dtype}; nmmc reads {', '.join(_READABLE)}")
        try:
            with self._open(path) as handle:
                array = handle.get_tensor(name)
        except (TypeError, KeyError, ValueError, SafetensorError) as exc:
            if dtype != "BF16":
                raise InputError(f"{path}: cannot read tensor {name!r}: {exc}") from None
            return read_raw_tensor(path, name)
        return np.ascontiguousarray(array.astype(np.float32, copy=False))


def check_mlp_checkpoint(model_dir: str | Path, config: ModelConfig) -> bool:
    """Check, without reading tensor data, that a model directory's checkpoint holds every MLP weight of ``config``
    (each layer's gate, up and down projection) with the shape the config implies (Hugging Face's ``[out, in]``) and
    a dtype nmmc reads, in files safetensors opens (a truncated file does not: its header must cover the file
    exactly). False when the directory holds no checkpoint (a config alone: the weights come later); InputError,
    naming the file and the tensor, for anything else."""
    from .config import mlp_weight_names, projection_shape

    directory = Path(model_dir)
    if not ((directory / SINGLE_FILE).is_file() or (directory / INDEX_FILE).is_file()):
        return False
    reader = WeightReader(directory)
    for layer in range(config.num_hidden_layers):
        for projection, name in mlp_weight_names(config, layer).items():
            dtype, stored = reader.info(name)
            expected = tuple(reversed(projection_shape(config, projection)))
            if stored != expected:
                raise InputError(f"{reader.file_of(name)}: tensor {name!r} has shape {list(stored)}; the config "
                                 f"implies {list(expected)}")
            if dtype not in _READABLE:
                raise InputError(f"{reader.file_of(name)}: tensor {name!r} has dtype {dtype}; nmmc reads "
                                 f"{', '.join(_READABLE)}")
    return True


def valid_tensor_file(path: str | Path, expected: Mapping[str, tuple[tuple[int, ...], str]]) -> dict[str, str] | None:
    """The metadata of a complete, valid safetensors file holding exactly ``expected``, else None.

    ``expected`` maps tensor name -> (shape, safetensors dtype such as "F32"). safetensors refuses to
    open a truncated file (the header must cover the file exactly), so a file that opens with the
    right names, shapes and dtypes is complete.
    """
    try:
        with safe_open(str(path), framework="np") as handle:
            if set(handle.keys()) != set(expected):
                return None
            for name, (shape, dtype) in expected.items():
                view = handle.get_slice(name)
                if tuple(view.get_shape()) != tuple(shape) or str(view.get_dtype()) != dtype:
                    return None
            return dict(handle.metadata() or {})
    except (SafetensorError, OSError, ValueError):
        return None


def write_tensor_file(path: str | Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
    """Write a safetensors file atomically (:func:`neuronmm_compiler.io.atomic_path`).

    No partially written file ever carries the final name; the temporary file is removed on failure.
    The bytes depend only on the tensors and metadata (safetensors orders its header deterministically).
    """
    with atomic_path(path) as tmp:
        # safetensors creates its files with mode 0600; give the file the mode any new file gets (umask)
        with open(tmp, "x"):
            mode = stat.S_IMODE(os.stat(tmp).st_mode)
        save_file({name: np.ascontiguousarray(t) for name, t in tensors.items()}, tmp, metadata=dict(metadata))
        os.chmod(tmp, mode)
