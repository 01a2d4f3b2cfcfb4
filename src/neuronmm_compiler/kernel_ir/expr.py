"""Index expressions of the loop-nest program: affine forms in loop variables, their minimum, and the
rotation slot of a multi-buffered tile (an affine form modulo a constant).

Loop trip counts and slice bounds of an emitted kernel are either affine in the enclosing loop
variables (``256 * m_blk + 128 * bm``) or, for the last, ragged tile of a dimension, the minimum of
such forms (``min(256 * m_blk + 128, 700)``). That closed class is all a schedule needs, and it
keeps expressions cheap to evaluate (the cost model does so thousands of times per search) and
easy to print as Python.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field


class Named(int):
    """An integer that a printed kernel spells by name: a tile size or hardware limit (``P``, ``TOKEN_TILE``) that
    the lowering gave a name where it chose the value. It is the integer in every computation (cost model,
    interpreter, equality, hashing, ``str``); only the printer, inside :func:`naming`, writes ``name`` (and declares
    ``name = value`` once per kernel). Arithmetic yields a plain int, except what keeps the value: negation (the name
    is of the absolute value), adding 0, scaling a variable (see :func:`scale`)."""

    name: str
    note: str
    #: what the kernel reads the value from at trace time (``x.shape[0]``): the value is then an upper bound (the
    #: size the program was built and costed for) that the kernel asserts, not a constant it declares
    source: str

    def __new__(cls, value: int, name: str, note: str = "", source: str = "") -> Named:
        item = super().__new__(cls, value)
        item.name, item.note, item.source = name, note, source
        return item

    def __neg__(self) -> Named:
        return Named(-int(self), self.name, self.note, self.source)

    def __reduce__(self) -> tuple:
        return Named, (int(self), self.name, self.note, self.source)


def named(value: int, name: str, note: str = "", source: str = "") -> int:
    """``value`` carrying ``name`` for the printer (a positive value; 0 and negatives stay plain)."""
    return Named(value, name, note, source) if value > 0 else int(value)


@dataclass
class Names:
    """The named constants one printed kernel used: name -> (the absolute values printed under it, its note,
    the expression it is read from or "")."""

    off: frozenset[str] = frozenset()  # names printed as numbers (one name used for two values)
    used: dict[str, tuple[set[int], str, str]] = field(default_factory=dict)


_NAMING: list[Names] = []


@contextmanager
def naming(off: frozenset[str] = frozenset()) -> Iterator[Names]:
    """While active, :func:`literal` spells named constants by name and records them."""
    names = Names(off)
    _NAMING.append(names)
    try:
        yield names
    finally:
        _NAMING.pop()


def literal(value: int) -> str:
    """An integer as printed code: its name inside :func:`naming` when it is a :class:`Named`, else its digits."""
    if isinstance(value, Named) and _NAMING and value.name not in _NAMING[-1].off:
        values, _, _ = _NAMING[-1].used.setdefault(value.name, (set(), value.note, value.source))
        values.add(abs(int(value)))
        return value.name if value > 0 else f"-{value.name}"
    return str(int(value))


@dataclass(frozen=True)
class Lin:
    """``const + sum(coef * var)``; terms keep their first-insertion order for stable printing."""

    const: int = 0
    terms: tuple[tuple[str, int], ...] = ()

    @property
    def is_const(self) -> bool:
        return not self.terms

    def variables(self) -> set[str]:
        return {name for name, _ in self.terms}

    def evaluate(self, env: Mapping[str, int]) -> int:
        total = self.const
        for name, coef in self.terms:
            total += coef * env[name]
        return total

    def substitute(self, env: Mapping[str, int]) -> Lin:
        const = self.const
        terms = []
        for name, coef in self.terms:
            if name in env:
                const += coef * env[name]
            else:
                terms.append((name, coef))
        return Lin(const, tuple(terms))

    def code(self) -> str:
        # Positive terms first, then the constant, then subtracted terms: "300 - 128 * bk".
        def term(name: str, coef: int) -> str:
            return name if coef == 1 else f"{literal(coef)} * {name}"

        text = ""
        for name, coef in self.terms:
            if coef > 0:
                text += (" + " if text else "") + term(name, coef)
        if self.const > 0 or (self.const < 0 and not text):
            text += (" + " if text else "") + literal(self.const)
        elif self.const < 0:
            text += f" - {literal(-self.const)}"
        for name, coef in self.terms:
            if coef < 0:
                text += (" - " if text else "-") + term(name, -coef)
        return text or "0"


@dataclass(frozen=True)
class Min:
    """The minimum of two or more affine forms (never all constant: that folds to a Lin)."""

    args: tuple[Lin, ...]

    def variables(self) -> set[str]:
        out: set[str] = set()
        for arg in self.args:
            out |= arg.variables()
        return out

    def evaluate(self, env: Mapping[str, int]) -> int:
        # A loop, not min() over a generator: the cost model evaluates extents ~10^5 times a search.
        args = self.args
        best = args[0].evaluate(env)
        for arg in args[1:]:
            value = arg.evaluate(env)
            if value < best:
                best = value
        return best

    def substitute(self, env: Mapping[str, int]) -> Expr:
        return minimum(*(arg.substitute(env) for arg in self.args))

    def code(self) -> str:
        return "min(" + ", ".join(arg.code() for arg in self.args) + ")"


@dataclass(frozen=True)
class Mod:
    """``arg % modulus``: which of ``modulus`` rotating copies a tile uses. Only ever a :class:`Point` index
    (never an extent or a trip count), and printed only after the loops it depends on are unrolled, when it
    is a constant (:mod:`.psum_banks`)."""

    arg: Lin
    modulus: int

    def variables(self) -> set[str]:
        return self.arg.variables()

    def evaluate(self, env: Mapping[str, int]) -> int:
        return self.arg.evaluate(env) % self.modulus

    def substitute(self, env: Mapping[str, int]) -> Expr:
        return modulo(self.arg.substitute(env), self.modulus)

    def code(self) -> str:
        arg = self.arg.code()
        modulus = literal(self.modulus)
        return f"{arg} % {modulus}" if self.arg.terms == ((arg, 1),) else f"({arg}) % {modulus}"


Expr = Lin | Min | Mod


def modulo(value: int | Expr, modulus: int) -> Expr:
    """``value % modulus`` of an affine form (a constant folds)."""
    item = as_expr(value)
    if not isinstance(item, Lin):
        raise ValueError("modulo() takes an affine form")
    if modulus < 1:
        raise ValueError("modulo() takes a positive modulus")
    if item.is_const or modulus == 1:
        return Lin(item.const % modulus if item.is_const else 0)
    return Mod(item, modulus)


def as_expr(value: int | Expr) -> Expr:
    if isinstance(value, Lin | Min | Mod):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an index expression: {value!r}")
    return Lin(value)


def var(name: str) -> Lin:
    return Lin(0, ((name, 1),))


def _add_lin(a: Lin, b: Lin) -> Lin:
    coeffs: dict[str, int] = dict(a.terms)
    for name, coef in b.terms:
        coeffs[name] = coeffs[name] + coef if name in coeffs else coef  # a lone coefficient keeps its name
    const = a.const + b.const if a.const and b.const else a.const or b.const
    return Lin(const, tuple((n, c) for n, c in coeffs.items() if c != 0))


def add(*values: int | Expr) -> Expr:
    """Sum of expressions; a sum involving a Min distributes into it."""
    result: Expr = Lin(0)
    for value in values:
        item = as_expr(value)
        if isinstance(item, Mod):
            raise ValueError("a rotation slot (Mod) takes no arithmetic")
        if isinstance(result, Min):
            result = minimum(*(add(arg, item) for arg in result.args))
        elif isinstance(item, Min):
            result = minimum(*(add(result, arg) for arg in item.args))
        else:
            result = _add_lin(result, item)
    return result


def scale(value: int | Expr, factor: int) -> Expr:
    """Multiply by a non-negative integer constant."""
    if factor < 0:
        raise ValueError("scale() takes a non-negative factor (it distributes into min)")
    item = as_expr(value)
    if isinstance(item, Mod):
        raise ValueError("a rotation slot (Mod) takes no arithmetic")
    if isinstance(item, Min):
        return minimum(*(scale(arg, factor) for arg in item.args))
    if factor == 0:
        return Lin(0)
    # a coefficient or constant of 1 takes the factor itself (which keeps a Named factor's name: 128 * kt -> P * kt)
    return Lin(factor if item.const == 1 else item.const * factor,
               tuple((n, factor if c == 1 else c * factor) for n, c in item.terms))


def sub(a: int | Expr, b: int | Lin) -> Expr:
    b_expr = as_expr(b)
    if isinstance(b_expr, Min):
        raise ValueError("cannot subtract a min() expression")
    return add(a, Lin(-b_expr.const, tuple((n, -c) for n, c in b_expr.terms)))


def minimum(*values: int | Expr) -> Expr:
    """min() of expressions, dropping arguments that provably never win."""
    flat: list[Lin] = []
    for value in values:
        item = as_expr(value)
        if isinstance(item, Mod):
            raise ValueError("a rotation slot (Mod) takes no arithmetic")
        flat.extend(item.args if isinstance(item, Min) else (item,))
    kept: list[Lin] = []
    for cand in flat:
        dominated = False
        for i, other in enumerate(kept):
            diff = _add_lin(cand, Lin(-other.const, tuple((n, -c) for n, c in other.terms)))
            if diff.is_const:
                if diff.const < 0:
                    kept[i] = cand
                dominated = True
                break
        if not dominated:
            kept.append(cand)
    # Replacing entries may leave duplicates; remove them preserving order.
    unique: list[Lin] = []
    for item in kept:
        if item not in unique:
            unique.append(item)
    return unique[0] if len(unique) == 1 else Min(tuple(unique))


def evaluate(value: int | Expr, env: Mapping[str, int]) -> int:
    return as_expr(value).evaluate(env)


def code(value: int | Expr) -> str:
    return as_expr(value).code()
