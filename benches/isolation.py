#!/usr/bin/env python3
"""What isolation costs a skill run and a forge, against running the same work bare.

    benches/isolation.py ROUNDS KAVI [BASELINE_KAVI]

Makes a workspace with `KAVI init`, forges `word_count`, then times, round by round and in
turn (so that a slow spell of the machine falls on every command alike):

  skill    `KAVI skill run word_count --input ...`: hash check, the ledger's records, and the
           skill run isolated (bubblewrap, seccomp, cgroup)
  python   the same file run bare: `python3 -I -B skills/word_count/skill.py`, the input on stdin,
           with the python3 the skill itself runs (found on the policy's search path)

and prints each one's median and the ratio skill / python (the isolation issue's target: at most
1.25). Then, with `KAVI executor` running in the workspace (sandboxes started ahead), the same
`kavi skill run` against the bare run again, in turn, half a second apart (the time the executor
takes to start the next sandbox), and that ratio. With BASELINE_KAVI (an older build), it also times the README's forge run with each
build, on a fresh copy of the workspace each time, and prints their ratio (target: within 15%).
"""
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INPUT = '{"text": "one two three"}'

# The interpreter the skill runs with: `python3` found on the search path the shipped
# confinement policy gives skills ([system] path), not the caller's PATH (a pyenv shim there
# costs more than the whole run, and would flatter kavi).
SKILL_PATH = "/usr/local/bin:/usr/bin:/bin"


def timed(command, cwd, stdin=None):
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, input=stdin, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True, text=True)
    return time.perf_counter() - start


def forge(kavi, workspace):
    subprocess.run([kavi, "init", str(workspace)], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([kavi, "pipeline", "run", "forge.toml", "--set", "skill=word_count"],
                   cwd=workspace, check=True, stdout=subprocess.DEVNULL)


def alternate(commands, rounds, workspace, settle=0.0):
    """Times the two commands round by round, in turn; prints their medians and ratio. With
    `settle`, waits that many seconds before each command, so that what one command left running
    (the executor starting the next sandbox) is not timed in the other."""
    times = {name: [] for name in commands}
    for round_ in range(rounds + 1):
        order = list(commands) if round_ % 2 else list(reversed(commands))
        for name in order:
            time.sleep(settle)
            took = timed(commands[name][0], workspace, commands[name][1])
            if round_:  # the first round warms the caches
                times[name].append(took)
    for name, values in times.items():
        print(f"{name:8} median {statistics.median(values) * 1000:7.1f} ms "
              f"(min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f}, n {len(values)})")
    first, second = list(commands)
    ratios = [a / b for a, b in zip(times[first], times[second])]
    print(f"{first} / {second}, round by round: median {statistics.median(ratios):.2f}")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rounds, kavi = int(sys.argv[1]), str(Path(sys.argv[2]).resolve())
    baseline = str(Path(sys.argv[3]).resolve()) if len(sys.argv) > 3 else None
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "ws"
        forge(kavi, workspace)
        commands = {
            "skill": ([kavi, "skill", "run", "word_count", "--input", INPUT], None),
            "python": ([shutil.which("python3", path=SKILL_PATH), "-I", "-B",
                        "skills/word_count/skill.py"], INPUT),
        }
        alternate(commands, rounds, workspace)
        # The executor's first line says its sandboxes are started; it ends on SIGTERM.
        executor = subprocess.Popen([kavi, "executor", "--idle-timeout", "10m"], cwd=workspace,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            print(executor.stderr.readline().strip())
            # The executor starts the next sandbox right after it answers: the pause keeps
            # that start out of the bare run's time (it took the bare run from 20 to 25 ms).
            alternate({"executor": commands["skill"], "python": commands["python"]}, rounds,
                      workspace, settle=0.5)
        finally:
            executor.terminate()
            executor.wait()
        if baseline:
            forged = {"kavi": [], "baseline": []}
            for round_ in range(max(3, rounds // 4)):
                for name, binary in (("kavi", kavi), ("baseline", baseline))[:: 1 if round_ % 2 else -1]:
                    fresh = Path(tmp) / f"forge-{name}-{round_}"
                    subprocess.run([binary, "init", str(fresh)], check=True,
                                   stdout=subprocess.DEVNULL)
                    forged[name].append(timed(
                        [binary, "pipeline", "run", "forge.toml", "--set", "skill=word_count"],
                        fresh))
                    shutil.rmtree(fresh)
            for name, values in forged.items():
                print(f"forge ({name}) median {statistics.median(values):.2f} s")
            print(f"forge kavi / baseline: "
                  f"{statistics.median(forged['kavi']) / statistics.median(forged['baseline']):.2f}")


if __name__ == "__main__":
    main()
