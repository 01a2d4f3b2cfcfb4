"""Index expressions of the loop-nest program: affine forms in loop variables, their minimum, the
rotation slot of a multi-buffered tile (an affine form modulo a constant), and the ceiling division of a
count read from the arguments (a trip count).

Loop trip counts and slice bounds of an emitted kernel are either affine in the enclosing loop
variables (``256 * m_blk + 128 * bm``) or, for the last, ragged tile of a dimension, the minimum of
such forms (``min(256 * m_blk + 128, 700)``). That closed class is all a schedule needs, and it
keeps expressions cheap to evaluate (the cost model does so thousands of times per search) and
easy to print as Python.

A kernel that takes any token count up to the one it was built for reads the count from its arguments at trace
time (``T = x.shape[0]``): a :class:`Named` value with a ``source``. It is an integer like any other (the size the
program was built and costed for), so the same closed class holds it (``min(TOKEN_TILE, T - TOKEN_TILE * t)``),
and :class:`CeilDiv` states the one thing affine forms cannot: how many tiles it takes
(``(T + TOKEN_TILE - 1) // TOKEN_TILE``). NKI shapes are Python integers at trace time, so such a bound is a Python
int when the kernel is traced, as a literal one is.
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
    #: what the kernel reads the value from at trace time: an argument's shape (``x.shape[0]``; the value is then an
    #: upper bound, the size the program was built and costed for, that the kernel asserts, not a constant it
    #: declares), or an expression of such values (``CeilDiv(T, 2)``: the kernel computes it, printed by
    #: :func:`code`; the value is the expression's at the built size)
    source: str | Expr

    def __new__(cls, value: int, name: str, note: str = "", source: str | Expr = "") -> Named:
        item = super().__new__(cls, value)
        item.name, item.note, item.source = name, note, source
        return item

    def __neg__(self) -> Named:
        return Named(-int(self), self.name, self.note, self.source)

    def __reduce__(self) -> tuple:
        return Named, (int(self), self.name, self.note, self.source)


def named(value: int, name: str, note: str = "", source: str | Expr = "") -> int:
    """``value`` carrying ``name`` for the printer (a positive value; 0 and negatives stay plain)."""
    if not isinstance(source, str) and value != source.evaluate(dict.fromkeys(source.variables(), 0)):
        raise ValueError(f"{name} = {value} is not its source {source.code()} at the built size")
    return Named(value, name, note, source) if value > 0 else int(value)


def traced(value: object) -> bool:
    """Whether ``value`` is read from the arguments at trace time (a :class:`Named` with a source), so that a
    quantity computed from it must be stated in the program, not folded into a number."""
    return isinstance(value, Named) and bool(value.source)


class Sym(str):
    """A count read from the arguments (:class:`Named` with a source) held as a term of an affine form, where a
    constant cannot keep it (``32 + T``, ``2 * T``): a variable whose value, absent from an environment, is the
    size the program was built for, and that prints as the Named's name."""

    named: Named

    def __new__(cls, value: Named) -> Sym:
        item = super().__new__(cls, value.name)
        item.named = value
        return item

    def __reduce__(self) -> tuple:
        return Sym, (self.named,)


@dataclass
class Names:
    """The named constants one printed kernel used: name -> (the absolute values printed under it, its note,
    the expression it is read from or ""); ``derived``: the names whose source is an expression of other names
    (declared after them, not asserted)."""

    off: frozenset[str] = frozenset()  # names printed as numbers (one name used for two values)
    used: dict[str, tuple[set[int], str, str]] = field(default_factory=dict)
    derived: list[str] = field(default_factory=list)


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
        names = _NAMING[-1]
        if value.name not in names.used and not isinstance(value.source, str):
            source = code(value.source)  # records the names it reads first
            names.derived.append(value.name)
            names.used[value.name] = (set(), value.note, source)
        values, _, _ = names.used.setdefault(value.name, (set(), value.note, value.source))
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
        try:
            for name, coef in self.terms:
                total += coef * env[name]
        except KeyError:  # a count read from the arguments (Sym): the built size unless the environment binds it
            return self.const + sum(coef * (env[name] if name in env or not isinstance(name, Sym) else name.named)
                                    for name, coef in self.terms)
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
            label = literal(name.named) if isinstance(name, Sym) else name  # records the name it prints
            return label if coef == 1 else f"{literal(coef)} * {label}"

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


@dataclass(frozen=True)
class CeilDiv:
    """``ceil(num / den)``: how many tiles of ``den`` a count read from the arguments takes (a loop's trip count,
    never a slice bound), ``num`` an affine form or a min() of such forms holding the count (:class:`Named` with a
    source). Printed as ``(num + den - 1) // den``, ``den`` by name when it has one."""

    num: Lin | Min
    den: int

    def variables(self) -> set[str]:
        return self.num.variables()

    def evaluate(self, env: Mapping[str, int]) -> int:
        return -(-self.num.evaluate(env) // self.den)

    def substitute(self, env: Mapping[str, int]) -> Expr:
        return ceil_div(self.num.substitute(env), self.den)

    def code(self) -> str:
        num, den = self.num.code(), literal(self.den)
        if self.den == 1:
            return num
        minus = f"{den} - 1" if isinstance(self.den, Named) else str(self.den - 1)
        return f"({num} + {minus}) // {den}"


Expr = Lin | Min | Mod | CeilDiv
_EXPRS, _SLOTS = (Lin, Min, Mod, CeilDiv), (Mod, CeilDiv)  # tuples: isinstance(x, A | B) builds the union each call


def ceil_div(value: int | Expr, den: int) -> Expr:
    """``ceil(value / den)`` of an affine form or a min() (a constant folds; a Named constant stays, to print)."""
    item = as_expr(value)
    if not isinstance(item, Lin | Min):
        raise ValueError("ceil_div() takes an affine form or a min()")
    if den < 1:
        raise ValueError("ceil_div() takes a positive divisor")
    if isinstance(item, Lin) and item.is_const and not traced(item.const):
        return Lin(-(-item.const // den))
    return item if den == 1 else CeilDiv(item, den)


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
    if isinstance(value, _EXPRS):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an index expression: {value!r}")
    return Lin(value)


def var(name: str) -> Lin:
    return Lin(0, ((name, 1),))


def _reads_count(lin: Lin) -> bool:
    """Whether an affine form holds a value read from the arguments (:func:`traced`), as constant or coefficient."""
    return traced(lin.const) or any(traced(c) for _, c in lin.terms)


def _lift(lin: Lin) -> Lin:
    """``lin`` with a constant read from the arguments moved into a :class:`Sym` term (so that it survives
    arithmetic)."""
    value = lin.const
    if not isinstance(value, Named) or not value.source:
        return lin
    return Lin(0, ((Sym(value if value > 0 else -value), 1 if value > 0 else -1), *lin.terms))


def _add_lin(a: Lin, b: Lin) -> Lin:
    if a.const and b.const and (traced(a.const) or traced(b.const)):
        a, b = _lift(a), _lift(b)
    coeffs: dict[str, int] = dict(a.terms)
    for name, coef in b.terms:
        if name in coeffs and (traced(coeffs[name]) or traced(coef)):
            raise ValueError(f"{a.code()} + {b.code()}: a count read from the arguments would fold into a number")
        coeffs[name] = coeffs[name] + coef if name in coeffs else coef  # a lone coefficient keeps its name
    const = a.const + b.const if a.const and b.const else a.const or b.const
    return Lin(const, tuple((n, c) for n, c in coeffs.items() if c != 0))


def add(*values: int | Expr) -> Expr:
    """Sum of expressions; a sum involving a Min distributes into it."""
    result: Expr = Lin(0)
    for value in values:
        item = as_expr(value)
        if isinstance(item, _SLOTS):
            raise ValueError("a rotation slot (Mod) or a tile count (CeilDiv) takes no arithmetic")
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
    if isinstance(item, _SLOTS):
        raise ValueError("a rotation slot (Mod) or a tile count (CeilDiv) takes no arithmetic")
    if isinstance(item, Min):
        return minimum(*(scale(arg, factor) for arg in item.args))
    if factor == 0:
        return Lin(0)
    if factor != 1 and traced(item.const):
        item = _lift(item)
    if (factor != 1 and _reads_count(item)) or (
            traced(factor) and (item.const not in (0, 1) or any(c != 1 for _, c in item.terms))):
        raise ValueError(f"{factor} * ({item.code()}): a count read from the arguments would fold into a number")
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
        if isinstance(item, _SLOTS):
            raise ValueError("a rotation slot (Mod) or a tile count (CeilDiv) takes no arithmetic")
        flat.extend(item.args if isinstance(item, Min) else (item,))
    kept: list[Lin] = []
    for cand in flat:
        dominated = False
        for i, other in enumerate(kept):
            if _reads_count(cand) or _reads_count(other):  # a count read from the arguments: either may win
                continue
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
    for item in kept:  # a count read from the arguments equals its built size as a number, not as an expression
        if not any(item == other and traced(item.const) == traced(other.const) and (
                not traced(item.const) or item.const.name == other.const.name) for other in unique):
            unique.append(item)
    return unique[0] if len(unique) == 1 else Min(tuple(unique))


def evaluate(value: int | Expr, env: Mapping[str, int]) -> int:
    return as_expr(value).evaluate(env)


def code(value: int | Expr) -> str:
    return as_expr(value).code()
