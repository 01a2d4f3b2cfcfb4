"""Passes over the graph IR, xDSL style: named frozen dataclasses, a registry, and a driver.

A pass is a frozen dataclass subclassing :class:`Pass` with a class-level ``name``, its options as
typed fields, a docstring, and ``apply(graph) -> bool`` that mutates the graph and says whether it
changed anything. The driver (:func:`run_pipeline`), not the pass, verifies the IR.

Pipeline specs are comma separated pass names, each optionally followed by options in braces:
``"canonicalize{max_iterations=10},fold-transposes"``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ..errors import InputError, IRError, UnknownNameError
from ..ir.graph import Graph
from ..ir.text import to_text
from ..ir.verify import verify

__all__ = [
    "Pass",
    "PipelineResult",
    "PipelineStep",
    "get_pass",
    "parse_pipeline",
    "register_pass",
    "registered_passes",
    "run_pipeline",
]


#: Where a docstring's first sentence ends: a full stop, then a space and a capital letter.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


@dataclass(frozen=True)
class Pass(ABC):
    """Base class of graph passes; subclasses are frozen dataclasses registered by ``name``."""

    name: ClassVar[str] = ""

    @abstractmethod
    def apply(self, graph: Graph) -> bool:
        """Rewrite ``graph`` in place; return True when anything changed."""

    @classmethod
    def summary(cls) -> str:
        """What the pass does, on one line: the first sentence of its class docstring (which may
        wrap over several lines), with reST double backquotes shown as single ones.

        Empty when the class has no docstring of its own (a dataclass without one gets its
        signature as ``__doc__``, which describes nothing). ``nmmc opt --help`` lists these.
        """
        doc = cls.__dict__.get("__doc__") or ""
        if not doc.strip() or doc.startswith(f"{cls.__name__}("):
            return ""
        paragraph = " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())
        return _SENTENCE_END.split(paragraph, 1)[0].replace("``", "`")

    @classmethod
    def options(cls) -> dict[str, tuple[Any, Any]]:
        """The pass's options as ``{name: (type, default)}``, in field order; a required option's
        default is ``dataclasses.MISSING``."""
        types = _option_types(cls)
        return {f.name: (types[f.name], f.default) for f in dataclasses.fields(cls)}

    def spec(self) -> str:
        """This pass as a pipeline spec item: its name, plus options that differ from the defaults."""
        changed = [
            f"{f.name}={_format_option(getattr(self, f.name))}"
            for f in dataclasses.fields(self)
            if f.default is dataclasses.MISSING or getattr(self, f.name) != f.default
        ]
        return f"{self.name}{{{','.join(changed)}}}" if changed else self.name


_REGISTRY: dict[str, type[Pass]] = {}
PassType = TypeVar("PassType", bound=type[Pass])


def register_pass(cls: PassType) -> PassType:
    """Class decorator: register a :class:`Pass` subclass under its ``name``."""
    if not (isinstance(cls, type) and issubclass(cls, Pass) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r} must be a dataclass subclassing Pass")
    if not cls.name:
        raise TypeError(f"{cls.__name__} needs a class-level name")
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing.__qualname__ != cls.__qualname__:
        raise TypeError(f"pass name {cls.name!r} is already registered by {existing.__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def registered_passes() -> dict[str, type[Pass]]:
    """The registered passes by name, sorted by name."""
    return dict(sorted(_REGISTRY.items()))


def _format_option(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _option_types(cls: type[Pass]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, str) for f in dataclasses.fields(cls)}


def _describe_options(cls: type[Pass]) -> str:
    types = _option_types(cls)
    if not types:
        return "it takes no options"
    listed = ", ".join(f"{name} ({getattr(kind, '__name__', kind)})" for name, kind in types.items())
    return f"it takes {listed}"


def get_pass(name: str, **options: Any) -> Pass:
    """Instantiate the registered pass ``name`` with ``options`` (UnknownNameError if unknown)."""
    cls = _REGISTRY.get(name)
    if cls is None:
        known = ", ".join(registered_passes()) or "none registered"
        raise UnknownNameError(f"unknown pass {name!r}; known passes: {known}")
    unknown = sorted(set(options) - set(_option_types(cls)))
    if unknown:
        raise InputError(f"pass {name!r} has no option(s) {', '.join(unknown)}; {_describe_options(cls)}")
    return cls(**options)


def _convert_option(pass_name: str, key: str, text: str, kind: Any) -> Any:
    try:
        if kind is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        if kind in (int, float, str):
            return kind(text)
    except ValueError:
        raise InputError(
            f"pass {pass_name!r}: option {key}={text!r} is not a valid {kind.__name__}"
        ) from None
    raise InputError(f"pass {pass_name!r}: option {key} cannot be set from a pipeline spec")


def _split_top_level(spec: str) -> list[str]:
    items, depth, current = [], 0, []
    for char in spec:
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return items


def parse_pipeline(spec: str) -> list[Pass]:
    """Parse ``"canonicalize,fold-transposes"`` (options as ``name{key=value,...}``) into passes.

    An empty or blank spec is the empty pipeline. Unknown pass names raise UnknownNameError
    listing the known passes; malformed items raise InputError.
    """
    if not spec.strip():
        return []
    passes = []
    for item in _split_top_level(spec):
        text = item.strip()
        name, _, rest = text.partition("{")
        name = name.strip()
        if not name or (rest and not rest.endswith("}")) or "}" in name:
            raise InputError(
                f"malformed pipeline item {item!r} in {spec!r}; expected name or name{{key=value,...}}, "
                "items separated by commas"
            )
        options: dict[str, Any] = {}
        if name not in _REGISTRY:
            get_pass(name)  # raises UnknownNameError listing the known passes
        types = _option_types(_REGISTRY[name])
        for assignment in filter(None, (part.strip() for part in rest[:-1].split(","))):
            key, equals, value = (piece.strip() for piece in assignment.partition("="))
            if not equals or key not in types:
                raise InputError(
                    f"pass {name!r}: bad option {assignment!r}; expected key=value, "
                    f"{_describe_options(_REGISTRY[name])}"
                )
            options[key] = _convert_option(name, key, value, types[key])
        passes.append(get_pass(name, **options))
    return passes


@dataclass(frozen=True)
class PipelineStep:
    """What one pass did: its name (spec), whether it changed the graph, and the IR text after it."""

    pass_name: str
    changed: bool
    text: str


@dataclass
class PipelineResult:
    """The transformed graph (a copy; the input graph is untouched) and one step per pass."""

    graph: Graph
    steps: list[PipelineStep] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """True when any pass changed the graph."""
        return any(step.changed for step in self.steps)


def _text_or_note(graph: Graph) -> str:
    # Unverified graphs (verify_each=False) may be too damaged to print; say so instead of failing.
    try:
        return to_text(graph)
    except (IRError, KeyError, TypeError, ValueError) as err:
        return f"<IR not printable: {type(err).__name__}: {err}>"


def run_pipeline(
    graph: Graph,
    passes: Sequence[Pass] | str,
    *,
    verify_each: bool = True,
    on_step: Callable[[str, bool, Graph], None] | None = None,
) -> PipelineResult:
    """Run ``passes`` (or a spec string) on a copy of ``graph`` and return the result.

    The graph is verified before the first pass and, with ``verify_each``, after every pass (a
    failure names the pass that broke it); without ``verify_each`` only the final graph is
    verified. ``on_step(pass_name, changed, graph)`` is called after each (verified) pass.
    """
    if isinstance(passes, str):
        passes = parse_pipeline(passes)
    work = graph.copy()
    try:
        verify(work)
    except IRError as err:
        raise IRError(f"the input graph is invalid (before any pass ran): {err}") from err
    result = PipelineResult(work)
    for pass_ in passes:
        changed = pass_.apply(work)
        if not isinstance(changed, bool):
            raise TypeError(f"pass {pass_.name!r} returned {changed!r}; apply must return a bool")
        if verify_each:
            try:
                verify(work)
            except IRError as err:
                raise IRError(f"pass {pass_.spec()!r} produced invalid IR: {err}") from err
        result.steps.append(PipelineStep(pass_.spec(), changed, _text_or_note(work)))
        if on_step is not None:
            on_step(pass_.spec(), changed, work)
    if not verify_each and passes:
        try:
            verify(work)
        except IRError as err:
            names = ", ".join(pass_.spec() for pass_ in passes)
            raise IRError(f"the pipeline {names} produced invalid IR: {err}") from err
    return result
