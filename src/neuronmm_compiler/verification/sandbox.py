"""What ``nmmc verify`` lets a kernel file do: an allowlist of the NKI subset nmmc emits, checked on
the file's syntax tree before any of it executes.

A kernel file is Python, and the interpreter runs it with ``exec``. Stand-in modules and a custom
``__import__`` alone do not make that safe: a file may call ``open``, reach ``ctypes`` through
``np.ctypeslib``, or climb from ``()`` to every loaded class through dunder attributes. So
:func:`check_source` admits only the constructs nmmc's emitter writes (codegen/printer.py and
codegen/reference.py) and rejects anything else with :class:`SandboxError`, naming the line:

* statements: at module level the docstring, the exact import lines the emitter writes (``import
  numpy as np`` and, per dialect, ``import nki`` / ``import neuronxcc.nki as nki``, ``import
  <nki>.isa as nisa``, ``import <nki>.language as nl``, and ``import nki.lnc``, which binds ``nki`` again, to
  the same package, for an exchange through ``nki.lnc``) and function definitions (plain positional
  parameters, no decorator but ``@nki.jit``); inside a function the docstring, ``assert``,
  assignment to a name or a subscript, ``+=``, ``for`` over a call, call statements and ``return``;
  and a list of tiles as the NKI migration guide writes it (kernel_ir/psum_banks.py): ``name = []`` (an
  empty list only) and the statement ``name.append(expr)`` on a name the file binds;
* expressions: names, numbers, subscripts and slices, tuples, ``+ - * / // @``, unary minus, ``==``, ``<=``,
  calls, and f-strings (the emitter's shape assertions) whose parts are plain ``{expr}``; string
  literals only as docstrings and inside f-strings;
* names: those the file binds (parameters, assignment and loop targets, functions, import aliases)
  and the builtins in :data:`~neuronmm_compiler.interpreter.loader.KERNEL_BUILTINS`; no name
  starting with an underscore, and neither the import aliases nor those builtins are rebound;
* attributes: under ``nki``/``nl``/``nisa`` exactly the names the interpreter's stand-in modules of
  the imported dialect define (``nl.tile_size.pmax`` included); under ``np`` only the functions the
  emitted ``reference()`` uses; on anything else only ``.shape`` and ``.T``.

No lambda, nested function, class, comprehension, ``global``, ``with``, ``try``, ``while``,
``del``, starred argument or keyword splat is part of the subset. What passes is then executed
with only :data:`KERNEL_BUILTINS` as builtins (interpreter/loader.py). The module is a little longer than
the 400-line guideline on purpose: an allowlist is audited in one piece.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from types import ModuleType

from ..codegen.mx import reference_numpy_names
from ..errors import InputError
from ..interpreter.loader import KERNEL_BUILTINS
from ..ir.fp8 import FP8_FORMATS, row_scale_source
from ..ir.fp8 import numpy_source as fp8_source
from ..vocab import ElementwiseOp, NormOp

#: The import lines a kernel file may hold (as ``ast.unparse`` prints them): alias -> module per line.
IMPORTS: dict[str, tuple[str, str]] = {
    "import numpy as np": ("np", "numpy"),
    "import nki": ("nki", "nki"),
    "import nki.isa as nisa": ("nisa", "nki.isa"),
    "import nki.language as nl": ("nl", "nki.language"),
    "import neuronxcc.nki as nki": ("nki", "neuronxcc.nki"),
    "import neuronxcc.nki.isa as nisa": ("nisa", "neuronxcc.nki.isa"),
    "import neuronxcc.nki.language as nl": ("nl", "neuronxcc.nki.language"),
}
#: Import lines of a submodule that bind its package's alias to the same package (``nki.lnc.sendrecv`` is then an
#: attribute chain under ``nki``): alias -> module, as :data:`IMPORTS`.
SUBMODULE_IMPORTS: dict[str, tuple[str, str]] = {"import nki.lnc": ("nki", "nki")}
#: Attributes of values that are not modules (tensors, arrays).
VALUE_ATTRIBUTES = frozenset({"shape", "T"})
#: The decorators a function may carry.
DECORATORS = frozenset({"nki.jit"})
OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.MatMult, ast.USub, ast.Eq, ast.LtE)


class SandboxError(InputError):
    """A kernel file uses a construct outside the NKI subset ``nmmc verify`` executes."""


def numpy_names() -> frozenset[str]:
    """``np.*`` names the emitted ``reference()`` uses: ``asarray``, ``float64`` and those of the
    elementwise ops' NumPy spelling."""
    names = {"asarray", "float64"}
    for op in ElementwiseOp:
        names.update(re.findall(r"\bnp\.(\w+)", op.numpy_source(*(["x"] * op.arity))))
    for dtype in FP8_FORMATS:
        names.update(re.findall(r"\bnp\.(\w+)", fp8_source("x", "s", dtype) + row_scale_source("x", dtype)))
    for norm in NormOp:
        names.update(re.findall(r"\bnp\.(\w+)", norm.numpy_source("x", "1e-06", "g", "b")))
    names.update(re.findall(r"\bnp\.(\w+)", reference_numpy_names()))  # an MX file's reference() helpers
    return frozenset(names)


def _chains(module: ModuleType, prefix: str) -> Iterator[str]:
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        yield f"{prefix}.{name}"
        if isinstance(value, ModuleType):
            yield from _chains(value, f"{prefix}.{name}")


@functools.cache
def module_attributes() -> dict[str, frozenset[str]]:
    """module name -> the dotted attribute chains (``nl.load``, ``nl.tile_size.pmax``) allowed under
    its alias: what the interpreter's stand-in module of that name defines; numpy: :func:`numpy_names`."""
    from ..interpreter import api_legacy, api_nki
    from ..interpreter.machine import Machine
    from ..targets import get_target

    out: dict[str, frozenset[str]] = {"numpy": frozenset(f"np.{n}" for n in numpy_names())}
    for build in (api_nki.build_modules, api_legacy.build_modules):
        modules = build(Machine(get_target("trn2"), "<sandbox>", []))
        for name, module in modules.items():
            alias = next((a for a, m in IMPORTS.values() if m == name), None)
            if alias is not None:
                out[name] = frozenset(_chains(module, alias))
    return out


def unimplemented_activation(node: ast.AST, chain: str, module: str) -> SandboxError | None:
    """The error for ``nl.<name>`` where NKI documents ``name`` as an activation function (the table
    NKI-ACTIVATION-OP cites) but nmmc's interpreter does not implement it: a limit of nmmc, not an error
    in the kernel (None for any other name). The NKI pages give those functions no exact formula (e.g.
    nki.language.gelu: "Similar to torch.nn.functional.gelu"), so the interpreter cannot claim the
    hardware's numbers for them."""
    from ..interpreter.ops import ACTIVATION_FUNCS
    from .rules import ACTIVATION_FUNCTIONS, ACTIVATION_FUNCTIONS_LEGACY

    alias, _, name = chain.partition(".")
    if not module.endswith("language") or "." in name:
        return None
    documented = ACTIVATION_FUNCTIONS_LEGACY if module.startswith("neuronxcc") else ACTIVATION_FUNCTIONS
    if name not in documented:
        return None
    implemented = ", ".join(f"{alias}.{n}" for n in sorted(ACTIVATION_FUNCS))
    return SandboxError(
        f"line {getattr(node, 'lineno', 1)}: {chain} is documented NKI (an activation function of the NKI ISA "
        f"table, rule NKI-ACTIVATION-OP), but nmmc's interpreter does not implement it, so nmmc cannot run this "
        f"kernel: a limit of nmmc, not an error in the kernel (the interpreter implements the activations "
        f"{implemented}; NKI documents no exact formula for {chain}, so the interpreter cannot reproduce the "
        "hardware's values)")


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base is not None else None
    return None


class _Checker:
    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.aliases: dict[str, str] = {}  # alias -> module
        self.imported: set[str] = set()  # aliases bound by an IMPORTS line (one each)
        self.bound: set[str] = set()
        self.patterns: set[int] = set()  # ids of the list displays of .ap(pattern=...)
        self.docstrings = {id(body[0].value) for body in self._bodies(tree)
                           if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                           and isinstance(body[0].value.value, str)}

    @staticmethod
    def _bodies(tree: ast.Module) -> Iterator[list[ast.stmt]]:
        yield tree.body
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                yield node.body

    def fail(self, node: ast.AST, what: str) -> SandboxError:
        return SandboxError(f"line {getattr(node, 'lineno', 1)}: {what} is not part of the NKI subset nmmc verifies")

    def check(self) -> None:
        # pass 1: imports and the names the file binds (a name may be used before its binding line)
        for stmt in self.tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                self.import_(stmt)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.bind(node, node.id)
            elif isinstance(node, ast.arg):
                self.bind(node, node.arg)
            elif isinstance(node, ast.FunctionDef):
                self.bind(node, node.name)
        # pass 2: every statement and expression
        for stmt in self.tree.body:
            if isinstance(stmt, ast.Expr) and id(stmt.value) in self.docstrings:
                continue
            if isinstance(stmt, ast.Import):
                continue
            if isinstance(stmt, ast.FunctionDef):
                self.function(stmt)
            else:
                raise self.fail(stmt, _describe(stmt) + " at module level")

    def import_(self, stmt: ast.Import | ast.ImportFrom) -> None:
        text = ast.unparse(stmt)
        if not isinstance(stmt, ast.ImportFrom) and text in SUBMODULE_IMPORTS:
            alias, module = SUBMODULE_IMPORTS[text]
            if self.aliases.setdefault(alias, module) != module:
                raise self.fail(stmt, f"'{text}' (it binds {alias}, imported as another module)")
            return
        if isinstance(stmt, ast.ImportFrom) or text not in IMPORTS:
            raise self.fail(stmt, f"'{text}' (a kernel imports only numpy as np and its NKI modules as nki, "
                                  "nisa, nl, and nki.lnc)")
        alias, module = IMPORTS[text]
        if alias in self.imported or self.aliases.get(alias, module) != module:
            raise self.fail(stmt, f"'{text}' (a second import binding {alias})")
        self.imported.add(alias)
        self.aliases[alias] = module

    def bind(self, node: ast.AST, name: str) -> None:
        if name.startswith("_"):
            raise self.fail(node, f"the name {name}")
        if name in self.aliases or name in KERNEL_BUILTINS:
            raise self.fail(node, f"rebinding the {'module' if name in self.aliases else 'builtin'} name {name}")
        self.bound.add(name)

    def function(self, fn: ast.FunctionDef) -> None:
        for decorator in fn.decorator_list:
            name = _dotted(decorator)
            if name not in DECORATORS:
                raise self.fail(decorator, f"the decorator @{ast.unparse(decorator)}")
        a = fn.args
        if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults or a.kw_defaults:
            raise self.fail(fn, f"a default, keyword-only or variadic parameter of {fn.name}")
        if fn.returns is not None or any(arg.annotation is not None for arg in a.args) \
                or getattr(fn, "type_params", None):
            raise self.fail(fn, f"an annotation in {fn.name}")
        for stmt in fn.body:
            if isinstance(stmt, ast.Expr) and id(stmt.value) in self.docstrings:
                continue
            self.statement(stmt)

    def statement(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Assert):
            self.expr(stmt.test)
            if stmt.msg is not None:
                self.expr(stmt.msg)
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                self.target(target)
            if isinstance(stmt.value, ast.List) and not stmt.value.elts and len(stmt.targets) == 1 \
                    and isinstance(stmt.targets[0], ast.Name):
                return  # name = []: a list of tiles
            self.expr(stmt.value)
        elif isinstance(stmt, ast.AugAssign):
            if not isinstance(stmt.op, ast.Add):
                raise self.fail(stmt, f"the augmented assignment {type(stmt.op).__name__}=")
            self.target(stmt.target)
            self.expr(stmt.value)
        elif isinstance(stmt, ast.For):
            if stmt.orelse:
                raise self.fail(stmt, "for ... else")
            if not isinstance(stmt.target, ast.Name):
                raise self.fail(stmt, "a for loop target other than a name")
            if not isinstance(stmt.iter, ast.Call):
                raise self.fail(stmt, "a for loop over anything but a range call")
            self.expr(stmt.iter)
            for inner in stmt.body:
                self.statement(inner)
        elif isinstance(stmt, ast.Expr):
            if not isinstance(stmt.value, ast.Call):
                raise self.fail(stmt, "an expression statement other than a call")
            call = stmt.value
            if isinstance(call.func, ast.Attribute) and call.func.attr == "append" \
                    and isinstance(call.func.value, ast.Name) and call.func.value.id in self.bound:
                if len(call.args) != 1 or call.keywords or isinstance(call.args[0], ast.Starred):
                    raise self.fail(stmt, "an append() call other than name.append(value)")
                self.expr(call.args[0])  # name.append(value): a list of tiles
                return
            self.expr(call)
        elif isinstance(stmt, ast.Return):
            if stmt.value is not None:
                self.expr(stmt.value)
        else:
            raise self.fail(stmt, _describe(stmt))

    def target(self, node: ast.expr) -> None:
        if isinstance(node, ast.Name):
            return  # checked by bind()
        if isinstance(node, ast.Subscript):
            self.expr(node.value)
            self.expr(node.slice)
            return
        raise self.fail(node, f"assignment to {_describe(node)}")

    def expr(self, node: ast.expr) -> None:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str) and id(node) not in self.docstrings:
                raise self.fail(node, "a string literal outside a docstring or f-string")
            if not isinstance(node.value, (int, float, str, type(None))) or isinstance(node.value, complex):
                raise self.fail(node, f"the literal {node.value!r:.40}")
        elif isinstance(node, ast.Name):
            if node.id.startswith("_"):
                raise self.fail(node, f"the name {node.id}")
            if node.id not in self.bound and node.id not in self.aliases and node.id not in KERNEL_BUILTINS:
                raise self.fail(node, f"the name {node.id}")
        elif isinstance(node, ast.Attribute):
            self.attribute(node)
        elif isinstance(node, ast.Call):
            self.call(node)
        elif isinstance(node, ast.Subscript):
            self.expr(node.value)
            self.expr(node.slice)
        elif isinstance(node, ast.Slice):
            if node.step is not None:
                raise self.fail(node, "a slice with a step")
            for part in (node.lower, node.upper):
                if part is not None:
                    self.expr(part)
        elif isinstance(node, ast.Tuple) or (isinstance(node, ast.List) and id(node) in self.patterns):
            for elt in node.elts:
                if isinstance(elt, ast.List):
                    self.patterns.add(id(elt))
                self.expr(elt)
        elif isinstance(node, ast.BinOp):
            self.operator(node, node.op)
            self.expr(node.left)
            self.expr(node.right)
        elif isinstance(node, ast.UnaryOp):
            self.operator(node, node.op)
            self.expr(node.operand)
        elif isinstance(node, ast.Compare):
            for op in node.ops:
                self.operator(node, op)
            self.expr(node.left)
            for comparator in node.comparators:
                self.expr(comparator)
        elif isinstance(node, ast.JoinedStr):
            for value in node.values:
                if isinstance(value, ast.Constant):
                    continue  # the literal text of the f-string
                if not isinstance(value, ast.FormattedValue) or value.conversion != -1 or value.format_spec:
                    raise self.fail(node, "an f-string with a conversion or format spec")
                self.expr(value.value)
        else:
            raise self.fail(node, _describe(node))

    def operator(self, node: ast.AST, op: ast.AST) -> None:
        if not isinstance(op, OPERATORS):
            raise self.fail(node, f"the operator {type(op).__name__}")

    def attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("_"):
            raise self.fail(node, f"the attribute .{node.attr}")
        chain = _dotted(node)
        root = chain.partition(".")[0] if chain else None
        if root in self.aliases:
            module = self.aliases[root]
            if chain not in module_attributes()[module]:
                raise unimplemented_activation(node, chain, module) or self.fail(node, f"the attribute {chain}")
            return
        if node.attr not in VALUE_ATTRIBUTES:
            raise self.fail(node, f"the attribute .{node.attr}")
        self.expr(node.value)

    def call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "ap" and isinstance(func.value, ast.Name):
            # a tensor's access pattern, t.ap(pattern=[[step, num], ...], offset=o): the FP8 scales' broadcast loads
            self.expr(func.value)
            for keyword in node.keywords:
                if keyword.arg not in ("pattern", "offset") or node.args:
                    raise self.fail(node, "an .ap() call other than .ap(pattern=[[step, num], ...], offset=o)")
                if isinstance(keyword.value, ast.List):
                    self.patterns.add(id(keyword.value))
                self.expr(keyword.value)
            return
        name = _dotted(node.func)
        root = name.partition(".")[0] if name else None
        if name is None or not (name in KERNEL_BUILTINS or root in self.aliases):
            raise self.fail(node, f"a call of {ast.unparse(node.func):.60}")
        self.expr(node.func)
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                raise self.fail(arg, "a starred argument")
            self.expr(arg)
        for keyword in node.keywords:
            if keyword.arg is None:
                raise self.fail(node, "a ** argument")
            if keyword.arg.startswith("_"):
                raise self.fail(node, f"the keyword argument {keyword.arg}")
            self.expr(keyword.value)


_NAMES = {
    "Lambda": "a lambda", "ClassDef": "a class definition", "ListComp": "a list comprehension",
    "SetComp": "a set comprehension", "DictComp": "a dict comprehension", "GeneratorExp": "a generator expression",
    "FunctionDef": "a nested function definition", "AsyncFunctionDef": "an async function",
    "Global": "a global statement", "Nonlocal": "a nonlocal statement", "With": "a with statement",
    "Try": "a try statement", "While": "a while loop", "Delete": "a del statement", "If": "an if statement",
    "Import": "an import", "ImportFrom": "an import", "NamedExpr": "an assignment expression (:=)",
    "IfExp": "a conditional expression", "Dict": "a dict display", "List": "a list display", "Set": "a set display",
    "Starred": "a starred expression", "Yield": "yield", "YieldFrom": "yield from", "Await": "await",
    "Raise": "a raise statement", "Match": "a match statement", "BoolOp": "and/or", "Pass": "pass",
    "Break": "break", "Continue": "continue", "AnnAssign": "an annotated assignment",
    "Attribute": "an attribute", "Call": "a call's result", "Tuple": "a tuple",
}


def _describe(node: ast.AST) -> str:
    kind = type(node).__name__
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        return f"a call of {ast.unparse(node.value.func):.60}"
    if isinstance(node, ast.Expr):
        return "an expression statement"
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return f"'{ast.unparse(node)}' inside a function"
    return _NAMES.get(kind, f"a {kind} node")


def check_source(source: str, filename: str) -> None:
    """Raise :class:`SandboxError` (``FILE line N: <construct> is not part of the NKI subset nmmc
    verifies``) unless ``source`` stays within the subset (see the module docstring). Nothing of the
    file runs: it is only parsed."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise SandboxError(f"{filename} line {exc.lineno}: the kernel file does not parse: {exc.msg}") from None
    except ValueError as exc:  # NUL bytes
        raise SandboxError(f"{filename}: the kernel file does not parse: {exc}") from None
    except (RecursionError, MemoryError):
        raise SandboxError(f"{filename}: the kernel file nests too deeply to parse") from None
    try:
        _Checker(tree).check()
    except SandboxError as exc:
        raise SandboxError(f"{filename} {exc}") from None
    except RecursionError:
        raise SandboxError(f"{filename}: the kernel file nests expressions too deeply to check") from None
