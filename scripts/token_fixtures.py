#!/usr/bin/env python3
"""Token-stream fixtures for tests/tokens.rs, written with numpy as users
write them (nanoGPT's prepare.py: `ids.astype(np.uint16).tofile(...)`):

    python3 scripts/token_fixtures.py      # (re)write tests/fixtures/tokens/

- stream.bin: 20,000 ids below 256, uint16 (nanoGPT's format);
- stream32.bin: the same ids as uint32; stream.npy: the same as a 1-D int32 .npy;
- windows.npz: what nanoGPT's get_batch slicing gives for the first STEPS
  steps, with shardc's window starts (`data::stream::window`, a SplitMix64 of
  the seed, the step and the example): x = data[i:i+T], y = data[i+1:i+1+T],
  as [steps, batch, T] int32 for `shardc run --data`; windows_seq.npz the
  same for `sequential: true` (start = (step * batch + b) * T mod span).
"""
import pathlib

import numpy as np

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tokens"
N, VOCAB, T, BATCH, STEPS, SEED, EVAL = 20000, 256, 16, 8, 3, 0, 0.1
M = (1 << 64) - 1


def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)


def window(seed, step, example, span, sequential):
    if sequential:
        return ((step * BATCH + example) * T) % span
    z = seed ^ ((step * 0x9E3779B97F4A7C15) & M) ^ (((example + 1) * 0xD1B54A32D192ED03) & M)
    return splitmix64(z) % span


def get_batch(data, step, sequential):
    """nanoGPT's slicing, at shardc's window starts in the training part."""
    train = data[: len(data) - round(len(data) * EVAL)]
    span = len(train) - T
    ix = [window(SEED, step, b, span, sequential) for b in range(BATCH)]
    x = np.stack([train[i : i + T].astype(np.int32) for i in ix])
    y = np.stack([train[i + 1 : i + 1 + T].astype(np.int32) for i in ix])
    return x, y


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(0).integers(0, VOCAB, size=N)
    ids.astype(np.uint16).tofile(OUT / "stream.bin")
    ids.astype(np.uint32).tofile(OUT / "stream32.bin")
    np.save(OUT / "stream.npy", ids.astype(np.int32))
    for name, sequential in (("windows.npz", False), ("windows_seq.npz", True)):
        xs, ys = zip(*(get_batch(ids, s, sequential) for s in range(STEPS)))
        np.savez(OUT / name, x=np.stack(xs), y=np.stack(ys))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
