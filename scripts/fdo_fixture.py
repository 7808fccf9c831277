#!/usr/bin/env python3
"""Write FDO statistics files the way jax-tpu-embedding's `NPZFileFDOClient`
does, for `tests/embed.rs` (`shardc fdo show` on library-written files).

It exists because the library itself (and JAX) is no test dependency: this
follows the client's documented behaviour with numpy alone.
`record()` keeps the first step's arrays as they are and `np.vstack`s every
later step onto them, and `publish()` `savez`es `<stack><suffix>` for each
statistic, so a file holds:

  <stack>_max_ids              int32  [steps, local devices x global partitions]
  <stack>_max_unique_ids       int32  [steps, local devices x global partitions]
  <stack>_required_buffer_size int32  [steps, local SparseCores]
  <stack>_id_drop_counters     int64  [steps, 1]   (a 0-d scalar after one step)

The statistics are hand-made for one host of 2 devices x 4 SparseCores (8
global partitions); the values the test expects are computed in its comments.

  python3 scripts/fdo_fixture.py tests/fixtures/fdo_library
"""

import os
import sys

import numpy as np

DEVICES, SPARSECORES = 2, 4
PARTITIONS = DEVICES * SPARSECORES


class Client:
    """The recording half of `NPZFileFDOClient` (no JAX)."""

    def __init__(self):
        self.params = {}

    def record(self, stack, step):
        for suffix, value in step.items():
            key = stack + suffix
            if key not in self.params:
                self.params[key] = value
            else:
                self.params[key] = np.vstack((self.params[key], value))

    def publish(self, path):
        np.savez(path, **self.params)


def step(base, drop):
    """One step: device d's SparseCores sent partition p at most base + d + p
    ids (half of them distinct); each SparseCore needs base * 8 slots."""
    ids = np.array(
        [base + d + p for d in range(DEVICES) for p in range(PARTITIONS)],
        dtype=np.int32,
    )
    return {
        "_max_ids": ids,
        "_max_unique_ids": (ids // 2).astype(np.int32),
        "_required_buffer_size": np.full(
            DEVICES * SPARSECORES, base * 8, dtype=np.int32
        ),
        "_id_drop_counters": drop,  # a Python int, as the library's stats hold
    }


def main(out):
    os.makedirs(out, exist_ok=True)
    # Process 0: three steps of stack `words`, dropping 14 then 0 then 17 ids.
    c = Client()
    for base, drop in [(3, 14), (5, 0), (4, 17)]:
        c.record("words", step(base, drop))
    c.publish(os.path.join(out, "fdo_stats_0_1700000000000000000.npz"))
    # Process 1: one step (1-D rows, a 0-d drop counter).
    c = Client()
    c.record("words", step(2, 3))
    c.publish(os.path.join(out, "fdo_stats_1_1700000000000000001.npz"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/fdo_library")
