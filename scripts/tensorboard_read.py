#!/usr/bin/env python3
"""Every scalar and text of a run directory's TensorBoard log, read by the
`tensorboard` package's own EventAccumulator, as JSON on stdout:

    python3 scripts/tensorboard_read.py runs/Shakespeare
    {"files": 1, "scalars": {"train/loss": [[1, 8.10, 1795778421.6], ...]}, "text": {"config": "..."}}

tests/tensorboard.rs compares it with metrics.jsonl.
"""
import json
import pathlib
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    run = sys.argv[1]
    ea = EventAccumulator(run, size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    tags = ea.Tags()
    out = {
        "files": len(list(pathlib.Path(run).glob("events.out.tfevents.*"))),
        "scalars": {t: [[e.step, e.value, e.wall_time] for e in ea.Scalars(t)] for t in tags["scalars"]},
        "text": {t: ea.Tensors(t)[0].tensor_proto.string_val[0].decode() for t in tags["tensors"]},
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
