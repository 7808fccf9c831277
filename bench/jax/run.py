# The side-by-side benchmark of issue 17: every configuration in .shard (timed
# through `shardc run --json`) and in JAX (models.py, in one worker process per
# device count), interleaved in one invocation, with the median steady-state
# step time of each side, their ratio, a measured f32 matmul peak of this
# machine and the fraction of it each run reaches. See bench/jax/README.md.
#
#   bash bench/jax/setup.sh                      # once: the venv with jax, flax, optax
#   bench/jax/.venv/bin/python bench/jax/run.py  # [--rounds 5] [--steps 30] [--only NAME]

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


@dataclass
class Config:
    name: str          # for --only
    label: str         # the table's first column
    shard: str         # file in bench/jax
    mesh: str | None   # shardc --mesh override
    devices: int       # the JAX worker's device count
    jax: str           # models.BUILDERS key
    shardc_times: list = field(default_factory=list)
    jax_times: list = field(default_factory=list)
    shardc_rounds: list = field(default_factory=list)  # per-round medians
    jax_rounds: list = field(default_factory=list)
    shardc_first_loss: float | None = None
    jax_first_loss: float | None = None
    flop: float | None = None  # model FLOP per step, all devices
    devices_bytes: float | None = None  # the plan for the devices (`one process`, or total × devices)
    plan_bytes: float | None = None  # the plan for the process (`with shardc`: the devices and shardc's code)
    shardc_rss: list = field(default_factory=list)  # peak RSS of each shardc run, bytes
    tiny_times: list = field(default_factory=list)  # the shrunk program's step times
    tiny_rss: list = field(default_factory=list)    # and its peak RSS
    shardc_busy: list = field(default_factory=list)  # steady steps beside a busy process (--contended)
    jax_busy: list = field(default_factory=list)


CONFIGS = [
    Config("shakespeare-8", "seed 000 next-word model, dense embedding, batch 256, 8 devices",
           "shakespeare_dense.shard", None, 8, "shakespeare"),
    Config("shakespeare-1", "the same, 1 device",
           "shakespeare_dense.shard", "device=1", 1, "shakespeare"),
    Config("classifier-8", "seed 003 classifier 784 → 512 (silu) → 10, batch 128, FSDP over 8 devices, adamw",
           "fsdp_classifier.shard", None, 8, "classifier"),
    Config("classifier-1", "the same, 1 device",
           "fsdp_classifier.shard", "data=1", 1, "classifier"),
    Config("gptj-256", "seed 001 GPT-J blocks, d_model 256, 2 layers, 4 heads, vocab 5000, T 32, batch 16, dp 4 × mp 2, Adam",
           "gptj_256.shard", None, 8, "gptj_256"),
    Config("gptj-768", "the same at d_model 768",
           "gptj_768.shard", None, 8, "gptj_768"),
]

# The fixed cost of a step, and the process's memory floor: each row's program
# with every size shrunk to a few elements (same ops, mesh, optimizer and
# accumulation), so that the kernels' arithmetic and the model's memory are
# negligible and what remains is the runtime's own work per step and per op
# (dispatch, allocation, the tape, collectives' bookkeeping, the optimizer's
# loop over tensors, metrics) and the memory any run holds (binary, data,
# threads). Per file: the constants to shrink and the batch.
SHRINK = {
    "shakespeare_dense.shard": ({"VOCAB": 8, "SEQ": 2, "EMB": 2}, 8),
    "fsdp_classifier.shard": ({"INPUT": 4, "HIDDEN": 4, "CLASSES": 2}, 32),
    "gptj_256.shard": ({"VOCAB": 16, "T": 4, "H": 2, "D": 8}, 8),
    "gptj_768.shard": ({"VOCAB": 16, "T": 4, "H": 2, "D": 8}, 8),
}

UNITS = {"FLOP": 1.0, "kFLOP": 1e3, "MFLOP": 1e6, "GFLOP": 1e9, "TFLOP": 1e12, "PFLOP": 1e15}


def die(msg: str):
    sys.exit(f"error: {msg}")


def say(msg: str):
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# shardc side
# --------------------------------------------------------------------------

BYTES = {"B": 1.0, "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40}


def plan_figures(shardc: str, cfg: Config) -> tuple[float, float, float]:
    """FLOP per step of the whole model (`shardc plan`'s "compute per device per
    step" times the number of devices in its header), the plan's memory for
    the devices: its "one process" row (every device in one process, replicas
    sharing parameters and optimizer state), or without one (no replicas, or
    one device) the per-device total times the devices; and for the process:
    its "with shardc" row (the devices and shardc's own code)."""
    cmd = [shardc, "plan", os.path.join(HERE, cfg.shard)] + (["--mesh", cfg.mesh] if cfg.mesh else [])
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        die(f"`{' '.join(cmd)}` failed:\n{p.stderr}")
    m = re.search(r"compute per device per step: ([0-9.]+) (\w+)", p.stdout)
    d = re.search(r"; (\d+) devices?\)", p.stdout)
    t = re.search(r"^  total +([0-9.]+) (\w+)", p.stdout, re.M)
    if not m or not d or not t or m.group(2) not in UNITS or t.group(2) not in BYTES:
        die(f"could not read the FLOP and memory per step from `{' '.join(cmd)}`:\n{p.stdout}")
    devices = int(d.group(1))
    one = re.search(r"^  one process +([0-9.]+) (\w+)", p.stdout, re.M)
    memory = (float(one.group(1)) * BYTES[one.group(2)] if one and one.group(2) in BYTES
              else float(t.group(1)) * BYTES[t.group(2)] * devices)
    w = re.search(r"^  with shardc +([0-9.]+) (\w+)", p.stdout, re.M)
    if not w or w.group(2) not in BYTES:
        die(f"`{' '.join(cmd)}` printed no `with shardc` row (the process's plan; Linux only):\n{p.stdout}")
    return float(m.group(1)) * UNITS[m.group(2)] * devices, memory, float(w.group(1)) * BYTES[w.group(2)]


def run_shardc(shardc: str, file: str, mesh: str | None, steps: int, tmp: str, seq: int):
    """`shardc run FILE --json --quiet --steps N --out DIR`: one JSON record per
    step on stdout; its `step_ms` is the wall time from the previous step's
    record to this one's. Returns the step times, the losses and the process's
    peak resident memory in bytes."""
    out = os.path.join(tmp, f"run{seq}")
    cmd = [shardc, "run", file, "--json", "--quiet",
           "--steps", str(steps), "--out", out] + (["--mesh", mesh] if mesh else [])
    with tempfile.TemporaryFile(mode="w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
        stdout = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read()
    if p.returncode != 0:
        die(f"`{' '.join(cmd)}` failed (exit {p.returncode}):\n{stderr}")
    recs = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if len(recs) != steps or any("step_ms" not in r for r in recs):
        die(f"`{' '.join(cmd)}` printed {len(recs)} step records with step_ms, expected {steps}:\n{stdout[-2000:]}")
    # ru_maxrss is in KiB on Linux.
    return [r["step_ms"] for r in recs], [r["loss"] for r in recs], usage.ru_maxrss * 1024


def tiny_file(src: str, tmp: str) -> str:
    """A copy of bench/jax/SRC with its SHRINK constants and batch, in TMP."""
    consts, batch = SHRINK[src]
    with open(os.path.join(HERE, src)) as f:
        text = f.read()
    for k, v in consts.items():
        text, n = re.subn(rf"^const {k} = \d+", f"const {k} = {v}", text, flags=re.M)
        if n != 1:
            die(f"{src} has no `const {k} = N` line to shrink")
    text, n = re.subn(r"batch: \d+", f"batch: {batch}", text)
    if n != 1:
        die(f"{src} has no `batch: N` to shrink")
    # `import nn` resolves next to the file or in the standard library, so the
    # copy can live in the temporary directory.
    path = os.path.join(tmp, f"tiny-{src}")
    with open(path, "w") as f:
        f.write(text)
    return path


# --------------------------------------------------------------------------
# JAX side: one models.py worker per device count
# --------------------------------------------------------------------------

class Worker:
    def __init__(self, devices: int):
        env = dict(os.environ)
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
        self.devices = devices
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "models.py"), "serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        hello = self._read()
        if hello.get("devices") != devices:
            die(f"the JAX worker sees {hello.get('devices')} devices, expected {devices}")
        self.jax_version = hello.get("jax")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            die(f"the JAX worker ({self.devices} devices) exited (its errors are above)")
        reply = json.loads(line)
        if "error" in reply:
            die(f"the JAX worker ({self.devices} devices): {reply['error']}")
        return reply

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------

class Competitor:
    """A busy process pinned to core 0 (`--contended`): what another user's job
    does to a shared machine. Started for a run and stopped after it."""

    SPIN = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", self.SPIN])
        time.sleep(0.2)  # pinned and spinning before the run starts
        if self.proc.poll() is not None:
            die("the competing busy process exited at once (can it pin itself to core 0?)")
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def check_environment(shardc: str):
    if not (os.path.isfile(shardc) and os.access(shardc, os.X_OK)):
        die(f"no shardc binary at {shardc}: build it with `cargo build --release` "
            f"(the default is target/release/shardc in the repository) or pass --shardc PATH")
    probe = subprocess.run([sys.executable, "-c", "import jax, flax, optax; print(jax.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        die(f"jax, flax and optax are not importable by {sys.executable}: run "
            f"`bash bench/jax/setup.sh`, then `bench/jax/.venv/bin/python bench/jax/run.py`")


def fmt_ms(ms: float) -> str:
    if ms < 1:
        return f"{ms * 1e3:.0f} µs"
    return f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def fmt_flop(f: float) -> str:
    for unit, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if f >= scale:
            return f"{f / scale:.3g} {unit}"
    return f"{f:.0f} FLOP"


def main():
    ap = argparse.ArgumentParser(
        description="shardc vs JAX, side by side: the configurations of issue 17, interleaved (bench/jax/README.md)")
    ap.add_argument("--shardc", default=os.path.join(ROOT, "target", "release", "shardc"),
                    help="the shardc binary (default: target/release/shardc in the repository)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per run (default 30)")
    ap.add_argument("--warmup", type=int, default=3,
                    help="steps run before the timed ones and discarded, every run (default 3)")
    ap.add_argument("--only", action="append", default=[],
                    help="run only this configuration (repeatable; names: "
                         + ", ".join(c.name for c in CONFIGS) + ")")
    ap.add_argument("--save", help="also write every step time to this JSON file")
    ap.add_argument("--contended", action="store_true",
                    help="also run every configuration on both sides with a busy process pinned to core 0, "
                         "and print how much each side's step time grows")
    a = ap.parse_args()
    shardc = os.path.abspath(a.shardc)
    configs = CONFIGS
    if a.only:
        unknown = [n for n in a.only if n not in {c.name for c in CONFIGS}]
        if unknown:
            die(f"unknown configuration {', '.join(unknown)}; known: {', '.join(c.name for c in CONFIGS)}")
        configs = [c for c in CONFIGS if c.name in a.only]
    if a.rounds < 1 or a.steps < 1 or a.warmup < 0:
        die("--rounds and --steps must be at least 1, --warmup at least 0")
    check_environment(shardc)

    for c in configs:
        c.flop, c.devices_bytes, c.plan_bytes = plan_figures(shardc, c)
    counts = sorted({c.devices for c in configs} | {1})
    say(f"starting JAX workers for {', '.join(map(str, counts))} device(s)")
    workers = {n: Worker(n) for n in counts}
    peaks = [workers[1].ask(cmd="peak")["flops_per_s"]]
    total = a.warmup + a.steps
    seq = 0
    started = time.time()
    try:
        with tempfile.TemporaryDirectory(prefix="shardc-vs-jax-") as tmp:
            for r in range(a.rounds):
                for i, c in enumerate(configs):
                    # Alternate which side goes first, so neither always runs
                    # right after the other's heavier configuration.
                    sides = ["shardc", "jax"] if (r + i) % 2 == 0 else ["jax", "shardc"]
                    def one(side):
                        nonlocal seq
                        if side == "shardc":
                            seq += 1
                            times, losses, rss = run_shardc(
                                shardc, os.path.join(HERE, c.shard), c.mesh, total, tmp, seq)
                            return times, losses, rss
                        reply = workers[c.devices].ask(cmd="run", config=c.jax, steps=total)
                        return reply["times_ms"], reply["losses"], None

                    for side in sides:
                        if a.contended:
                            with Competitor():
                                busy = one(side)[0][a.warmup:]
                            (c.shardc_busy if side == "shardc" else c.jax_busy).extend(busy)
                            say(f"round {r + 1}/{a.rounds}  {c.name:<14} {side:<6} median {fmt_ms(statistics.median(busy)):>10}"
                                f"  beside a busy process")
                        times, losses, rss = one(side)
                        if rss is not None:
                            c.shardc_rss.append(rss)
                        steady = times[a.warmup:]
                        if side == "shardc":
                            c.shardc_times += steady
                            c.shardc_rounds.append(statistics.median(steady))
                            if c.shardc_first_loss is None:
                                c.shardc_first_loss = losses[0]
                        else:
                            c.jax_times += steady
                            c.jax_rounds.append(statistics.median(steady))
                            if c.jax_first_loss is None:
                                c.jax_first_loss = losses[0]
                        say(f"round {r + 1}/{a.rounds}  {c.name:<14} {side:<6} median {fmt_ms(statistics.median(steady)):>10}"
                            f"  ({a.steps} steps after {a.warmup} discarded)")
            # The shrunk programs (SHRINK), shardc only, the same rounds.
            for r in range(a.rounds):
                for c in configs:
                    seq += 1
                    times, _, rss = run_shardc(shardc, tiny_file(c.shard, tmp), c.mesh, total, tmp, seq)
                    c.tiny_times += times[a.warmup:]
                    c.tiny_rss.append(rss)
                    say(f"round {r + 1}/{a.rounds}  {c.name:<14} shrunk median {fmt_ms(statistics.median(times[a.warmup:])):>10}")
        peaks.append(workers[1].ask(cmd="peak")["flops_per_s"])
        jax_version = workers[1].jax_version
    finally:
        for w in workers.values():
            w.close()

    peak = max(peaks)
    print()
    print(f"shardc {shardc} vs JAX {jax_version} on CPU, {os.cpu_count()} cores; "
          f"{a.rounds} interleaved rounds × {a.steps} steps per side (after {a.warmup} discarded); "
          f"{time.time() - started:.0f} s")
    print(f"f32 matmul peak (jitted 2048×2048 matmul, JAX, 1 device, best of 10, at the start and the end): "
          f"{peak / 1e9:.0f} GFLOP/s")
    print()
    print("| configuration | shardc | JAX | shardc / JAX | FLOP / step | shardc, % of peak | JAX, % of peak | first loss shardc / JAX |")
    print("|---|---|---|---|---|---|---|---|")
    for c in configs:
        s, j = statistics.median(c.shardc_times), statistics.median(c.jax_times)
        ps, pj = c.flop / (s / 1e3) / peak, c.flop / (j / 1e3) / peak
        print(f"| {c.label} | {fmt_ms(s)} | {fmt_ms(j)} | {s / j:.2f}× | {fmt_flop(c.flop)} | "
              f"{100 * ps:.1f}% | {100 * pj:.1f}% | {c.shardc_first_loss:.4f} / {c.jax_first_loss:.4f} |")
    print()
    print("Medians of all steady-state steps of all rounds. Per-round medians (ms), shardc | JAX:")
    for c in configs:
        print(f"  {c.name:<14} " + " ".join(f"{x:.2f}" for x in c.shardc_rounds)
              + "  |  " + " ".join(f"{x:.2f}" for x in c.jax_rounds))
    print("FLOP / step: `shardc plan`'s compute per device per step × devices (the same figure for both sides).")
    if a.contended:
        print()
        print("| configuration | shardc quiet | shardc beside a busy process | growth | JAX quiet | JAX beside a busy process | growth |")
        print("|---|---|---|---|---|---|---|")
        for c in configs:
            sq, sb = statistics.median(c.shardc_times), statistics.median(c.shardc_busy)
            jq, jb = statistics.median(c.jax_times), statistics.median(c.jax_busy)
            print(f"| {c.name} | {fmt_ms(sq)} | {fmt_ms(sb)} | {sb / sq:.2f}× | {fmt_ms(jq)} | {fmt_ms(jb)} | {jb / jq:.2f}× |")
        print("Busy process: a Python loop pinned to core 0, started before each contended run and killed after it; "
              "each side's contended run comes right before its quiet one in every round.")
    print()
    print("| configuration | shardc peak RSS | the same program shrunk | plan for the devices | plan for the process | RSS / plan for the process | (RSS − shrunk) / plan for the devices |")
    print("|---|---|---|---|---|---|---|")
    for c in configs:
        rss, floor = max(c.shardc_rss), max(c.tiny_rss)
        print(f"| {c.name} | {rss / 2**20:.1f} MiB | {floor / 2**20:.1f} MiB | {c.devices_bytes / 2**20:.1f} MiB | "
              f"{c.plan_bytes / 2**20:.1f} MiB | {rss / c.plan_bytes:.2f}× | {(rss - floor) / c.devices_bytes:.2f}× |")
    print("Peak RSS: the largest of the runs' (the whole process: every virtual device, the binary, the data).")
    print("Plan for the devices: `shardc plan`'s `one process` row (replicas share parameters and optimizer state), else its per-device total × devices.")
    print("Plan for the process: its `with shardc` row, the devices and shardc's own code and read-only data (mapped from its binary and libraries: an upper bound).")
    print("Shrunk: the same file with every size a few elements (SHRINK in run.py), the process's floor.")
    print()
    print("| configuration, shardc | step, shrunk program (the runtime's fixed cost) |")
    print("|---|---|")
    for c in configs:
        print(f"| {c.name} | {fmt_ms(statistics.median(c.tiny_times))} |")
    if a.save:
        with open(a.save, "w") as f:
            json.dump({"peak_flops_per_s": peaks, "jax": jax_version, "configs": [
                {"name": c.name, "flop": c.flop, "shardc_ms": c.shardc_times, "jax_ms": c.jax_times,
                 "shrunk_ms": c.tiny_times, "shardc_rss": c.shardc_rss, "shrunk_rss": c.tiny_rss,
                 "plan_bytes": c.plan_bytes, "devices_bytes": c.devices_bytes,
                 "shardc_first_loss": c.shardc_first_loss, "jax_first_loss": c.jax_first_loss,
                 "shardc_busy_ms": c.shardc_busy, "jax_busy_ms": c.jax_busy}
                for c in configs]}, f, indent=1)


if __name__ == "__main__":
    main()
