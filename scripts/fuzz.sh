#!/usr/bin/env bash
# A long fuzz campaign over everything that reads untrusted input: the parser,
# checker, planner and formatter (tests/fuzz.rs), the language server's framing
# and message loop (tests/fuzz_lsp.rs) and the array and FDO readers
# (tests/fuzz_arrays.rs), then the adversarial campaign's fixed attacks
# (tests/untrusted.rs: huge inputs, checkpoint-directory tricks, bad FDO files,
# concurrent runs, an enormous editor buffer). Each fuzz test runs CASES fresh
# random inputs per target; every input must finish without a panic or an
# abort within a 10 s guard, and every test binary runs under a memory cap
# (address space, `ulimit -v`; MEM_CAP_MB, default 4096): an allocation past
# it fails, and a reader that does not check its sizes aborts (exit 134),
# which this script reports as an abort, not a failure.
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
[ ${#targets[@]} -eq 0 ] && targets=(fuzz fuzz_lsp fuzz_arrays untrusted)
cap_mb="${MEM_CAP_MB:-4096}"
flag=()
[ "$profile" = release ] && flag=(--release)
# Build first, without the cap (the compiler needs more).
for t in "${targets[@]}"; do
    cargo test "${flag[@]}" --test "$t" --no-run
done
status=0
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for t in "${targets[@]}"; do
    start=$(date +%s)
    set +e
    (
        ulimit -v $(( cap_mb * 1024 ))
        SHARDC_FUZZ_CASES="$cases" cargo test "${flag[@]}" --test "$t" -- --test-threads 1
    ) 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    took=$(( $(date +%s) - start ))
    if [ "$rc" -eq 0 ]; then
        echo "fuzz: $t, $cases inputs per target under a ${cap_mb} MiB cap, passed in $took s" >&2
    elif grep -q "SIGABRT\|signal: 6" "$log"; then
        echo "fuzz: $t ABORTED (SIGABRT: an abort, or an allocation over the ${cap_mb} MiB cap) after $took s" >&2
        status=1
    else
        echo "fuzz: $t FAILED (exit $rc) after $took s" >&2
        status=1
    fi
done
exit $status
