#!/usr/bin/env python3
"""Concurrent runs on one ledger (issue 56): 1, 2, 4 and 8 runs at once of a 200-node pipeline
whose nodes each take 20 ms (`sleep 0.02`), on a SQLite file and on one PostgreSQL server.

The pipeline is four chains of 50 nodes (`--jobs 4`): one run lasts at least 50 x 20 ms = 1 s.
Every run is its own `kavi pipeline run` process, started at the same moment, each in a
workspace of its own for SQLite (one file per workspace, as a team without a server has it) and
all in one database for PostgreSQL (started with tests/postgres/server.sh, as the tests do).
Printed per backend and count: the wall time until the last run ended (median of ROUNDS), its
ratio to one run's, node records per second (runs x 200 / wall time), how busy the machine's
CPUs were meanwhile (all processes, this machine's other users included), and for PostgreSQL
the share of the server's active kavi sessions found waiting for a lock (pg_stat_activity and
pg_locks, sampled every 20 ms by one psql), split by lock: the write lock (kavi's advisory lock
"kavi"), the journal lock ("kjnl", taken at commit for the journal's entries) and any other
(rows, tables): whether the runs wait on the ledger, on which lock, or on the CPUs.

    benches/team.py target/debug/kavi            # ROUNDS=3 by default
    ROUNDS=5 benches/team.py target/dist/kavi
"""
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Beside the server tests/postgres/server.sh starts (Debian's packages).
PSQL = (sorted(glob.glob("/usr/lib/postgresql/*/bin/psql")) or ["psql"])[-1]
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


def cpu_times():
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


# Per sample: sessions waiting for the write lock, for the journal lock, for any other lock,
# and active sessions. An advisory lock of a key under 2^32 is (classid 0, objid key).
LOCK_SAMPLE = """SELECT count(*) FILTER (WHERE l.objid = x'6b617669'::int::oid),
       count(*) FILTER (WHERE l.objid = x'6b6a6e6c'::int::oid),
       count(*) FILTER (WHERE a.wait_event_type = 'Lock' AND l.objid IS DISTINCT FROM
                              x'6b617669'::int::oid AND l.objid IS DISTINCT FROM
                              x'6b6a6e6c'::int::oid),
       count(*) FILTER (WHERE a.state = 'active')
FROM pg_stat_activity a
LEFT JOIN pg_locks l ON l.pid = a.pid AND NOT l.granted AND l.locktype = 'advisory'
WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()
\\watch 0.02
"""


def lock_sampler(ledger):
    """A psql that samples the server's sessions until it is ended (see `lock_share`)."""
    psql = subprocess.Popen(
        [PSQL, "-X", "-q", "-A", "-t", "-F", ",", ledger],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    psql.stdin.write(LOCK_SAMPLE)
    psql.stdin.flush()
    return psql


def lock_share(psql):
    """Of the sampled active sessions, the shares waiting for the write lock, the journal lock
    and any other lock."""
    psql.terminate()
    out, _ = psql.communicate()
    sums = [0, 0, 0, 0]
    for line in out.splitlines():
        parts = line.split(",")
        if len(parts) == 4 and all(p.isdigit() for p in parts):
            sums = [total + int(part) for total, part in zip(sums, parts)]
    active = sums[3]
    return tuple(waiting / active if active else 0.0 for waiting in sums[:3])


def wave(kavi, roots, ledger):
    """The wall time of one wave, the CPUs' busy share meanwhile, and (PostgreSQL) the share
    of active sessions waiting for a lock."""
    env = dict(os.environ)
    if ledger:
        env["KAVI_LEDGER"] = ledger
    sampler = lock_sampler(ledger) if ledger else None
    busy, total = cpu_times()
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
    wall = time.monotonic() - started
    busy_after, total_after = cpu_times()
    cpu = (busy_after - busy) / max(total_after - total, 1)
    return wall, cpu, lock_share(sampler) if sampler else None


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
            # Not timed: the server's first run makes the ledger's schema.
            wave(kavi, [workspace(parent)], ledger)
            one = None
            for count in COUNTS:
                waves = []
                for _ in range(rounds):
                    roots = [workspace(parent) for _ in range(count)]
                    if ledger:
                        # One workspace folder is enough: they share the server's ledger.
                        roots = [roots[0]] * count
                    waves.append(wave(kavi, roots, ledger))
                # The median wave by wall time, with its own CPU and lock figures.
                wall, cpu, locks = sorted(waves)[len(waves) // 2]
                one = one or wall
                waiting = (
                    ", sessions waiting for the write lock {:.0%}, the journal lock {:.0%}, "
                    "another lock {:.0%}".format(*locks)
                    if ledger
                    else ""
                )
                print(
                    f"{backend:8} {count} run(s) at once: {wall:6.2f} s "
                    f"({wall / one:4.2f} x one run), "
                    f"{count * NODES / wall:6.0f} node records/s, "
                    f"CPUs {cpu:4.0%} busy{waiting}",
                    flush=True,
                )


main()
