#!/usr/bin/env python3
"""An offline stand-in for a coding agent.

kavi runs it like any builder: in the sandbox (a copy of the workspace, its working folder),
with the build packet on stdin. It writes the prepared files of the skill named by KAVI_SKILL
(from the sandbox's builders/prepared/<skill>/) into skills/<skill>/, so the forge runs end to
end on a machine with no agent and no network. It is never told where the workspace is.

KAVI_SCRIPTED_FLAWS injects one flaw on a given attempt, for drills: "1=policy,2=test".
    syntax  the skill does not parse                          (lint gate: ruff)
    lint    the skill imports a module it never uses          (lint gate: ruff F401)
    type    a helper returns its str argument, declaring int  (types gate: mypy --strict)
    test    a unit test expects the wrong value               (tests gate: pytest)
    policy  the skill imports a forbidden module              (policy gate)
    escape  a test reads /etc/shadow                          (tests gate: a tripwire)
    scope   a file outside the allowlist is written    (diff gate)
    link    an allowed path is a symlink out of the tree (diff gate)
    fail    the builder exits 1 without writing        (build error)
"""

import os
import pathlib
import shutil
import sys


def flaw_for(attempt):
    for item in os.environ.get("KAVI_SCRIPTED_FLAWS", "").split(","):
        number, _, flaw = item.strip().partition("=")
        if number == str(attempt):
            return flaw
    return None


def main():
    packet = sys.stdin.read()
    skill = os.environ["KAVI_SKILL"]
    attempt = int(os.environ.get("KAVI_ATTEMPT", "1"))
    prepared = pathlib.Path("builders") / "prepared" / skill
    if not prepared.is_dir():
        print(f"scripted builder: nothing prepared for `{skill}` in {prepared}", file=sys.stderr)
        return 1
    flaw = flaw_for(attempt)
    print(f"scripted builder: `{skill}`, attempt {attempt}, packet of {len(packet)} characters"
          + (f", injecting flaw `{flaw}`" if flaw else ""))
    if flaw == "fail":
        print("scripted builder: failing as asked", file=sys.stderr)
        return 1

    target = pathlib.Path("skills") / skill
    target.mkdir(parents=True, exist_ok=True)
    for source in sorted(prepared.iterdir()):
        shutil.copyfile(source, target / source.name)
        print(f"wrote {target / source.name}")

    skill_file = target / "skill.py"
    test_file = target / "test_skill.py"
    if flaw == "syntax":
        skill_file.write_text(skill_file.read_text() + "\ndef broken(:\n    pass\n")
    elif flaw == "lint":
        skill_file.write_text(skill_file.read_text().replace("import json\n", "import json\nimport textwrap\n", 1))
    elif flaw == "type":
        skill_file.write_text(
            skill_file.read_text() + "\n\ndef _word_total(text: str) -> int:\n    return text.strip()\n"
        )
    elif flaw == "test":
        test_file.write_text(test_file.read_text().replace("assertEqual(", "assertNotEqual(", 1))
    elif flaw == "policy":
        skill_file.write_text(skill_file.read_text().replace("import json\n", "import json\nimport subprocess\n", 1))
    elif flaw == "escape":
        # A test that reaches for the machine's password hashes while the gates run it.
        test_file.write_text(
            "import pathlib\n" + test_file.read_text()
            + "\n\ndef test_key() -> None:\n"
            + "    pathlib.Path('/etc/shadow').read_bytes()\n"
        )
    elif flaw == "scope":
        pathlib.Path("notes.txt").write_text("written outside the allowlist\n")
    elif flaw == "link":
        (target / "README.md").symlink_to("/etc/passwd")
    elif flaw:
        print(f"scripted builder: unknown flaw `{flaw}`", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
