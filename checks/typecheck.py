#!/usr/bin/env python3
"""The type gate of the shipped gate set: a small stand-in for mypy.

It checks what can be decided from literals alone: a function annotated `-> int` (or str, float,
bool, dict, list, None) that returns a literal of another type. Standard library only, so the
forge runs on a fresh machine; where mypy is installed, declare `mypy --strict` as the gate in
policies/gates.toml for the full check.

Usage: typecheck.py FILE...   Prints `file:line: error: ...` per finding; exits 1 if any.
"""

import ast
import sys

LITERAL_TYPES = {
    ast.Dict: "dict",
    ast.List: "list",
    ast.JoinedStr: "str",
}

# What each annotation accepts, as mypy does (an int is a float; a bool is an int).
ACCEPTS = {
    "int": {"int", "bool"},
    "float": {"float", "int", "bool"},
    "str": {"str"},
    "bool": {"bool"},
    "dict": {"dict"},
    "list": {"list"},
    "None": {"None"},
}


def literal_type(node):
    if isinstance(node, ast.Constant):
        return "None" if node.value is None else type(node.value).__name__
    return LITERAL_TYPES.get(type(node))


def annotation_name(node):
    if isinstance(node, ast.Name) and node.id in ACCEPTS:
        return node.id
    if isinstance(node, ast.Constant) and node.value is None:
        return "None"
    return None


def returns_of(function):
    """The return statements of `function` itself, not of functions nested in it."""
    stack = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def check(path):
    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read(), path)
    findings = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        declared = annotation_name(function.returns) if function.returns else None
        if declared is None:
            continue
        for ret in returns_of(function):
            found = literal_type(ret.value) if ret.value is not None else "None"
            if found is not None and found not in ACCEPTS[declared]:
                findings.append(
                    f"{path}:{ret.lineno}: error: `{function.name}` returns {found} "
                    f"where `-> {declared}` is declared"
                )
    return findings


def main(paths):
    findings = []
    for path in paths:
        try:
            findings.extend(check(path))
        except (OSError, SyntaxError) as error:
            findings.append(f"{path}: cannot check: {error}")
    for finding in findings:
        print(finding)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
