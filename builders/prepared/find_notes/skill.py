"""Find the markdown notes whose lines mention a query (case-insensitive)."""

import json
import pathlib
import sys

SIDE_EFFECT = "READ_ONLY"


def inside(folder):
    """The folder, refused when it could leave the current one."""
    path = pathlib.PurePosixPath(folder)
    if path.is_absolute() or ".." in path.parts:
        raise ValueError(f"the folder must stay inside the workspace: {folder}")
    return pathlib.Path(path)


def run(data):
    query = data["query"].lower()
    folder = inside(data.get("folder", "notes"))
    results = []
    for note in sorted(folder.glob("*.md")):
        for number, text in enumerate(note.read_text(encoding="utf-8").splitlines(), start=1):
            if query in text.lower():
                results.append({"path": note.as_posix(), "line": number, "text": text})
    return {"results": results}


if __name__ == "__main__":
    json.dump(run(json.load(sys.stdin)), sys.stdout)
