#!/usr/bin/env python3
"""Fixtures for the masked losses in tests/losses.rs (`ignore_index`), with
the reference computed in numpy:

    python3 scripts/masked_fixtures.py      # (re)write tests/fixtures/masked/

The model is an embedding and a projection to the vocabulary (logits =
E[x] @ W, V = 16 classes), trained with plain SGD. Two datasets of 3 steps of
8 sequences of 6 tokens, written as users write them (`np.savez`, int32):

- mlm.npz: a masked LM as BERT's collator makes it: about 30% of positions
  replaced by the mask id 15 in `x`; `y` holds the original id there and
  -100 (Hugging Face's ignore index) everywhere else;
- padded.npz: a padded LM: sequences of 2 to 6 tokens padded with id 0 on the
  right, `y` the next token, 0 (the pad id) where nothing follows.

- weighted.npz: per-token weights for a loss function's third parameter:
  `x` and `y` as a next-token LM, and `mask` (float32) 0 on about 30% of the
  positions (padding) and 0.5, 1 or 2 elsewhere.

reference.json holds the initial E and W (row-major) and, per dataset, its
ignore index and the losses of 3 SGD steps computed here: the mean cross-
entropy over the targets that are not ignored in each step's whole batch,
and the update from its exact gradient; and each step's accuracy over the
counted targets. For `weighted`: the weighted mean sum(w * ce) / sum(w)
over each step's whole batch, and the update from its exact gradient.
"""
import json
import pathlib

import numpy as np

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "masked"
V, D, T, B, STEPS, LR = 16, 8, 6, 8, 3, 0.5
MASK = V - 1


def mlm(rng):
    ids = rng.integers(1, MASK, size=(STEPS, B, T))
    chosen = rng.random((STEPS, B, T)) < 0.3
    chosen[:, :, 0] = True  # every sequence has a target
    x = np.where(chosen, MASK, ids)
    y = np.where(chosen, ids, -100)
    return x.astype(np.int32), y.astype(np.int32), -100


def padded(rng):
    x = np.zeros((STEPS, B, T), dtype=np.int64)
    y = np.zeros((STEPS, B, T), dtype=np.int64)
    for s in range(STEPS):
        for b in range(B):
            n = int(rng.integers(2, T + 2))  # tokens in the sequence, with its next
            seq = rng.integers(1, V, size=n)
            k = min(n - 1, T)
            x[s, b, :k] = seq[:k]
            y[s, b, :k] = seq[1 : k + 1]
    return x.astype(np.int32), y.astype(np.int32), 0


def weighted(rng):
    x = rng.integers(0, V, size=(STEPS, B, T))
    y = rng.integers(0, V, size=(STEPS, B, T))
    w = rng.choice(np.array([0.5, 1.0, 2.0]), size=(STEPS, B, T))
    w = np.where(rng.random((STEPS, B, T)) < 0.3, 0.0, w)
    w[:, :, 0] = 1.0  # every sequence counts
    return x.astype(np.int32), y.astype(np.int32), w.astype(np.float32)


def weighted_losses(E, W, x, y, w):
    """The losses of STEPS SGD steps of the weighted mean cross-entropy."""
    E, W = E.copy(), W.copy()
    out = []
    for s in range(STEPS):
        h = E[x[s]]
        z = h @ W
        m = z.max(-1, keepdims=True)
        p = np.exp(z - m)
        se = p.sum(-1, keepdims=True)
        lse = np.log(se) + m
        tgt = np.take_along_axis(z, y[s][..., None], -1)
        ws = w[s].astype(np.float64)
        n = ws.sum()
        out.append(float(((lse - tgt)[..., 0] * ws).sum() / n))
        onehot = np.zeros_like(z)
        np.put_along_axis(onehot, y[s][..., None], 1.0, -1)
        g = (p / se - onehot) * ws[..., None] / n
        dW = np.einsum("btd,btv->dv", h, g)
        dE = np.zeros_like(E)
        np.add.at(dE, x[s], g @ W.T)
        E -= LR * dE
        W -= LR * dW
    return out


def losses(E, W, x, y, ignore):
    """The losses of STEPS SGD steps, and each step's accuracy (a counted
    target is right when its logit is the largest) before its update."""
    E, W = E.copy(), W.copy()
    out, acc = [], []
    for s in range(STEPS):
        h = E[x[s]]  # [B, T, D]
        z = h @ W  # [B, T, V]
        m = z.max(-1, keepdims=True)
        p = np.exp(z - m)
        se = p.sum(-1, keepdims=True)
        lse = np.log(se) + m
        keep = y[s] != ignore
        n = max(keep.sum(), 1)
        tgt = np.take_along_axis(z, np.where(keep, y[s], 0)[..., None], -1)
        out.append(float(((lse - tgt)[..., 0] * keep).sum() / n))
        acc.append(float(((tgt >= m)[..., 0] * keep).sum() / n))
        g = p / se
        onehot = np.zeros_like(z)
        np.put_along_axis(onehot, np.where(keep, y[s], 0)[..., None], 1.0, -1)
        g = (g - onehot) * keep[..., None] / n
        dW = np.einsum("btd,btv->dv", h, g)
        dE = np.zeros_like(E)
        np.add.at(dE, x[s], g @ W.T)
        E -= LR * dE
        W -= LR * dW
    return out, acc


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    E = rng.normal(0.0, 0.5, size=(V, D))
    W = rng.normal(0.0, 0.5, size=(D, V))
    ref = {"embed": E.ravel().tolist(), "head": W.ravel().tolist(), "data": {}}
    for name, make in [("mlm", mlm), ("padded", padded)]:
        x, y, ignore = make(rng)
        np.savez(OUT / f"{name}.npz", x=x, y=y)
        loss, acc = losses(E, W, x, y, ignore)
        ref["data"][name] = {
            "ignore_index": ignore,
            "counted": [int((y[s] != ignore).sum()) for s in range(STEPS)],
            "losses": loss,
            "accuracy": acc,
        }
    # Its own stream, so the datasets above keep theirs.
    x, y, w = weighted(np.random.default_rng(11))
    np.savez(OUT / "weighted.npz", x=x, y=y, mask=w)
    ref["data"]["weighted"] = {
        "total": [float(w[s].sum()) for s in range(STEPS)],
        "losses": weighted_losses(E, W, x, y, w),
    }
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")


if __name__ == "__main__":
    main()
