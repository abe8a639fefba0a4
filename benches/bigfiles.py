#!/usr/bin/env python3
"""Real work's large files in the node cache, measured as benches/HISTORY.md reports them.

Each measured command is one kavi process: its wall time, and its peak memory (the largest
resident set of the commands it waited for, kavi itself here, from getrusage).

    output    a node writes 1 GiB of random bytes (`dd`), declared as its output: the first run
              (storing it), `dd` alone for reference, a cached run after the output was deleted
              (putting it back), and `kavi artifact cat` of it (to /dev/null)
    beside    a node whose key hashes a 4 GiB sparse input, next to one printing 1 MiB, `--jobs
              4`: when the printing node ended and the hashing one started, after the run began
    unchanged the same pipeline twice on a fresh ledger, its 4 GiB input settled and unchanged:
              the first run reads it, the second takes its digest from the memo

    benches/bigfiles.py [KAVI] [ROUNDS]     # default target/dist/kavi, 3 rounds
"""
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

OUTPUT = """[pipeline]
name = "bigout"

[nodes.model]
kind = "exec"
run = ["dd", "if=/dev/urandom", "of=out/model.bin", "bs=1M", "count=1024", "status=none"]
inputs = ["data/seed.txt"]
outputs = ["out/model.bin"]
"""

BESIDE = """[pipeline]
name = "beside"

[nodes.hashed]
kind = "exec"
run = ["true"]
inputs = ["data/big.bin"]

[nodes.quick]
kind = "exec"
shell = "yes | head -c 1048576"
"""


def measured(command, cwd, keep=False):
    """Runs `command` under a wrapper of its own, so that the peak is the command's alone:
    (wall seconds, peak KB, its stdout when `keep`, else it goes to /dev/null)."""
    wrapper = (
        "import resource, subprocess, sys, time\n"
        "keep = sys.argv[1] == 'keep'\n"
        "start = time.perf_counter()\n"
        "done = subprocess.run(sys.argv[2:], check=True,\n"
        "                      stdout=subprocess.PIPE if keep else subprocess.DEVNULL)\n"
        "wall = time.perf_counter() - start\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "sys.stderr.write(f'{wall} {peak}\\n')\n"
        "sys.stdout.buffer.write(done.stdout or b'')\n"
    )
    done = subprocess.run([sys.executable, "-c", wrapper, "keep" if keep else "drop", *command],
                          cwd=cwd, capture_output=True, check=True)
    wall, peak = done.stderr.decode().split()[-2:]
    return float(wall), int(peak), done.stdout


def workspace(root, pipeline):
    os.makedirs(f"{root}/pipelines")
    os.makedirs(f"{root}/data")
    os.makedirs(f"{root}/out")
    with open(f"{root}/pipelines/p.toml", "w") as f:
        f.write(pipeline)
    with open(f"{root}/data/seed.txt", "w") as f:
        f.write("1\n")


def output(kavi, rounds, scratch):
    root = f"{scratch}/output"
    workspace(root, OUTPUT)
    for _ in range(rounds):
        shutil.rmtree(f"{root}/.kavi", ignore_errors=True)
        wall, peak, _ = measured([kavi, "pipeline", "run", "p.toml"], root)
        print(f"output   first run            {wall:6.2f} s  {peak:9,d} KB")
        alone, _, _ = measured(["dd", "if=/dev/urandom", f"of={root}/dd.bin", "bs=1M",
                                "count=1024", "status=none"], root)
        os.remove(f"{root}/dd.bin")
        print(f"output   dd alone             {alone:6.2f} s")
        os.remove(f"{root}/out/model.bin")
        wall, peak, _ = measured([kavi, "pipeline", "run", "p.toml"], root)
        print(f"output   cached, put back     {wall:6.2f} s  {peak:9,d} KB")
        digest = subprocess.run(["sha256sum", f"{root}/out/model.bin"], capture_output=True,
                                check=True, text=True).stdout.split()[0]
        wall, peak, _ = measured([kavi, "artifact", "cat", digest], root)
        print(f"output   artifact cat         {wall:6.2f} s  {peak:9,d} KB")


def beside(kavi, rounds, scratch):
    root = f"{scratch}/beside"
    workspace(root, BESIDE)
    with open(f"{root}/data/big.bin", "wb") as f:
        f.truncate(4 << 30)

    def at(text):
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))

    for _ in range(rounds):
        shutil.rmtree(f"{root}/.kavi", ignore_errors=True)
        _, _, out = measured([kavi, "pipeline", "run", "p.toml", "--json", "--jobs", "4"], root,
                             keep=True)
        run = json.loads(out)
        nodes = {n["node_id"]: n for n in run["nodes"]}
        began = at(run["started_at"])
        ended = (at(nodes["quick"]["finished_at"]) - began).total_seconds() * 1e3
        hashed = (at(nodes["hashed"]["started_at"]) - began).total_seconds() * 1e3
        print(f"beside   printing node ended {ended:7.0f} ms, hashing node started "
              f"{hashed:7.0f} ms after the run began")


def unchanged(kavi, rounds, scratch):
    root = f"{scratch}/unchanged"
    workspace(root, BESIDE)
    with open(f"{root}/data/big.bin", "wb") as f:
        f.truncate(4 << 30)
    # A file changed under 2 s ago is read on every run (src/cache/digests.rs): let it settle.
    time.sleep(2.1)
    for _ in range(rounds):
        shutil.rmtree(f"{root}/.kavi", ignore_errors=True)
        first, _, _ = measured([kavi, "pipeline", "run", "p.toml"], root)
        again, _, _ = measured([kavi, "pipeline", "run", "p.toml"], root)
        print(f"unchanged first run {first:6.2f} s, next run {again:6.2f} s")


def main():
    kavi = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else "target/dist/kavi")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    if not os.access(kavi, os.X_OK):
        sys.exit(f"bigfiles: no kavi at {kavi} (cargo build --profile dist)")
    missing = [tool for tool in ("dd", "sha256sum", "yes", "head") if not shutil.which(tool)]
    if missing:
        sys.exit(f"bigfiles: missing {' '.join(missing)} (Debian: apt-get install coreutils)")
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as scratch:
        output(kavi, rounds, scratch)
        beside(kavi, rounds, scratch)
        unchanged(kavi, rounds, scratch)


main()
