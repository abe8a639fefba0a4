"""Checks an Argo Workflows manifest against Argo's published schema for `Workflow`.

The schema comes as the pydantic models hera generates from it (hera 7.1.0: Argo Workflows'
JSON Schema of v4.0.5, named in the models' header), installed from PyPI by the test. The models
ignore keys they do not know and coerce types (a "30" for an integer), so the manifest is also
compared with what the models make of it: any key dropped or value changed is an error. Then
the references the schema cannot check: every task's template, every name in `depends`, the
entrypoint and the exit handler exist.

Usage: validate.py MANIFEST.json; prints `valid` and exits 0, or prints each problem and exits 1.
"""

import json
import re
import sys

from hera.workflows.models import Workflow


def differences(given, parsed, path):
    if isinstance(given, dict) and isinstance(parsed, dict):
        for key, value in given.items():
            if key not in parsed:
                yield f"{path}.{key}: not a field of the schema"
            else:
                yield from differences(value, parsed[key], f"{path}.{key}")
    elif isinstance(given, list) and isinstance(parsed, list) and len(given) == len(parsed):
        for i, (a, b) in enumerate(zip(given, parsed)):
            yield from differences(a, b, f"{path}[{i}]")
    elif given != parsed or type(given) is not type(parsed):
        yield f"{path}: {given!r} is read as {parsed!r}"


def references(doc):
    templates = {t["name"]: t for t in doc["spec"]["templates"]}
    for field in ("entrypoint", "onExit"):
        name = doc["spec"].get(field)
        if name is not None and name not in templates:
            yield f"spec.{field}: no template `{name}`"
    for template in templates.values():
        tasks = template.get("dag", {}).get("tasks", [])
        names = {task["name"] for task in tasks}
        for task in tasks:
            if task["template"] not in templates:
                yield f"task `{task['name']}`: no template `{task['template']}`"
            for dep in re.findall(r"[A-Za-z0-9-]+(?=\.|\b)", task.get("depends", "")):
                if dep not in names and dep not in ("Succeeded", "Failed", "Errored", "Skipped", "Omitted", "Daemoned", "AnySucceeded", "AllFailed"):
                    yield f"task `{task['name']}`: depends on no task `{dep}`"


def main():
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    parsed = Workflow.model_validate(doc).model_dump(by_alias=True, exclude_unset=True, mode="json")
    problems = list(differences(doc, parsed, "")) + list(references(doc))
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(1)
    print("valid")


if __name__ == "__main__":
    main()
