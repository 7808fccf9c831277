#!/usr/bin/env bash
# A long fuzz campaign over everything that reads untrusted input: the parser,
# checker, planner and formatter (tests/fuzz.rs), the language server's framing
# and message loop (tests/fuzz_lsp.rs) and the array and FDO readers
# (tests/fuzz_arrays.rs). Each test runs CASES fresh random inputs per target;
# every input must finish without a panic or an abort within a 10 s guard.
#   scripts/fuzz.sh [CASES=20000] [PROFILE=release|dev] [TARGET...]
# A failure prints the smallest input proptest shrank it to: fix it, then keep
# it as a fixed case in tests/hostile.rs, tests/lsp.rs or tests/arrays.rs.
# On a shared machine, limit the build: CARGO_BUILD_JOBS=1 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-20000}"
profile="${2:-release}"
shift $(( $# > 2 ? 2 : $# ))
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz fuzz_lsp fuzz_arrays)
flag=()
[ "$profile" = release ] && flag=(--release)
for t in "${targets[@]}"; do
    start=$(date +%s)
    SHARDC_FUZZ_CASES="$cases" cargo test "${flag[@]}" --test "$t" -- --test-threads 1
    echo "fuzz: $t, $cases inputs per target, passed in $(( $(date +%s) - start )) s" >&2
done
