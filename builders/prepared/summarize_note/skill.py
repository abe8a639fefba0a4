"""Summarize one markdown note: its title (the first heading) and how long it is."""

import json
import pathlib
import sys
from typing import Any

SIDE_EFFECT = "READ_ONLY"


def run(data: dict[str, Any]) -> dict[str, Any]:
    path = pathlib.PurePosixPath(str(data["path"]))
    if path.is_absolute() or ".." in path.parts:
        raise ValueError(f"the note must be inside the workspace: {data['path']}")
    text = pathlib.Path(path).read_text(encoding="utf-8")
    lines = text.splitlines()
    headings = (line.lstrip("#").strip() for line in lines if line.startswith("#"))
    return {
        "path": path.as_posix(),
        "title": next(headings, ""),
        "words": len(text.split()),
        "lines": len(lines),
    }


if __name__ == "__main__":
    json.dump(run(json.load(sys.stdin)), sys.stdout)
