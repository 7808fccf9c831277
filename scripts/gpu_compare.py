"""Figures for scripts/gpu-check.sh: loss agreement and GPU throughput.

  gpu_compare.py losses A.json B.json TOL WHAT
      the common prefix of two `--dump-losses` files, max relative difference
  gpu_compare.py grads A.safetensors B.safetensors TOL WHAT
      two `--dump-grads` files: per tensor, max |a - b| over max |b|; the worst
  gpu_compare.py speed RUN.log PLAN.json PRECISION TOKENS_PER_EXAMPLE
      step time (median of steps 2..), tokens/s, MFU against the plan's FLOPs
      and the H100's peak, planned step time, memory measured vs planned
"""
import json
import statistics
import sys

# NVIDIA H100 SXM, dense: bf16 tensor cores, and f32 on the CUDA cores (TF32
# is off, so f32 matrix products do not use the tensor cores).
PEAK = {"bf16": 989e12, "f32": 67e12}


def losses(a, b, tol, what):
    try:
        la = json.load(open(a))["losses"]
        lb = json.load(open(b))["losses"]
    except (OSError, ValueError, KeyError) as e:
        print(f"FAIL {what}: cannot read the losses ({e})")
        return 1
    n = min(len(la), len(lb))
    if n == 0:
        print(f"FAIL {what}: no losses")
        return 1
    rel = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(la[:n], lb[:n]))
    ok = rel <= float(tol)
    print(f"{'ok  ' if ok else 'FAIL'} {what}: max relative difference {rel:.2e} over {n} losses (≤ {tol}); "
          f"first {la[0]:.6f} / {lb[0]:.6f}, last {la[n-1]:.6f} / {lb[n-1]:.6f}")
    return 0 if ok else 1


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes) of an f32/f64 safetensors file (no
    dependency beyond the standard library: the GPU machine may lack numpy)."""
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        body = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        code = {"F32": "f", "F64": "d"}.get(t["dtype"])
        if code is None:
            raise ValueError(f"{name}: dtype {t['dtype']}")
        raw = body[a:b]
        out[name] = struct.unpack(f"<{len(raw) // struct.calcsize(code)}{code}", raw)
    return out


def grads(a, b, tol, what):
    try:
        ga, gb = read_safetensors(a), read_safetensors(b)
    except (OSError, ValueError, KeyError) as e:
        print(f"FAIL {what}: cannot read the gradients ({e})")
        return 1
    if set(ga) != set(gb) or not ga:
        print(f"FAIL {what}: the files name different tensors")
        return 1
    worst, at = 0.0, ""
    for name in sorted(ga):
        x, y = ga[name], gb[name]
        scale = max((abs(v) for v in y), default=0.0) or 1.0
        d = max((abs(p - q) for p, q in zip(x, y)), default=0.0) / scale
        if d > worst:
            worst, at = d, name
    ok = worst <= float(tol)
    print(f"{'ok  ' if ok else 'FAIL'} {what}: first-step gradients, worst {worst:.2e} of the tensor's largest "
          f"({at or 'all equal'}) over {len(ga)} tensors (≤ {tol})")
    return 0 if ok else 1


def speed(log, plan, precision, tokens):
    steps, mem = [], []
    for line in open(log, errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("{"):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "step_ms" in r:
                steps.append(r["step_ms"])
        elif line.startswith("  ") and any(w in line for w in ("total", "activations", "params", "resident", "in use")):
            mem.append(line.strip())
    try:
        p = json.load(open(plan))[0]
    except (OSError, ValueError, IndexError, KeyError) as e:
        print(f"FAIL speed: cannot read the plan ({e})")
        return 1
    if len(steps) < 2:
        print(f"FAIL speed ({precision}): fewer than 2 steps in {log}")
        return 1
    ms = statistics.median(steps[1:])
    flops = 3 * p["forward_flops"] + p["recompute_flops"] + p["optimizer_flops"]
    tok = p["batch"] * int(tokens) / (ms / 1e3)
    mfu = flops / (ms / 1e3) / PEAK[precision]
    planned = p.get("device", {}).get("step_seconds")
    print(f"gpt2_124m {precision}: step {ms:.1f} ms (median of steps 2..{len(steps)}; first {steps[0]:.0f} ms), "
          f"{tok:,.0f} tokens/s, {flops / 1e12:.2f} TFLOP/step = {flops / (ms / 1e3) / 1e12:.1f} TFLOP/s, "
          f"MFU {100 * mfu:.1f}% of the H100's {PEAK[precision] / 1e12:.0f} TFLOP/s {precision}"
          + (f"; plan --device h100-80g says {planned * 1e3:.1f} ms" if planned else ""))
    for m in mem:
        print(f"    memory: {m}")
    return 0


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "losses":
        sys.exit(losses(*args))
    if cmd == "grads":
        sys.exit(grads(*args))
    if cmd == "speed":
        sys.exit(speed(*args))
    sys.exit(f"unknown command {cmd}")
