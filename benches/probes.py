#!/usr/bin/env python3
"""When a kavi run reaches its own functions: the start and the tail split finer than
benches/ends.py can, from uprobes (root, perf and tracefs needed).

Each probe is a function of the kavi binary, named by the start of its demangled name; the
first symbol that matches is probed at its entry (`name`) and, with a trailing `%return`, at
its return. Every run is on a fresh ledger, one node at a time; printed are the medians over
the runs of each probe's first hit, in ms after kavi's `exec` (up to the first node's `exec`),
and of each probe's last hit after the last node's exit. Uprobes cost a few microseconds a hit:
probe functions called once or twice a run, not once a node, and none on the way to a child's
`clone` (a return probe pending across it made the first spawn 2 ms slower).

    benches/probes.py /tmp/graphs/chain 8 target/dist/kavi \\
        kavi::cli::main 'kavi::spec::load::load_pipeline%return' kavi::dag::compile \\
        'kavi_ledger::Ledger::run_detail' 'kavi_ledger::Ledger::run_detail%return'
"""
import os
import shutil
import statistics
import subprocess
import sys

TRACEFS = "/sys/kernel/tracing"


def symbols(binary):
    """(demangled name, file offset) of the binary's text symbols."""
    text = subprocess.run(["nm", "-C", binary], capture_output=True, text=True, check=True).stdout
    headers = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True,
                             check=True).stdout
    # The executable segment maps file offsets to addresses at a fixed distance.
    load = next(line.split() for line in headers.splitlines()
                if line.strip().startswith("LOAD") and " R E " in line)
    shift = int(load[2], 16) - int(load[1], 16)
    found = []
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in ("t", "T"):
            found.append((parts[2], int(parts[0], 16) - shift))
    return found


def place(binary, probes):
    table = symbols(binary)
    events = []
    with open(f"{TRACEFS}/uprobe_events", "w") as f:
        for i, probe in enumerate(probes):
            name, _, ret = probe.partition("%")
            match = next((off for sym, off in table if sym.startswith(name)), None)
            if match is None:
                sys.exit(f"probes: no symbol starts with {name!r} in {binary}")
            kind = "r" if ret == "return" else "p"
            f.write(f"{kind}:kaviprobe/p{i} {os.path.realpath(binary)}:{match:#x}\n")
            events.append(f"kaviprobe:p{i}")
    return events


def one_run(binary, graph, events):
    shutil.rmtree(f"{graph}/.kavi", ignore_errors=True)
    data = "/tmp/kavi-probes.data"
    record = ["perf", "record", "-q", "-o", data, "-e", "sched:sched_process_exec",
              "-e", "sched:sched_process_fork", "-e", "sched:sched_process_exit"]
    for event in events:
        record += ["-e", event]
    subprocess.run(record + [binary, "pipeline", "run", "--workspace", graph, "g.toml",
                             "--jobs", "1", "--json"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,time,event"],
                            capture_output=True, text=True, check=True).stdout
    rows = []
    for line in script.splitlines():
        # comm pid/tid time: event:
        parts = line.split()
        pid = int(parts[1].split("/")[0])
        rows.append((parts[0], pid, float(parts[2].rstrip(":")), parts[3].rstrip(":")))
    kavi = rows[0][1]
    exec_at = rows[0][2]
    children = [r for r in rows if r[1] != kavi]
    first_child = min(r[2] for r in children if r[3] == "sched:sched_process_exec")
    last_exit = max(r[2] for r in children if r[3] == "sched:sched_process_exit")
    start, tail = {}, {}
    for comm, pid, at, event in rows:
        if pid != kavi:
            continue
        if at <= first_child:
            start.setdefault(event, (at - exec_at) * 1e3)
        elif at >= last_exit:
            tail[event] = (at - last_exit) * 1e3
    start["first node's exec"] = (first_child - exec_at) * 1e3
    return start, tail


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    graph, runs, binary, probes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    if shutil.which("perf") is None:
        sys.exit("probes: perf is missing (apt-get install linux-perf)")
    if not os.access(f"{TRACEFS}/uprobe_events", os.W_OK):
        sys.exit(f"probes: needs root and tracefs at {TRACEFS} "
                 f"(mount -t tracefs nodev {TRACEFS})")
    events = place(binary, probes)
    names = dict(zip(events, probes))
    try:
        one_run(binary, graph, events)  # warms the caches; not counted
        results = [one_run(binary, graph, events) for _ in range(runs)]
    finally:
        with open(f"{TRACEFS}/uprobe_events", "w") as f:
            f.write("")
    for part, label in ((0, "after exec"), (1, "after the last node's exit")):
        print(f"== ms {label}, medians of {runs}")
        keys = sorted({k for r in results for k in r[part]},
                      key=lambda k: statistics.median(r[part][k] for r in results if k in r[part]))
        for key in keys:
            times = [r[part][key] for r in results if key in r[part]]
            print(f"{statistics.median(times):8.2f}  {names.get(key, key)}")


if __name__ == "__main__":
    main()
