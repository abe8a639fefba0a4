"""Write a markdown note into the notes folder (KAVI_NOTES_DIR, default ./notes)."""

import json
import os
import pathlib
import re
import sys
from typing import Any

SIDE_EFFECT = "FILE_WRITE"


def slug(title: str) -> str:
    words = re.findall(r"[a-z0-9]+", title.lower())
    return "-".join(words)[:80] or "note"


def run(data: dict[str, Any], notes_dir: str | None = None) -> dict[str, str]:
    title = str(data["title"]).strip()
    if not title:
        raise ValueError("the title is empty")
    folder = pathlib.Path(notes_dir or os.environ.get("KAVI_NOTES_DIR", "notes"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (slug(title) + ".md")
    body = str(data["body"]).rstrip()
    path.write_text("# " + title + "\n\n" + body + "\n", encoding="utf-8")
    return {"path": str(path)}


if __name__ == "__main__":
    json.dump(run(json.load(sys.stdin)), sys.stdout)
