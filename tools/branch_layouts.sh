#!/usr/bin/env bash
# How much of a `branch` sweep is layout luck.
#
#   tools/branch_layouts.sh [-o DIR] [-l "0 1 ... 8"] TRACE...
#
# The branch policy keeps its records in a set-associative table; which set
# a key lands in decides which records collide, and one collision early in a
# replay can move a capacity's hits by hundreds (docs/replay.md, "Layout
# luck").  This builds the CLI once per layout (-DKVO_BRANCH_LAYOUT=k: the
# same policy, other set collisions) into DIR (default build-layouts, git
# ignored), replays each TRACE over the 84-capacity sweep of docs/replay.md
# (200..50,000 blocks) with LRU, ARC and S3-FIFO once and `branch` under each
# layout, and prints, per layout, the capacities where `branch` is below the
# best of the three (tools/replay_oracles.py --gaps), then over all layouts:
# the capacities below in most layouts (a property of the policy) apart from
# the others (luck), the hits short summed and the mean surplus per layout.
# A rule is better than another when it is better over the layouts, not at
# layout 0 alone.  Takes about 25 s per trace and layout on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=build-layouts
layouts="0 1 2 3 4 5 6 7 8"
while getopts "o:l:" opt; do
    case $opt in
    o) out=$OPTARG ;;
    l) layouts=$OPTARG ;;
    *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
case $out in /*) ;; *) out=$root/$out ;; esac
mkdir -p "$out/json"
sweep=(--capacity 200:50000:84 --no-min --json --quiet)
for k in $layouts; do
    b=$out/layout$k
    if [ ! -f "$b/CMakeCache.txt" ]; then
        cmake -S "$root" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVO_CUDA=OFF -DKVO_BUILD_TESTS=OFF \
            -DKVO_DEVELOPER=OFF "-DCMAKE_C_FLAGS=-DKVO_BRANCH_LAYOUT=$k" > "$b.cmake.log" 2>&1 ||
            { cat "$b.cmake.log"; exit 1; }
    fi
    # incremental: the sources as they are now (the sweeps are redone each run)
    ninja -C "$b" kvoffload > "$b.build.log" 2>&1 || { cat "$b.build.log"; exit 1; }
done
names=()
first=${layouts%% *}
for t in "$@"; do
    n=$(basename "$t" .jsonl)
    names+=("$n")
    [ -s "$out/json/$n.base.json" ] ||
        "$out/layout$first/kvoffload" replay --trace "$t" "${sweep[@]}" --policy lru,arc,s3fifo \
            > "$out/json/$n.base.json"
    for k in $layouts; do
        "$out/layout$k/kvoffload" replay --trace "$t" "${sweep[@]}" --policy branch > "$out/json/$n.$k.json"
    done
done
for k in $layouts; do
    echo "layout $k:"
    for n in "${names[@]}"; do
        echo "  $n: $(cat "$out/json/$n.base.json" "$out/json/$n.$k.json" |
            python3 "$root/tools/replay_oracles.py" --gaps branch)"
    done
done
python3 - "$root/tools" "$out/json" "$layouts" "${names[@]}" <<'EOF'
import sys
from collections import defaultdict
sys.path.insert(0, sys.argv[1])
from replay_oracles import margins
d, layouts, names = sys.argv[2], sys.argv[3].split(), sys.argv[4:]
below, short, surplus, total = defaultdict(list), 0, 0, 0
for n in names:
    for k in layouts:
        with open(f"{d}/{n}.base.json") as base, open(f"{d}/{n}.{k}.json") as run:
            rows, _ = margins(list(base) + list(run), "branch")
        for c, (hits, best, _) in rows.items():
            surplus += hits - best
            if hits < best:
                below[(n, c)].append(hits - best)
                short += hits - best
                total += 1
most = {p: v for p, v in below.items() if 2 * len(v) > len(layouts)}
print(f"over {len(layouts)} layouts: {total} capacities below the best of three "
      f"(of {len(layouts) * 84 * len(names)}), {short} hits short in all, "
      f"mean surplus {surplus / len(layouts):.0f} hits per layout")
print(f"below in most layouts ({len(most)}):" +
      "".join(f" {n} at {c} ({min(v)}..{max(v)} hits, {len(v)} layouts)" for (n, c), v in sorted(most.items())))
EOF
