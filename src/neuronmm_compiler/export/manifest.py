"""The manifest of an export package (``manifest.json``): its format name and version, its JSON Schema
(``schema/manifest.schema.json``, copied into every package as ``manifest.schema.json``), and the reading that
``nmmc verify`` and the runtime rely on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import InputError

FORMAT = "nmmc-export"
#: 2: layers grouped by format (``layers``, ``groups``), per-argument dtypes, ``activation_dtype`` (FP8 exports).
VERSION = 2
MANIFEST_NAME = "manifest.json"
SCHEMA_FILE = "manifest.schema.json"
_SCHEMA_PATH = Path(__file__).parent / "schema" / SCHEMA_FILE
#: The largest manifest ``nmmc verify`` reads.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024


def schema_text() -> str:
    """The manifest's JSON Schema (draft 2020-12) as shipped in the package."""
    return _SCHEMA_PATH.read_text(encoding="utf-8")


def schema() -> dict[str, Any]:
    return json.loads(schema_text())


def is_export(path: str | Path) -> bool:
    """Whether ``path`` is an export package directory or its manifest.json."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    if p.name != MANIFEST_NAME or not p.is_file():
        return False
    try:
        return json.loads(p.read_text(encoding="utf-8")).get("format") == FORMAT
    except (UnicodeDecodeError, ValueError):
        return True  # a damaged manifest: read_export says so, rather than "not a package"
    except (OSError, AttributeError):
        return False


def read_export(path: str | Path) -> tuple[dict[str, Any], Path]:
    """(the manifest, the package directory) of an export package or its manifest.json; InputError when it is not
    a readable manifest of this format, or names a file outside the package."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    try:
        if p.stat().st_size > MAX_MANIFEST_BYTES:
            raise InputError(f"{p}: larger than {MAX_MANIFEST_BYTES} bytes")
        manifest = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read export manifest {str(p)!r}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{p}: damaged export package: manifest.json is not valid UTF-8 JSON ({exc}; truncated or "
                         "edited?); export the package again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InputError(f"{p}: not an nmmc export manifest (no \"format\": \"{FORMAT}\")")
    if manifest.get("version") != VERSION:
        raise InputError(f"{p}: export manifest version {manifest.get('version')!r} is not supported (this nmmc "
                         f"reads {VERSION})")
    root = p.parent.resolve()
    try:
        for bucket in (b for group in manifest["groups"].values() for b in group["buckets"]):
            if bucket.get("plan") is not None and not (root / bucket["plan"]).is_file():
                raise InputError(f"{p.parent}: damaged export package: plan {bucket['plan']} (bucket "
                                 f"{bucket['tokens']}) is missing; export the package again")
            for key, kernel in bucket["kernels"].items():
                file = (root / kernel["file"]).resolve()
                if root not in file.parents or file.suffix != ".py":
                    raise InputError(f"{p}: kernel {key!r} of bucket {bucket['tokens']} names {kernel['file']!r}, "
                                     "not a .py file inside the package")
                if not file.is_file():
                    raise InputError(f"{p.parent}: damaged export package: kernel file {kernel['file']} (bucket "
                                     f"{bucket['tokens']}, kernel {key!r}) is missing; export the package again")
    except (KeyError, TypeError) as exc:
        raise InputError(f"{p}: malformed export manifest: {exc!r}") from None
    return manifest, p.parent
