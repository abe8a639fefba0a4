"""Drives `kavi chat` on a terminal (a pseudo-terminal), as a person at a keyboard would.

Usage: terminal.py KAVI WORKSPACE

Types part of a message and presses Ctrl-C (the line must be cleared, nothing run); counts
words; asks to write a note titled `block`, confirms (its file, `notes/block.md`, is a FIFO
nobody reads, so the run hangs) and presses Ctrl-C during the run (that run must be cancelled,
the session must go on); counts words again;
presses Ctrl-D (the chat must end). Prints one JSON object: the exit status and the transcript.
"""

import json
import os
import pty
import select
import sys
import time

kavi, workspace = sys.argv[1:3]
pid, fd = pty.fork()
if pid == 0:
    os.chdir(workspace)
    os.execv(kavi, [kavi, "chat"])

transcript = b""
# Where the last token awaited ended: the next one is looked for after it.
seen = 0


def read_until(token, seconds=60):
    """Reads the terminal until `token` shows after the last token awaited."""
    global transcript, seen
    deadline = time.monotonic() + seconds
    while token not in transcript[seen:]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SystemExit(f"no {token!r} on the terminal after: {transcript!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                transcript += os.read(fd, 4096)
            except OSError:
                raise SystemExit(f"the chat ended early: {transcript!r}")
    seen = transcript.index(token, seen) + len(token)


read_until(b"> ")
os.write(fd, b"summarize notes/kavi")
time.sleep(0.5)
os.write(fd, b"\x03")
read_until(b"> ")
os.write(fd, b"count words in one two\r")
read_until(b'"words":2')
read_until(b"> ")
os.write(fd, b"write a note titled block saying never written\r")
read_until(b"yes/no> ")
os.write(fd, b"yes\r")
# An answer shows once its run ends: this one's never would.
time.sleep(3)
os.write(fd, b"\x03")
read_until(b"> ")
os.write(fd, b"count words in still here\r")
read_until(b'"words":2')
read_until(b"> ")
os.write(fd, b"\x04")
_, status = os.waitpid(pid, 0)
try:
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        transcript += chunk
except OSError:
    pass
print(json.dumps({"exit": os.waitstatus_to_exitcode(status), "transcript": transcript.decode("utf-8", "replace")}))
