#!/usr/bin/env bash
# A long fuzzing campaign against the array and FDO readers (tests/fuzz_arrays.rs):
# ROUNDS rounds of CASES cases per target, each round with fresh random seeds,
# in a release build. Stops at the first failure, whose minimal input proptest
# prints (it is also in the log). `cargo test` runs 256 cases per target.
#   [JOBS=1] scripts/fuzz_arrays.sh [CASES=100000] [ROUNDS=1] [LOG=target/fuzz_arrays.log]
set -euo pipefail
cases="${1:-100000}"
rounds="${2:-1}"
log="${3:-target/fuzz_arrays.log}"
cd "$(dirname "$0")/.."
cargo test --release -j"${JOBS:-1}" --test fuzz_arrays --no-run
for r in $(seq 1 "$rounds"); do
    start=$(date +%s)
    echo "round $r of $rounds: $cases cases per target" | tee -a "$log"
    if ! SHARDC_FUZZ_CASES="$cases" cargo test --release -j"${JOBS:-1}" --test fuzz_arrays 2>&1 | tee -a "$log"; then
        echo "round $r failed; see $log" >&2
        exit 1
    fi
    echo "round $r passed in $(( $(date +%s) - start )) s" | tee -a "$log"
done
