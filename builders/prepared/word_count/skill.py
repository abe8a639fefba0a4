"""Count the words, lines and characters of a text."""

import json
import sys
from typing import Any

SIDE_EFFECT = "READ_ONLY"


def run(data: dict[str, Any]) -> dict[str, int]:
    text = str(data["text"])
    return {
        "words": len(text.split()),
        "lines": len(text.splitlines()),
        "characters": len(text),
    }


if __name__ == "__main__":
    json.dump(run(json.load(sys.stdin)), sys.stdout)
