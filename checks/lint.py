#!/usr/bin/env python3
"""The lint gate of the shipped gate set: unused imports (what ruff reports as F401).

Standard library only, so the forge verifies skills on a fresh machine with nothing but python3.
Where ruff is installed, a team may declare `ruff check` as the gate in policies/gates.toml
instead; this is the smallest real check, not a stand-in that always passes.

Usage: lint.py FILE...   Prints `file:line: F401 ...` per finding; exits 1 if any.
"""

import ast
import sys


def imported_names(tree):
    """Every name an import statement binds, with its line and what it imports."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield (alias.asname or alias.name.split(".")[0]), node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    yield alias.asname or alias.name, node.lineno, f"{node.module}.{alias.name}"


def used_names(tree):
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    # Names listed in __all__ are exported, which is a use.
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            if isinstance(node.value, (ast.List, ast.Tuple)):
                used |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return used


def lint(path):
    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read(), path)
    used = used_names(tree)
    return [
        f"{path}:{line}: F401 `{what}` imported but unused"
        for name, line, what in imported_names(tree)
        if name not in used
    ]


def main(paths):
    findings = []
    for path in paths:
        try:
            findings.extend(lint(path))
        except (OSError, SyntaxError) as error:
            findings.append(f"{path}: cannot lint: {error}")
    for finding in findings:
        print(finding)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
