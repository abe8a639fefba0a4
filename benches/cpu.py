#!/usr/bin/env python3
"""kavi's own CPU on one of bench.sh's graphs, two or more builds in turn: what a run costs
beside its nodes, which wall-time rounds cannot show on a machine shared with other work.

Each round runs every build once (the order reversed every other round), each on a fresh
ledger, with `RUST_LOG=kavi=debug`, and reads two lines of its log: the recorder's CPU
(`recorder done ... cpu=`) and the whole process's, every thread's, its nodes not included
(`run reported cpu=`). Medians are printed, with the recorder's figures sorted.

    GRAPHS=/tmp/graphs RUNS=3 benches/bench.sh     # makes /tmp/graphs/{chain,wide,printing}
    benches/cpu.py /tmp/graphs/wide 2 10 base=/path/to/old/kavi new=target/release/kavi
"""
import os
import re
import shutil
import statistics
import subprocess
import sys

UNITS = {"ns": 1e-6, "µs": 1e-3, "ms": 1.0, "s": 1e3}


def cpu(log, marker):
    """The `cpu=` of the log's last line holding `marker`, in ms."""
    line = [line for line in log.splitlines() if marker in line][-1]
    value, unit = re.search(r"cpu=([\d.]+)(ns|µs|ms|s)\b", line).groups()
    return float(value) * UNITS[unit]


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    graph, jobs, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    builds = dict(named.split("=", 1) for named in sys.argv[4:])
    found = {name: {"recorder": [], "process": []} for name in builds}
    env = dict(os.environ, RUST_LOG="kavi=debug,kavi_engine=debug")
    for round_ in range(rounds):
        names = list(builds) if round_ % 2 == 0 else list(reversed(builds))
        for name in names:
            shutil.rmtree(f"{graph}/.kavi", ignore_errors=True)
            log = subprocess.run([builds[name], "pipeline", "run", "--workspace", graph, "g.toml",
                                  "--jobs", jobs, "--json"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, env=env, check=True).stderr
            found[name]["recorder"].append(cpu(log, "recorder done"))
            found[name]["process"].append(cpu(log, "run reported"))
    for name, figures in found.items():
        recorder = sorted(round(ms, 1) for ms in figures["recorder"])
        print(f"{name}: recorder {statistics.median(recorder):.1f} ms {recorder}; "
              f"process {statistics.median(figures['process']):.1f} ms")


if __name__ == "__main__":
    main()
