"""The measurements CSV that ``nmmc calibrate`` reads and ``nmmc bench --append-csv`` writes.

One row per measurement of one emitted kernel file (docs/calibration.md)::

    kernel,latency_us,p10_us,p90_us,predicted_us,warmup,iters,kernel_sha256,measured_at,host
    kernels/gemm_1024.py,131.200,129.900,133.000,129.960,10,100,3f2a...,2026-12-01T10:00:00+00:00,trn1-a

Required: ``kernel`` (the kernel file's path; a relative path is relative to the CSV's directory)
and ``latency_us`` (the measured latency of the whole file, every kernel of it run in order, in
microseconds). ``kernel_sha256``, when present and not empty, must be the file's sha256: the row
is then known to describe this very file. Every other column is informational and ignored by the
fit. A header line is required; blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

REQUIRED = ("kernel", "latency_us")
#: The columns ``nmmc bench --append-csv`` writes to a new file, in this order.
BENCH_COLUMNS = ("kernel", "latency_us", "p10_us", "p90_us", "predicted_us", "warmup", "iters", "kernel_sha256",
                 "measured_at", "host")


@dataclass(frozen=True)
class Measurement:
    """One row: which kernel file, its measured latency, and where in the CSV it was."""

    line: int
    kernel: str  # as written in the CSV
    path: Path  # resolved against the CSV's directory
    latency_us: float
    kernel_sha256: str | None = None


def _content_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every line that is neither blank nor a ``#`` comment."""
    return [(i, line) for i, line in enumerate(text.splitlines(), start=1)
            if line.strip() and not line.lstrip().startswith("#")]


def _row(line: str, number: int, where: str) -> list[str]:
    try:
        rows = list(csv.reader([line]))
    except csv.Error as exc:
        raise InputError(f"{where}:{number}: not a CSV line ({exc})") from None
    return [cell.strip() for cell in rows[0]] if rows else []


def parse_latency(text: str, what: str = "latency_us") -> float:
    """A latency cell as microseconds; InputError unless a positive finite number."""
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{what} {text!r} is not a number (microseconds)") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{what} must be a positive finite number of microseconds; got {text!r}")
    return value


def read_measurements(path: str | Path) -> list[Measurement]:
    """Every row of a measurements CSV; InputError naming the file and line on the first problem."""
    p = Path(path)
    where = str(p)
    try:
        text = p.read_text(encoding="utf-8-sig")  # tolerate the BOM spreadsheets write
    except FileNotFoundError:
        raise InputError(f"measurements file not found: {where}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read measurements file {where}: {exc}") from None
    lines = _content_lines(text)
    if not lines:
        raise InputError(f"{where} is empty: expected a header line with the columns {','.join(REQUIRED)} "
                         "and one row per measured kernel")
    header_line, header_text = lines[0]
    header = _row(header_text, header_line, where)
    duplicates = sorted({c for c in header if header.count(c) > 1})
    if duplicates:
        raise InputError(f"{where}:{header_line}: column(s) {', '.join(duplicates)} appear more than once")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InputError(f"{where}:{header_line}: missing column(s) {', '.join(missing)} (the header has "
                         f"{','.join(header) or 'nothing'}; required: {','.join(REQUIRED)})")
    if len(lines) == 1:
        raise InputError(f"{where} has a header but no measurements")
    out = []
    for number, line in lines[1:]:
        cells = _row(line, number, where)
        if len(cells) != len(header):
            raise InputError(f"{where}:{number}: {len(cells)} cells, but the header has {len(header)} columns")
        row = dict(zip(header, cells, strict=True))
        if not row["kernel"]:
            raise InputError(f"{where}:{number}: empty kernel path")
        try:
            latency = parse_latency(row["latency_us"])
        except InputError as exc:
            raise InputError(f"{where}:{number}: {exc}") from None
        kernel_path = Path(row["kernel"])
        if not kernel_path.is_absolute():
            kernel_path = p.parent / kernel_path
        out.append(Measurement(number, row["kernel"], kernel_path, latency, row.get("kernel_sha256") or None))
    return out


def relative_to_csv(kernel: str | Path, csv_path: str | Path) -> str:
    """How a CSV at ``csv_path`` names ``kernel``: relative to the CSV's directory when possible, so the
    CSV and its kernels can move together."""
    base = Path(csv_path).resolve().parent
    try:
        return Path(os.path.relpath(Path(kernel).resolve(), base)).as_posix()
    except ValueError:  # another drive (Windows)
        return str(Path(kernel).resolve())


def format_row(values: dict[str, object], columns: tuple[str, ...] | list[str]) -> str:
    """One CSV line (with its newline) of ``values`` in ``columns`` order; floats with 3 decimals
    (nanoseconds), absent values as empty cells."""
    def cell(value: object) -> str:
        if value is None:
            return ""
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow([cell(values.get(c)) for c in columns])
    return buffer.getvalue()


def appended_text(csv_path: str | Path, values: dict[str, object]) -> str:
    """The text of ``csv_path`` with one more row (a new file gets the :data:`BENCH_COLUMNS` header).
    An existing file keeps its header: the row fills its columns (others are left out); a header
    without the required columns is an InputError."""
    p = Path(csv_path)
    try:
        text = p.read_text(encoding="utf-8-sig")  # tolerate the BOM spreadsheets write
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read measurements file {p}: {exc}") from None
    lines = _content_lines(text)
    if not lines:
        return text + format_row({c: c for c in BENCH_COLUMNS}, BENCH_COLUMNS) + format_row(values, BENCH_COLUMNS)
    header = _row(lines[0][1], lines[0][0], str(p))
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InputError(f"{p}:{lines[0][0]}: cannot append a measurement: the header lacks {', '.join(missing)}")
    if not text.endswith("\n"):
        text += "\n"
    return text + format_row(values, header)


def check_appendable(csv_path: str | Path) -> None:
    """InputError now, before a measurement is taken, when a row could not be appended to ``csv_path``
    (its directory is missing, or its header lacks the required columns)."""
    p = Path(csv_path)
    directory = p.parent if str(p.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"cannot append to {p}: directory {str(directory)!r} does not exist")
    appended_text(p, {})
