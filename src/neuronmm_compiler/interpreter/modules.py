"""Stand-in module objects: a fixed set of attributes, and UnsupportedAPIError for anything else."""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import UnsupportedAPIError

if TYPE_CHECKING:
    from .machine import Machine


class StandInModule(types.ModuleType):
    """A module whose unknown attributes raise :class:`UnsupportedAPIError` naming the attribute."""

    def __init__(self, name: str, attrs: dict[str, Any]):
        super().__init__(name)
        self.__dict__.update(attrs)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        raise UnsupportedAPIError(f"{self.__name__}.{attr} is not in the NKI subset nmmc interprets "
                                  "(see docs/nki-subset.md)")

    def __repr__(self) -> str:
        return f"<nmmc stand-in module {self.__name__!r}>"


def api(qualname: str, machine: Machine) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Name an API function of ``machine``'s stand-ins; each call advances the machine's event clock
    (:attr:`Machine.clock`) by one, and a call that does not match the signature raises
    UnsupportedAPIError."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            machine.clock += 1
            try:
                return fn(*args, **kwargs)
            except TypeError:
                try:
                    signature.bind(*args, **kwargs)
                except TypeError as exc:
                    raise UnsupportedAPIError(
                        f"{qualname}: {exc}; the subset's signature is {qualname}{signature}") from None
                raise

        checked.__qualname__ = checked.__name__ = qualname
        return checked

    return decorate


def plain_range(*args: Any, **kwargs: Any) -> range:
    """``nl.affine_range`` / ``sequential_range`` / ``static_range``: a plain Python range."""
    if kwargs:
        raise UnsupportedAPIError(f"range arguments {sorted(kwargs)} are not in the subset")
    return range(*args)


def jit(fn: Callable[..., Any] | None = None, **_options: Any) -> Any:
    """``@nki.jit`` / ``@nki.jit(...)``: returns the function unchanged."""
    if fn is None:
        return lambda f: f
    return fn


def tile_size(target: Any) -> StandInModule:
    """``nl.tile_size`` with the target's limits."""
    return StandInModule("nl.tile_size", {
        "pmax": target.pmax,
        "gemm_stationary_fmax": target.gemm_stationary_fmax,
        "gemm_moving_fmax": target.gemm_moving_fmax,
        "psum_fmax": target.psum_bank_bytes // 4,
        "bn_stats_fmax": target.bn_stats_fmax,
    })


def ds(start: int, size: int) -> slice:
    """``nl.ds(start, size)``: the slice ``start:start+size`` (bounds are checked when indexing)."""
    return slice(start, start + size)
