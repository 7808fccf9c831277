"""Fixtures for the Python package's tests: the repository root, the
command-line binary to compare with, and a reader of safetensors files (the
tests read what the CLI writes without the package under test)."""

import json
import os
import pathlib
import shutil
import struct
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    """Model paths are the repository's; run directories go to tmp_path."""
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="session")
def cli():
    """The `shardc` binary cargo built (SHARDC_BIN), else the one on PATH."""
    exe = os.environ.get("SHARDC_BIN") or shutil.which("shardc")
    if not exe:
        pytest.skip("no shardc binary: set SHARDC_BIN")

    def call(*args, check=True):
        p = subprocess.run([exe, *map(str, args)], cwd=ROOT, capture_output=True, text=True)
        if check and p.returncode != 0:
            raise AssertionError(f"shardc {' '.join(map(str, args))} failed:\n{p.stderr}")
        return p

    return call


_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I32": "<i4", "I64": "<i8"}


def read_safetensors(path):
    """Every tensor of a safetensors file as a numpy array."""
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    body = raw[8 + n :]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(body[a:b], dtype=_DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def write_safetensors(path, arrays):
    """A safetensors file of float32 arrays, written by hand (not by shardc)."""
    header, blobs, at = {}, [], 0
    for name, a in arrays.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def losses_of(path):
    return json.loads(pathlib.Path(path).read_text())["losses"]
