#!/usr/bin/env python3
"""Concurrent runs on one ledger (issue 56): 1, 2, 4 and 8 runs at once of a 200-node pipeline
whose nodes each take 20 ms (`sleep 0.02`), on a SQLite file and on one PostgreSQL server.

The pipeline is four chains of 50 nodes (`--jobs 4`): one run lasts at least 50 x 20 ms = 1 s.
Every run is its own `kavi pipeline run` process, started at the same moment, each in a
workspace of its own for SQLite (one file per workspace, as a team without a server has it) and
all in one database for PostgreSQL (started with tests/postgres/server.sh, as the tests do).
Printed per backend and count: the wall time until the last run ended (median of ROUNDS), its
ratio to one run's, and node records per second (runs x 200 / wall time).

    benches/team.py target/debug/kavi            # ROUNDS=3 by default
    ROUNDS=5 benches/team.py target/dist/kavi
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NODES, LANES, COUNTS = 200, 4, (1, 2, 4, 8)


def pipeline():
    text = '[pipeline]\nname = "team"\n'
    per_lane = NODES // LANES
    for i in range(NODES):
        text += f'\n[nodes.n{i}]\nkind = "exec"\nrun = ["sleep", "0.02"]\n'
        if i % per_lane:
            text += f'needs = ["n{i - 1}"]\n'
    return text


def workspace(parent):
    root = Path(tempfile.mkdtemp(dir=parent))
    (root / "pipelines").mkdir()
    (root / "kavi.toml").write_text("# a workspace\n")
    (root / "pipelines/team.toml").write_text(pipeline())
    return root


def wave(kavi, roots, ledger):
    env = dict(os.environ)
    if ledger:
        env["KAVI_LEDGER"] = ledger
    started = time.monotonic()
    runs = [
        subprocess.Popen(
            [kavi, "pipeline", "run", "team", "--jobs", str(LANES), "-q"],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for root in roots
    ]
    for run in runs:
        _, err = run.communicate()
        if run.returncode != 0:
            sys.exit(f"a run failed ({run.returncode}): {err.decode()}")
    return time.monotonic() - started


def server():
    # Not inside another private folder: as root, the server runs as `nobody`, which must
    # reach it. server.sh removes it once this script has ended.
    folder = tempfile.mkdtemp(prefix="kavi-bench-postgres")
    url = subprocess.run(
        ["bash", REPO / "tests/postgres/server.sh", folder, str(os.getpid())],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return url + "/postgres"


def main():
    kavi = str(Path(sys.argv[1]).resolve())
    rounds = int(os.environ.get("ROUNDS", "3"))
    with tempfile.TemporaryDirectory() as parent:
        for backend in ("sqlite", "postgres"):
            ledger = server() if backend == "postgres" else None
            one = None
            for count in COUNTS:
                walls = []
                for _ in range(rounds):
                    roots = [workspace(parent) for _ in range(count)]
                    if ledger:
                        # One workspace folder is enough: they share the server's ledger.
                        roots = [roots[0]] * count
                    walls.append(wave(kavi, roots, ledger))
                wall = statistics.median(walls)
                one = one or wall
                print(
                    f"{backend:8} {count} run(s) at once: {wall:6.2f} s "
                    f"({wall / one:4.2f} x one run), "
                    f"{count * NODES / wall:6.0f} node records/s",
                    flush=True,
                )


main()
