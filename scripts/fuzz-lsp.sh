#!/usr/bin/env bash
# A long fuzz campaign on `shardc lsp`'s input side (tests/fuzz_lsp.rs: the
# framing parser and the whole message loop, in process), in release.
#   scripts/fuzz-lsp.sh [CASES] [cargo test args...]
# CASES (default 100000) is per property; each run draws new random inputs.
# A failure prints the smallest input proptest shrank it to; add it to
# tests/lsp.rs or tests/fuzz_lsp.rs as a fixed case once it is fixed.
# On a shared machine, limit the build: CARGO_BUILD_JOBS=1 scripts/fuzz-lsp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-100000}"
shift || true
start=$(date +%s)
SHARDC_FUZZ_CASES="$cases" cargo test --release --test fuzz_lsp "$@"
echo "fuzz-lsp: $cases cases per property in $(($(date +%s) - start)) s" >&2
