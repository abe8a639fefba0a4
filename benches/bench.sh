#!/usr/bin/env bash
# kavi against make, ninja and just, side by side in one run, on the same generated graphs, next
# to the spawn floor (a small C program that posix_spawns the same command N times):
#
#   chain     N nodes, each `touch out/i`, each needing the one before (jobs 1)
#   wide      N independent `touch out/i` (jobs $JOBS)
#   printing  a chain whose nodes each `echo` a line of their own: every node stores an output
#             (kavi with a fresh ledger and store; then again, its outputs already stored)
#
#   up to date  a chain whose nodes each copy `src/i` to `out/i`, inputs and outputs declared,
#             run when nothing changed since the last run: make and ninja compare times, kavi
#             finds every node's key in its ledger (restored before each run to the one the
#             building run left, so that it does not grow from round to round)
#
# then `check` and `plan` of layered DAGs of 10,000 and 100,000 nodes, `runs show` of a
# 10,000-node run, the ledger's growth per node run, and the README's forge run split by node.
#
#   benches/bench.sh            # full run (RUNS=10)
#   RUNS=3 benches/bench.sh     # fewer repetitions
#   GRAPHS=dir benches/bench.sh # keep the generated graphs in dir (for benches/ab.py)
#   GRAPHS=dir GRAPHS_ONLY=1 N=100 benches/bench.sh  # only make the graphs (benches/slope.py)
#
# It installs what it needs where it can (Debian: hyperfine, make, ninja-build, a C compiler;
# just from its package on PyPI, into target/bench-tools) and otherwise says what is missing.
# Results go to stdout and to $OUT (default target/bench) as markdown and JSON.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-10}
N=${N:-1000}
JOBS=${JOBS:-2}
OUT=$(realpath -m "${OUT:-target/bench}")
TOOLS="$PWD/target/bench-tools"

missing=()
for tool in hyperfine make ninja cc; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})) && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    echo "bench: installing ${missing[*]}" >&2
    apt-get install -y hyperfine make ninja-build gcc >/dev/null 2>&1 \
        || { apt-get update >/dev/null && apt-get install -y hyperfine make ninja-build gcc >/dev/null; }
fi
for tool in hyperfine make ninja cc; do
    command -v "$tool" >/dev/null || { echo "bench: $tool is missing (apt-get install hyperfine make ninja-build gcc)" >&2; exit 2; }
done
if ! command -v just >/dev/null && [[ ! -x $TOOLS/bin/just ]]; then
    echo "bench: installing just from PyPI into $TOOLS" >&2
    python3 -m venv "$TOOLS" && "$TOOLS/bin/pip" install --quiet rust-just \
        || { echo "bench: just is missing and could not be installed (pip install rust-just)" >&2; exit 2; }
fi
JUST=$(command -v just || echo "$TOOLS/bin/just")

cargo build --profile dist --quiet
KAVI="$PWD/target/dist/kavi"
rm -rf "$OUT" && mkdir -p "$OUT"
if [[ -n ${GRAPHS:-} ]]; then
    work=$(realpath -m "$GRAPHS") && rm -rf "$work" && mkdir -p "$work"
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi

# The floor: posix_spawn the command N times in the graph's folder, one after another, waiting
# for each.
cat > "$work/floor.c" <<'C'
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) {
    if (argc != 4 || chdir(argv[3]) != 0) return 2;
    int n = atoi(argv[1]);
    char line[32];
    for (int i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof path, "out/%d", i);
        snprintf(line, sizeof line, "line %d", i);
        char *touch[] = {"touch", path, NULL};
        char *echo[] = {"echo", line, NULL};
        char **args = strcmp(argv[2], "echo") == 0 ? echo : touch;
        pid_t pid;
        int status;
        if (posix_spawnp(&pid, args[0], NULL, NULL, args, environ) != 0) return 1;
        waitpid(pid, &status, 0);
    }
    return 0;
}
C
cc -O2 -o "$work/floor" "$work/floor.c"

# gen KIND DIR: pipelines/g.toml, Makefile, build.ninja and justfile for one graph.
gen() {
    local kind=$1 dir=$2
    mkdir -p "$dir/pipelines" "$dir/out"
    printf '# generated\n' > "$dir/kavi.toml"
    local cmd
    {
        printf '[pipeline]\nname = "%s"\n' "$kind"
        for ((i = 0; i < N; i++)); do
            if [[ $kind == printing ]]; then cmd="[\"echo\", \"line $i\"]"; else cmd="[\"touch\", \"out/$i\"]"; fi
            printf '\n[nodes.n%d]\nkind = "exec"\nrun = %s\n' "$i" "$cmd"
            [[ $kind != wide && $i -gt 0 ]] && printf 'needs = ["n%d"]\n' $((i - 1))
        done
    } > "$dir/pipelines/g.toml"
    {
        printf '.PHONY: all'
        for ((i = 0; i < N; i++)); do printf ' n%d' "$i"; done
        printf '\nall:'
        for ((i = 0; i < N; i++)); do printf ' n%d' "$i"; done
        printf '\n'
        for ((i = 0; i < N; i++)); do
            if [[ $kind == printing ]]; then cmd="echo line $i"; else cmd="touch out/$i"; fi
            if [[ $kind != wide && $i -gt 0 ]]; then printf 'n%d: n%d\n\t@%s\n' "$i" $((i - 1)) "$cmd"; else printf 'n%d:\n\t@%s\n' "$i" "$cmd"; fi
        done
    } > "$dir/Makefile"
    {
        printf 'rule touch\n  command = touch $path\nrule echo\n  command = echo $text\n'
        for ((i = 0; i < N; i++)); do
            local dep=""
            [[ $kind != wide && $i -gt 0 ]] && dep=" | n$((i - 1))"
            # Phony-like outputs that are never created: ninja runs every edge every time.
            if [[ $kind == printing ]]; then printf 'build n%d: echo%s\n  text = line %d\n' "$i" "$dep" "$i"
            else printf 'build n%d: touch%s\n  path = out/%d\n' "$i" "$dep" "$i"; fi
        done
    } > "$dir/build.ninja"
    {
        printf 'all:'
        for ((i = 0; i < N; i++)); do printf ' n%d' "$i"; done
        printf '\n'
        for ((i = 0; i < N; i++)); do
            if [[ $kind == printing ]]; then cmd="echo line $i"; else cmd="touch out/$i"; fi
            if [[ $kind != wide && $i -gt 0 ]]; then printf 'n%d: n%d\n    @%s\n' "$i" $((i - 1)) "$cmd"; else printf 'n%d:\n    @%s\n' "$i" "$cmd"; fi
        done
    } > "$dir/justfile"
}

# GRAPHS_ONLY=1 (with GRAPHS=dir): the graphs, and nothing run (for benches/slope.py).
if [[ -n ${GRAPHS_ONLY:-} ]]; then
    [[ -n ${GRAPHS:-} ]] || { echo "bench: GRAPHS_ONLY needs GRAPHS=dir to keep them in" >&2; exit 2; }
    for kind in chain wide printing; do gen "$kind" "$work/$kind"; done
    echo "bench: $N-node graphs in $work" >&2
    exit 0
fi

for kind in chain wide printing; do
    dir="$work/$kind"
    gen "$kind" "$dir"
    jobs=$([[ $kind == wide ]] && echo "$JOBS" || echo 1)
    floor=$([[ $kind == printing ]] && echo echo || echo touch)
    echo "== $N nodes, $kind (jobs $jobs)"
    # Every command is started by hyperfine itself, no shell in between (-N), its output sent to
    # /dev/null by hyperfine: none of them pays for a shell the others do not.
    run_kavi="$KAVI pipeline run --workspace $dir g.toml --jobs $jobs --json"
    # One --prepare per command: kavi starts from a fresh ledger and store each time.
    commands=(
        --prepare true -n "floor" "$work/floor $N $floor $dir"
        --prepare "rm -rf $dir/.kavi" -n "kavi" "$run_kavi"
        --prepare true -n "make" "make -s -C $dir -j$jobs all"
        --prepare true -n "ninja" "ninja -C $dir -j$jobs"
        --prepare true -n "just" "$JUST --justfile $dir/justfile --working-directory $dir all"
    )
    if [[ $kind == printing ]]; then
        # The same run again, its outputs already in the ledger: the cost of recording alone.
        commands+=(--prepare true -n "kavi (outputs stored)" "$run_kavi")
    fi
    hyperfine --runs "$RUNS" --warmup 1 --style basic -N \
        --export-markdown "$OUT/$kind.md" --export-json "$OUT/$kind.json" "${commands[@]}"
    if [[ $kind == printing ]]; then
        rm -rf "$dir/.kavi"
        (cd "$dir" && "$KAVI" pipeline run g.toml --jobs 1 --json > /dev/null)
        du -sb "$dir/.kavi" | awk -v n="$N" '{ printf "%d\n", $1 / n }' > "$OUT/bytes_per_node"
    fi
done

# The up-to-date chain: real files in and out, so that make and ninja have times to compare and
# kavi has inputs to key and outputs to find in place.
uptodate() {
    local dir=$1
    mkdir -p "$dir/pipelines" "$dir/src" "$dir/out"
    printf '# generated\n' > "$dir/kavi.toml"
    python3 - "$dir" "$N" <<'PY'
import sys
root, n = sys.argv[1], int(sys.argv[2])
with open(f"{root}/pipelines/g.toml", "w") as toml, open(f"{root}/Makefile", "w") as make, \
        open(f"{root}/build.ninja", "w") as ninja:
    toml.write('[pipeline]\nname = "uptodate"\n')
    make.write("all:" + "".join(f" out/{i}" for i in range(n)) + "\n")
    ninja.write("rule cp\n  command = cp $in $out\n")
    for i in range(n):
        with open(f"{root}/src/{i}", "w") as f:
            f.write(f"{i}\n")
        after = f"out/{i - 1}" if i else ""
        toml.write(f'\n[nodes.n{i}]\nkind = "exec"\nrun = ["cp", "src/{i}", "out/{i}"]\n'
                   f'inputs = ["src/{i}"]\noutputs = ["out/{i}"]\n')
        if i:
            toml.write(f'needs = ["n{i - 1}"]\n')
        make.write(f"out/{i}: src/{i} {after}\n\t@cp src/{i} out/{i}\n")
        ninja.write(f"build out/{i}: cp src/{i}" + (f" | {after}" if i else "") + "\n")
PY
}
dir="$work/uptodate"
uptodate "$dir"
echo "== $N nodes, up to date (jobs 1)"
make -s -C "$dir" -j1 all && ninja -C "$dir" -j1 > /dev/null
run_kavi="$KAVI pipeline run --workspace $dir g.toml --jobs 1 --json"
$run_kavi > /dev/null && $run_kavi > /dev/null && cp -a "$dir/.kavi" "$dir/.kavi-built"
hyperfine --runs "$RUNS" --warmup 1 --style basic -N \
    --export-markdown "$OUT/uptodate.md" --export-json "$OUT/uptodate.json" \
    --prepare "sh -c 'rm -rf $dir/.kavi && cp -a $dir/.kavi-built $dir/.kavi'" -n "kavi" "$run_kavi" \
    --prepare true -n "make" "make -s -C $dir -j1 all" \
    --prepare true -n "ninja" "ninja -C $dir -j1"

# Layered DAGs: L layers of 100, each node needing three of the layer above.
layered() {
    local layers=$1 dir=$2
    mkdir -p "$dir/pipelines"
    printf '# generated\n' > "$dir/kavi.toml"
    python3 - "$dir/pipelines/big.toml" "$layers" <<'PY'
import sys
path, layers, width = sys.argv[1], int(sys.argv[2]), 100
with open(path, "w") as f:
    f.write('[pipeline]\nname = "big"\n')
    for l in range(layers):
        for w in range(width):
            f.write(f'\n[nodes.l{l}_{w}]\nkind = "exec"\nrun = ["true"]\n')
            if l:
                needs = ", ".join(f'"l{l-1}_{(w + k) % width}"' for k in range(3))
                f.write(f"needs = [{needs}]\n")
PY
}
layered 100 "$work/big10k"
layered 1000 "$work/big100k"
# These take milliseconds, where one stray interruption weighs on a mean of three: at least 20
# runs, each kavi started directly (hyperfine sends its output to /dev/null), no shell between.
QUICK_RUNS=$((RUNS > 20 ? RUNS : 20))
echo "== check and plan, 10,000 and 100,000 nodes"
hyperfine --runs "$QUICK_RUNS" --warmup 2 --style basic -N \
    --export-markdown "$OUT/big.md" --export-json "$OUT/big.json" \
    -n "check 10k" "$KAVI pipeline check --workspace $work/big10k big.toml" \
    -n "plan 10k" "$KAVI pipeline plan --workspace $work/big10k big.toml" \
    -n "check 100k" "$KAVI pipeline check --workspace $work/big100k big.toml" \
    -n "plan 100k" "$KAVI pipeline plan --workspace $work/big100k big.toml"

echo "== runs show of a 10,000-node run"
(cd "$work/big10k" && "$KAVI" pipeline run big.toml --jobs "$JOBS" --json > /dev/null)
hyperfine --runs "$QUICK_RUNS" --warmup 2 --style basic -N \
    --export-markdown "$OUT/show.md" --export-json "$OUT/show.json" \
    -n "runs show 10k" "$KAVI runs show --workspace $work/big10k latest" \
    -n "runs show 10k --json" "$KAVI runs show --workspace $work/big10k latest --json"

echo "== the README's forge run, by node"
forge="$work/forge"
mkdir -p "$forge"
cp -r kavi.toml pipelines policies templates proposals builders chains "$forge/"
(cd "$forge" && "$KAVI" toolchain install > /dev/null 2>&1 || true)
start=$(date +%s.%N)
(cd "$forge" && "$KAVI" pipeline run forge.toml --set skill=word_count --json > /dev/null)
end=$(date +%s.%N)
(cd "$forge" && "$KAVI" runs show latest --json > "$OUT/forge_run.json")
(cd "$forge" && "$KAVI" runs show "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["children"][0]["id"])' "$OUT/forge_run.json")" --json > "$OUT/forge_attempt.json")
echo "$start $end" > "$OUT/forge_wall"

python3 - "$OUT" "$N" <<'PY'
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
def means(name):
    return {x["command"]: x["mean"] for x in json.load(open(f"{out}/{name}.json"))["results"]}
print(f"\n== summary: mean seconds for {n} nodes; ratios to make and to the floor")
print("| graph | floor | make | ninja | just | kavi | kavi / make | kavi / floor |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for kind in ("chain", "wide", "printing"):
    r = means(kind)
    print(f"| {kind} | {r['floor']:.2f} | {r['make']:.2f} | {r['ninja']:.2f} | {r['just']:.2f} | "
          f"{r['kavi']:.2f} | {r['kavi'] / r['make']:.2f} | {r['kavi'] / r['floor']:.2f} |")
    if "kavi (outputs stored)" in r:
        s = r["kavi (outputs stored)"]
        print(f"| {kind}, outputs stored | | | | | {s:.2f} | {s / r['make']:.2f} | {s / r['floor']:.2f} |")
r = means("uptodate")
print(f"| up to date | | {r['make']:.2f} | {r['ninja']:.2f} | | {r['kavi']:.2f} | "
      f"{r['kavi'] / r['make']:.2f} | |")
big = means("big")
print(f"\ncheck 10k {big['check 10k']*1e3:.0f} ms, 100k {big['check 100k']*1e3:.0f} ms "
      f"({big['check 100k'] / big['check 10k']:.1f}x); plan 10k {big['plan 10k']*1e3:.0f} ms, "
      f"100k {big['plan 100k']*1e3:.0f} ms ({big['plan 100k'] / big['plan 10k']:.1f}x)")
show = means("show")
print(f"runs show of a 10,000-node run: {show['runs show 10k']*1e3:.0f} ms "
      f"(--json {show['runs show 10k --json']*1e3:.0f} ms)")
print(f"ledger and store growth per node run (printing chain): {open(f'{out}/bytes_per_node').read().strip()} bytes")
start, end = map(float, open(f"{out}/forge_wall").read().split())
attempt = json.load(open(f"{out}/forge_attempt.json"))
nodes = sorted(((x.get("duration_ms") or 0, x["node_id"]) for x in attempt["nodes"]), reverse=True)
print(f"forge run (README command, toolchain provisioned): {end - start:.2f} s wall; slowest nodes: "
      + ", ".join(f"{name} {ms} ms" for ms, name in nodes[:5]))
PY
