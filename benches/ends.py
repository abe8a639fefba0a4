#!/usr/bin/env python3
"""The once-per-run costs of kavi builds, which benches/ab.py's rounds are too noisy to see.

Each run is recorded with perf's sched_process_{fork,exec,exit} tracepoints; from them come
"start", the time from kavi's exec to the fork of its first node, and "tail", from the last
node's exit to kavi's own. Builds take turns, in a new order every round, each on a fresh
ledger; the first round warms the caches and is not counted. Medians and quartiles are
printed. perf's recording adds a little to both figures, the same for every build.

    GRAPHS=/tmp/graphs RUNS=3 benches/bench.sh     # makes /tmp/graphs/{chain,wide,printing}
    benches/ends.py /tmp/graphs/chain 10 before=/path/to/old/kavi after=target/release/kavi
"""
import random
import re
import shutil
import statistics
import subprocess
import sys

EVENTS = "sched:sched_process_fork,sched:sched_process_exec,sched:sched_process_exit"
LINE = re.compile(r"\s*\S+\s+(\d+)\s+(?:\[\d+\]\s+)?([\d.]+):\s+(\S+):\s*(.*)")


def ends(binary, graph):
    """(start, tail) in ms of one run of `binary` on `graph`."""
    shutil.rmtree(f"{graph}/.kavi", ignore_errors=True)
    subprocess.run(["perf", "record", "-q", "-e", EVENTS, "-o", "/tmp/ends.data", "--",
                    binary, "pipeline", "run", "--workspace", graph, "g.toml", "--json"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    script = subprocess.run(["perf", "script", "-i", "/tmp/ends.data"], capture_output=True,
                            text=True, check=True).stdout
    events = []
    for line in script.splitlines():
        match = LINE.match(line)
        if match:
            pid, at, event, rest = match.groups()
            events.append((int(pid), float(at), event.split(":")[-1], rest))
    kavi, began = events[0][0], events[0][1]
    forks, execs, exits = {}, {}, {}
    for pid, at, event, rest in events:
        if event == "sched_process_fork":
            forks[int(re.search(r"child_pid=(\d+)", rest).group(1))] = at
        elif event == "sched_process_exec" and pid != kavi:
            execs[pid] = at
        elif event == "sched_process_exit":
            exits[pid] = at
    nodes = sorted(execs, key=execs.get)
    return ((forks[nodes[0]] - began) * 1e3, (exits[kavi] - exits[nodes[-1]]) * 1e3)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    graph, rounds = sys.argv[1], int(sys.argv[2])
    builds = dict(named.split("=", 1) for named in sys.argv[3:])
    measured = {name: ([], []) for name in builds}
    order = list(builds)
    shuffle = random.Random(0).shuffle
    for round_ in range(rounds + 1):
        shuffle(order)
        for name in order:
            start, tail = ends(builds[name], graph)
            if round_:
                measured[name][0].append(start)
                measured[name][1].append(tail)
    for name, (starts, tails) in measured.items():
        q = lambda xs: statistics.quantiles(xs, n=4)
        print(f"{name:10s} start {statistics.median(starts):6.2f} ms "
              f"(q1 {q(starts)[0]:.2f}, q3 {q(starts)[2]:.2f})   "
              f"tail {statistics.median(tails):6.2f} ms (q1 {q(tails)[0]:.2f}, q3 {q(tails)[2]:.2f})")


main()
