"""Find the markdown notes whose lines mention a query (case-insensitive)."""

import json
import pathlib
import sys
from typing import Any

SIDE_EFFECT = "READ_ONLY"


def inside(folder: str) -> pathlib.Path:
    """The folder, refused when it could leave the current one."""
    path = pathlib.PurePosixPath(folder)
    if path.is_absolute() or ".." in path.parts:
        raise ValueError(f"the folder must stay inside the workspace: {folder}")
    return pathlib.Path(path)


def run(data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    query = str(data["query"]).lower()
    folder = inside(str(data.get("folder", "notes")))
    results: list[dict[str, Any]] = []
    for note in sorted(folder.glob("*.md")):
        lines = note.read_text(encoding="utf-8").splitlines()
        for number, text in enumerate(lines, start=1):
            if query in text.lower():
                results.append({"path": note.as_posix(), "line": number, "text": text})
    return {"results": results}


if __name__ == "__main__":
    json.dump(run(json.load(sys.stdin)), sys.stdout)
