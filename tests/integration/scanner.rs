//! The policy and secret scans, end to end: the shipped `policies/scanner.toml`, the analyser run
//! by the pinned toolchain's interpreter (provisioned once, under target/), confined as every
//! gate process is. Each disguise of a forbidden capability is its own skill folder in one
//! workspace, verified by its own gate node of one pipeline run.

use crate::common;

use std::path::Path;

use common::{copy_policies, kavi, last_run, node};

/// One skill folder: its side-effect class, its files, and the rule its scan must fail with
/// (`None`: it must pass).
struct Case {
    name: &'static str,
    class: &'static str,
    files: &'static [(&'static str, &'static str)],
    expect: Option<&'static str>,
}

const fn read_only(
    name: &'static str,
    skill: &'static str,
    expect: &'static str,
) -> (&'static str, &'static str, &'static str, &'static str) {
    (name, "READ_ONLY", skill, expect)
}

/// Each disguise in `skill.py` of a READ_ONLY skill, and the rule that names it.
const DISGUISES: &[(&str, &str, &str, &str)] = &[
    read_only(
        "from_import_alias",
        "from os import system as shell\nshell('id')\n",
        "process",
    ),
    // Python decodes a file as its coding declaration says: in utf-7, `+AAo-` is a new line.
    read_only(
        "utf7_hidden_import",
        "# -*- coding: utf-7 -*-\n# +AAo-import ctypes\n",
        "source",
    ),
    read_only(
        "utf7_cookie_in_prose",
        "# notes: the decoding: utf-7 of this file\nx = 1\n",
        "source",
    ),
    // Python folds names by NFKC: fullwidth letters spell what the text rules look for.
    read_only(
        "fullwidth_name",
        "import typing\n\n\n@typing.\u{ff4e}o_type_check\ndef run() -> None:\n    DB_\u{ff30}ASSWORD = 'x'\n",
        "source",
    ),
    read_only(
        "import_alias",
        "import os as o\no.system('id')\n",
        "process",
    ),
    read_only("star_import", "from os import *\nsystem('id')\n", "process"),
    read_only(
        "dunder_import",
        "__import__('os').system('id')\n",
        "process",
    ),
    read_only(
        "importlib",
        "import importlib\nimportlib.import_module('subprocess').run(['id'])\n",
        "dynamic_code",
    ),
    read_only(
        "importlib_from",
        "from importlib import import_module as im\nim('subprocess')\n",
        "dynamic_code",
    ),
    read_only(
        "getattr_builtins_concat",
        "getattr(__builtins__, 'ev' + 'al')('1')\n",
        "dynamic_code",
    ),
    read_only(
        "getattr_builtins_module",
        "import builtins\ngetattr(builtins, 'ex' + 'ec')('1')\n",
        "dynamic_code",
    ),
    read_only(
        "exec_compile",
        "exec(compile('1', 'x', 'exec'))\n",
        "dynamic_code",
    ),
    read_only(
        "pickle_loads",
        "import pickle\npickle.loads(b'')\n",
        "dynamic_code",
    ),
    read_only(
        "marshal_loads",
        "import marshal\nmarshal.loads(b'')\n",
        "dynamic_code",
    ),
    read_only(
        "shelve",
        "import shelve\nshelve.open('db')\n",
        "dynamic_code",
    ),
    read_only(
        "ctypes_cdll",
        "import ctypes\nctypes.CDLL(None)\n",
        "native",
    ),
    read_only(
        "private_socket",
        "import _socket\n_socket.socket()\n",
        "network",
    ),
    read_only(
        "socket",
        "from socket import create_connection\ncreate_connection(('h', 1))\n",
        "network",
    ),
    read_only(
        "urllib",
        "import urllib.request\nurllib.request.urlopen('http://x')\n",
        "network",
    ),
    read_only(
        "posix_system",
        "import posix\nposix.system('id')\n",
        "process",
    ),
    read_only(
        "os_posix_spawnp",
        "import os\nos.posix_spawnp('id', ['id'], {})\n",
        "process",
    ),
    read_only("os_popen", "import os\nos.popen('id')\n", "process"),
    read_only(
        "os_execv",
        "import os\nos.execv('/bin/id', ['id'])\n",
        "process",
    ),
    read_only("os_fork", "import os\nos.fork()\n", "process"),
    read_only(
        "subprocess",
        "from subprocess import run as r\nr(['id'])\n",
        "process",
    ),
    read_only(
        "io_fileio_write",
        "import io\nio.FileIO('p', 'w')\n",
        "file_write",
    ),
    read_only("open_write", "open('p', 'w')\n", "file_write"),
    read_only("open_mode_keyword", "open('p', mode='a')\n", "file_write"),
    read_only(
        "open_mode_computed",
        "import sys\nopen('p', sys.argv[1])\n",
        "file_write",
    ),
    read_only(
        "pathlib_write_text",
        "import pathlib\npathlib.Path('x').write_text('x')\n",
        "file_write",
    ),
    read_only(
        "shutil_rmtree",
        "import shutil\nshutil.rmtree('x')\n",
        "file_write",
    ),
    read_only(
        "os_remove_alias",
        "from os import remove as rm\nrm('x')\n",
        "file_write",
    ),
    read_only(
        "sys_modules",
        "import sys\nsys.modules['os'].system('id')\n",
        "process",
    ),
    read_only(
        "sys_modules_get",
        "import sys\nsys.modules.get('subprocess').run(['id'])\n",
        "process",
    ),
    read_only(
        "vars_builtins",
        "import builtins\nvars(builtins)['exec']('1')\n",
        "dynamic_code",
    ),
    read_only(
        "globals_builtins",
        "globals()['__builtins__'].exec('1')\n",
        "dynamic_code",
    ),
    read_only(
        "assigned_alias",
        "import os\ns = os.system\ns('id')\n",
        "process",
    ),
    read_only(
        "lambda_alias",
        "import os\nf = lambda c: os.system(c)\nf('id')\n",
        "process",
    ),
    read_only(
        "class_attribute",
        "import os\n\n\nclass A:\n    run = os.system\n\n\nA().run('id')\n",
        "process",
    ),
    read_only(
        "decorator",
        "import os\n\n\n@os.system\ndef f() -> None:\n    pass\n",
        "process",
    ),
    read_only(
        "default_argument",
        "import os\n\n\ndef f(o=os):\n    return o.system('id')\n",
        "process",
    ),
    read_only(
        "module_alias_getattr",
        "import os as o\ngetattr(o, 'sys' + 'tem')('id')\n",
        "process",
    ),
    read_only(
        "reversed_name",
        "import os\ngetattr(os, 'metsys'[::-1])('id')\n",
        "process",
    ),
    read_only(
        "getattr_computed",
        "import os\nimport sys\ngetattr(os, sys.argv[1])('id')\n",
        "dynamic_names",
    ),
    read_only(
        "import_computed",
        "import sys\n__import__(sys.argv[1])\n",
        "dynamic_code",
    ),
    read_only(
        "subclasses_escape",
        "().__class__.__bases__[0].__subclasses__()\n",
        "dynamic_code",
    ),
    read_only(
        "asyncio_subprocess",
        "import asyncio\nasyncio.create_subprocess_exec('id')\n",
        "process",
    ),
    read_only(
        "getattr_passed_on",
        "import functools\nimport os\nfunctools.reduce(getattr, ['system'], os)('id')\n",
        "dynamic_names",
    ),
    // A built-in function's `__self__` is its module; a format field name is looked up at run
    // time (the attack round of 2026-11-29 reached `subprocess` and `os.system` so).
    read_only(
        "builtin_self",
        "measure = len\nmeasure.__self__.__import__('subprocess')\n",
        "dynamic_code",
    ),
    read_only(
        "module_function_self",
        "import os\nos.getcwd.__self__.system('id')\n",
        "dynamic_code",
    ),
    read_only(
        "format_field",
        "import string\nimport sys\nstring.Formatter().get_field('0.modules[os].system', [sys], {})[0]('id')\n",
        "dynamic_code",
    ),
    read_only(
        "format_field_from",
        "import sys\nfrom string import Formatter as F\nF().get_field('0.modules', [sys], {})\n",
        "dynamic_code",
    ),
    // A cast is a type the checker takes on trust.
    read_only(
        "typing_cast",
        "from typing import cast\n\n\ndef run(text: str) -> int:\n    return cast(int, text)\n",
        "unchecked_types",
    ),
    // The mode of a call `open` is passed to cannot be read where it is made.
    read_only(
        "open_passed_on",
        "import functools\nwriter = functools.partial(open, mode='w')\nwriter('/proc/self/comm').write('x')\n",
        "file_write",
    ),
    read_only(
        "operator_attrgetter",
        "import operator\nimport os\noperator.attrgetter('system')(os)('id')\n",
        "dynamic_code",
    ),
    read_only(
        "deleted_shadow",
        "def eval(x: str) -> str:\n    return x\n\n\ndel eval\neval('1')\n",
        "dynamic_code",
    ),
    // Branches mypy decides itself, and never checks one side of.
    read_only(
        "mypy_constant",
        "MYPY = False\nif MYPY:\n    X = 1\nelse:\n    X = '1'\n",
        "dynamic_code",
    ),
    read_only(
        "typing_extensions_type_checking",
        "import typing_extensions\nif typing_extensions.TYPE_CHECKING:\n    pass\nelse:\n    X = 1\n",
        "dynamic_code",
    ),
    read_only(
        "typing_alias_not_type_checking",
        "import typing as t\nif not t.TYPE_CHECKING:\n    X = 1\n",
        "dynamic_code",
    ),
    read_only(
        "type_checking_renamed",
        "from typing import TYPE_CHECKING as TC\nif TC:\n    pass\nelse:\n    X = 1\n",
        "dynamic_code",
    ),
    read_only(
        "py2_constant",
        "PY2 = True\nif PY2:\n    X = 1\n",
        "dynamic_code",
    ),
    read_only(
        "version_decided",
        "import sys\nif sys.version_info >= (3, 99):\n    X = 1\n",
        "dynamic_code",
    ),
    // Code in a string, run.
    read_only(
        "timeit_string",
        "import timeit\ntimeit.timeit(\"__import__('os').system('id')\", number=1)\n",
        "dynamic_code",
    ),
    read_only(
        "cprofile_run",
        "from cProfile import run as go\ngo('1')\n",
        "dynamic_code",
    ),
    read_only(
        "mock_patch_target",
        "from unittest import mock\nmock.patch('os.system').start()\n",
        "dynamic_code",
    ),
    read_only(
        "string_annotation",
        "import typing\n\n\ndef f(x: \"__import__('os').system('id')\") -> None:\n    pass\n\n\ntyping.get_type_hints(f)\n",
        "dynamic_code",
    ),
    read_only(
        "logging_factory",
        "import logging.config\nlogging.config.dictConfig({'version': 1, 'handlers': {'h': {'()': 'os.system'}}})\n",
        "dynamic_code",
    ),
    read_only(
        "pydoc_pager",
        "import pydoc\npydoc.pipepager('x', 'id')\n",
        "process",
    ),
    read_only(
        "mailcap_test_command",
        "import mailcap\nmailcap.findmatch({'a/b': [{'view': 'x', 'test': 'id'}]}, 'a/b')\n",
        "process",
    ),
    read_only(
        "tcl_exec",
        "import tkinter\ntkinter.Tcl().eval('exec id')\n",
        "process",
    ),
    // Writes and network through less usual doors.
    read_only(
        "bz2_file_write",
        "import bz2\nbz2.BZ2File('x.bz2', 'wb').write(b'x')\n",
        "file_write",
    ),
    read_only(
        "lzma_file_write",
        "from lzma import LZMAFile\nLZMAFile('x.xz', mode='w')\n",
        "file_write",
    ),
    read_only(
        "wave_file_write",
        "import wave\nwave.open('x.wav', 'wb')\n",
        "file_write",
    ),
    read_only(
        "element_tree_write",
        "import xml.etree.ElementTree as ET\nET.ElementTree(ET.Element('a')).write('out.xml')\n",
        "file_write",
    ),
    read_only(
        "syslog_handler",
        "from logging.handlers import SysLogHandler\nSysLogHandler(('203.0.113.1', 514))\n",
        "network",
    ),
    read_only(
        "sax_url",
        "import xml.sax\nxml.sax.parse('http://203.0.113.1/x.xml', xml.sax.ContentHandler())\n",
        "network",
    ),
    read_only(
        "robots",
        "from urllib import robotparser\nrobotparser.RobotFileParser('http://203.0.113.1/robots.txt').read()\n",
        "network",
    ),
    // What pytest reads from any module: the skill's own code may become a plugin.
    read_only(
        "hook_assigned_in_code",
        "def _make(item: object, call: object) -> None:\n    pass\n\n\npytest_runtest_makereport = _make\n",
        "verdict",
    ),
    read_only(
        "module_getattr",
        "def __getattr__(name: str) -> list[str]:\n    return [__name__]\n",
        "verdict",
    ),
    read_only("os_exit", "import os\nos._exit(0)\n", "verdict"),
    read_only("syntax_error", "def broken(:\n    pass\n", "syntax"),
    // The environment read whole or by a computed name (issue 52).
    read_only(
        "environment_dumped",
        "import json\nimport os\njson.dumps(dict(os.environ))\n",
        "environment",
    ),
    read_only(
        "environment_copied",
        "import os\nos.environ.copy()\n",
        "environment",
    ),
    read_only(
        "environment_unpacked",
        "import os\n{**os.environ}\n",
        "environment",
    ),
    read_only(
        "environment_items",
        "import os\nos.environ.items()\n",
        "environment",
    ),
    read_only(
        "environment_getenv_computed",
        "import os\nname = 'HO' + input()\nos.getenv(name)\n",
        "environment",
    ),
    read_only(
        "environment_get_computed",
        "from os import environ\nenviron.get(input())\n",
        "environment",
    ),
    read_only(
        "environment_bytes",
        "import os\nos.environb\n",
        "environment",
    ),
    read_only(
        "environment_by_getattr",
        "import os\ndict(getattr(os, 'environ'))\n",
        "environment",
    ),
    read_only(
        "environment_by_vars",
        "import os\nlist(vars(os)['environ'])\n",
        "environment",
    ),
    // Logging handlers that open a file, or a socket.
    read_only(
        "logging_file_handler",
        "import logging\nlogging.getLogger().addHandler(logging.FileHandler('x.log'))\n",
        "file_write",
    ),
    read_only(
        "logging_rotating_alias",
        "from logging.handlers import RotatingFileHandler as R\nR('x.log')\n",
        "file_write",
    ),
    read_only(
        "logging_timed_rotating",
        "import logging.handlers\nlogging.handlers.TimedRotatingFileHandler('x.log')\n",
        "file_write",
    ),
    read_only(
        "logging_watched",
        "from logging import handlers\nhandlers.WatchedFileHandler('x.log')\n",
        "file_write",
    ),
    read_only(
        "logging_basic_config_file",
        "import logging\nlogging.basicConfig(filename='x.log')\n",
        "file_write",
    ),
    read_only(
        "logging_basic_config_unknown",
        "import logging\noptions: dict[str, str] = {}\nlogging.basicConfig(**options)\n",
        "file_write",
    ),
    read_only(
        "logging_socket_handler",
        "import logging.handlers\nlogging.handlers.SocketHandler('h', 1)\n",
        "network",
    ),
];

/// Disguises that are not in `skill.py`, or depend on the class.
const OTHERS: &[Case] = &[
    Case {
        name: "utf8_declared",
        class: "READ_ONLY",
        files: &[("skill.py", "# -*- coding: utf-8 -*-\nNAME = 'caf\u{e9}'\n")],
        expect: None,
    },
    Case {
        name: "in_test_file",
        class: "READ_ONLY",
        files: &[
            (
                "skill.py",
                "import test_skill\n\n\ndef run() -> None:\n    test_skill.helper()\n",
            ),
            (
                "test_skill.py",
                "import subprocess\n\n\ndef helper() -> None:\n    subprocess.run(['id'])\n",
            ),
        ],
        expect: Some("process"),
    },
    Case {
        name: "skill_imports_its_tests",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "from test_skill import write\n\nwrite()\n"),
            (
                "test_skill.py",
                "import pathlib\n\n\ndef write() -> None:\n    pathlib.Path('x').write_text('x')\n",
            ),
        ],
        expect: Some("imports-tests"),
    },
    Case {
        name: "in_helper_module",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "import helpers\n\nhelpers.go()\n"),
            (
                "helpers.py",
                "import os\n\n\ndef go() -> None:\n    os.system('id')\n",
            ),
        ],
        expect: Some("process"),
    },
    Case {
        name: "in_conftest",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            ("conftest.py", "import os\nos.system('id')\n"),
        ],
        expect: Some("process"),
    },
    Case {
        name: "test_skips_itself",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "import unittest\n\n\n@unittest.skip('later')\nclass T(unittest.TestCase):\n    def test_x(self) -> None:\n        self.fail()\n",
            ),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "testcase_run_assigned",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "import unittest\n\n\ndef nothing(self: object, result: object = None) -> object:\n    return result\n\n\nclass T(unittest.TestCase):\n    run = nothing\n",
            ),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "testcase_run_from_mixin_and_alias",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "from unittest import TestCase as Base\n\n\nclass Mixin:\n    def run(self, result: object = None) -> object:\n        return result\n\n\nclass T(Mixin, Base):\n    pass\n",
            ),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "testcase_setattr",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "import unittest\n\n\nclass T(unittest.TestCase):\n    pass\n\n\nsetattr(T, 'r' + 'un', lambda self, result=None: result)\n",
            ),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "testcase_made_by_type",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "import unittest\n\nT = type('T', (unittest.TestCase,), {'run': lambda self, result=None: result})\n",
            ),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "testcase_class_decorator",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "import unittest\n\n\ndef quiet(cls: type) -> type:\n    return cls\n\n\n@quiet\nclass T(unittest.TestCase):\n    pass\n",
            ),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "init_subclass",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "class Base:\n    def __init_subclass__(cls) -> None:\n        pass\n",
            ),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "testcase_outcome",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "import unittest\n\n\nclass T(unittest.TestCase):\n    def test_x(self) -> None:\n        self._outcome.result = None\n",
            ),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "framework_attribute_set",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "import pytest\n\nReport = pytest.TestReport\nReport.passed = property(lambda self: True)\n",
            ),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "plugin_by_fixture",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "import pytest\n\n\ndef test_x(request: pytest.FixtureRequest) -> None:\n    request.config.pluginmanager.register(object())\n",
            ),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "skill_result_equal_to_anything",
        class: "READ_ONLY",
        files: &[
            (
                "skill.py",
                "from typing import Any\n\n\nclass Counts(dict[str, int]):\n    def __eq__(self, other: object) -> bool:\n        return True\n\n\ndef run(data: Any) -> dict[str, int]:\n    return Counts(words=0)\n",
            ),
            ("test_skill.py", "X = 1\n"),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "skill_comparison_set_later",
        class: "READ_ONLY",
        files: &[
            (
                "skill.py",
                "class Counts(dict[str, int]):\n    pass\n\n\nsetattr(Counts, '__e' + 'q__', lambda self, other: True)\n",
            ),
            ("test_skill.py", "X = 1\n"),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "skill_class_made_by_type",
        class: "READ_ONLY",
        files: &[
            (
                "skill.py",
                "Counts = type('Counts', (dict,), {'__contains__': lambda self, key: True})\n",
            ),
            ("test_skill.py", "X = 1\n"),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "skill_class_made_by_a_metaclass_call",
        class: "READ_ONLY",
        files: &[
            (
                "skill.py",
                "def same(self: object, other: object) -> bool:\n    return True\n\n\nclass Record(type):\n    pass\n\n\nCounts = Record('Counts', (dict,), {'__e' + 'q__': same})\n",
            ),
            ("test_skill.py", "X = 1\n"),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "skill_class_namespace_prepared",
        class: "READ_ONLY",
        files: &[
            (
                "skill.py",
                "from typing import Any\n\n\ndef same(self: object, other: object) -> bool:\n    return True\n\n\nclass Record(type):\n    @classmethod\n    def __prepare__(mcs, name: str, bases: tuple[type, ...], /, **kwds: Any) -> dict[str, object]:\n        return dict(__eq__=same)\n\n\nclass Counts(dict[str, int], metaclass=Record):\n    pass\n",
            ),
            ("test_skill.py", "X = 1\n"),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "skill_result_dict_shows_the_output_other_items",
        class: "READ_ONLY",
        files: &[
            (
                "skill.py",
                "from typing import Any\n\n\nclass Counts(dict[str, int]):\n    def items(self) -> Any:\n        return [('words', 1)]\n",
            ),
            ("test_skill.py", "X = 1\n"),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "skill_result_holds_any",
        class: "READ_ONLY",
        files: &[
            (
                "skill.py",
                "from unittest import mock\n\n\ndef run(data: object) -> object:\n    return {'words': mock.ANY}\n",
            ),
            ("test_skill.py", "X = 1\n"),
        ],
        expect: Some("test_doubles"),
    },
    Case {
        name: "test_compares_with_any",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "from unittest.mock import ANY\n\n\ndef test_x() -> None:\n    assert {'words': 2} == {'words': ANY}\n",
            ),
        ],
        expect: Some("anything_equal"),
    },
    Case {
        name: "test_mock_told_to_equal_anything",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "from unittest import mock\n\n\ndef test_x() -> None:\n    assert {'words': 2} == mock.MagicMock(**{'__eq__.return_value': True})\n",
            ),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "test_standing_a_mock_in_passes",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "from unittest import mock\n\n\ndef test_x() -> None:\n    called = mock.Mock(return_value=1)\n    assert called() == 1\n",
            ),
        ],
        expect: None,
    },
    Case {
        name: "expected_value_equal_to_anything",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "class Anything:\n    def __eq__(self, other: object) -> bool:\n        return True\n\n\ndef test_x() -> None:\n    assert {'words': 2} == Anything()\n",
            ),
        ],
        expect: Some("verdict"),
    },
    Case {
        name: "skill_dataclass_passes",
        class: "READ_ONLY",
        files: &[
            (
                "skill.py",
                "import dataclasses\nfrom typing import TypedDict\n\n\n@dataclasses.dataclass(order=True)\nclass Count:\n    word: str\n    n: int\n\n    def __repr__(self) -> str:\n        return self.word\n\n\nclass Options(TypedDict, total=False):\n    limit: int\n",
            ),
            ("test_skill.py", "X = 1\n"),
        ],
        expect: None,
    },
    Case {
        name: "test_data_classes_pass",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "X = 1\n"),
            (
                "test_skill.py",
                "import typing\nimport unittest\n\n\nclass Row(typing.NamedTuple):\n    id: int\n\n\nclass Shown:\n    def __repr__(self) -> str:\n        return 'shown'\n\n\nclass T(unittest.TestCase):\n    maxDiff = None\n\n    def setUp(self) -> None:\n        self.longMessage = True\n\n    def test_x(self) -> None:\n        self.assertEqual(Row(1).id, 1)\n",
            ),
        ],
        expect: None,
    },
    Case {
        name: "compiled_module",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "import helpers\n"),
            ("helpers.so", "\u{7f}ELF"),
        ],
        expect: Some("compiled-code"),
    },
    Case {
        name: "file_write_may_write",
        class: "FILE_WRITE",
        files: &[(
            "skill.py",
            "import pathlib\npathlib.Path('x').write_text('x')\nopen('y', 'w')\n",
        )],
        expect: None,
    },
    Case {
        name: "file_write_may_not_spawn",
        class: "FILE_WRITE",
        files: &[("skill.py", "import os\nos.spawnlp(os.P_WAIT, 'id', 'id')\n")],
        expect: Some("process"),
    },
    Case {
        name: "file_write_may_not_load_a_sqlite_extension",
        class: "FILE_WRITE",
        files: &[(
            "skill.py",
            "import sqlite3\ndb = sqlite3.connect('x.db')\ndb.enable_load_extension(True)\ndb.load_extension('./native.so')\n",
        )],
        expect: Some("native"),
    },
    Case {
        name: "network_may_not_run_an_imap_command",
        class: "NETWORK",
        files: &[("skill.py", "import imaplib\nimaplib.IMAP4_stream('id')\n")],
        expect: Some("process"),
    },
    Case {
        name: "network_may_use_sockets",
        class: "NETWORK",
        files: &[(
            "skill.py",
            "import socket\nimport urllib.request\nsocket.socket()\nurllib.request.urlopen('https://example.org')\n",
        )],
        expect: None,
    },
    Case {
        name: "network_may_not_write",
        class: "NETWORK",
        files: &[("skill.py", "import shutil\nshutil.rmtree('x')\n")],
        expect: Some("file_write"),
    },
    Case {
        name: "tests_may_write_temporary_files",
        class: "READ_ONLY",
        files: &[
            ("skill.py", "def run() -> int:\n    return 1\n"),
            (
                "test_skill.py",
                "import pathlib\nimport tempfile\n\nwith tempfile.TemporaryDirectory() as d:\n    pathlib.Path(d, 'n').write_text('x')\n",
            ),
        ],
        expect: None,
    },
    Case {
        name: "a_key_is_not_a_name",
        class: "READ_ONLY",
        files: &[(
            "skill.py",
            "def run(data: dict[str, str]) -> str | None:\n    return data.get('mkdir') or data.get('system')\n",
        )],
        expect: None,
    },
    Case {
        name: "environment_named_reads_pass",
        class: "READ_ONLY",
        files: &[(
            "skill.py",
            "import logging\nimport os\n\nhome = os.environ['HOME']\nnotes = os.environ.get('KAVI_NOTES_DIR', 'notes')\nset_ = 'HOME' in os.environ\nlang = os.getenv('LANG')\nlogging.basicConfig(level=logging.INFO)\nlogging.getLogger().addHandler(logging.StreamHandler())\nprint(home, notes, set_, lang)\n",
        )],
        expect: None,
    },
    Case {
        name: "secret_read_may_read_the_environment",
        class: "SECRET_READ",
        files: &[("skill.py", "import os\n\ntokens = dict(os.environ)\n")],
        expect: None,
    },
    Case {
        name: "file_write_may_log_to_a_file",
        class: "FILE_WRITE",
        files: &[(
            "skill.py",
            "import logging\nlogging.basicConfig(filename='x.log')\n",
        )],
        expect: None,
    },
    Case {
        name: "reading_is_read_only",
        class: "READ_ONLY",
        files: &[(
            "skill.py",
            "import pathlib\nfrom PIL import Image\n\nopen('p').read()\nopen('p', 'rb').read()\npathlib.Path('p').open('r').read()\nImage.open('x.png')\n",
        )],
        expect: None,
    },
];

const SECRETS: &[(&str, &str)] = &[
    ("aws_key", "KEY = 'AKIAIOSFODNN7EXAMPLQ'\n"),
    (
        "github_token",
        "TOKEN = 'ghp_aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5'\n",
    ),
    (
        "pem_key",
        "KEY = '''-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7VJTUt9Us8cKjMzEfYyjiWA4R4\n-----END RSA PRIVATE KEY-----'''\n",
    ),
    ("password", "password = \"correct-horse-battery\"\n"),
    ("slack", "HOOK = 'xoxb-2048-4096-aBcDeFgHiJkL'\n"),
    // Built from pieces (issue 52): no line holds the key, the program builds it whole.
    (
        "aws_key_concatenated",
        "KEY = 'AKIA' + 'IOSFODNN7EXAMPLQ'\n",
    ),
    (
        "aws_key_implicit",
        "KEY = ('AKIAIOSF'\n       'ODNN7EXAMPLQ')\n",
    ),
    (
        "aws_key_joined",
        "KEY = ''.join(['AKIA', 'IOSFODNN', '7EXAMPLQ'])\n",
    ),
    (
        "aws_key_fstring",
        "KEY = f'{HEAD}IOSFODNN7EXAMPLQ'\nHEAD = 'AK' + 'IA'\n",
    ),
    (
        "aws_key_formatted",
        "KEY = '%s%s' % ('AKIA', 'IOSFODNN') + '{}'.format('7EXAMPLQ')\n",
    ),
    (
        "password_split",
        "password = 'cor' + 'rect-horse-battery'\n",
    ),
    (
        "aws_key_indexed",
        "KEY = PARTS[0] + bytes.fromhex(PARTS[1]).decode()\nPARTS = ('AKIA', '494f53464f444e4e374558414d504c51')\n",
    ),
    ("github_token_repeated", "TOKEN = 'ghp_' + 'aB3d' * 9\n"),
];

/// The secret each SECRETS case must not print (the PEM key's body stands for it).
fn secret_value(name: &str) -> &'static str {
    match name {
        "aws_key" => "AKIAIOSFODNN7EXAMPLQ",
        "github_token" => "ghp_aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5",
        "pem_key" => "MIIEowIBAAKCAQEA7VJTUt9Us8cKjMzEfYyjiWA4R4",
        "password" => "correct-horse-battery",
        "slack" => "xoxb-2048-4096-aBcDeFgHiJkL",
        "aws_key_concatenated"
        | "aws_key_implicit"
        | "aws_key_joined"
        | "aws_key_fstring"
        | "aws_key_formatted"
        | "aws_key_indexed" => "AKIAIOSFODNN7EXAMPLQ",
        "github_token_repeated" => "ghp_aB3daB3daB3daB3daB3daB3daB3daB3daB3d",
        "password_split" => "correct-horse-battery",
        _ => unreachable!(),
    }
}

fn write_skill(root: &Path, name: &str, files: &[(&str, &str)]) {
    let folder = root.join("skills").join(name);
    std::fs::create_dir_all(&folder).unwrap();
    for (file, text) in files {
        std::fs::write(folder.join(file), text).unwrap();
    }
}

fn propose(root: &Path, name: &str, class: &str) {
    let proposal = root.join(format!("{name}.toml"));
    std::fs::write(
        &proposal,
        format!("name = \"{name}\"\ndescription = \"A case\"\nside_effect = \"{class}\"\ncommand = [\"python3\"]\ninput_schema = {{}}\noutput_schema = {{}}\n"),
    )
    .unwrap();
    let out = kavi(root, &["skill", "propose", &format!("{name}.toml")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A workspace with the shipped scanner and toolchains, and a gate set of one gate.
fn workspace(gate: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("pipelines")).unwrap();
    copy_policies(
        root,
        &[
            "classifier.toml",
            "scanner.toml",
            "trust.toml",
            "conventions.toml",
            "confinement.toml",
            "lifecycle.toml",
        ],
    );
    common::copy_gate_tools(root);
    std::fs::write(root.join("policies/scan.toml"), gate).unwrap();
    dir
}

/// Runs one gate node per skill; returns each node's gate result by skill name.
fn verify_each(root: &Path, names: &[&str]) -> Vec<serde_json::Value> {
    let mut pipeline = String::from("[pipeline]\nname = \"scan\"\n");
    for name in names {
        pipeline.push_str(&format!(
            "\n[nodes.{name}]\nkind = \"gate\"\nset = \"policies/scan.toml\"\nskill = \"{name}\"\nvars = {{ skill = \"{name}\" }}\non_failure = \"continue\"\n"
        ));
    }
    std::fs::write(root.join("pipelines/scan.toml"), pipeline).unwrap();
    let out = kavi(root, &["pipeline", "run", "scan", "--jobs", "2"]);
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(1),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = last_run(root);
    names
        .iter()
        .map(|name| node(&run, name)["outputs"]["gates"][0].clone())
        .collect()
}

/// A case as the test builds it: name, class, files, expected rule.
type Owned = (
    String,
    &'static str,
    Vec<(&'static str, &'static str)>,
    Option<&'static str>,
);

const POLICY_GATE: &str = "[[gate]]\nid = \"policy\"\nkind = \"policy_scan\"\ntoolchain = \"python\"\nrules = \"policies/scanner.toml\"\nfiles = [\"{{ paths.folder }}\"]\nfailure = \"VERIFY_POLICY\"\n";

/// The toolchain is provisioned from PyPI on first use; where that cannot happen, the test says
/// why and skips (under CI, which can, that fails).
fn toolchain_or_skip(root: &Path) -> bool {
    common::provisioned_or_skip(&kavi(root, &["toolchain", "install"]))
}

#[test]
fn every_disguise_of_a_forbidden_capability_is_found_in_every_file_and_clean_code_passes() {
    let dir = workspace(POLICY_GATE);
    let root = dir.path();
    if !toolchain_or_skip(root) {
        return;
    }
    let mut cases: Vec<Owned> = DISGUISES
        .iter()
        .map(|(name, class, skill, rule)| {
            (
                (*name).to_owned(),
                *class,
                vec![("skill.py", *skill)],
                Some(*rule),
            )
        })
        .collect();
    for case in OTHERS {
        cases.push((
            case.name.to_owned(),
            case.class,
            case.files.to_vec(),
            case.expect,
        ));
    }
    // The shipped examples, with their tests, as the forge builds them.
    for (example, class) in [
        ("word_count", "READ_ONLY"),
        ("find_notes", "READ_ONLY"),
        ("summarize_note", "READ_ONLY"),
        ("write_note", "FILE_WRITE"),
    ] {
        let folder = common::repo().join("builders/prepared").join(example);
        let files: Vec<(&str, &str)> = ["skill.py", "test_skill.py"]
            .into_iter()
            .map(|file| {
                let text = std::fs::read_to_string(folder.join(file)).unwrap();
                (file, &*Box::leak(text.into_boxed_str()))
            })
            .collect();
        cases.push((format!("example_{example}"), class, files, None));
    }
    for (name, class, files, _) in &cases {
        write_skill(root, name, files);
        if *class != "READ_ONLY" {
            propose(root, name, class);
        }
    }
    let names: Vec<&str> = cases.iter().map(|c| c.0.as_str()).collect();
    let results = verify_each(root, &names);
    let mut wrong = Vec::new();
    for ((name, _, _, expect), result) in cases.iter().zip(&results) {
        let detail = result["detail"].as_str().unwrap_or_default();
        let ok = match expect {
            None => result["status"] == "passed",
            Some(rule) => {
                // Code that does not parse fails the scan, named for its cause.
                let kind = if *rule == "syntax" {
                    "VERIFY_LINT"
                } else {
                    "VERIFY_POLICY"
                };
                result["status"] == "failed"
                    && result["failure_kind"] == kind
                    && detail.contains(&format!("[{rule}]"))
            }
        };
        if !ok {
            wrong.push(format!("{name}: expected {expect:?}, got {result}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // A finding names file, line and column.
    let star = &results[names.iter().position(|n| *n == "star_import").unwrap()];
    assert_eq!(
        star["detail"],
        "skills/star_import/skill.py:2:1: [process] starts a process: `os.system`"
    );
    let in_test = &results[names.iter().position(|n| *n == "in_test_file").unwrap()];
    assert!(
        in_test["detail"]
            .as_str()
            .unwrap()
            .contains("skills/in_test_file/test_skill.py:1:1: [process] starts a process: imports `subprocess`"),
        "{in_test}"
    );
    // The interpreter that parsed is recorded with the result.
    assert_eq!(star["tool"]["toolchain"], "python");
    assert_eq!(star["tool"]["tool"], "python");
}

#[test]
fn secrets_fail_as_verify_secret_and_the_value_is_printed_nowhere() {
    // Beside the secret scan, a gate that prints the skill's source, as a traceback would.
    let gate = "[[gate]]\nid = \"secrets\"\nkind = \"secret_scan\"\ntoolchain = \"secrets\"\nrules = \"policies/scanner.toml\"\nfiles = [\"{{ paths.folder }}\"]\nfailure = \"VERIFY_SECRET\"\n\n[[gate]]\nid = \"echo\"\nkind = \"command\"\ntoolchain = \"python\"\nrun = [\"python\", \"-c\", \"import sys; print(open(sys.argv[1]).read()); sys.exit(1)\", \"{{ paths.source }}\"]\nfailure = \"VERIFY_TEST\"\nrequired = false\n";
    let dir = workspace(gate);
    let root = dir.path();
    if !toolchain_or_skip(root) {
        return;
    }
    let mut names: Vec<&str> = SECRETS.iter().map(|(name, _)| *name).collect();
    for (name, text) in SECRETS {
        write_skill(
            root,
            name,
            &[("skill.py", text), ("README.md", "A skill.\n")],
        );
    }
    // detect-secrets finds what kavi's own rules do not know; its inline allowlist, a comment in
    // the code under review, does not silence it.
    write_skill(
        root,
        "keyword_allowlisted",
        &[(
            "skill.py",
            "db_pass = 'Zq8vLw2rTx5yNc7b'  # pragma: allowlist secret\n",
        )],
    );
    names.push("keyword_allowlisted");
    // A file whose built strings the analyser cannot follow (a sum too deep for its recursion)
    // hides the key it builds beside: it fails, named as unscanned.
    let deep = format!(
        "def pad() -> str:\n    return {}\n\n\nKEY = 'AKIA' + 'IOSFODNN7EXAMPLQ'\n",
        vec!["'a'"; 1000].join(" + ")
    );
    write_skill(root, "too_deep", &[("skill.py", &deep)]);
    names.push("too_deep");
    // A file in another encoding: no rule reads it as the skill does.
    write_skill(root, "utf16_readme", &[("skill.py", "NAME = 'x'\n")]);
    let utf16: Vec<u8> = "\u{feff}KEY = AKIAIOSFODNN7EXAMPLQ\n"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    std::fs::write(root.join("skills/utf16_readme/README.md"), utf16).unwrap();
    names.push("utf16_readme");
    write_skill(
        root,
        "clean",
        &[
            ("skill.py", "NAME = 'word_count'\n"),
            ("test_skill.py", "X = 1\n"),
        ],
    );
    names.push("clean");
    let results = verify_each(root, &names);
    for ((name, _), result) in SECRETS.iter().zip(&results) {
        assert_eq!(result["status"], "failed", "{name}: {result}");
        assert_eq!(result["failure_kind"], "VERIFY_SECRET", "{name}");
        let detail = result["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(&format!("skills/{name}/skill.py:1")),
            "{detail}"
        );
        assert!(
            !detail.contains(secret_value(name)),
            "{name} printed: {detail}"
        );
        assert!(
            !detail.contains(secret_value(name).get(..12).unwrap()),
            "{detail}"
        );
    }
    for (index, rule) in [
        (SECRETS.len() + 1, "[unscanned]"),
        (SECRETS.len() + 2, "[encoding]"),
    ] {
        let result = &results[index];
        assert_eq!(result["status"], "failed", "{result}");
        assert_eq!(result["failure_kind"], "VERIFY_SECRET", "{result}");
        assert!(
            result["detail"].as_str().unwrap().contains(rule),
            "{rule}: {result}"
        );
    }
    let allowlisted = &results[SECRETS.len()];
    assert_eq!(allowlisted["status"], "failed", "{allowlisted}");
    assert!(
        allowlisted["detail"]
            .as_str()
            .unwrap()
            .contains("[detect-secrets] Secret Keyword (redacted)"),
        "{allowlisted}"
    );
    assert_eq!(allowlisted["tool"]["tool"], "detect-secrets");
    assert_eq!(allowlisted["tool"]["version"], "1.5.0");
    assert_eq!(
        results[SECRETS.len() + 3]["status"],
        "passed",
        "{}",
        results[SECRETS.len() + 3]
    );
    // Nor by another gate, nor by the run's own output.
    let run = last_run(root);
    for (name, text) in SECRETS {
        let echo = &node(&run, name)["outputs"]["gates"][1];
        assert_eq!(echo["gate"], "echo");
        let detail = echo["detail"].as_str().unwrap();
        // A key built from pieces prints as its pieces; one written whole is redacted.
        if text.contains(secret_value(name)) {
            assert!(detail.contains("[redacted]"), "{name}: {detail}");
        }
        assert!(!detail.contains(secret_value(name)), "{name}: {detail}");
    }
    let shown = kavi(root, &["runs", "show", "latest"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    for (name, _) in SECRETS {
        assert!(!text.contains(secret_value(name)), "{name}");
    }
}

/// What a gate prints is redacted as it is printed, not only once it is kept: the live log of a
/// gate node still running (what `kavi runs logs -f` and the review page follow) never shows a
/// secret the scan found in the code, though a gate tool quotes the line that holds it.
#[test]
fn a_running_gates_live_log_is_redacted_of_the_secrets_in_the_code() {
    // The second gate quotes the skill's source, as a tool quoting the line it reports does,
    // then goes on running until the test has read its live log.
    let gate = "[[gate]]\nid = \"secrets\"\nkind = \"secret_scan\"\ntoolchain = \"secrets\"\nrules = \"policies/scanner.toml\"\nfiles = [\"{{ paths.folder }}\"]\nfailure = \"VERIFY_SECRET\"\n\n[[gate]]\nid = \"quote\"\nkind = \"command\"\ntoolchain = \"python\"\nrun = [\"python\", \"-c\", \"import sys, time; print(open(sys.argv[1]).read()); print('quoted', flush=True); time.sleep(600)\", \"{{ paths.source }}\"]\nfailure = \"VERIFY_TEST\"\nrequired = false\n";
    let dir = workspace(gate);
    let root = dir.path();
    if !toolchain_or_skip(root) {
        return;
    }
    write_skill(root, "aws_key", &[("skill.py", SECRETS[0].1)]);
    std::fs::write(
        root.join("pipelines/scan.toml"),
        "[pipeline]\nname = \"scan\"\n\n[nodes.aws_key]\nkind = \"gate\"\nset = \"policies/scan.toml\"\nskill = \"aws_key\"\nvars = { skill = \"aws_key\" }\n",
    )
    .unwrap();
    let mut run = common::kavi_command(root, &["pipeline", "run", "scan"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let live = loop {
        let so_far = kavi(root, &["runs", "logs", "1", "aws_key"]);
        let text = String::from_utf8_lossy(&so_far.stdout).into_owned();
        if text.contains("quoted") {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline && run.try_wait().unwrap().is_none(),
            "the gate never quoted the source while it ran: {so_far:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    // Read while the gate still runs: the run has not ended.
    assert!(run.try_wait().unwrap().is_none());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    run.wait().unwrap();
    assert!(live.contains("KEY = '[redacted]'"), "{live}");
    assert!(!live.contains(secret_value("aws_key")), "{live}");
}

/// A key built from pieces is in no line of the source, but a gate that runs the code prints it
/// whole (a test's assertion, a log line): the secret scan's fold finds it, and every gate's
/// detail is redacted of it.
#[test]
fn a_key_built_from_pieces_is_redacted_from_what_other_gates_print() {
    let gate = "[[gate]]\nid = \"secrets\"\nkind = \"secret_scan\"\ntoolchain = \"secrets\"\nrules = \"policies/scanner.toml\"\nfiles = [\"{{ paths.folder }}\"]\nfailure = \"VERIFY_SECRET\"\n\n[[gate]]\nid = \"run\"\nkind = \"command\"\ntoolchain = \"python\"\nrun = [\"python\", \"-c\", \"import runpy, sys; print(runpy.run_path(sys.argv[1])['KEY']); sys.exit(1)\", \"{{ paths.source }}\"]\nfailure = \"VERIFY_TEST\"\nrequired = false\n";
    let dir = workspace(gate);
    let root = dir.path();
    if !toolchain_or_skip(root) {
        return;
    }
    write_skill(
        root,
        "built",
        &[(
            "skill.py",
            "PARTS = ['AKIA', 'IOSFODNN', '7EXAMPLQ']\nKEY = ''.join(PARTS)\n",
        )],
    );
    let results = verify_each(root, &["built"]);
    assert_eq!(results[0]["status"], "failed", "{}", results[0]);
    assert_eq!(
        results[0]["detail"],
        "skills/built/skill.py:2:7: [aws-access-key] an AWS access key id (20 characters, \
         redacted), built from pieces"
    );
    let run = last_run(root);
    let printed = &node(&run, "built")["outputs"]["gates"][1];
    assert_eq!(printed["gate"], "run");
    let detail = printed["detail"].as_str().unwrap();
    assert!(!detail.contains("AKIAIOSFODNN7EXAMPLQ"), "{detail}");
    assert!(detail.contains("[redacted]"), "{detail}");
}

#[test]
fn an_analyser_that_cannot_run_is_an_error_never_a_pass() {
    let dir = workspace(POLICY_GATE);
    let root = dir.path();
    write_skill(root, "demo", &[("skill.py", "X = 1\n")]);
    // An interpreter that is not there: the toolchain cannot be provisioned.
    let toolchains = root.join("policies/toolchains.toml");
    let text = std::fs::read_to_string(&toolchains).unwrap();
    std::fs::write(
        &toolchains,
        text.replacen(
            "interpreter = \"python3\"",
            "interpreter = \"/nonexistent/python3\"",
            1,
        ),
    )
    .unwrap();
    let results = verify_each(root, &["demo"]);
    assert_eq!(results[0]["status"], "error", "{}", results[0]);
    assert!(
        results[0]["detail"]
            .as_str()
            .unwrap()
            .contains("could not provision toolchain `python`"),
        "{}",
        results[0]
    );
    // A policy_scan gate without a toolchain is refused before anything runs.
    std::fs::write(
        root.join("policies/scan.toml"),
        POLICY_GATE.replace("toolchain = \"python\"\n", ""),
    )
    .unwrap();
    let out = kavi(root, &["pipeline", "check", "scan"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("a policy_scan gate needs `toolchain`"),
        "{stderr}"
    );
}
