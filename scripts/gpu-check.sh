#!/usr/bin/env bash
#! The GPU check: runs on a GPU machine that has no Rust (Python and the NVIDIA
#! driver only), with the binary scripts/build-cuda.sh packed. It trains
#!   - the four seed models on the GPU and on the CPU (10 losses each,
#!     ≤ 1e-4 relative in f32), and on the GPU on a mesh of one device
#!     (its virtual devices on one GPU equal one device: ≤ 1e-5);
#!   - four models of the attention family (causal, bidirectional, cross,
#!     grouped-query sliding-window) with the fused attention kernels and with
#!     the composed ones (SHARDC_KERNELS=candle): 10 losses and the first
#!     step's gradients (≤ 1e-4), and the windowed one against the CPU;
#!   - a GPT-2-124M-sized model (bench/gpu/gpt2_124m.shard) on the GPU in f32
#!     and in bf16 (≤ 2% from f32), its first losses against the CPU,
#! and prints step time, tokens/s, MFU against the plan's FLOPs, memory
#! measured vs planned, the bf16 step on candle's kernels alone, and the
#! `--profile` table of a bf16 step. Every figure goes to OUT/gpu-check.txt.
#!
#! Usage: bash scripts/gpu-check.sh [--dry-run] [--bin PATH] [--out DIR] [--quick]
#!   --dry-run  check the inputs and print what would run; run nothing
#!   --bin      the CUDA shardc (default .cuda/dist/shardc-cuda, or its .xz)
#!   --out      where logs and figures go (default $OUT, else runs/gpu-check)
#!   --quick    the seed models and the attention models only
#! Environment: GPU_CHECK_NO_CPU_GPT2=1 skips the CPU's two GPT-2 steps (about
#! 100 s on 16 cores); GPU_CHECK_LIMIT caps each GPT-2 run (seconds, default 150).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dry=0 quick=0
bin=${SHARDC_CUDA_BIN:-$root/.cuda/dist/shardc-cuda}
out=${OUT:-$root/runs/gpu-check}
while [[ $# -gt 0 ]]; do
  case $1 in
    --dry-run) dry=1 ;;
    --quick) quick=1 ;;
    --bin) bin=$2; shift ;;
    --out) out=$2; shift ;;
    *) echo "gpu-check: unknown argument $1 (--dry-run, --bin PATH, --out DIR, --quick)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
log=$out/gpu-check.txt
: >"$log"
say() { echo "$*" | tee -a "$log"; }
fail=0

seeds=(models/shakespeare.shard models/fsdp_mlp.shard tests/models/gptj_small.shard tests/models/t3d_small.shard)
gpt2=bench/gpu/gpt2_124m.shard
attn=(tests/models/gptj_small.shard examples/encoder_decoder.shard examples/vit.shard bench/gpu/window.shard)
STEPS=10

# --- inputs -----------------------------------------------------------------
for f in "${seeds[@]}" "${attn[@]}" "$gpt2" scripts/gpu_compare.py; do
  [[ -f $f ]] || { echo "gpu-check: missing $f" >&2; exit 2; }
done
if [[ ! -x $bin && -f $bin.xz ]]; then
  [[ $dry == 1 ]] || { xz -dc "$bin.xz" >/tmp/shardc-cuda && chmod +x /tmp/shardc-cuda && bin=/tmp/shardc-cuda; }
fi
if [[ $dry == 1 ]]; then
  if [[ -x $bin || -f $bin.xz ]]; then echo "gpu-check: binary: $bin$([[ -x $bin ]] || echo .xz)"
  else echo "gpu-check: binary: missing: build it first with bash scripts/build-cuda.sh"; fi
fi
if [[ $dry == 0 && ! -x $bin ]]; then
  echo "gpu-check: no CUDA shardc at $bin (build it with: bash scripts/build-cuda.sh)" >&2
  exit 2
fi
py=$(command -v python3 || true)
[[ -n $py ]] || { echo "gpu-check: needs python3" >&2; exit 2; }

# The CUDA libraries: PyTorch's wheels (nvidia/cu13/lib, nvidia/nccl/lib) or
# /usr/local/cuda; the driver's libcuda is on the loader's path already.
libs=$("$py" - <<'EOF'
import glob, importlib.util, os
dirs = []
spec = importlib.util.find_spec("nvidia")
for base in (spec.submodule_search_locations if spec else []):
    for so in sorted(glob.glob(os.path.join(base, "**", "lib", "lib*.so*"), recursive=True)):
        d = os.path.dirname(so)
        if d not in dirs:
            dirs.append(d)
for d in ("/usr/local/cuda/lib64",):
    if os.path.isdir(d):
        dirs.append(d)
print(":".join(dirs))
EOF
)
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

own_mesh_of_one() { # `--mesh a=1,b=1` for the file's mesh
  grep -m1 -oP '^mesh \w+\(\K[^)]*' "$1" | sed -E 's/ *: *[0-9]+//g; s/ //g; s/([a-z_0-9]+)/\1=1/g'
}

run() { # NAME TIMEOUT ARGS...: one shardc run, its log in OUT/NAME.log
  local name=$1 limit=$2; shift 2
  if [[ $dry == 1 ]]; then
    say "would run: shardc $*"
    return 0
  fi
  local t0 t1 rc
  t0=$(date +%s%N)
  timeout "$limit" "$bin" "$@" >"$out/$name.log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  if [[ $rc != 0 ]]; then
    say "FAILED ($rc): $name: shardc $*"
    grep -m3 -i 'error\|panicked' "$out/$name.log" | sed 's/^/    /' | tee -a "$log"
    fail=1
  else
    say "ran $name in $(( (t1 - t0) / 1000000 )) ms"
  fi
  return $rc
}

compare() { # A.json B.json TOL WHAT
  [[ $dry == 1 ]] && { say "would compare: $4 (≤ $3 relative)"; return 0; }
  "$py" scripts/gpu_compare.py losses "$1" "$2" "$3" "$4" | tee -a "$log"
  [[ ${PIPESTATUS[0]} == 0 ]] || fail=1
}

say "gpu-check: $(date -u +%FT%TZ) binary $bin"
if [[ $dry == 0 ]]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$log"
  if ldd "$bin" | grep -q 'not found'; then
    say "gpu-check: libraries missing (LD_LIBRARY_PATH=$LD_LIBRARY_PATH):"
    ldd "$bin" | grep 'not found' | tee -a "$log"
    exit 2
  fi
fi

# --- the seed models: GPU = CPU, and a mesh on one GPU = one device ------------
for f in "${seeds[@]}"; do
  b=$(basename "$f" .shard)
  common=(run "$f" --steps $STEPS --quiet)
  run "$b.cpu" 90 "${common[@]}" --out "$out/r.$b.cpu" --dump-losses "$out/$b.cpu.json"
  run "$b.gpu" 90 "${common[@]}" --device cuda --out "$out/r.$b.gpu" --dump-losses "$out/$b.gpu.json"
  run "$b.gpu1" 90 "${common[@]}" --device cuda --mesh "$(own_mesh_of_one "$f")" --out "$out/r.$b.gpu1" --dump-losses "$out/$b.gpu1.json"
  compare "$out/$b.cpu.json" "$out/$b.gpu.json" 1e-4 "$b: GPU vs CPU (f32)"
  compare "$out/$b.gpu.json" "$out/$b.gpu1.json" 1e-5 "$b: its mesh on one GPU vs one device"
done
# --- fused attention (prim/flash.rs) = the composed one (SHARDC_KERNELS=candle) --
grads() { # A.safetensors B.safetensors TOL WHAT
  [[ $dry == 1 ]] && { say "would compare: $4 (≤ $3)"; return 0; }
  "$py" scripts/gpu_compare.py grads "$1" "$2" "$3" "$4" | tee -a "$log"
  [[ ${PIPESTATUS[0]} == 0 ]] || fail=1
}
for f in "${attn[@]}"; do
  b=$(basename "$f" .shard)
  common=(run "$f" --steps $STEPS --quiet --device cuda)
  run "$b.fused" 90 "${common[@]}" --out "$out/r.$b.fused" --dump-losses "$out/$b.fused.json" --dump-grads "$out/$b.fused.grads"
  SHARDC_KERNELS=candle run "$b.composed" 90 "${common[@]}" --out "$out/r.$b.composed" --dump-losses "$out/$b.composed.json" --dump-grads "$out/$b.composed.grads"
  compare "$out/$b.composed.json" "$out/$b.fused.json" 1e-4 "$b: fused attention vs composed on the GPU"
  grads "$out/$b.fused.grads" "$out/$b.composed.grads" 1e-4 "$b: fused attention vs composed on the GPU"
done
run window.cpu 90 run bench/gpu/window.shard --steps $STEPS --quiet --out "$out/r.window.cpu" --dump-losses "$out/window.cpu.json"
compare "$out/window.cpu.json" "$out/window.fused.json" 1e-4 "window: GPU (fused) vs CPU"
[[ $quick == 1 ]] && { say "gpu-check: --quick: seed models and attention only"; exit $fail; }

# --- GPT-2 124M-sized: throughput, memory, bf16 ------------------------------
bf=$out/gpt2_124m_bf16.shard
if [[ $dry == 0 ]]; then
  sed -E 's/^(  optimizer: .*)$/\1\n  precision: bf16/' "$gpt2" >"$bf"
  "$bin" plan "$gpt2" --device h100-80g --json >"$out/gpt2.plan.json" 2>"$out/gpt2.plan.err" || fail=1
  "$bin" plan "$bf" --device h100-80g --json >"$out/gpt2_bf16.plan.json" 2>"$out/gpt2_bf16.plan.err" || fail=1
fi
run gpt2.f32 "${GPU_CHECK_LIMIT:-150}" run "$gpt2" --steps $STEPS --device cuda --json --mem --out "$out/r.gpt2" --dump-losses "$out/gpt2.f32.json"
[[ $dry == 1 ]] || "$py" scripts/gpu_compare.py speed "$out/gpt2.f32.log" "$out/gpt2.plan.json" f32 1024 | tee -a "$log"
run gpt2.bf16 "${GPU_CHECK_LIMIT:-150}" run "$bf" --steps $STEPS --device cuda --json --out "$out/r.gpt2b" --dump-losses "$out/gpt2.bf16.json"
[[ $dry == 1 ]] || "$py" scripts/gpu_compare.py speed "$out/gpt2.bf16.log" "$out/gpt2_bf16.plan.json" bf16 1024 | tee -a "$log"
compare "$out/gpt2.f32.json" "$out/gpt2.bf16.json" 2e-2 "gpt2_124m: bf16 vs f32 on the GPU"
# The same bf16 run on candle's kernels alone (what shardc's fused ones gain),
# then where a fused step's time goes (`--profile`, 4 steps).
SHARDC_KERNELS=candle run gpt2.bf16.composed "${GPU_CHECK_LIMIT:-150}" run "$bf" --steps 5 --device cuda --json --out "$out/r.gpt2bc" --dump-losses "$out/gpt2.bf16.composed.json"
[[ $dry == 1 ]] || "$py" scripts/gpu_compare.py speed "$out/gpt2.bf16.composed.log" "$out/gpt2_bf16.plan.json" bf16 1024 | sed 's/^gpt2_124m bf16:/gpt2_124m bf16 (candle kernels only):/' | head -1 | tee -a "$log"
compare "$out/gpt2.bf16.composed.json" "$out/gpt2.bf16.json" 5e-3 "gpt2_124m bf16: fused kernels vs candle's"
if run gpt2.profile 120 run "$bf" --steps 4 --device cuda --quiet --profile --out "$out/r.gpt2p"; then
  [[ $dry == 1 ]] || head -16 "$out/gpt2.profile.log" | tee -a "$log"
fi
# The CPU's 2 steps of GPT-2 take about 100 s on 16 cores: GPU_CHECK_NO_CPU_GPT2=1 skips them.
if [[ -z ${GPU_CHECK_NO_CPU_GPT2:-} ]]; then
  run gpt2.cpu 150 run "$gpt2" --steps 2 --quiet --out "$out/r.gpt2c" --dump-losses "$out/gpt2.cpu.json"
  compare "$out/gpt2.cpu.json" "$out/gpt2.f32.json" 1e-4 "gpt2_124m: GPU vs CPU, first 2 steps (f32)"
fi
if [[ $dry == 1 ]]; then say "gpu-check: dry run: the inputs are there; nothing ran"; exit 0; fi
say "gpu-check: $([[ $fail == 0 ]] && echo passed || echo FAILED)"
exit $fail
