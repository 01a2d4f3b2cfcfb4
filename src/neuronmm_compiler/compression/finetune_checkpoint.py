"""Resuming a fine-tuning run: the checkpoint's key, reading it back, and Ctrl-C that writes one first.

A checkpoint (written by :func:`.finetune.finetune_heal`) holds the trained factors, the optimizer's state,
the step, the losses so far, the matmul type "auto" chose, and what the caller stored with it; its key
covers everything the run's result depends on, so another run's checkpoint is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checkpoints.config import PROJECTIONS
from .torch_lm import import_torch

if TYPE_CHECKING:
    from .finetune import FinetuneSettings

__all__ = ["checkpoint_factors", "checkpoint_key", "deferred_sigint", "load_checkpoint", "save_checkpoint"]


def checkpoint_key(settings: FinetuneSettings, identity: Mapping[str, Any], ids: np.ndarray,
                   ranks: Mapping[tuple[int, str], int]) -> str:
    """What a checkpoint must record to be resumed: the settings, ``identity``, the calibration tokens and
    the rank of every trained ``(layer, projection)``."""
    record = {k: v for k, v in asdict(settings).items() if k not in ("threads", "checkpoint_seconds")}
    full = {"settings": record, **identity, "ranks": sorted((f"{k[0]}.{k[1]}", int(r)) for k, r in ranks.items()),
            "tokens": hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]}
    return hashlib.sha256(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_checkpoint(path: str | Path | None, key: str) -> dict | None:
    """The checkpoint at ``path`` if it records ``key`` (None: absent, truncated, foreign or another run's).
    Its ``params`` are the trained factors in :func:`finetune_heal`'s order (layers, then gate/up/down,
    then ``u``, ``v``); ``extra`` is what the caller stored with it."""
    if path is None or not Path(path).is_file():
        return None
    torch = import_torch()
    try:
        state = torch.load(path, weights_only=False)
    except Exception:  # a truncated or foreign file: start over
        return None
    return state if isinstance(state, dict) and state.get("key") == key else None


def save_checkpoint(state: dict, path: str | Path) -> None:
    """Write ``state`` (holding its ``key``) to ``path`` with torch: a temporary file renamed into place, so that a
    kill leaves the previous checkpoint or none, never a truncated one; the directory is created first (compress's
    ``-o`` directory is created after healing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    import_torch().save(state, tmp)
    os.replace(tmp, path)


def checkpoint_factors(state: dict, factors_like: Mapping[int, Mapping[str, Any]]) -> dict[int, dict]:
    """The factors a checkpoint holds, arranged as ``factors_like`` (the trained projections marked by any
    non-array value, e.g. their rank; other entries, such as dense weights, passed through)."""
    saved = iter(state["params"])
    out: dict[int, dict] = {}
    for layer, projections in factors_like.items():
        out[layer] = {}
        for proj in PROJECTIONS:
            f = projections[proj]
            out[layer][proj] = f if isinstance(f, np.ndarray) else (next(saved).numpy(), next(saved).numpy())
    return out



@contextmanager
def deferred_sigint():
    """A list that becomes non-empty on SIGINT, until the block ends (the handler is restored then);
    outside the main thread, or when SIGINT is ignored, nothing changes."""
    flag: list[bool] = []
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, None):
        yield flag
        return
    previous = signal.signal(signal.SIGINT, lambda *_: flag.append(True))
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
