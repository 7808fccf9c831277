#!/usr/bin/env python3
"""Parquet, Arrow and tokenizer fixtures for tests/tables.rs, written with the
libraries users write them with (pyarrow, Hugging Face `datasets` and
`tokenizers`):

    pip install pyarrow datasets tokenizers numpy
    python3 scripts/table_fixtures.py     # (re)write tests/fixtures/tables/

- ids.parquet: the 20,000 ids of tests/fixtures/tokens/stream.bin cut into
  rows of 1 to 97 ids, a list<int32> column `input_ids` beside a string
  column `note` and a float column `score` (snappy, pyarrow's default): the
  rows joined are the stream, so shardc's windows must equal windows.npz;
- flat.parquet: the same ids one per row, a uint16 column `tokens`, gzip,
  row groups of 3,000;
- ds/: the rows of ids.parquet as a `datasets` Dataset saved with
  `save_to_disk` in 2 shards (Arrow IPC streams and state.json);
- floats.parquet: `input_ids` as float64 (the wrong type);
- late_bad_id.parquet: ids.parquet with the id 300 in the tenth row from the end (the stream's
  last few hundred ids: past every window of the first steps), and the same
  written without statistics (so only the conversion on `run` finds it);
- tiny-tokenizer.json: a byte-level BPE (GPT-2's pre-tokenizer) of 320 ids
  trained on the built-in Shakespeare; shakespeare_tok.json: what `tokenizers`
  gives for the whole text (`encode(text, add_special_tokens=False)`): the
  number of ids, the sha256 of them as little-endian uint32, and the
  training windows nanoGPT's slicing gives at shardc's starts (seq 16,
  batch 8, 3 steps) in windows_tok.npz.
"""
import hashlib
import json
import pathlib
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "tables"
sys.path.insert(0, str(ROOT / "scripts"))
import token_fixtures as tf  # noqa: E402  (the windows, as shardc draws them)


def rows_of(ids):
    out, i, k = [], 0, 0
    while i < len(ids):
        n = 1 + (k * 37) % 97
        out.append([int(x) for x in ids[i : i + n]])
        i, k = i + n, k + 1
    return out


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    ids = np.fromfile(ROOT / "tests" / "fixtures" / "tokens" / "stream.bin", dtype=np.uint16)
    rows = rows_of(ids)
    table = pa.table(
        {
            "note": [f"row {i}" for i in range(len(rows))],
            "input_ids": pa.array(rows, type=pa.list_(pa.int32())),
            "score": [float(i) / 7 for i in range(len(rows))],
        }
    )
    pq.write_table(table, OUT / "ids.parquet")
    pq.write_table(
        pa.table({"tokens": pa.array(ids, type=pa.uint16())}),
        OUT / "flat.parquet",
        compression="gzip",
        row_group_size=3000,
    )
    pq.write_table(
        pa.table({"input_ids": pa.array([[float(x) for x in r] for r in rows])}),
        OUT / "floats.parquet",
    )
    bad = [list(r) for r in rows]
    bad[len(rows) - 10][0] = 300
    bad_t = pa.table({"input_ids": pa.array(bad, type=pa.list_(pa.int32()))})
    pq.write_table(bad_t, OUT / "late_bad_id.parquet")
    pq.write_table(bad_t, OUT / "late_bad_id_nostats.parquet", write_statistics=False)

    import datasets

    ds = datasets.Dataset.from_dict({"input_ids": rows, "note": [f"row {i}" for i in range(len(rows))]})
    ds.save_to_disk(str(OUT / "ds"), num_shards=2)

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = (ROOT / "data" / "tinyshakespeare.txt").read_text()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([text], trainer)
    tok.save(str(OUT / "tiny-tokenizer.json"))
    enc = np.array(tok.encode(text, add_special_tokens=False).ids, dtype=np.uint32)
    xs, ys = zip(*(tf.get_batch(enc, s, False) for s in range(tf.STEPS)))
    np.savez(OUT / "windows_tok.npz", x=np.stack(xs), y=np.stack(ys))
    (OUT / "shakespeare_tok.json").write_text(
        json.dumps(
            {
                "ids": int(len(enc)),
                "sha256": hashlib.sha256(enc.astype("<u4").tobytes()).hexdigest(),
                "vocab": tok.get_vocab_size(),
                # ds/'s `note` column, each row tokenized, joined in order.
                "notes_sha256": hashlib.sha256(
                    np.array(
                        [i for r in range(len(rows)) for i in tok.encode(f"row {r}", add_special_tokens=False).ids],
                        dtype="<u4",
                    ).tobytes()
                ).hexdigest(),
            },
            indent=1,
        )
        + "\n"
    )
    print("wrote", OUT)


if __name__ == "__main__":
    main()
