#!/usr/bin/env python3
"""Run the real jax-tpu-embedding input processing on the batches shardc trains
`examples/shakespeare_reference_limits.shard` on, under seed 000's own settings
(limits 64/64, MOD over 8 devices x 4 SparseCores, FDO every 15 steps through
`NPZFileFDOClient` without headroom, no id dropping), and print the step where
the library stops the process. shardc's `overflow: error` must stop at the same
step with the same counts.

It exists because the step is a property of the data: on the library's own
Shakespeare batches (its example repeats one batch every step) the statistics
never change and no step exceeds the FDO-set limits, while on shardc's batches
(consecutive windows through the corpus) the library aborts at step 22 with
"Observed max ids per partition: 39 ... greater than ... 36", shardc's
diagnostic to the count.

Set-up (PyPI; JAX on CPU with 8 virtual devices):

  python3 -m venv /tmp/jte && /tmp/jte/bin/pip install jax==0.10.2 flax jax-tpu-embedding
  /tmp/jte/bin/python scripts/reference_overflow.py [STEPS]

The tokenizer and windows below restate shardc's documented rules
(docs/language.md, `shakespeare_words` and token sources): lowercase, split on
non-letters, the VOCAB-1 most frequent words get ids 1.. (ties alphabetical),
0 for the rest; training uses the first 90% of the ids; step s (from 0) takes
sample b's window at ((s * batch + b) * seq) mod (n - seq - 1).
"""

import collections
import os
import re
import sys
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import linen as nn  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.fdo import file_fdo_client  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding, embedding_spec  # noqa: E402

VOCAB, SEQ, DIM, BATCH = 2048, 16, 16, 256
DEVICES, SPARSECORES = 8, 4
FDO_EVERY = 15
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def word_ids():
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt")) as f:
        words = [w for w in re.split(r"[^a-z]", f.read().lower()) if w]
    counts = collections.Counter(words)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: VOCAB - 1]
    ids = {w: i + 1 for i, (w, _) in enumerate(ranked)}
    every = [ids.get(w, 0) for w in words]
    return every[: len(every) * 9 // 10]


def batch(ids, step):
    n = max(len(ids), SEQ + 2)
    starts = [((step * BATCH + b) * SEQ) % (n - SEQ - 1) for b in range(BATCH)]
    x = np.array([ids[s : s + SEQ] for s in starts], dtype=np.int32)
    return x.reshape(-1, 1)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    table = embedding_spec.TableSpec(
        vocabulary_size=VOCAB,
        embedding_dim=DIM,
        initializer=jax.nn.initializers.normal(),
        optimizer=embedding_spec.AdamOptimizerSpec(learning_rate=0.005),
        combiner="sum",
        name="shakespeare",
        max_ids_per_partition=64,
        max_unique_ids_per_partition=64,
    )
    feature = embedding_spec.FeatureSpec(
        table_spec=table,
        input_shape=(BATCH * SEQ, 1),
        output_shape=(BATCH * SEQ, DIM),
        name="shakespeare_feature",
    )
    specs = nn.FrozenDict({feature.name: feature})
    embedding.prepare_feature_specs_for_training(
        specs, global_device_count=DEVICES, num_sc_per_device=SPARSECORES
    )
    structure = jax.tree.structure(specs)
    client = file_fdo_client.NPZFileFDOClient(tempfile.mkdtemp(prefix="fdo-"))
    ids = word_ids()
    for step in range(1, steps + 1):
        stacked = feature.table_spec.stacked_table_spec
        limits = (stacked.max_ids_per_partition, stacked.max_unique_ids_per_partition)
        # The library ends the process itself (a fatal check) on a step over the
        # limits, so the step is printed first.
        print(f"step {step}: limits {limits[0]}/{limits[1]}", end="", flush=True)
        x = batch(ids, step - 1)
        _, stats = embedding.preprocess_sparse_dense_matmul_input(
            jax.tree_util.tree_unflatten(structure, [x]),
            jax.tree_util.tree_unflatten(structure, [np.ones(x.shape, np.float32)]),
            specs,
            local_device_count=DEVICES,
            global_device_count=DEVICES,
            num_sc_per_device=SPARSECORES,
            sharding_strategy="MOD",
            batch_number=step,
            allow_id_dropping=False,
        )
        most = int(np.max(stats.max_ids_per_partition["shakespeare"]))
        unique = int(np.max(stats.max_unique_ids_per_partition["shakespeare"]))
        print(f", needs {most}/{unique}", flush=True)
        client.record(stats)
        if step % FDO_EVERY == 0:
            client.publish()
            embedding.update_preprocessing_parameters(specs, client.load(), SPARSECORES)
    print(f"all {steps} steps within the limits")


if __name__ == "__main__":
    main()
