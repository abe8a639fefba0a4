#!/usr/bin/env python3
"""Two kavi builds' `skill run word_count`, in turn, round by round, in one workspace.

    benches/skill_ab.py WORKSPACE ROUNDS before=/path/to/old/kavi after=target/dist/kavi

WORKSPACE is one where `word_count` has been forged (`kavi init ws && cd ws && kavi pipeline
run forge.toml --set skill=word_count`) and no `kavi executor` runs. Each round runs both
builds, the order reversed every other round; the first round warms the caches and is not
counted. Prints each build's median and the median, over rounds, of the second's time over
the first's.
"""
import statistics
import subprocess
import sys
import time
from pathlib import Path

INPUT = '{"text": "one two three"}'


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    workspace, rounds = sys.argv[1], int(sys.argv[2])
    # Resolved here: the commands run in the workspace.
    builds = {name: str(Path(binary).resolve())
              for name, binary in (named.split("=", 1) for named in sys.argv[3:5])}
    names = list(builds)
    if len(names) != 2:
        sys.exit("two builds, each under a name of its own")
    times = {name: [] for name in names}
    for round_ in range(rounds + 1):
        for name in names if round_ % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            subprocess.run([builds[name], "skill", "run", "word_count", "--input", INPUT],
                           cwd=workspace, stdout=subprocess.DEVNULL, check=True)
            if round_:
                times[name].append((time.perf_counter() - start) * 1e3)
    for name in names:
        print(f"{name:10s} median {statistics.median(times[name]):6.1f} ms   "
              f"min {min(times[name]):6.1f} ms")
    first, second = (times[name] for name in names)
    ratio = statistics.median(b / a for a, b in zip(first, second))
    print(f"{names[1]} / {names[0]}, round by round: median {ratio:.3f}")


main()
