"""``nmmc verify DIR``: every kernel and tensor-parallel plan of an ``nmmc export`` package (DIR or
DIR/manifest.json) or of a ``tune --model`` directory (DIR or DIR/index.json), each as ``nmmc verify`` checks one
file (NKI rules, interpreter vs float64 reference) or one plan (every rank, collectives in NumPy). An export's
manifest is also checked against the kernel files: every function, argument shape and dtype it states must be the
file's own."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..model_tuning.formats import kernel_buckets
from .manifest import MANIFEST_NAME, is_export, read_export

INDEX_NAME = "index.json"


@dataclass
class Item:
    """One kernel file or plan checked."""

    path: str
    ok: bool
    rel_error: float | None = None
    error: str | None = None


@dataclass
class DirReport:
    kind: str  # "export" or "tune --model"
    items: list[Item] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.items) and all(item.ok for item in self.items)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "ok": self.ok, "items": [item.__dict__ for item in self.items]}

    def lines(self, source: str) -> list[str]:
        out = [f"{source}: {self.kind} directory, {len(self.items)} kernel file(s)/plan(s)"]
        for item in self.items:
            rel = "" if item.rel_error is None else f", relative error {item.rel_error:.3e}"
            out.append(f"  {'OK' if item.ok else 'FAILED'}  {item.path}{rel}" + (f": {item.error}" if item.error
                                                                                  else ""))
        out.append("OK: every kernel verifies" if self.ok else "FAILED")
        return out


def is_model_dir(path: str | Path) -> bool:
    """Whether ``path`` is an export package or a ``tune --model`` output (the directory or its manifest/index)."""
    p = Path(path)
    if is_export(p):
        return True
    index = p / INDEX_NAME if p.is_dir() else p
    return index.name == INDEX_NAME and index.is_file()


def verify_dir(path: str | Path, seed: int = 0, max_memory: int | None = None) -> DirReport:
    """Verify an export package or a ``tune --model`` directory (see the module docstring); ``max_memory`` (bytes)
    refuses, before anything runs, a directory one of whose kernel files or plans is estimated to need more."""
    if is_export(path):
        return verify_export(path, seed, max_memory)
    p = Path(path)
    index_path = p / INDEX_NAME if p.is_dir() else p
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        buckets = kernel_buckets(index)  # of an output of layer groups: every group's, files under its directory
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{index_path}: not a 'tune --model' index ({exc})") from None
    root = index_path.parent
    report = DirReport("tune --model")
    for bucket in buckets:
        if "plan" in bucket:
            report.items.append(_plan(root, bucket["plan"], seed, max_memory))
            continue
        for name in dict.fromkeys((bucket["file"], bucket.get("recommended_file", bucket["file"]))):
            if name:  # none where nki-library's MLP is recommended
                report.items.append(_kernel(root, name, seed, max_memory))
    return report


def verify_export(path: str | Path, seed: int = 0, max_memory: int | None = None) -> DirReport:
    """Verify every kernel (tp 1) or plan (tp > 1) of an export package, and its manifest against the files."""
    manifest, root = read_export(path)
    if max_memory is not None:  # every file's estimate first: refuse the directory before anything runs
        for group in manifest["groups"].values():
            for bucket in group["buckets"]:
                if bucket["plan"] is not None:
                    _plan_memory(root / bucket["plan"], max_memory)
                else:
                    for kernel in bucket["kernels"].values():
                        _kernel_memory(root / kernel["file"], max_memory)
    report = DirReport("export")
    for name, group in manifest["groups"].items():
        for bucket in group["buckets"]:
            if bucket["plan"] is not None:
                report.items.append(_plan(root, bucket["plan"], seed, max_memory))
            else:
                for kernel in bucket["kernels"].values():
                    report.items.append(_kernel(root, kernel["file"], seed, max_memory))
            for key, kernel in bucket["kernels"].items():
                mismatch = _manifest_mismatch(root, kernel)
                if mismatch:
                    report.items.append(Item(f"{MANIFEST_NAME}: group {name}, bucket {bucket['tokens']}, kernel {key}",
                                             False, error=mismatch))
    report.items += [Item(MANIFEST_NAME, False, error=problem) for problem in group_problems(manifest)]
    return report


def group_problems(manifest: dict[str, Any]) -> list[str]:
    """What an export manifest's layer groups contradict: a weight whose stated dtype is not its kernel argument's,
    a layer in no group, in two, or in another than ``layers`` names."""
    problems = []
    for name, group in manifest["groups"].items():
        stated = {t: info["dtype"] for t, info in group["tensors"].items()}
        actual = {a["name"]: a["dtype"] for b in group["buckets"] for k in b["kernels"].values()
                  for f in k["functions"] for a in f["arguments"] if a["name"] in stated}
        if stated != actual:
            problems.append(f"group {name}: the tensors' dtypes {stated} differ from the kernels' arguments' {actual}")
    layers = manifest["layers"]
    if sorted(layer for g in manifest["groups"].values() for layer in g["layers"]) != list(range(len(layers))) or \
            any(layers[layer] != name for name, g in manifest["groups"].items() for layer in g["layers"]):
        problems.append("layers and groups disagree: every layer must be in exactly the group the layers list names")
    return problems


def _kernel_memory(path: Path, max_memory: int) -> None:
    """InputError when verifying the kernel file at ``path`` would need more than ``max_memory`` bytes."""
    from ..codegen import read_metadata
    from ..ir import parse_text
    from ..verification import read_kernel_file
    from ..verification.memory import check_memory

    meta = read_metadata(read_kernel_file(path))
    if meta is not None:
        check_memory(str(path), meta, parse_text(meta.graph), max_memory)


def _plan_memory(path: Path, max_memory: int) -> None:
    from ..tensor_parallel.plan import read_plan
    from ..verification.memory import check_plan_memory

    plan, _ = read_plan(path)
    check_plan_memory(str(path), sum(math.prod(t["shape"]) for t in plan["tensors"].values()), len(plan["ranks"]),
                      max_memory)


def _kernel(root: Path, name: str, seed: int, max_memory: int | None = None) -> Item:
    from ..verification import verify_file

    try:
        result = verify_file(root / name, seed=seed, rules=True, max_memory=max_memory)
    except InputError as exc:
        return Item(name, False, error=str(exc))
    error = result.error or ("; ".join(f"{v.rule} (line {v.line})" for v in result.violations)
                             if getattr(result, "violations", None) else None)
    return Item(name, result.ok, result.rel_error, None if result.ok else error or "failed")


def _plan(root: Path, name: str, seed: int, max_memory: int | None = None) -> Item:
    from ..tensor_parallel.verify import verify_plan

    try:
        result = verify_plan(root / name, seed=seed, max_memory=max_memory)
    except InputError as exc:
        return Item(name, False, error=str(exc))
    return Item(name, result.ok, result.rel_error, result.error)


def _manifest_mismatch(root: Path, kernel: dict[str, Any]) -> str | None:
    """What the manifest says of a kernel file that the file's own metadata contradicts (None: nothing)."""
    from ..codegen import read_metadata

    meta = read_metadata((root / kernel["file"]).read_text(encoding="utf-8"))
    if meta is None:
        return f"{kernel['file']} is not an nmmc kernel file"
    stated = [(f["name"], [(a["name"], tuple(a["shape"]), a["dtype"]) for a in f["arguments"]],
               [(r["name"], tuple(r["shape"]), r["dtype"]) for r in f["results"]]) for f in kernel["functions"]]
    actual = [(k.name, [(a.name, tuple(a.shape), a.dtype) for a in k.inputs],
               [(r.name, tuple(r.shape), r.dtype) for r in k.outputs]) for k in meta.kernels]
    return None if stated == actual else f"the manifest's functions {stated} differ from the file's {actual}"
