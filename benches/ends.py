#!/usr/bin/env python3
"""Where a run's time goes, from the kernel's view of its processes: what benches/ab.py's
wall-time rounds are too noisy to split.

Each run is recorded with perf's sched_process_{fork,exec,exit} tracepoints, and cut into:

    start   from the runner's exec to the fork of its first node
    tail    from the last node's exit to the runner's own
    turns   summed over the nodes, from one node's exit to the next one's fork
    spawn   summed over the nodes, from a node's fork to its exec
    lives   summed over the nodes, from a node's exec to its exit

Every graph is run one node at a time (kavi `--jobs 1`, make `-j1`), so the five add up to the
whole run. A build named `make` runs `make -s -j1` in the graph instead of kavi; one named
`floor` is bench.sh's spawn floor (`floor=/tmp/graphs/floor`, kept with GRAPHS=dir).
Builds take turns, taking every order in turn (a multiple of the number of orders is
balanced), each kavi on a fresh ledger; the first round warms the caches and is not counted.
Medians are printed (quartiles of start and tail too).
perf's recording adds a little to every figure, the same for every build.

    GRAPHS=/tmp/graphs RUNS=3 benches/bench.sh     # makes /tmp/graphs/{chain,wide,printing}
    benches/ends.py /tmp/graphs/chain 10 before=/path/to/old/kavi after=target/dist/kavi
    benches/ends.py /tmp/graphs/chain 10 kavi=target/dist/kavi make=make
    benches/ends.py /tmp/graphs/chain 10 kavi=... make=make floor=/tmp/graphs/floor
"""
import itertools
import re
import shutil
import statistics
import subprocess
import sys

EVENTS = "sched:sched_process_fork,sched:sched_process_exec,sched:sched_process_exit"
LINE = re.compile(r"\s*\S+\s+(\d+)\s+(?:\[\d+\]\s+)?([\d.]+):\s+(\S+):\s*(.*)")
PARTS = ("start", "tail", "turns", "spawn", "lives")


def split(name, binary, graph):
    """The parts of one run, in ms, keyed as PARTS."""
    shutil.rmtree(f"{graph}/.kavi", ignore_errors=True)
    if name == "make":
        command = ["make", "-s", "-C", graph, "-j1"]
    elif name == "floor":
        # bench.sh's spawn floor, on as many nodes as the graph has, with its command.
        with open(f"{graph}/pipelines/g.toml") as spec:
            text = spec.read()
        kind = "echo" if '"echo"' in text else "touch"
        command = [binary, str(text.count("[nodes.")), kind, graph]
    else:
        command = [binary, "pipeline", "run", "--workspace", graph, "g.toml", "--jobs", "1",
                   "--json"]
    subprocess.run(["perf", "record", "-q", "-e", EVENTS, "-o", "/tmp/ends.data", "--"] + command,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    script = subprocess.run(["perf", "script", "-i", "/tmp/ends.data"], capture_output=True,
                            text=True, check=True).stdout
    events = []
    for line in script.splitlines():
        match = LINE.match(line)
        if match:
            pid, at, event, rest = match.groups()
            events.append((int(pid), float(at), event.split(":")[-1], rest))
    runner, began = events[0][0], events[0][1]
    forks, execs, exits = {}, {}, {}
    for pid, at, event, rest in events:
        if event == "sched_process_fork":
            forks[int(re.search(r"child_pid=(\d+)", rest).group(1))] = at
        elif event == "sched_process_exec" and pid != runner:
            execs[pid] = at
        elif event == "sched_process_exit":
            exits[pid] = at
    nodes = sorted(execs, key=execs.get)
    parts = (
        forks[nodes[0]] - began,
        exits[runner] - exits[nodes[-1]],
        sum(forks[after] - exits[before] for before, after in zip(nodes, nodes[1:])),
        sum(execs[node] - forks[node] for node in nodes),
        sum(exits[node] - execs[node] for node in nodes),
    )
    return dict(zip(PARTS, (part * 1e3 for part in parts)))


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    graph, rounds = sys.argv[1], int(sys.argv[2])
    if rounds < 2:
        sys.exit("ends.py: at least 2 rounds, for the quartiles")
    builds = dict(named.split("=", 1) for named in sys.argv[3:])
    measured = {name: {part: [] for part in PARTS} for name in builds}
    # Every order in turn, so that each build holds each place as often (see ab.py).
    orders = list(itertools.permutations(builds))
    for round_ in range(rounds + 1):
        for name in orders[(round_ - 1) % len(orders)]:
            parts = split(name, builds[name], graph)
            if round_:
                for part, value in parts.items():
                    measured[name][part].append(value)
    for name, parts in measured.items():
        q = lambda xs: statistics.quantiles(xs, n=4)
        start, tail = parts["start"], parts["tail"]
        print(f"{name:10s} start {statistics.median(start):6.2f} ms "
              f"(q1 {q(start)[0]:.2f}, q3 {q(start)[2]:.2f})   "
              f"tail {statistics.median(tail):6.2f} ms (q1 {q(tail)[0]:.2f}, q3 {q(tail)[2]:.2f})   "
              + "   ".join(f"{part} {statistics.median(parts[part]):7.1f} ms"
                           for part in PARTS[2:]))


main()
