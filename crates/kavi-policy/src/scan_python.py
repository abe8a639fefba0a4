"""kavi's policy analyser: which capabilities a skill's Python files reach, by syntax.

Run by kavi with a pinned interpreter (`python -I -B -c <this>`), confined like every gate
process. It reads one JSON document on stdin:

    {"capabilities": {NAME: {"message": str, "modules": [str], "calls": [str],
                             "write_modes": [{"call": str, "position": int}],
                             "dynamic": bool}},
     "forbid": {"code": [NAME], "tests": [NAME]},
     "files": [{"name": str, "module": str, "test": bool, "text": str}]}

and prints {"findings": [{"file", "line", "col", "rule", "message"}]} on stdout. It never
imports, runs or follows the code it reads: every file is parsed with `ast`, names are resolved
through imports and assignments (aliases, `from m import *`, `getattr` with a constant name,
`__import__`, `sys.modules[...]`, `vars(builtins)[...]`), and each reference to a forbidden
module or qualified callable is a finding where it appears, called or not. A name computed at run
time cannot be followed: reaching one is a finding of a `dynamic` capability.
"""

import ast
import base64
import binascii
import builtins
import codecs
import fnmatch
import io
import json
import re
import string
import sys
import tokenize
import unicodedata
import unittest

BUILTINS = frozenset(dir(builtins))

# What a test case may define of `TestCase`'s own: its fixtures. Any other name `TestCase` has
# (`run`, `__call__`, `assertEqual`, `fail`, `_callTestMethod`, ...) decides what is reported.
FIXTURES = frozenset(
    ("setUp", "tearDown", "setUpClass", "tearDownClass", "asyncSetUp", "asyncTearDown",
     "__init__")
)
TESTCASE = frozenset(dir(unittest.IsolatedAsyncioTestCase)) - FIXTURES
# `TestCase`'s private parts, its instance's too: `self._outcome.result` is where a failure is
# reported, so a test that replaces it passes whatever it asserts.
INTERNALS = frozenset(
    name
    for name in TESTCASE | set(vars(unittest.IsolatedAsyncioTestCase()))
    if name.startswith("_") and not name.startswith("__")
)


# Names mypy decides a condition by, whatever they are bound to (mypy's `infer_condition_value`):
# `TYPE_CHECKING` and `MYPY` it takes for true while the program finds them false, `PY3` for true
# and `PY2` for false.
MYPY_TRUE = frozenset(("TYPE_CHECKING", "MYPY", "PY3"))
MYPY_FALSE = frozenset(("PY2",))
# What mypy compares with the interpreter it runs as, not the one the skill runs with.
MYPY_COMPARES = ("sys.version_info", "sys.platform")


def unchecked_branches(tree, scope, add, rule, message):
    """Code that runs where the type checker, deciding the condition itself, never looks."""

    def decided_name(part):
        if isinstance(part, ast.Name):
            name = part.id
        elif isinstance(part, ast.Attribute):
            name = part.attr
        else:
            return None
        quals = scope.quals(part)
        if name in MYPY_TRUE or any(q.endswith(".TYPE_CHECKING") for q in quals):
            return True
        if name in MYPY_FALSE:
            return False
        return None

    def decided(expression):
        """What mypy takes a plain (maybe negated) name for, or None."""
        negated = isinstance(expression, ast.UnaryOp) and isinstance(expression.op, ast.Not)
        value = decided_name(expression.operand if negated else expression)
        return None if value is None else value != negated

    def mentioned(expression):
        for part in ast.walk(expression):
            if isinstance(part, (ast.Name, ast.Attribute)) and (
                decided_name(part) is not None
                or any(q.startswith(MYPY_COMPARES) for q in scope.quals(part))
            ):
                return ast.unparse(part)
        return None

    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp)):
            value = decided(node.test)
            if value is not None:
                skipped = node.orelse if value else node.body
                if skipped:
                    first = skipped[0] if isinstance(skipped, list) else skipped
                    add(first, rule, "%s: a branch mypy skips, under `if %s`" % (message, ast.unparse(node.test)))
                continue
            tests = [node.test]
        elif isinstance(node, (ast.While, ast.Assert)):
            tests = [node.test]
        elif isinstance(node, ast.BoolOp):
            tests = [node]
        elif isinstance(node, ast.comprehension):
            tests = node.ifs
        elif isinstance(node, ast.match_case) and node.guard is not None:
            tests = [node.guard]
        else:
            continue
        for test in tests:
            name = mentioned(test)
            if name:
                add(test, rule, "%s: a condition mypy decides by `%s` itself, one side of which it never checks" % (message, name))


# What a class in a test file may set of `TestCase`'s own: how a failed assertion is worded, and
# how an object prints and compares, which decide no verdict.
TESTCASE_DATA = frozenset(
    ("maxDiff", "longMessage", "__repr__", "__str__", "__format__", "__eq__", "__ne__",
     "__hash__", "__lt__", "__le__", "__gt__", "__ge__")
)
# Bases that make a class a plain data type (a `NamedTuple`, an `Enum`), never a test case.
DATA_BASES = ("builtins.", "typing.", "typing_extensions.", "enum.", "collections.", "abc.")


def bindings(node):
    """The names a statement binds in the scope it runs in (not in the functions and classes it
    defines), each with where."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node, node.name
        return
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            if alias.name != "*":
                yield node, alias.asname or alias.name.split(".")[0]
        return
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        yield node, node.id
        return
    name = getattr(node, "name", None) if isinstance(
        node, (ast.MatchAs, ast.MatchStar, ast.ExceptHandler)
    ) else getattr(node, "rest", None) if isinstance(node, ast.MatchMapping) else None
    if name:
        yield node, name
    for child in ast.iter_child_nodes(node):
        yield from bindings(child)


def test_hooks(tree, scope, add, rule, message):
    """The ways a test file changes what its run reports without touching the framework: a
    class (a test case, or one a test case may derive from) taking over a method of
    `TestCase`'s own, by `def`, assignment, import, `setattr` or a decorator that replaces it,
    and a class made or changed where no syntax shows its methods."""
    taken = TESTCASE - TESTCASE_DATA
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = [scope.quals(base) for base in node.bases]
            if bases and not node.keywords and all(
                quals and all(q.startswith(DATA_BASES) for q in quals) for quals in bases
            ):
                continue
            for decorator in node.decorator_list:
                add(decorator, rule, "%s: decorates a class, which may replace its methods" % message)
            for keyword in node.keywords:
                add(keyword.value, rule, "%s: makes a class with `%s=`, which may replace its methods" % (message, keyword.arg))
            for item in node.body:
                for where, name in bindings(item):
                    if name in taken:
                        add(where, rule, "%s: overrides `TestCase.%s`" % (message, name))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__init_subclass__":
            add(node, rule, "%s: defines `__init_subclass__`, which may change every class derived from it" % message)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("pytest_"):
            # A method of an object registered as a plugin is a hook as much as a function is.
            add(node, rule, "%s: defines the pytest hook `%s`" % (message, node.name))
        elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load) and node.attr in taken:
            add(node, rule, "%s: replaces `TestCase.%s` on `%s`" % (message, node.attr, ast.unparse(node.value)))
        elif isinstance(node, ast.Attribute) and node.attr in INTERNALS:
            add(node, rule, "%s: reaches `TestCase`'s internals (`%s`)" % (message, node.attr))
        elif isinstance(node, ast.Call):
            func = scope.quals(node.func)
            name = fold(node.args[1]) if len(node.args) >= 2 else None
            if "builtins.setattr" in func and name in taken:
                add(node, rule, "%s: replaces `TestCase.%s` by `setattr`" % (message, name))
            if func & set(GETATTR) and name in INTERNALS:
                add(node, rule, "%s: reaches `TestCase`'s internals (`%s`)" % (message, name))
            if func & {"builtins.type", "types.new_class"} and len(node.args) + len(node.keywords) >= 2:
                add(node, rule, "%s: makes a class at run time, whose methods no syntax shows" % message)
    class_stores(tree, scope, add, rule, message)


# What reaches the class of an object at run time, whatever the object is (a pytest item, a
# report): `type(x)`, `x.__class__`, and the classes it derives from.
CLASS_ATTRIBUTES = frozenset({"__class__", "__mro__", "__bases__", "__base__"})
SETTERS = frozenset({"builtins.setattr", "builtins.delattr", "builtins.object.__setattr__",
                     "builtins.object.__delattr__"})


def class_stores(tree, scope, add, rule, message):
    """A test that sets or removes an attribute of a class it reached through an object
    (`type(item).runtest = ...`, `item.__class__`, `setattr(type(item), ...)`, `vars(type(item))[...]`,
    by way of names bound to such a class), or by `type.__setattr__`: the class may be the test
    framework's, which no import names."""
    derived = set()

    def reaches(node):
        for part in ast.walk(node):
            if isinstance(part, ast.Attribute) and part.attr in CLASS_ATTRIBUTES:
                return True
            if isinstance(part, ast.Name) and part.id in derived:
                return True
            if isinstance(part, ast.Call) and "builtins.type" in scope.quals(part.func) and len(part.args) == 1:
                return True
        return False

    bound = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound += [(target, node.value) for target in targets]
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            bound.append((node.target, node.iter))
        elif isinstance(node, ast.comprehension):
            bound.append((node.target, node.iter))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            bound.append((node.optional_vars, node.context_expr))
    # Names bound to such a class, through any number of other names.
    grew = True
    while grew:
        grew = False
        for target, value in bound:
            if reaches(value):
                for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                    if name not in derived:
                        derived.add(name)
                        grew = True

    def namespace(node):
        """`vars(cls)` or `cls.__dict__` of such a class."""
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            return reaches(node.value)
        return isinstance(node, ast.Call) and "builtins.vars" in scope.quals(node.func) and any(map(reaches, node.args))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load) and reaches(node.value):
            add(node, rule, "%s: sets `%s` on a class reached through an object, which may be the test framework's" % (message, node.attr))
        elif isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load) and namespace(node.value):
            add(node, rule, "%s: writes into the namespace of a class reached through an object" % message)
        elif isinstance(node, ast.Call):
            func = scope.quals(node.func)
            if func & {"builtins.type.__setattr__", "builtins.type.__delattr__"} or (
                func & SETTERS and node.args and reaches(node.args[0])
            ):
                add(node, rule, "%s: sets an attribute of a class reached through an object, which may be the test framework's" % message)
            elif isinstance(node.func, ast.Attribute) and node.func.attr in ("update", "__setitem__", "setdefault", "pop", "__delitem__") and namespace(node.func.value):
                add(node, rule, "%s: writes into the namespace of a class reached through an object" % message)


# The test frameworks, whose objects (`pytest.TestReport`, `unittest.TestResult`) decide what a
# run reports.
FRAMEWORKS = ("pytest.", "_pytest.", "unittest.", "pluggy.")


def module_hooks(tree, scope, add, rule, message):
    """What pytest reads from a module, however bound: a module-level `pytest_*` name (a hook,
    or `pytest_plugins`, which makes any module, this one too, a plugin), and a module-level
    `__getattr__`, which answers for every name the module does not bind, those too. And a name
    set on the test frameworks' own objects (`pytest.TestReport.passed = ...`)."""

    def check(where, name):
        if name == "pytest_plugins":
            add(where, rule, "%s: names pytest plugins (`pytest_plugins`)" % message)
        elif name.startswith("pytest_"):
            add(where, rule, "%s: binds the pytest hook name `%s`" % (message, name))
        elif name == "__getattr__":
            add(where, rule, "%s: a module-level `__getattr__`, which answers for names pytest looks up" % message)

    for statement in tree.body:
        for where, name in bindings(statement):
            check(where, name)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                check(node, name)
        owner = None
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
            owner, name = node.value, node.attr
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and scope.quals(node.func) & {"builtins.setattr", "builtins.delattr"}:
            owner, name = node.args[0], fold(node.args[1])
        if owner is not None:
            framework = sorted(q for q in scope.quals(owner) if (q + ".").startswith(FRAMEWORKS))
            if framework:
                add(node, rule, "%s: sets `%s.%s`, a part of the test framework" % (message, framework[0], name))


# How an object answers the tests' comparisons, truth and membership tests: defined by a class
# of the code under test (or of its tests), an object can pass `assertEqual(result, expected)`
# whatever it holds (a `dict` whose `__eq__` says equal to any).
VERDICT_METHODS = frozenset(
    ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__",
     "__contains__", "__instancecheck__", "__subclasscheck__")
)


# Containers whose subclass shows the tests one thing and the output another: equality reads
# the stored items, `json` reads what `items()` or `__iter__` answers.
CONTAINERS = frozenset(
    ["builtins." + name for name in ("dict", "list", "set", "frozenset", "tuple")]
    + ["collections." + name for name in ("OrderedDict", "defaultdict", "Counter", "UserDict",
                                          "UserList", "UserString", "deque", "ChainMap")]
    + ["typing." + name for name in ("Dict", "List", "Set", "FrozenSet", "Tuple", "OrderedDict",
                                     "DefaultDict", "Counter", "Deque", "ChainMap")]
)


def verdict_objects(tree, scope, add, rule, message, test):
    """A class that decides how its objects compare, whether they are true, or what they hold,
    by `def`, assignment or `setattr`, or by naming such a method at all (a key of the
    namespace a class is made from: `{"__eq__": ...}`, `dict(__eq__=...)`); and, outside a test
    file, a class made at run time, by `type(...)`, a metaclass or a class with one, whose
    methods no syntax shows."""
    why = "%s: %s `%s`, so an object of it decides the tests' comparisons about it"
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and VERDICT_METHODS.intersection(node.value.split(".")):
            # `"__eq__.return_value"` tells a `MagicMock` how to compare.
            add(node, rule, why % (message, "names", sorted(VERDICT_METHODS.intersection(node.value.split(".")))[0]))
        elif isinstance(node, ast.keyword) and node.arg in VERDICT_METHODS:
            add(node.value, rule, why % (message, "names", node.arg))
        elif isinstance(node, (ast.BinOp, ast.JoinedStr)):
            name = fold(node)
            if name in VERDICT_METHODS:
                add(node, rule, why % (message, "names", name))
        if isinstance(node, ast.ClassDef) and not test:
            for base in node.bases:
                # `dict[str, int]` is `dict`.
                generic = base.value if isinstance(base, ast.Subscript) else base
                container = sorted(q for q in scope.quals(generic) if q in CONTAINERS)
                if container:
                    add(base, rule, "%s: derives from `%s`, so what the tests compare (its items) and what "
                        "is written out (its `items()`, `__iter__`) can differ" % (message, container[0]))
            # `total=False` of a `TypedDict` says nothing of methods.
            for keyword in node.keywords:
                if keyword.arg in ("metaclass", None):
                    add(keyword.value, rule, "%s: makes a class with `%s`, which may give it methods no syntax shows" % (message, "metaclass=" if keyword.arg else "**"))
            for base in node.bases:
                if "builtins.type" in scope.quals(base):
                    add(base, rule, "%s: defines a metaclass, whose classes get methods no syntax shows" % message)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                for where, name in bindings(item):
                    if name in VERDICT_METHODS:
                        add(where, rule, why % (message, "defines", name))
        elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load) and node.attr in VERDICT_METHODS:
            add(node, rule, why % (message, "sets", node.attr))
        elif isinstance(node, ast.Call):
            func = scope.quals(node.func)
            name = fold(node.args[1]) if len(node.args) >= 2 else None
            if func & SETTERS and name in VERDICT_METHODS:
                add(node, rule, why % (message, "sets", name))
            # In a test file, `test_hooks` says so.
            if not test and func & {"builtins.type", "types.new_class"} and len(node.args) + len(node.keywords) >= 2:
                add(node, rule, "%s: makes a class at run time, whose methods no syntax shows" % message)


# Namespaces whose items are names: a key that cannot be read is a name that cannot be checked.
NAMESPACES = ("sys.modules", "builtins", "<globals>", "<locals>")

GETATTR = ("builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.hasattr")
IMPORTERS = ("builtins.__import__", "importlib.import_module", "importlib.__import__")


# Decoders whose result a literal argument fixes: a secret written encoded is still written.
DECODERS = {
    ("bytes", "fromhex"): bytes.fromhex,
    ("bytearray", "fromhex"): bytes.fromhex,
    ("base64", "b64decode"): base64.b64decode,
    ("base64", "urlsafe_b64decode"): base64.urlsafe_b64decode,
    ("base64", "b32decode"): base64.b32decode,
    ("base64", "b16decode"): base64.b16decode,
    ("base64", "b85decode"): base64.b85decode,
    ("base64", "a85decode"): base64.a85decode,
    ("binascii", "unhexlify"): binascii.unhexlify,
    ("binascii", "a2b_hex"): binascii.a2b_hex,
    ("binascii", "a2b_base64"): binascii.a2b_base64,
}

FOLD_LIMIT = 64 * 1024

# The codecs `codecs.decode(literal, codec)` undoes.
CODECS = ("rot13", "rot_13", "hex", "hex_codec", "base64", "base64_codec")


def fold(node, depth=0, names=None):
    """The string a constant expression makes, or None when it is only known at run time.
    `names`: the values of names bound once to such an expression (see `constants`)."""
    if depth > 50:
        return None
    try:
        text = fold_one(node, depth, names or {})
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, LookupError):
        # What the program would fail on at run time makes no string (binascii.Error is a
        # ValueError).
        return None
    # A string built past any key's length is no key; bounding it bounds the work too.
    return text if text is None or len(text) <= FOLD_LIMIT else None


def text_of(value):
    """A folded value as text: bytes are read byte for byte."""
    return value.decode("latin-1") if isinstance(value, (bytes, bytearray)) else value


def fold_one(node, depth, names):
    def sub(part):
        return fold(part, depth + 1, names)

    if isinstance(node, ast.Name):
        value = names.get(node.id)
        return value if isinstance(value, str) else None
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return node.value
        if isinstance(node.value, bytes):
            return node.value.decode("latin-1")
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = sub(node.left), sub(node.right)
        if left is not None and right is not None:
            return left + right
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        # `"ab" * 3`, either way round, bounded before it is made.
        for text_node, count_node in ((node.left, node.right), (node.right, node.left)):
            if isinstance(count_node, ast.Constant) and type(count_node.value) is int:
                text = sub(text_node)
                if text is not None and len(text) * max(count_node.value, 0) <= FOLD_LIMIT:
                    return text * count_node.value
        return None
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and type(node.slice.value) is int
    ):
        # `PARTS[0]` of a literal tuple or list, or of a name bound once to one.
        parts = sequence(node.value, depth, names)
        return None if parts is None else parts[node.slice.value]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        # `"%s%s" % ("AKIA", "...")`: every argument a string.
        template = sub(node.left)
        if template is None or re.search(r"%(?![s%])", template):
            return None  # a width or another conversion: not worth the risk of a huge string
        right = node.right
        items = right.elts if isinstance(right, ast.Tuple) else [right]
        parts = [sub(part) for part in items]
        if any(part is None for part in parts):
            return None
        return template % (tuple(parts) if isinstance(right, ast.Tuple) else parts[0])
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue) and value.format_spec is None:
                part = sub(value.value)
                if part is None:
                    return None
                convert = {-1: str, 115: str, 114: repr, 97: ascii}[value.conversion]
                parts.append(convert(part))
            else:
                return None
        return "".join(parts)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        text = sub(node.value)
        bounds = []
        for bound in (node.slice.lower, node.slice.upper, node.slice.step):
            if bound is None:
                bounds.append(None)
            elif isinstance(bound, ast.Constant) and isinstance(bound.value, int):
                bounds.append(bound.value)
            elif (
                isinstance(bound, ast.UnaryOp)
                and isinstance(bound.op, ast.USub)
                and isinstance(bound.operand, ast.Constant)
                and isinstance(bound.operand.value, int)
            ):
                bounds.append(-bound.operand.value)
            else:
                return None
        if text is None or bounds[2] == 0:
            return None
        return text[slice(*bounds)]
    if not isinstance(node, ast.Call) or node.keywords:
        return None
    if isinstance(node.func, ast.Name):
        # `chr(65)`: one character; `bytes([65, 75])`: one per number.
        if node.func.id == "chr" and len(node.args) == 1:
            code = node.args[0]
            if isinstance(code, ast.Constant) and isinstance(code.value, int):
                return chr(code.value)
        if node.func.id in ("bytes", "bytearray") and len(node.args) == 1:
            codes = numbers(node.args[0])
            return None if codes is None else bytes(codes).decode("latin-1")
        return None
    if not isinstance(node.func, ast.Attribute):
        return None
    if isinstance(node.func.value, ast.Name) and node.args:
        module = node.func.value.id
        decoder = DECODERS.get((module, node.func.attr))
        if decoder is not None and len(node.args) == 1:
            encoded = sub(node.args[0])
            return None if encoded is None else text_of(decoder(encoded))
        if module == "codecs" and node.func.attr in ("decode", "encode") and len(node.args) == 2:
            encoded, codec = sub(node.args[0]), sub(node.args[1])
            if encoded is None or codec not in CODECS:
                return None
            if codec.startswith("rot"):
                return codecs.decode(encoded, codec)
            data = encoded.encode("latin-1")
            return text_of(getattr(codecs, node.func.attr)(data, codec))
    receiver = sub(node.func.value)
    if receiver is None:
        return None
    if node.func.attr == "join" and len(node.args) == 1:
        parts = sequence(node.args[0], depth, names)
        return None if parts is None else receiver.join(parts)
    if node.func.attr == "__add__" and len(node.args) == 1:
        other = sub(node.args[0])
        return None if other is None else receiver + other
    if node.func.attr == "format":
        # Only `{}` and `{0}`: a width or an attribute could make anything.
        parts = sequence(ast.List(elts=node.args), depth, names)
        plain = all(
            not spec and conversion is None and (not field or field.isdigit())
            for _, field, spec, conversion in string.Formatter().parse(receiver)
        )
        if plain and parts is not None:
            return receiver.format(*parts)
    if node.func.attr in ("decode", "encode") and not node.args:
        return receiver
    if node.func.attr in ("lower", "upper", "strip", "swapcase", "title") and not node.args:
        return getattr(receiver, node.func.attr)()
    if node.func.attr == "replace" and len(node.args) == 2:
        old, new = sub(node.args[0]), sub(node.args[1])
        if old is not None and new is not None:
            return receiver.replace(old, new)
    return None


def numbers(node):
    """The integers a literal list or tuple holds, or None."""
    if not isinstance(node, (ast.List, ast.Tuple)):
        return None
    codes = [e.value for e in node.elts if isinstance(e, ast.Constant) and type(e.value) is int]
    return codes if len(codes) == len(node.elts) else None


def sequence(node, depth, names):
    """The strings a literal list or tuple makes (`*` of another included), a name bound once to
    one, or `map(chr, [65, ...])`; None when one of them is only known at run time."""
    if isinstance(node, ast.Name):
        value = names.get(node.id)
        return value if isinstance(value, list) else None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "map"
        and len(node.args) == 2
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == "chr"
    ):
        codes = numbers(node.args[1])
        return None if codes is None else [chr(code) for code in codes]
    if not isinstance(node, (ast.List, ast.Tuple)):
        return None
    parts = []
    for item in node.elts:
        if isinstance(item, ast.Starred):
            inner = sequence(item.value, depth + 1, names)
            if inner is None:
                return None
            parts.extend(inner)
        else:
            part = fold(item, depth + 1, names)
            if part is None:
                return None
            parts.append(part)
    return parts


def constants(tree):
    """Names bound exactly once in a file, to a string `fold` can make: `A = "AKIA"` makes
    `A + B` a string known before the program runs."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound[node.id] = bound.get(node.id, 0) + 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] = bound.get(node.name, 0) + 2
        elif isinstance(node, ast.arg):
            bound[node.arg] = bound.get(node.arg, 0) + 2
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                bound[name] = bound.get(name, 0) + 2
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                bound[name] = bound.get(name, 0) + 2
    assigned = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and bound.get(target.id) == 1:
            assigned[target.id] = value
    names = {}
    # Names refer to each other in any order: a few rounds settle them.
    for _ in range(4):
        for name, value in assigned.items():
            text = fold(value, names=names)
            if text is None:
                text = sequence(value, 0, names)
            if text is not None:
                names[name] = text
    return names


def literal(node, source):
    """Whether a string node is written as the one literal it is (so text rules see it whole)."""
    if not isinstance(node, ast.Constant):
        return False
    segment = ast.get_source_segment(source, node)
    value = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
    return segment is not None and value in segment


def built_strings(source):
    """Every string a file builds from pieces known before it runs, as kavi's secret rules read
    it: concatenations (`+`, implicit, `join`, f-strings, `%`, `format`), literals with escapes,
    encodings a literal undoes (hex, base64, rot13), names bound once to such pieces. One bound
    to a name (an assignment, a keyword, a dict key) is written `name = "value"`, so that the
    rules about named values (a password) see it as written whole."""
    tree = ast.parse(source["text"], filename=source["name"])
    names = constants(tree)
    found = []

    def emit(node, value, name):
        text = "%s = %s" % (name, json.dumps(value, ensure_ascii=False)) if name else value
        found.append(
            {
                "file": source["name"],
                "line": node.lineno,
                "col": node.col_offset + 1,
                "text": text,
                "value": value,
            }
        )

    def visit(node, name, hidden=False):
        """`hidden`: the text rules cannot see the name (a dict's key), so even a literal counts."""
        if isinstance(node, ast.expr) and not isinstance(node, ast.Name):
            value = fold(node, names=names)
            if value is not None:
                if hidden or not literal(node, source["text"]):
                    emit(node, value, name)
                return
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            visit(node.value, target_name(node.targets[0]))
            return
        if isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            visit(node.value, target_name(node.target))
            return
        if isinstance(node, ast.keyword):
            visit(node.value, node.arg)
            return
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if key is not None:
                    visit(key, None)
                named = None if key is None else fold(key, names=names)
                visit(value, named, hidden=named is not None)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, None)

    visit(tree, None)
    return found


def target_name(target):
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def item(namespace, key):
    """What `namespace[key]` is: `sys.modules['os']` is `os`, `vars(builtins)['exec']` is
    `builtins.exec`."""
    if namespace == "sys.modules":
        return key
    return normalize(namespace + "." + key)


def normalize(name):
    """One spelling for the ways to reach a name: a module's `__dict__` is the module,
    `__builtins__` anywhere is `builtins`."""
    parts = [part for part in name.split(".") if part != "__dict__"]
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] == "__builtins__":
            parts = ["builtins"] + parts[index + 1:]
            break
    name = ".".join(parts)
    if name.startswith("<globals>.") or name.startswith("<locals>."):
        rest = name.split(".", 1)[1]
        name = rest if rest.startswith("builtins") else "<globals>." + rest
    return name


class File:
    def __init__(self, tree):
        self.tree = tree
        self.aliases = {}
        self.stars = []
        self.defined = set()
        # A name deleted anywhere may be the built-in again after it.
        self.deleted = set()
        # The callables in call position: `getattr` anywhere else is passed on, unfollowable.
        self.called = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.add(node.name)
            elif isinstance(node, ast.arg):
                self.defined.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Del):
                self.deleted.add(node.id)
            elif isinstance(node, ast.Call):
                self.called.add(id(node.func))
        # Bindings refer to each other in any order: a few rounds settle them.
        for _ in range(4):
            before = {key: set(value) for key, value in self.aliases.items()}
            self.bind_all()
            if before == self.aliases:
                break

    def bind(self, name, quals):
        if quals:
            self.aliases.setdefault(name, set()).update(quals)

    def bind_target(self, target, value):
        if isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                for sub_target, sub_value in zip(target.elts, value.elts):
                    self.bind_target(sub_target, sub_value)
            else:
                for sub_target in target.elts:
                    self.bind_target(sub_target, value)
            return
        if isinstance(target, ast.Starred):
            self.bind_target(target.value, value)
            return
        quals = self.quals(value)
        if isinstance(target, ast.Name):
            self.bind(target.id, quals)
            # A class attribute is read as `self.name` or `Class.name`.
            self.bind("*." + target.id, quals)
        elif isinstance(target, ast.Attribute):
            self.bind("*." + target.attr, quals)

    def bind_all(self):
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.bind(alias.asname, {alias.name})
                    else:
                        top = alias.name.split(".")[0]
                        self.bind(top, {top})
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                for alias in node.names:
                    if alias.name == "*":
                        if module not in self.stars:
                            self.stars.append(module)
                    else:
                        full = module + "." + alias.name if module else alias.name
                        self.bind(alias.asname or alias.name, {full})
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    self.bind_target(target, node.value)
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                self.bind_target(node.target, node.value)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                if isinstance(node.iter, (ast.List, ast.Tuple, ast.Set)):
                    for item in node.iter.elts:
                        self.bind_target(node.target, item)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        self.bind_target(item.optional_vars, item.context_expr)
            elif isinstance(node, ast.arguments):
                positional = node.posonlyargs + node.args
                for arg, default in zip(positional[len(positional) - len(node.defaults):], node.defaults):
                    self.bind(arg.arg, self.quals(default))
                for arg, default in zip(node.kwonlyargs, node.kw_defaults):
                    if default is not None:
                        self.bind(arg.arg, self.quals(default))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                # A decorator that returns what it is given makes the name that thing.
                for decorator in node.decorator_list:
                    self.bind(node.name, self.quals(decorator))

    def quals(self, node, depth=0):
        """The qualified names an expression may be, as far as syntax tells."""
        if depth > 100:
            return set()
        if isinstance(node, ast.Name):
            name = node.id
            found = set(self.aliases.get(name, ()))
            if name == "__builtins__":
                found.add("builtins")
            elif name in BUILTINS and (
                name in self.deleted or (name not in self.defined and name not in self.aliases)
            ):
                found.add("builtins." + name)
            if name not in self.defined:
                found.update(module + "." + name for module in self.stars)
            return {normalize(q) for q in found}
        if isinstance(node, ast.Attribute):
            base = self.quals(node.value, depth + 1)
            found = {q + "." + node.attr for q in base} if base else {"*." + node.attr}
            found.update(self.aliases.get("*." + node.attr, ()))
            return {normalize(q) for q in found}
        if isinstance(node, ast.Subscript):
            base = self.quals(node.value, depth + 1)
            key = fold(node.slice)
            if key is None:
                return set()
            return {item(q, key) for q in base}
        if isinstance(node, ast.NamedExpr):
            return self.quals(node.value, depth + 1)
        if isinstance(node, (ast.IfExp,)):
            return self.quals(node.body, depth + 1) | self.quals(node.orelse, depth + 1)
        if isinstance(node, ast.BoolOp):
            found = set()
            for value in node.values:
                found |= self.quals(value, depth + 1)
            return found
        if isinstance(node, ast.Lambda):
            return self.quals(node.body, depth + 1)
        if isinstance(node, ast.Call):
            func = self.quals(node.func, depth + 1)
            found = set()
            if func & set(GETATTR) and len(node.args) >= 2:
                name = fold(node.args[1])
                if name is not None:
                    found |= {normalize(q + "." + name) for q in self.quals(node.args[0], depth + 1)}
            if func & set(IMPORTERS) and node.args:
                name = fold(node.args[0])
                if name is not None:
                    found |= {name, name.split(".")[0]}
            if "builtins.vars" in func:
                found |= self.quals(node.args[0], depth + 1) if node.args else {"<locals>"}
            if func & {"builtins.globals", "builtins.locals"}:
                found.add("<globals>")
            for q in func:
                namespace, _, method = q.rpartition(".")
                # `sys.modules.get("os")` is `os`; `data.get("mkdir")` is only a key.
                if method in ("get", "pop", "__getitem__", "setdefault") and namespace in NAMESPACES:
                    if node.args:
                        name = fold(node.args[0])
                        if name is not None:
                            found.add(item(q.rsplit(".", 1)[0], name))
            # What a call makes is named by what was called: `pathlib.Path(p).write_text`.
            return found | {q for q in func if not q.startswith("builtins.")}
        return set()

    def dynamic_reason(self, node):
        """Why this node reaches a name only known at run time, or None."""
        if isinstance(node, (ast.Name, ast.Attribute)) and id(node) not in self.called:
            passed = self.quals(node) & set(GETATTR + IMPORTERS)
            if passed:
                return "passes `%s` on, so the name it is given cannot be followed" % (
                    sorted(passed)[0].split(".")[-1]
                )
        if isinstance(node, ast.Call):
            func = self.quals(node.func)
            if func & set(GETATTR):
                if len(node.args) < 2 or fold(node.args[1]) is None:
                    return "`%s` with a name computed at run time" % sorted(func & set(GETATTR))[0].split(".")[-1]
            if func & set(IMPORTERS):
                if not node.args or fold(node.args[0]) is None:
                    return "imports a module named at run time"
            for q in func:
                for namespace in NAMESPACES:
                    if q.startswith(namespace + ".") and q.rsplit(".", 1)[1] in ("get", "pop", "__getitem__", "setdefault"):
                        if not node.args or fold(node.args[0]) is None:
                            return "reads `%s` with a key computed at run time" % namespace
        if isinstance(node, ast.Subscript) and fold(node.slice) is None:
            for q in self.quals(node.value):
                if q in NAMESPACES or q.endswith(".__dict__"):
                    return "reads `%s` with a key computed at run time" % q
        return None


def imported_names(node):
    """The modules and module members an import statement names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    module = node.module or ""
    names = [module] if module else []
    for alias in node.names:
        if alias.name != "*":
            names.append(module + "." + alias.name if module else alias.name)
    return names


STDLIB = frozenset(sys.stdlib_module_names)


def reexports(name):
    """`name`, and what it also is where a standard module reaches another through an attribute
    (`glob.os.system` is `os.system`: a module's imports are its attributes too)."""
    parts = name.split(".")
    yield name
    if parts[0] in STDLIB:
        for i in range(1, len(parts)):
            if parts[i] in STDLIB:
                yield ".".join(parts[i:])


def matches(capability, name):
    for candidate in reexports(name):
        for module in capability.get("modules", ()):
            if candidate == module or candidate.startswith(module + "."):
                return "`%s`" % name
        for pattern in capability.get("calls", ()):
            if fnmatch.fnmatchcase(candidate, pattern):
                return "`%s`" % name
    return None


def private_helper(name):
    """A private name of a standard module (`uuid._get_command_stdout`): what it does is not
    listed anywhere, so it cannot be checked."""
    parts = name.split(".")
    return (
        len(parts) > 1
        and parts[0] in STDLIB
        and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])
    )


# The environment as a whole, and the calls that read one variable of it by name.
ENVIRONMENTS = frozenset(("os.environ", "os.environb", "posix.environ", "nt.environ"))
GETENV = frozenset(("os.getenv", "os.getenvb"))
NAMED_READS = ("get", "__getitem__", "__contains__", "setdefault", "pop", "__setitem__", "__delitem__")


def environment_reason(node, names, parents):
    """Why this node reads the environment other than one variable by a literal name, or None:
    `os.environ["HOME"]`, `os.environ.get("HOME")`, `"HOME" in os.environ`, `os.getenv("HOME")`
    name what they read; `dict(os.environ)`, `os.environ.copy()`, `os.getenv(name)` do not."""
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        return None
    parent = parents.get(id(node))
    whole = sorted(names & ENVIRONMENTS)
    if whole:
        if isinstance(parent, ast.Subscript) and parent.value is node and fold(parent.slice) is not None:
            return None
        if isinstance(parent, ast.Attribute) and parent.value is node and parent.attr in NAMED_READS:
            call = parents.get(id(parent))
            if isinstance(call, ast.Call) and call.func is parent and call.args and fold(call.args[0]) is not None:
                return None
        if (
            isinstance(parent, ast.Compare)
            and any(node is c for c in parent.comparators)
            and all(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops)
            and fold(parent.left) is not None
        ):
            return None
        return "reads the whole environment (`%s`)" % whole[0]
    getenv = sorted(names & GETENV)
    if getenv and isinstance(node, (ast.Name, ast.Attribute)):
        if isinstance(parent, ast.Call) and parent.func is node:
            key = parent.args[0] if parent.args else None
            key = next((k.value for k in parent.keywords if k.arg == "key"), key)
            if key is not None and fold(key) is not None:
                return None
            return "reads an environment variable named at run time (`%s`)" % getenv[0]
        # A name is also what a call's result was bound to (`home = os.getenv("HOME")`), so
        # only the attribute itself, not called, is passed on.
        if isinstance(node, ast.Attribute):
            return "passes `%s` on, so the variable it reads cannot be followed" % getenv[0]
    return None


def mode_of(call, position):
    if len(call.args) > position:
        return call.args[position], True
    for keyword in call.keywords:
        if keyword.arg == "mode":
            return keyword.value, True
    return None, False


def read_otherwise(text, add):
    """Where Python would read `text` otherwise than the gates do. Every gate (ruff, mypy, this
    analyser, the text rules) reads a file as the UTF-8 it is stored as. Python decodes it as its
    coding declaration says (`# coding: utf-7` makes a comment's `+AAo-` a new line and what
    follows it code), and folds each name by NFKC (`no_type_check` spelled in fullwidth letters
    is `no_type_check`, which the text rules do not see)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(text.encode("utf-8")).readline)
    except SyntaxError as error:
        encoding = str(error)
    if encoding not in ("utf-8", "utf-8-sig"):
        add(None, "source", "declares its encoding as `%s`: Python would read it otherwise than the "
            "gates do; write plain UTF-8 with no coding declaration" % encoding)
        return
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.NAME and not token.string.isascii():
                add(token, "source", "the name `%s` is not ASCII: Python reads it as `%s`, which "
                    "the gates' text rules do not see" % (token.string, unicodedata.normalize("NFKC", token.string)))
    except (tokenize.TokenError, SyntaxError):
        pass  # the parse below says what is wrong


def analyse(source, capabilities, forbidden, test_modules):
    findings = []

    def add(node, rule, message):
        if isinstance(node, tokenize.TokenInfo):
            line, col = node.start
        else:
            line, col = getattr(node, "lineno", 1) or 1, getattr(node, "col_offset", 0) or 0
        findings.append(
            {
                "file": source["name"],
                "line": line,
                "col": col + 1,
                "rule": rule,
                "message": message,
            }
        )

    read_otherwise(source["text"], add)

    try:
        tree = ast.parse(source["text"], filename=source["name"])
    except SyntaxError as error:
        findings.append(
            {
                "file": source["name"],
                "line": error.lineno or 1,
                "col": error.offset or 1,
                "rule": "syntax",
                "message": "does not parse: %s" % error.msg,
            }
        )
        return findings
    except (ValueError, RecursionError, MemoryError) as error:
        findings.append(
            {
                "file": source["name"],
                "line": 1,
                "col": 1,
                "rule": "syntax",
                "message": "does not parse: %s" % (str(error) or type(error).__name__),
            }
        )
        return findings

    caps = [(name, capabilities[name]) for name in forbidden if name in capabilities]
    scope = File(tree)
    parents = {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for rule, capability in caps:
        if capability.get("test_hooks"):
            module_hooks(tree, scope, add, rule, capability["message"])
            verdict_objects(tree, scope, add, rule, capability["message"], source["test"])
            if source["test"]:
                test_hooks(tree, scope, add, rule, capability["message"])
    for rule, capability in caps:
        if capability.get("unchecked_branches"):
            unchecked_branches(tree, scope, add, rule, capability["message"])
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.level:
                names = [alias.name for alias in node.names] + ([node.module] if node.module else [])
            else:
                names = imported_names(node)
            for name in names:
                if not source["test"] and name.split(".")[0] in test_modules:
                    add(node, "imports-tests", "the skill's code imports its tests `%s`, which are checked less strictly" % name)
                for rule, capability in caps:
                    what = matches(capability, name)
                    if what:
                        add(node, rule, "%s: imports %s" % (capability["message"], what))
            continue
        if isinstance(node, ast.Match):
            # `case object(system=f)` reads the subject's attribute `system`.
            subjects = scope.quals(node.subject)
            for case in node.cases:
                for pattern in ast.walk(case.pattern):
                    if isinstance(pattern, ast.MatchClass):
                        for attribute in pattern.kwd_attrs:
                            for subject in sorted(subjects):
                                for rule, capability in caps:
                                    what = matches(capability, subject + "." + attribute)
                                    if what:
                                        add(pattern, rule, "%s: %s" % (capability["message"], what))
            continue
        if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
            names = scope.quals(node)
            if isinstance(node, ast.Attribute):
                for rule, capability in caps:
                    if capability.get("private_helpers"):
                        private = sorted(n for n in names if private_helper(n))
                        if private:
                            add(node, rule, "%s: reaches `%s`, a private helper of the standard library" % (capability["message"], private[0]))
            for rule, capability in caps:
                for name in sorted(names):
                    what = matches(capability, name)
                    if what:
                        add(node, rule, "%s: %s" % (capability["message"], what))
                        break
                # `functools.partial(open, mode="w")`, `opener = open`: the call it is passed to
                # is made where its mode cannot be read.
                if (isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load)
                        and id(node) not in scope.called):
                    for spec in capability.get("write_modes", ()):
                        passed = sorted(q for q in names if fnmatch.fnmatchcase(q, spec["call"]))
                        if passed:
                            add(node, rule, "%s: passes `%s` on, so the mode it opens a file with "
                                "cannot be checked" % (capability["message"], passed[0]))
                            break
                if isinstance(node, ast.Call):
                    func = scope.quals(node.func)
                    for spec in capability.get("write_modes", ()):
                        if not any(fnmatch.fnmatchcase(q, spec["call"]) for q in func):
                            continue
                        mode, given = mode_of(node, spec["position"])
                        if not given:
                            continue
                        text = fold(mode)
                        if text is not None and not (len(text) <= 4 and set(text) <= set("rwxabt+U")):
                            break  # not a mode: `Image.open("x.png")` names a path
                        if text is None:
                            add(node, rule, "%s: opens a file with a mode computed at run time" % capability["message"])
                        elif any(c in text for c in "wax+"):
                            add(node, rule, "%s: opens a file with mode `%s`" % (capability["message"], text))
                        break
                if isinstance(node, ast.Call):
                    for spec in capability.get("keywords", ()):
                        if not any(fnmatch.fnmatchcase(q, spec["call"]) for q in func):
                            continue
                        if any(k.arg == spec["keyword"] for k in node.keywords):
                            add(node, rule, "%s: `%s` with `%s=`" % (capability["message"], spec["call"], spec["keyword"]))
                        elif any(k.arg is None for k in node.keywords):
                            add(node, rule, "%s: `%s` with arguments computed at run time" % (capability["message"], spec["call"]))
                if capability.get("environment"):
                    reason = environment_reason(node, names, parents)
                    if reason:
                        add(node, rule, "%s: %s" % (capability["message"], reason))
                if capability.get("dynamic"):
                    reason = scope.dynamic_reason(node)
                    if reason:
                        add(node, rule, "%s: %s" % (capability["message"], reason))
    return findings


def main():
    request = json.load(sys.stdin)
    if request.get("strings"):
        # For the secret scan: the strings each file builds. One that does not parse builds
        # none known here; the policy scan fails it.
        # A file Python cannot compile builds no string when it runs (the policy scan fails
        # it); one whose strings cannot all be followed is named, never passed over: a secret
        # hidden in it would be missed.
        strings = []
        unscanned = []
        for source in request["files"]:
            try:
                strings.extend(built_strings(source))
            except (SyntaxError, ValueError):
                continue
            except RecursionError:
                unscanned.append({"file": source["name"], "reason": "too deeply nested"})
            except MemoryError:
                unscanned.append({"file": source["name"], "reason": "too large"})
        json.dump({"strings": strings, "unscanned": unscanned}, sys.stdout)
        return
    capabilities = request["capabilities"]
    test_modules = {f["module"] for f in request["files"] if f["test"]}
    findings = []
    for source in request["files"]:
        forbidden = request["forbid"]["tests" if source["test"] else "code"]
        try:
            findings.extend(analyse(source, capabilities, forbidden, test_modules))
        except RecursionError:
            findings.append(
                {
                    "file": source["name"],
                    "line": 1,
                    "col": 1,
                    "rule": "syntax",
                    "message": "too deeply nested to analyse",
                }
            )
    # One finding per line and rule: `subprocess.run` names the module twice over.
    seen = set()
    unique = []
    for finding in sorted(findings, key=lambda f: (f["file"], f["line"], f["col"], f["rule"])):
        key = (finding["file"], finding["line"], finding["rule"])
        if key not in seen:
            seen.add(key)
            unique.append(finding)
    json.dump({"findings": unique}, sys.stdout)


main()
