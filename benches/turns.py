#!/usr/bin/env python3
"""Two commands run in turn, round after round: medians of wall time and of CPU.

For commands that take milliseconds, such as `check` and `plan` of bench.sh's layered DAGs,
where ab.py's runs of a pipeline do not apply. Alternating the order each round keeps a slow
spell of the machine from landing on one command only. CPU is the children's user and system
time, threads included.

    GRAPHS=/tmp/graphs RUNS=3 benches/bench.sh     # makes /tmp/graphs/big10k and big100k
    benches/turns.py 40 /old/kavi pipeline check --workspace /tmp/graphs/big10k big.toml \\
        -- target/dist/kavi pipeline check --workspace /tmp/graphs/big10k big.toml
"""
import resource
import statistics
import subprocess
import sys
import time


def main():
    if len(sys.argv) < 5 or "--" not in sys.argv[2:]:
        sys.exit(__doc__)
    rounds = int(sys.argv[1])
    rest = sys.argv[2:]
    split = rest.index("--")
    commands = {"A": rest[:split], "B": rest[split + 1:]}
    wall = {name: [] for name in commands}
    cpu = {name: [] for name in commands}
    for round_ in range(rounds):
        for name in ("A", "B") if round_ % 2 == 0 else ("B", "A"):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(commands[name], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=True)
            wall[name].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(after.ru_utime + after.ru_stime
                             - before.ru_utime - before.ru_stime)
    for name in commands:
        walls = sorted(wall[name])
        print(f"{name}: wall median {statistics.median(walls) * 1000:.1f} ms, "
              f"quartile {walls[len(walls) // 4] * 1000:.1f}, min {walls[0] * 1000:.1f}; "
              f"CPU median {statistics.median(cpu[name]) * 1000:.1f} ms  "
              f"({' '.join(commands[name])})")


if __name__ == "__main__":
    main()
