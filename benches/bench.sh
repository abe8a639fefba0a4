#!/usr/bin/env bash
# Scheduling overhead, measured side by side: kavi against make and ninja on the same generated
# graphs, and against spawning `true` directly. Also times `check` and `plan` of a 10,000-node
# layered DAG. Needs hyperfine, make and ninja (Debian: hyperfine, make, ninja-build).
#
#   benches/bench.sh            # full run
#   RUNS=3 benches/bench.sh     # fewer repetitions
#
# Results go to stdout and to $OUT (default target/bench) as markdown tables.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-10}
N=${N:-1000}
JOBS=${JOBS:-2}
OUT=${OUT:-target/bench}
for tool in hyperfine make ninja; do
    command -v "$tool" >/dev/null || { echo "bench: $tool is missing (apt-get install hyperfine make ninja-build)" >&2; exit 2; }
done

cargo build --release --quiet
KAVI="$PWD/target/release/kavi"
rm -rf "$OUT" && mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# gen KIND DIR: writes pipelines/g.toml, Makefile and build.ninja for one graph shape.
gen() {
    local kind=$1 dir=$2
    mkdir -p "$dir/pipelines"
    printf '# generated\n' > "$dir/kavi.toml"
    {
        printf '[pipeline]\nname = "%s"\n' "$kind"
        for ((i = 0; i < N; i++)); do
            printf '\n[nodes.n%d]\nkind = "exec"\nrun = ["true"]\n' "$i"
            [[ $kind == chain && $i -gt 0 ]] && printf 'needs = ["n%d"]\n' $((i - 1))
        done
    } > "$dir/pipelines/g.toml"
    {
        printf '.PHONY: all'
        for ((i = 0; i < N; i++)); do printf ' n%d' "$i"; done
        printf '\nall:'
        for ((i = 0; i < N; i++)); do printf ' n%d' "$i"; done
        printf '\n'
        for ((i = 0; i < N; i++)); do
            if [[ $kind == chain && $i -gt 0 ]]; then printf 'n%d: n%d\n\t@true\n' "$i" $((i - 1)); else printf 'n%d:\n\t@true\n' "$i"; fi
        done
    } > "$dir/Makefile"
    {
        printf 'rule t\n  command = true\n'
        for ((i = 0; i < N; i++)); do
            # Outputs are never created, so ninja runs every edge on every invocation.
            if [[ $kind == chain && $i -gt 0 ]]; then printf 'build n%d: t | n%d\n' "$i" $((i - 1)); else printf 'build n%d: t\n' "$i"; fi
        done
    } > "$dir/build.ninja"
}

# The floor: spawning `true` N times from a shell.
printf '#!/bin/sh\ni=0\nwhile [ $i -lt %d ]; do /bin/true; i=$((i + 1)); done\n' "$N" > "$work/spawn.sh"

for kind in chain independent; do
    dir="$work/$kind"
    gen "$kind" "$dir"
    jobs=$([[ $kind == chain ]] && echo 1 || echo "$JOBS")
    echo "== $N nodes, $kind (jobs $jobs)"
    hyperfine --runs "$RUNS" --warmup 1 --style basic \
        --export-markdown "$OUT/$kind.md" --export-json "$OUT/$kind.json" \
        -n "spawn true x$N" "sh $work/spawn.sh" \
        -n "kavi" --prepare "rm -rf $dir/.kavi" "cd $dir && $KAVI pipeline run g.toml --jobs $jobs --json > /dev/null" \
        -n "make" "make -s -C $dir -j$jobs all" \
        -n "ninja" "ninja -C $dir -j$jobs > /dev/null"
done

# A layered DAG of 10,000 nodes: 100 layers of 100, each node needing three of the layer above.
big="$work/big"
mkdir -p "$big/pipelines"
printf '# generated\n' > "$big/kavi.toml"
python3 - "$big/pipelines/big.toml" <<'PY'
import sys
layers, width = 100, 100
with open(sys.argv[1], "w") as f:
    f.write('[pipeline]\nname = "big"\n')
    for l in range(layers):
        for w in range(width):
            f.write(f'\n[nodes.l{l}_{w}]\nkind = "exec"\nrun = ["true"]\n')
            if l:
                needs = ", ".join(f'"l{l-1}_{(w + k) % width}"' for k in range(3))
                f.write(f"needs = [{needs}]\n")
PY
echo "== check and plan, 10,000 nodes"
hyperfine --runs "$RUNS" --warmup 1 --style basic \
    --export-markdown "$OUT/big.md" --export-json "$OUT/big.json" \
    -n "kavi pipeline check" "cd $big && $KAVI pipeline check big.toml" \
    -n "kavi pipeline plan" "cd $big && $KAVI pipeline plan big.toml > /dev/null"

python3 - "$OUT" "$N" <<'PY'
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
print("\n== summary (mean seconds; per-node = (tool - nothing) / N)")
for kind in ("chain", "independent"):
    r = {x["command"]: x["mean"] for x in json.load(open(f"{out}/{kind}.json"))["results"]}
    spawn = r[f"spawn true x{n}"] / n
    line = [f"{kind:12}", f"spawn true {spawn*1e3:.3f} ms/node"]
    for tool in ("kavi", "make", "ninja"):
        line.append(f"{tool} {r[tool]/n*1e3:.3f} ms/node ({r[tool]/n/spawn:.2f}x spawn)")
    print("  ".join(line))
for x in json.load(open(f"{out}/big.json"))["results"]:
    print(f"{x['command']:22} 10,000 nodes: {x['mean']*1e3:.0f} ms")
PY
