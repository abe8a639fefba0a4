#!/usr/bin/env python3
"""Two kavi builds and make on one of bench.sh's graphs, interleaved round by round.

hyperfine runs each command's repetitions in one block, so on a machine whose speed drifts
within minutes a block can land in a slow spell. Here every round runs each command once, in
turn, each kavi on a fresh ledger (as bench.sh's --prepare does), and the figure to read is the
median over rounds of kavi's time minus make's in the same round. The rounds take every order
of the commands in turn: with two builds and make, a multiple of 6 rounds is balanced.

    GRAPHS=/tmp/graphs RUNS=3 benches/bench.sh     # makes /tmp/graphs/{chain,wide,printing}
    benches/ab.py /tmp/graphs/chain 1 24 before=/path/to/old/kavi after=target/dist/kavi
    benches/ab.py /tmp/graphs/wide 2 24 before=... after=...
"""
import itertools
import shutil
import statistics
import subprocess
import sys
import time


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    graph, jobs, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    commands = {}
    for named in sys.argv[4:]:
        name, binary = named.split("=", 1)
        commands[name] = [binary, "pipeline", "run", "--workspace", graph, "g.toml",
                          "--jobs", jobs, "--json"]
    commands["make"] = ["make", "-s", "-C", graph, f"-j{jobs}"]
    times = {name: [] for name in commands}
    # One round more than asked: the first warms the caches and is not counted.
    # Each round in its own order: whichever command runs right after make is slower (one
    # binary three times a round, first after make: 41, 27 and 26 ms behind make, the same
    # with a `sync` before each command), so a fixed order favoured every command but the first.
    # The rounds go through every order in turn, so that each command holds each place as often
    # as the others: a shuffle seeded the same every time dealt the same orders to the same
    # places, and the build named first stayed ahead (chain: 38.6 against 61.8 ms behind make
    # named one way round, 23.2 against -1.4 the other).
    orders = list(itertools.permutations(commands))
    for round_ in range(rounds + 1):
        for name in orders[(round_ - 1) % len(orders)]:
            command = commands[name]
            shutil.rmtree(f"{graph}/.kavi", ignore_errors=True)
            start = time.perf_counter()
            subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=True)
            if round_:
                times[name].append((time.perf_counter() - start) * 1e3)
    for name, each in times.items():
        behind = [mine - make for mine, make in zip(each, times["make"])]
        print(f"{name:10s} median {statistics.median(each):7.1f} ms   "
              f"behind make, median of rounds {statistics.median(behind):6.1f} ms")


main()
