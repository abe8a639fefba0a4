"""kavi's witness inside the test gate's pytest (loaded with `-p kavi_witness`, before any test
module is imported).

It writes into the JUnit report, as global properties, what kavi checks the report against:
how many tests pytest collected, that the session reached its end, the run's nonce (read from a
file kavi wrote beside this module, then removed, so that a report written without pytest does
not carry it), and which parts of the test framework the code under test replaced at run time
(an `assertEqual` that never fails, a patched pytest runner). It runs in the same process as the
tests, so a test written against kavi itself can still forge it: it catches the usual ways and
makes a forgery deliberate, it is no proof against that.
"""

import builtins
import os
import sys
import unittest

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

# What a test could replace to make failures pass, as it stands before any test module loads.
_WATCHED = [
    ("unittest.TestCase", unittest.TestCase),
    ("unittest.case", sys.modules["unittest.case"]),
    ("builtins", builtins),
    ("pytest", pytest),
]
for _name in ("_pytest.runner", "_pytest.python", "_pytest.unittest", "_pytest.reports",
              "_pytest.outcomes", "_pytest.main", "_pytest.junitxml", "_pytest.skipping"):
    if _name in sys.modules:
        _WATCHED.append((_name, sys.modules[_name]))
# The classes whose attributes decide what a result says (`BaseReport.passed` is a property):
# a class is watched whole, and a name added to it (one that shadows what it inherits) counts too.
_WATCHED.append(("unittest.TestResult", unittest.TestResult))
if "_pytest.reports" in sys.modules:
    _reports = sys.modules["_pytest.reports"]
    _WATCHED += [("_pytest.reports.BaseReport", _reports.BaseReport),
                 ("_pytest.reports.TestReport", _reports.TestReport),
                 ("_pytest.reports.CollectReport", _reports.CollectReport)]


def _attributes(owner):
    if isinstance(owner, type) and owner is not unittest.TestCase:
        return dict(vars(owner))
    return {name: value for name, value in list(vars(owner).items())
            if not name.startswith("__") or name in ("__call__", "__init__")}


_BEFORE = [(label, owner, _attributes(owner)) for label, owner in _WATCHED]
_collected = None
_deselected = 0


def _replaced():
    changed = []
    for label, owner, before in _BEFORE:
        now = vars(owner)
        for name, value in before.items():
            if name not in now:
                changed.append(f"{label}.{name} (removed)")
            elif now[name] is not value:
                changed.append(f"{label}.{name}")
        if isinstance(owner, type):
            changed += [f"{label}.{name} (added)" for name in _attributes(owner) if name not in before]
    return changed


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    global _collected
    _collected = len(session.items)


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
    xml.add_global_property("kavi_optimized", str(sys.flags.optimize))
    xml.add_global_property("kavi_exitstatus", str(int(exitstatus)))
