"""kavi's witness inside the test gate's pytest (loaded with `-p kavi_witness`, before any test
module is imported).

It writes into the JUnit report, as global properties, what kavi checks the report against:
how many tests pytest collected, that the session reached its end, the run's nonce (read from a
file kavi wrote beside this module, then removed, so that a report written without pytest does
not carry it), which parts of the test framework the code under test replaced at run time
(an `assertEqual` that never fails, a patched pytest runner, a test item's class or the item
itself, or a test class that overrides an assertion), which plugins were registered once tests
began to load, which tests passed without their body being entered, and which tests passed
although an assertion failed while they ran (its failure caught and hidden, however that was
spelled). It runs in the same process as the tests, so a test written
against kavi itself can still forge it: it catches the usual ways and makes a forgery
deliberate, it is no proof against that.
"""

import builtins
import inspect
import os
import sys
import types
import unittest

import pluggy
import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_NONCE_FILE = os.path.join(_HERE, "nonce")
# Names the test that is running, so that a gate stopped at its time limit can say which hung.
_RUNNING = os.path.join(os.path.dirname(_HERE), "running")
try:
    with open(_NONCE_FILE, encoding="utf-8") as _f:
        _NONCE = _f.read().strip()
    os.unlink(_NONCE_FILE)
except OSError:
    _NONCE = ""

# The tests in which an assertion failed while they ran. A test that passed with one of them
# caught what the assertion raised and hid it: with an `except`, a context manager whose
# `__exit__` returns True, a helper of the code under test, a name bound to AssertionError.
_failed_in = set()


def _assertion_failed():
    if _running is not None:
        _failed_in.add(_running)


class _AssertionFailed(AssertionError):
    """What unittest's assertions raise under the witness: an AssertionError that notes the test."""

    def __init__(self, *args):
        _assertion_failed()
        super().__init__(*args)


# Shown as what it stands for, in tracebacks and in the report's failure messages.
_AssertionFailed.__name__ = _AssertionFailed.__qualname__ = "AssertionError"
_AssertionFailed.__module__ = "builtins"
unittest.TestCase.failureException = _AssertionFailed

# pytest's rewritten `assert` formats its explanation only when the assertion fails.
import _pytest.assertion.rewrite as _rewrite  # noqa: E402

_format_explanation = _rewrite._format_explanation


def _witnessed_format_explanation(explanation):
    _assertion_failed()
    return _format_explanation(explanation)


_rewrite._format_explanation = _witnessed_format_explanation
# unittest.TestCase's own assertion machinery, which a test class may not redefine (a mixin whose
# `assertEqual` never fails); what a test class sets up for itself is its own.
_OVERRIDABLE = {"setUp", "tearDown", "setUpClass", "tearDownClass", "maxDiff", "longMessage"}
# The type-specific equality checks `assertEqual` dispatches to, as unittest registers them: one
# a test adds (`addTypeEqualityFunc`) can make `assertEqual` pass anything.
_EQUALITY = dict(unittest.TestCase()._type_equality_funcs)
# Test classes that redefine the framework's assertions, and tests that changed their equality
# checks, as found.
_overridden = []
_seen_classes = set()


def _check_overrides(test_class):
    if id(test_class) in _seen_classes:
        return
    _seen_classes.add(id(test_class))
    for name in dir(unittest.TestCase):
        if name in _OVERRIDABLE or (name.startswith("__") and name != "__call__"):
            continue
        owner = next((kind for kind in test_class.__mro__ if name in vars(kind)), None)
        if owner is None or owner.__module__.startswith(("unittest", "_pytest", "pytest")):
            continue
        _overridden.append(f"{test_class.__module__}.{test_class.__qualname__}.{name} "
                           f"(defined by {owner.__module__}.{owner.__qualname__})")


# What a test could replace to make failures pass, as it stands before any test module loads.
_WATCHED = [
    ("unittest.TestCase", unittest.TestCase),
    ("unittest.case", sys.modules["unittest.case"]),
    ("builtins", builtins),
    ("pytest", pytest),
]
# The modules pytest runs a test through, from the hook call to the report, imported here so
# that they are watched as they stand before any test module loads.
_MODULES = ("_pytest.runner", "_pytest.python", "_pytest.unittest", "_pytest.reports",
            "_pytest.outcomes", "_pytest.main", "_pytest.junitxml", "_pytest.skipping",
            "_pytest.nodes", "_pytest.fixtures", "_pytest.timing", "_pytest.assertion.rewrite",
            "pluggy._callers",
            "pluggy._hooks", "pluggy._manager", "pluggy._result")
for _name in _MODULES:
    __import__(_name)
    _WATCHED.append((_name, sys.modules[_name]))
# Every class those modules define is watched whole too: `Function.runtest` replaced on the class
# (reached as `type(item)`) leaves the module's attributes as they were.
for _name in _MODULES:
    for _value in list(vars(sys.modules[_name]).values()):
        if isinstance(_value, type) and _value.__module__ == _name:
            _WATCHED.append((f"{_name}.{_value.__qualname__}", _value))
# The classes whose attributes decide what a result says (`BaseReport.passed` is a property):
# a class is watched whole, and a name added to it (one that shadows what it inherits) counts too.
_WATCHED.append(("unittest.TestResult", unittest.TestResult))


def _attributes(owner):
    if isinstance(owner, type) and owner is not unittest.TestCase:
        return {name: value for name, value in vars(owner).items() if name not in _FRAMEWORK_MARKS}
    return {name: value for name, value in list(vars(owner).items())
            if not name.startswith("__") or name in ("__call__", "__init__")}


# Taken when collection starts (see `pytest_collection`): pytest's own set-up (its legacy path
# plugin adds `Node.fspath`) is done, and no test module has loaded yet.
_BEFORE = []
# What the frameworks set on classes themselves as tests run: pytest on an item's class when it
# makes the first item of it, unittest on a test class when its class clean-ups run.
_FRAMEWORK_MARKS = {"_pytest_diamond_inheritance_warning_shown", "tearDown_exceptions"}
_collected = None
_deselected = 0
# Per collected test, by node id: its item, the item's class and attributes as collected, and
# the code object its body is (None: not a Python function, so it cannot be shown to have run).
_ITEMS = {}
# The tests whose body was entered while pytest ran them, and those pytest reported skipped.
_entered = set()
_skipped = set()
# Plugins registered once collection began: a test module's `pytest_plugins`, or a test
# registering one itself, would run hooks kavi did not choose.
_late_plugins = []
_collecting = False


def _body(item):
    """The code object of the test function `item` runs, unwrapped from its decorators."""
    function = getattr(item, "obj", None)
    function = inspect.unwrap(getattr(function, "__func__", function))
    return getattr(function, "__code__", None)


# The test's own classes (by id): their data may change as tests run (`cls.data = ...` in
# `setUpClass`), only what runs may not.
_OWN = set()
_RUNNABLE = (types.FunctionType, classmethod, staticmethod, property)


def _watch_classes(classes):
    """Watches from now on the classes a collected test runs through that are not watched yet
    (an item's own class and its bases, the test's class and its bases)."""
    known = {id(owner) for _, owner, _ in _BEFORE}
    for kind in classes:
        if kind is object or id(kind) in known or kind.__module__ == "builtins":
            continue
        known.add(id(kind))
        if not kind.__module__.startswith(("_pytest", "pytest", "pluggy", "unittest")):
            _OWN.add(id(kind))
        _BEFORE.append((f"{kind.__module__}.{kind.__qualname__}", kind, _attributes(kind)))


def _runs(name, value):
    """Whether an attribute of a test's own class is one that runs: a method, or a name the
    framework calls (a test, `setUp`, `run`...)."""
    return isinstance(value, _RUNNABLE) or name.startswith("test") or hasattr(unittest.TestCase, name)


def _replaced():
    changed = []
    for label, owner, before in _BEFORE:
        now = vars(owner)
        own = id(owner) in _OWN
        for name, value in before.items():
            if own and not _runs(name, value) and not _runs(name, now.get(name)):
                continue
            if name not in now:
                changed.append(f"{label}.{name} (removed)")
            elif now[name] is not value:
                changed.append(f"{label}.{name}")
        if isinstance(owner, type):
            changed += [f"{label}.{name} (added)" for name, value in _attributes(owner).items()
                        if name not in before and (not own or _runs(name, value))]
    for nodeid, (item, kind, before, body) in _ITEMS.items():
        if type(item) is not kind:
            changed.append(f"{nodeid}: the test item's class")
            continue
        if _body(item) is not body:
            changed.append(f"{nodeid}: the test item's function")
        # An attribute on the item itself that hides a method of its class's (`item.runtest =
        # ...`); data the class defaults (`_excinfo = None`) is the item's to set.
        inherited = {name for base in kind.__mro__ for name, value in vars(base).items()
                     if isinstance(value, _RUNNABLE)}
        changed += [f"{nodeid}: the test item's {name}" for name in vars(item)
                    if name in inherited and name not in before]
    if sys.getprofile() is not None and sys.getprofile() is not _profile:
        changed.append("sys.setprofile")
    if unittest.TestCase.failureException is not _AssertionFailed:
        changed.append("unittest.TestCase.failureException")
    return changed + _overridden


def _not_run():
    """The tests pytest did not skip whose body was never entered while pytest ran them."""
    return [nodeid for nodeid in _ITEMS if nodeid not in _entered and nodeid not in _skipped]


_running_body = None


def _profile(frame, event, arg):
    global _running_body
    if event == "call" and frame.f_code is _running_body:
        _entered.add(_running)
        _running_body = None


_running = None


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
    global _collecting
    _BEFORE.extend((label, owner, _attributes(owner)) for label, owner in _WATCHED)
    _collecting = True


def pytest_plugin_registered(plugin, plugin_name, manager):
    if _collecting:
        _late_plugins.append(getattr(plugin, "__name__", None) or type(plugin).__qualname__)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    global _collected
    _collected = len(session.items)
    for item in session.items:
        kind = type(item)
        _ITEMS[item.nodeid] = (item, kind, dict(vars(item)), _body(item))
        test_class = getattr(item, "cls", None)
        _watch_classes(kind.__mro__ + (test_class.__mro__ if isinstance(test_class, type) else ()))
        if isinstance(test_class, type) and issubclass(test_class, unittest.TestCase):
            _check_overrides(test_class)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Watches, while pytest runs `item`'s test, for the body collected for it to be entered."""
    global _running, _running_body
    entry = _ITEMS.get(item.nodeid)
    _running, _running_body = item.nodeid, entry and entry[3]
    previous = sys.getprofile()
    sys.setprofile(_profile)
    try:
        return (yield)
    finally:
        sys.setprofile(previous)
        _running = _running_body = None
        instance = getattr(item, "instance", None)
        if (isinstance(instance, unittest.TestCase)
                and getattr(instance, "_type_equality_funcs", _EQUALITY) != _EQUALITY):
            _overridden.append(f"{item.nodeid}: addTypeEqualityFunc")


_swallowed = []


def pytest_runtest_logreport(report):
    if report.skipped:
        _skipped.add(report.nodeid)
    if report.when == "call" and report.passed and report.nodeid in _failed_in:
        _swallowed.append(report.nodeid)


def pytest_runtest_logstart(nodeid, location):
    try:
        fd = os.open(_RUNNING, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, nodeid.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass


def pytest_deselected(items):
    global _deselected
    _deselected += len(items)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    from _pytest.junitxml import xml_key

    xml = session.config.stash.get(xml_key, None)
    if xml is None:
        return
    xml.add_global_property("kavi_nonce", _NONCE)
    xml.add_global_property("kavi_collected", "" if _collected is None else str(_collected))
    xml.add_global_property("kavi_deselected", str(_deselected))
    xml.add_global_property("kavi_replaced", " ".join(_replaced()))
    xml.add_global_property("kavi_plugins", " ".join(_late_plugins))
    xml.add_global_property("kavi_not_run", " ".join(_not_run()))
    xml.add_global_property("kavi_swallowed", " ".join(_swallowed))
    xml.add_global_property("kavi_optimized", str(sys.flags.optimize))
    xml.add_global_property("kavi_exitstatus", str(int(exitstatus)))
