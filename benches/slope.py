#!/usr/bin/env python3
"""What a run costs per node and what it costs once, for kavi and for make, on the chain.

Two chains of different lengths, each command once per round in turn (each kavi on a fresh
ledger, as bench.sh runs it): the per-node cost is the median over rounds of
(T(long) - T(short)) / (long - short), and what is left of T(short) is the fixed cost (start,
load, ledger, read-back, exit). A gap to make that is all fixed cost and one that grows with
the graph call for different work; the ratio bench.sh prints cannot tell them apart.

    N=100 GRAPHS=/tmp/g100 GRAPHS_ONLY=1 benches/bench.sh     # makes /tmp/g100/chain
    N=1000 GRAPHS=/tmp/g1000 GRAPHS_ONLY=1 benches/bench.sh   # makes /tmp/g1000/chain
    benches/slope.py /tmp/g100/chain /tmp/g1000/chain 12 target/dist/kavi
"""
import shutil
import statistics
import subprocess
import sys
import time


def nodes(graph):
    with open(f"{graph}/pipelines/g.toml") as pipeline:
        return sum(line.startswith("[nodes.") for line in pipeline)


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    short, long_, rounds, kavi = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    sizes = {short: nodes(short), long_: nodes(long_)}
    if sizes[short] >= sizes[long_]:
        sys.exit("the first chain must be the shorter one")
    commands = {
        "kavi": lambda g: [kavi, "pipeline", "run", "--workspace", g, "g.toml", "--jobs", "1",
                           "--json"],
        "make": lambda g: ["make", "-s", "-C", g, "-j1"],
    }
    times = {(name, g): [] for name in commands for g in sizes}
    # One round more than asked: the first warms the caches and is not counted.
    for round_ in range(rounds + 1):
        for graph in sizes:
            for name, command in commands.items():
                shutil.rmtree(f"{graph}/.kavi", ignore_errors=True)
                start = time.perf_counter()
                subprocess.run(command(graph), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=True)
                if round_:
                    times[(name, graph)].append((time.perf_counter() - start) * 1e3)
    extra = sizes[long_] - sizes[short]
    for name in commands:
        per_node = statistics.median(
            (t_long - t_short) / extra * 1e3
            for t_long, t_short in zip(times[(name, long_)], times[(name, short)]))
        fixed = statistics.median(times[(name, short)]) - per_node * sizes[short] / 1e3
        print(f"{name:5s} per node {per_node:6.1f} us   fixed {fixed:5.1f} ms   "
              f"({sizes[short]} nodes {statistics.median(times[(name, short)]):.1f} ms, "
              f"{sizes[long_]} nodes {statistics.median(times[(name, long_)]):.1f} ms)")


main()
