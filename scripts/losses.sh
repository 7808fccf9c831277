#!/usr/bin/env bash
# Dump the first 10 losses of every `train` in models/ and examples/, on the
# file's own mesh and on a mesh of one device, as JSON files in OUT (one per
# run; a run that stops writes its exit code and last error line instead).
# Two dumps compare with `diff -r A B` (bit-identical losses print identically).
#   scripts/losses.sh OUT [path/to/shardc]
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
bin="$(realpath "${2:-$root/target/release/shardc}")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
for f in "$root"/models/*.shard "$root"/examples/*.shard; do
    base="$(basename "$f" .shard)"
    axes="$(grep -m1 -oP '^mesh \w+\(\K[^)]*' "$f" | sed -E 's/ *: *[0-9]+//g; s/ //g')"
    one="$(echo "$axes" | sed -E 's/([a-z_0-9]+)/\1=1/g')"
    models="$(grep -oP '^train \K\w+' "$f")"
    [ -z "$models" ] && continue
    for m in $models; do
        for mesh in own one; do
            name="$base.$m.$mesh"
            args=(run "$f" --model "$m" --steps 10 --quiet --out "$work/run" --dump-losses "$out/$name.json")
            [ "$mesh" = one ] && args+=(--mesh "$one")
            if ! "$bin" "${args[@]}" 2>"$work/err"; then
                # The machine's free memory is not part of the result.
                echo "refused: $(grep -m1 'error' "$work/err" | sed -E 's/, but only .* is available//')" >"$out/$name.json"
            fi
            echo "$name: $(head -c 200 "$out/$name.json")"
        done
    done
done
