"""KernelMetadata: the typed ``# nmmc-metadata:`` line, read by every reader of kernel files.

It round-trips every golden kernel's line byte for byte, and a malformed line or one of another
format is one InputError line naming the file, in ``nmmc verify`` and ``nmmc calibrate`` alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import compile_gemm
from neuronmm_compiler.calibration.kernels import read_kernel_file
from neuronmm_compiler.codegen import (
    METADATA_FORMAT,
    METADATA_PREFIX,
    KernelMetadata,
    KernelSpec,
    ScheduleRecord,
    TensorSpec,
    read_metadata,
)
from neuronmm_compiler.errors import InputError
from neuronmm_compiler.verification import verify_source
from neuronmm_compiler.vocab import Dialect

KERNELS = Path(__file__).parent / "golden" / "kernels"
GOLDEN = sorted(KERNELS.glob("*.py"))


def _line(source: str) -> str:
    return next(line for line in source.splitlines() if line.startswith(METADATA_PREFIX))


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_metadata_round_trips_byte_for_byte(path: Path) -> None:
    source = path.read_text()
    meta = read_metadata(source)
    assert meta is not None and meta.format == METADATA_FORMAT == 3
    assert meta.to_line() == _line(source)
    data = json.loads(_line(source)[len(METADATA_PREFIX):])
    assert meta.to_dict() == data and KernelMetadata.from_dict(meta.to_dict()) == meta
    assert isinstance(meta.dialect, Dialect) and meta.schedule.kind in ("gemm", "fused")
    assert all(isinstance(t, TensorSpec) and type(t.shape) is tuple for t in meta.inputs + meta.outputs)


def test_emitted_metadata_is_typed() -> None:
    compiled = compile_gemm(64, 128, 96, schedule="aws-tiled", dialect="neuronxcc")
    meta = compiled.kernel.metadata
    assert read_metadata(compiled.kernel.source) == meta
    assert meta.dialect is Dialect.NEURONXCC and meta.target == "trn1"
    assert meta.kernels == (KernelSpec("gemm_kernel", (TensorSpec("a", (64, 96), "bfloat16"),
                                                       TensorSpec("b", (96, 128), "bfloat16")),
                                       (TensorSpec("c", (64, 128), "bfloat16"),)),)
    assert meta.inputs == meta.kernels[0].inputs and meta.outputs == meta.kernels[0].outputs
    assert isinstance(meta.schedule, ScheduleRecord) and meta.schedule.name == "aws-tiled"
    with pytest.raises(TypeError):
        meta.schedule.params["tile_m"] = 1  # type: ignore[index]


def test_a_file_without_the_line_has_no_metadata() -> None:
    assert read_metadata('print("hello")\n') is None


@pytest.fixture(scope="module")
def emitted() -> tuple[str, dict[str, Any]]:
    source = compile_gemm(64, 128, 96, schedule="aws-tiled").kernel.source
    return source, json.loads(_line(source)[len(METADATA_PREFIX):])


def _with(source: str, data: Any) -> str:
    return source.replace(_line(source), METADATA_PREFIX + json.dumps(data))


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def change(data: dict[str, Any]) -> dict[str, Any]:
        *parents, last = path.split(".")
        node: Any = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is KeyError:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return data
    return change


MALFORMED = [
    (lambda d: [d], "malformed nmmc metadata: the metadata must be an object; got a list"),
    (_set("format", KeyError), "malformed nmmc metadata: has no 'format'"),
    (_set("format", "3"), "malformed nmmc metadata: 'format' must be an integer; got a string"),
    (_set("format", True), "'format' must be an integer; got a boolean"),
    (_set("format", 2), "the file's nmmc metadata is format 2, written by an older nmmc; this nmmc reads format 3 "
                        r"\(which records the schedule's kind\): re-emit the file with this nmmc"),
    (_set("format", 4), "format 4, written by a newer nmmc"),
    (_set("dialect", "cuda"), "malformed nmmc metadata: unknown dialect 'cuda'; dialects: nki, neuronxcc"),
    (_set("target", 1), "'target' must be a string; got a number"),
    (_set("graph", KeyError), "has no 'graph'"),
    (_set("kernels", {}), "'kernels' must be a list; got an object"),
    (_set("kernels", []), "'kernels' is empty"),
    (_set("kernels.0.name", None), r"kernels\[0\] 'name' must be a string; got null"),
    (_set("kernels.0.inputs.1", "b"), r"kernels\[0\] inputs\[1\] must be an object; got a string"),
    (_set("inputs.0.shape", [64, 0]), r"inputs\[0\] 'shape' must be a list of positive integers; got \[64, 0\]"),
    (_set("outputs.0.dtype", "int8"), r"outputs\[0\] has the unknown dtype 'int8'; dtypes: bfloat16, float32"),
    (_set("schedule.kind", KeyError), "'schedule' has no 'kind'"),
    (_set("schedule.params", []), "'schedule' 'params' must be an object; got a list"),
    (_set("schedule.params.tile_m", [1]), "schedule parameter 'tile_m' must be a string or a number; got a list"),
    (_set("sdk", 2.34), "'sdk' must be a Neuron SDK release such as \"2.34\"; got 2.34"),
    (_set("sdk", "2..34"), "'sdk' must be a Neuron SDK release"),
]


@pytest.mark.parametrize(("change", "message"), MALFORMED)
def test_malformed_or_other_format_metadata_is_one_input_error(emitted, change, message) -> None:
    source, data = emitted
    bad = change(json.loads(json.dumps(data)))
    with pytest.raises(InputError, match=message) as raised:
        KernelMetadata.from_dict(bad)
    assert "\n" not in str(raised.value)
    with pytest.raises(InputError, match=f"^k.py: .*{message}"):
        verify_source(_with(source, bad), filename="k.py")


def test_the_recorded_sdk_round_trips_and_a_release_nmmc_does_not_know_is_one_input_error(emitted) -> None:
    """``sdk`` is on the line only where the code depends on the release (absent from this GEMM's); verify checks a
    file against it by default, and names a release it cannot check in one line."""
    source, data = emitted
    assert "sdk" not in data and read_metadata(source).sdk is None
    recorded = KernelMetadata.from_dict({**data, "sdk": "2.33"})
    assert recorded.sdk == "2.33" and recorded.to_dict()["sdk"] == "2.33"
    assert verify_source(_with(source, {**data, "sdk": "2.33"}), filename="k.py", rules=True).sdk == "2.33"
    with pytest.raises(InputError, match=r"^k.py: its metadata records Neuron SDK 2\.99 \(unknown Neuron SDK release"):
        verify_source(_with(source, {**data, "sdk": "2.99"}), filename="k.py", rules=True)


def test_a_line_that_is_not_json(emitted) -> None:
    source, _ = emitted
    broken = source.replace(_line(source), _line(source)[:-5])
    with pytest.raises(InputError, match=r"^k.py: malformed nmmc metadata: the '# nmmc-metadata:' line is not JSON"):
        verify_source(broken, filename="k.py")


def test_calibration_names_the_file_of_an_older_format(emitted, tmp_path: Path) -> None:
    source, data = emitted
    path = tmp_path / "old.py"
    path.write_text(_with(source, {**data, "format": 2}))
    with pytest.raises(InputError, match=r"old.py: the file's nmmc metadata is format 2, written by an older nmmc"):
        read_kernel_file(path, shown="old.py")
    path.write_text(source)
    assert read_kernel_file(path).metadata == read_metadata(source)
