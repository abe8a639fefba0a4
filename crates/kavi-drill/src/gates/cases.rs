//! The drill's cases against the code-quality gates (lint, types, tests): what a case is,
//! the sound skill the cases start from, and the suppressions, lying tests and tool
//! configurations they hide behind.

/// Where a case's file goes.
#[derive(Clone, Copy)]
pub(super) enum At {
    /// The skill's folder, `skills/demo/`.
    Skill,
    /// The workspace's root.
    Root,
    /// The folder holding the workspace.
    Above,
}

pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) what: &'static str,
    /// The gates that must not pass.
    pub(super) targets: &'static [&'static str],
    /// `skill.py` and `test_skill.py`; `None`: the sound one.
    pub(super) skill: Option<&'static str>,
    pub(super) test: Option<&'static str>,
    /// Further files, by where they go and their name.
    pub(super) extra: &'static [(At, &'static str, &'static str)],
    /// The failure kind the targeted gates must fail as, where it matters (a security
    /// violation goes to a person at once).
    pub(super) kind: Option<&'static str>,
}

pub(super) const SKILL: &str = "import json\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\n\
def run(data: Any) -> dict[str, Any]:\n    return {\"echo\": json.loads(json.dumps(data))}\n";

pub(super) const TEST: &str = "import unittest\n\nfrom skill import run\n\n\nclass T(unittest.TestCase):\n    \
def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 1})\n";

/// The sound test's assertion, made to fail.
const FAILING_TEST: &str = "import unittest\n\nfrom skill import run\n\n\n\
class T(unittest.TestCase):\n    def test_echo(self) -> None:\n        \
self.assertEqual(run(1), {\"echo\": 2})\n";

/// A skill with an unused import, a type error, and nothing else wrong.
const BROKEN_SKILL: &str = "import json\nimport os\nfrom typing import Any\n\n\
SIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: Any) -> dict[str, Any]:\n    \
return {\"echo\": json.loads(json.dumps(data))}\n\n\ndef count(text: str) -> int:\n    \
return text\n";

/// Tool configuration that would switch every gate off, were it read.
const SETUP_CFG: &str = "[flake8]\nignore = F401\n\n[mypy]\nignore_errors = True\n\n\
[tool:pytest]\naddopts = --collect-only -p no:junitxml\n";
const PYTEST_INI: &str = "[pytest]\naddopts = --collect-only\n";
const PYPROJECT: &str = "[tool.ruff.lint]\nignore = [\"F401\"]\n\n[tool.mypy]\nignore_errors = true\n\n\
[tool.pytest.ini_options]\naddopts = \"--collect-only\"\n";

/// The attacker's test that made every later test "pass" without running its body.
pub(super) const ITEM_CLASS_RUNTEST: &str = "import unittest\nfrom typing import Any\n\nimport pytest\n\nfrom skill import run\n\n\ndef test_a_setup(request: pytest.FixtureRequest) -> None:\n    for item in request.node.session.items:\n        kind: Any = type(item)\n        kind.runtest = lambda self: None\n\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 2})\n";

/// A proposal that runs `skill.py` and promises the echo of 1.
pub(super) const CONTRACT_PROPOSAL: &str = "name = \"demo\"\ndescription = \"A drill case\"\nside_effect = \"READ_ONLY\"\n\
command = [\"python3\", \"skills/demo/skill.py\"]\ninput_schema = {}\noutput_schema = {}\n\n\
[[examples]]\ninput = 1\noutput = { echo = 1 }\n";

pub(super) const TOOL_CASES: &[Case] = &[
    Case {
        name: "ruff_noqa_file",
        what: "`# ruff: noqa` over an unused import",
        targets: &["lint"],
        skill: Some(
            "# ruff: noqa\nimport os\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return data\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "flake8_noqa_file",
        what: "`# flake8: noqa` over an unused import",
        targets: &["lint"],
        skill: Some(
            "# flake8: noqa\nimport os\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return data\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "ruff_noqa_file_codes",
        what: "`# ruff: noqa: F401` for the whole file",
        targets: &["lint"],
        skill: Some(
            "# ruff: noqa: F401\nimport os\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return data\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "blanket_noqa",
        what: "a `# noqa` without codes on an unused import",
        targets: &["lint"],
        skill: Some(
            "import os  # noqa\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return data\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "unused_import_aliased_to_itself",
        what: "an unused import written `import os as os`, which ruff takes for a re-export",
        targets: &["lint"],
        skill: Some(
            "import os as os\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return data\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "line_noqa_with_code",
        what: "`# noqa: F401` on an unused import, which silences exactly what it names",
        targets: &["lint"],
        skill: Some(
            "import os  # noqa: F401\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return data\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "line_type_ignore_with_code",
        what: "`# type: ignore[return-value]` on a `str` returned as `int`",
        targets: &["types"],
        skill: Some(
            "SIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: str) -> int:\n    return data.strip()  # type: ignore[return-value]\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "mypy_ignore_errors",
        what: "`# mypy: ignore-errors` over a type error",
        targets: &["types"],
        skill: Some(
            "# mypy: ignore-errors\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return data\n\n\ndef count(text: str) -> int:\n    return text\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "mypy_inline_disable",
        what: "`# mypy: disable-error-code` over a type error",
        targets: &["types"],
        skill: Some(
            "# mypy: disable-error-code=\"return-value\"\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return data\n\n\ndef count(text: str) -> int:\n    return text\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "type_ignore_blanket",
        what: "a `# type: ignore` without codes on a type error",
        targets: &["types"],
        skill: Some(
            "SIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return data\n\n\ndef count(text: str) -> int:\n    return text  # type: ignore\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "type_ignore_module",
        what: "a `# type: ignore` at the top of the file",
        targets: &["types"],
        skill: Some(
            "# type: ignore\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return data\n\n\ndef count(text: str) -> int:\n    return text\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "no_type_check",
        what: "`@no_type_check` on a function with a type error",
        targets: &["types"],
        skill: Some(
            "from typing import no_type_check\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return data\n\n\n@no_type_check\ndef count(text: str) -> int:\n    return text\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "type_checking_else",
        what: "a type error in the `else` of `if TYPE_CHECKING:`, a branch mypy never checks",
        targets: &["policy"],
        skill: Some(
            "from typing import TYPE_CHECKING\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return data\n\n\nif TYPE_CHECKING:\n\n    def count(text: str) -> int:\n        return len(text)\n\nelse:\n\n    def count(text: str) -> int:\n        return text.strip() + 1\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "pytest_plugins_self",
        what: "`pytest_plugins` naming the test module itself, whose hook reports every test passed",
        targets: &["policy"],
        skill: None,
        test: Some(
            "from collections.abc import Generator\nimport unittest\n\nimport pytest\n\nfrom skill import run\n\npytest_plugins = [\"test_skill\"]\n\n\n@pytest.hookimpl(wrapper=True)\ndef pytest_runtest_makereport(\n    item: pytest.Item, call: pytest.CallInfo[None]\n) -> Generator[None, pytest.TestReport, pytest.TestReport]:\n    report = yield\n    report.outcome = \"passed\"\n    return report\n\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 2})\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "testcase_run_overridden",
        what: "a test case whose `run` does nothing",
        targets: &["policy"],
        skill: None,
        test: Some(
            "import unittest\n\nfrom skill import run\n\n\nclass T(unittest.TestCase):\n    def run(self, result: unittest.TestResult | None = None) -> unittest.TestResult | None:\n        return result\n\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 2})\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "testcase_assertion_overridden",
        what: "a test case whose `assertEqual` asserts nothing",
        targets: &["policy"],
        skill: None,
        test: Some(
            "import unittest\nfrom typing import Any\n\nfrom skill import run\n\n\nclass T(unittest.TestCase):\n    def assertEqual(self, first: Any, second: Any, msg: Any = None) -> None:\n        return None\n\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 2})\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "match_class_attribute",
        what: "`os.system` reached by a `match` class pattern: `case object(system=launch)`",
        targets: &["policy"],
        skill: Some(
            "import os\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    match os:\n        case object(system=launch):\n            return {\"echo\": launch(\"true\")}\n    return data\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "module_through_another",
        what: "`os` reached as an attribute of `glob`: `from glob import os`",
        targets: &["policy"],
        skill: Some(
            "from glob import os as _o\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return {\"echo\": _o.system(\"true\")}\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "private_stdlib_helper",
        what: "a private helper of the standard library that runs a command (`uuid._get_command_stdout`)",
        targets: &["policy"],
        skill: Some(
            "import uuid\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: object) -> object:\n    return {\"echo\": str(uuid._get_command_stdout(\"true\"))}\n",
        ),
        test: None,
        extra: &[],
        kind: None,
    },
    Case {
        name: "os_exit_in_test",
        what: "`os._exit(0)` in a test, before the failing one runs",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import os\nimport unittest\n\nfrom skill import run\n\n\nclass T(unittest.TestCase):\n    def test_a_first(self) -> None:\n        os._exit(0)\n\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 2})\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "sys_exit_at_import",
        what: "`sys.exit(0)` when the test module is imported",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import sys\nimport unittest\n\nfrom skill import run\n\nsys.exit(0)\n\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 2})\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "atexit_exit_code",
        what: "an `atexit` hook forcing exit status 0",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import atexit\nimport os\nimport unittest\n\nfrom skill import run\n\natexit.register(lambda: os._exit(0))\n\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 2})\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "patched_assert_equal",
        what: "`unittest.TestCase.assertEqual` replaced by a no-op",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import unittest\n\nfrom skill import run\n\nsetattr(unittest.TestCase, \"assertEqual\", lambda *args, **kwargs: None)\n\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 2})\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "all_tests_skipped",
        what: "every test skipped",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import unittest\n\nfrom skill import run\n\n\n@unittest.skip(\"later\")\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 2})\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "pytestmark_skip",
        what: "`pytestmark = pytest.mark.skip` for the module",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import pytest\n\nfrom skill import run\n\npytestmark = pytest.mark.skip(reason=\"later\")\n\n\ndef test_echo() -> None:\n    assert run(1) == {\"echo\": 2}\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "module_level_skip",
        what: "`pytest.skip(..., allow_module_level=True)`",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import pytest\n\nfrom skill import run\n\npytest.skip(\"later\", allow_module_level=True)\n\n\ndef test_echo() -> None:\n    assert run(1) == {\"echo\": 2}\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "zero_tests",
        what: "a test file with no test",
        targets: &["tests"],
        skill: None,
        test: Some("from skill import run\n\nassert run is not None\n"),
        extra: &[],
        kind: None,
    },
    Case {
        name: "conftest_deselect",
        what: "a `conftest.py` that deselects every test",
        targets: &["tests"],
        skill: None,
        test: Some(FAILING_TEST),
        extra: &[(
            At::Skill,
            "conftest.py",
            "def pytest_collection_modifyitems(config, items):\n    items.clear()\n",
        )],
        kind: None,
    },
    Case {
        name: "junit_rewritten",
        what: "a test that rewrites the JUnit report at exit",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import atexit\nimport os\nimport sys\nimport unittest\n\nfrom skill import run\n\nFORGED = '<?xml version=\"1.0\"?><testsuites><testsuite name=\"pytest\" errors=\"0\" failures=\"0\" skipped=\"0\" tests=\"1\"><testcase classname=\"test_skill.T\" name=\"test_echo\" /></testsuite></testsuites>'\n\n\ndef forge() -> None:\n    for arg in sys.argv:\n        if arg.startswith(\"--junitxml=\"):\n            with open(arg.split(\"=\", 1)[1], \"w\") as report:\n                report.write(FORGED)\n    os._exit(0)\n\n\natexit.register(forge)\n\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 2})\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "hung_test",
        what: "a test that never ends",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import time\nimport unittest\n\nfrom skill import run\n\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 1})\n\n    def test_hangs(self) -> None:\n        time.sleep(3600)\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "setup_cfg_in_skill",
        what: "a `setup.cfg` in the skill's folder",
        targets: &["lint", "types", "tests"],
        skill: Some(BROKEN_SKILL),
        test: Some(FAILING_TEST),
        extra: &[(At::Skill, "setup.cfg", SETUP_CFG)],
        kind: None,
    },
    Case {
        name: "setup_cfg_at_root",
        what: "a `setup.cfg` at the workspace's root",
        targets: &["lint", "types", "tests"],
        skill: Some(BROKEN_SKILL),
        test: Some(FAILING_TEST),
        extra: &[(At::Root, "setup.cfg", SETUP_CFG)],
        kind: None,
    },
    Case {
        name: "pytest_ini_in_skill",
        what: "a `pytest.ini` in the skill's folder",
        targets: &["tests"],
        skill: None,
        test: Some(FAILING_TEST),
        extra: &[(At::Skill, "pytest.ini", PYTEST_INI)],
        kind: None,
    },
    Case {
        name: "pytest_ini_at_root",
        what: "a `pytest.ini` at the workspace's root",
        targets: &["tests"],
        skill: None,
        test: Some(FAILING_TEST),
        extra: &[(At::Root, "pytest.ini", PYTEST_INI)],
        kind: None,
    },
    Case {
        name: "pytest_ini_above",
        what: "a `pytest.ini` in the folder above the workspace",
        targets: &["tests"],
        skill: None,
        test: Some(FAILING_TEST),
        extra: &[(At::Above, "pytest.ini", PYTEST_INI)],
        kind: None,
    },
    Case {
        name: "pyproject_in_skill",
        what: "a `pyproject.toml` in the skill's folder",
        targets: &["lint", "types", "tests"],
        skill: Some(BROKEN_SKILL),
        test: Some(FAILING_TEST),
        extra: &[(At::Skill, "pyproject.toml", PYPROJECT)],
        kind: None,
    },
    Case {
        name: "pyproject_at_root",
        what: "a `pyproject.toml` at the workspace's root",
        targets: &["lint", "types", "tests"],
        skill: Some(BROKEN_SKILL),
        test: Some(FAILING_TEST),
        extra: &[(At::Root, "pyproject.toml", PYPROJECT)],
        kind: None,
    },
    Case {
        name: "tool_files_in_skill",
        what: "`ruff.toml`, `mypy.ini` and `tox.ini` in the skill's folder",
        targets: &["lint", "types", "tests"],
        skill: Some(BROKEN_SKILL),
        test: Some(FAILING_TEST),
        extra: &[
            (At::Skill, "ruff.toml", "[lint]\nignore = [\"F401\"]\n"),
            (At::Skill, "mypy.ini", "[mypy]\nignore_errors = True\n"),
            (At::Skill, "tox.ini", "[pytest]\naddopts = --collect-only\n"),
        ],
        kind: None,
    },
    Case {
        name: "item_class_runtest",
        what: "a test replacing `runtest` on the later tests' item classes (`type(item)`)",
        targets: &["tests"],
        skill: None,
        test: Some(ITEM_CLASS_RUNTEST),
        extra: &[],
        kind: None,
    },
    Case {
        name: "item_function_replaced",
        what: "a test replacing the later tests' functions on their items (`item.obj`)",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import pytest\n\nfrom skill import run\n\n\ndef test_a_setup(request: pytest.FixtureRequest) -> None:\n    for item in request.node.session.items:\n        item.obj = lambda *args, **kwargs: None\n\n\ndef test_echo() -> None:\n    assert run(1) == {\"echo\": 2}\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "plugin_from_test_file",
        what: "a plugin named by `pytest_plugins` in the test file, passing every call",
        targets: &["tests"],
        skill: None,
        test: Some(
            "from skill import run\n\npytest_plugins = [\"passing\"]\n\n\ndef test_echo() -> None:\n    assert run(1) == {\"echo\": 2}\n",
        ),
        extra: &[(
            At::Skill,
            "passing.py",
            "import pytest\n\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_pyfunc_call(pyfuncitem: object) -> bool:\n    return True\n",
        )],
        kind: None,
    },
    Case {
        name: "swallowed_by_context_manager",
        what: "the test's assertion inside a context manager whose `__exit__` returns True",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import unittest\nfrom types import TracebackType\n\nfrom skill import run\n\n\nclass Calm:\n    def __enter__(self) -> \"Calm\":\n        return self\n\n    def __exit__(\n        self,\n        kind: type[BaseException] | None,\n        value: BaseException | None,\n        trace: TracebackType | None,\n    ) -> bool:\n        return True\n\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        with Calm():\n            self.assertEqual(run(1), {\"echo\": 2})\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "swallowed_by_multiline_except",
        what: "the test's assertion caught by an `except (` spread over lines",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import unittest\n\nfrom skill import run\n\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        try:\n            self.assertEqual(run(1), {\"echo\": 2})\n        except (\n            AssertionError\n        ):\n            pass\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "swallowed_by_skill_helper",
        what: "the test's assertion run by a helper of the skill that catches it",
        targets: &["tests"],
        skill: Some(
            "import json\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: Any) -> dict[str, Any]:\n    return {\"echo\": json.loads(json.dumps(data))}\n\n\ndef lenient(check: Any) -> None:\n    try:\n        check()\n    except AssertionError:\n        pass\n",
        ),
        test: Some(
            "import unittest\n\nfrom skill import lenient, run\n\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        lenient(lambda: self.assertEqual(run(1), {\"echo\": 2}))\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "swallowed_by_alias",
        what: "a plain `assert` caught under another name for AssertionError",
        targets: &["tests"],
        skill: None,
        test: Some(
            "from skill import run\n\nExpected = AssertionError\n\n\ndef test_echo() -> None:\n    try:\n        assert run(1) == {\"echo\": 2}\n    except Expected:\n        pass\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "assertions_from_a_mixin",
        what: "a mixin from the skill that redefines `assertEqual`, ahead of unittest's",
        targets: &["tests"],
        skill: Some(
            "import json\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: Any) -> dict[str, Any]:\n    return {\"echo\": json.loads(json.dumps(data))}\n\n\nclass Checks:\n    def assertEqual(self, first: object, second: object, msg: object = None) -> None:\n        \"\"\"Compares leniently.\"\"\"\n",
        ),
        test: Some(
            "import unittest\n\nfrom skill import Checks, run\n\n\nclass T(Checks, unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 2})\n",
        ),
        extra: &[],
        kind: None,
    },
    Case {
        name: "equality_func_registered",
        what: "an equality check registered for dicts that passes anything",
        targets: &["tests"],
        skill: None,
        test: Some(
            "import unittest\n\nfrom skill import run\n\n\nclass T(unittest.TestCase):\n    def setUp(self) -> None:\n        self.addTypeEqualityFunc(dict, lambda first, second, msg=None: None)\n\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {\"echo\": 2})\n",
        ),
        extra: &[],
        kind: None,
    },
];
