"""Writes the data fixtures the UI and runtime tests read, without numpy: .npy
and .npz as numpy documents them, .safetensors as its spec does, so the reader
shardc uses is tested against an independent writer. Run: python3 make.py"""
import json, os, struct, zipfile

def npy(shape, kind, values):
    code, fmt = {"f4": ("<f4", "f"), "f8": ("<f8", "d"), "i4": ("<i4", "i"), "i8": ("<i8", "q")}[kind]
    sh = "(" + "".join(f"{d}," for d in shape) + ")" if len(shape) == 1 else "(" + ", ".join(map(str, shape)) + ")"
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (code, sh)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + struct.pack("<%d%s" % (len(values), fmt), *values)

def npz(path, arrays, compression=zipfile.ZIP_STORED):
    # numpy.savez_compressed writes the same archive with ZIP_DEFLATED.
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, a in arrays.items():
            z.writestr(name + ".npy", npy(*a))

def safetensors(path, arrays):
    dt = {"f4": ("F32", "f", 4), "f8": ("F64", "d", 8), "i4": ("I32", "i", 4), "i8": ("I64", "q", 8)}
    header, blobs, off = {}, [], 0
    for name, (shape, kind, values) in arrays.items():
        t, f, n = dt[kind]
        b = struct.pack("<%d%s" % (len(values), f), *values)
        header[name] = {"dtype": t, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

def xs(n, scale=0.25):
    return [((i * 7) % 11 - 5) * scale for i in range(n)]

# The classifier of the UI tests: x f32[4, 6] -> 3 classes, batch 4.
npz("cls.npz", {"x": ((4, 6), "f4", xs(24)), "y": ((4,), "i8", [0, 1, 2, 1])})
safetensors("cls_steps.safetensors", {"x": ((5, 4, 6), "f4", xs(120)), "y": ((5, 4), "i4", [i % 3 for i in range(20)])})
os.makedirs("cls_npy", exist_ok=True)
open("cls_npy/x.npy", "wb").write(npy((4, 6), "f8", xs(24)))
open("cls_npy/y.npy", "wb").write(npy((4,), "i4", [2, 0, 1, 0]))
npz("cls_eval.npz", {"x": ((4, 6), "f4", xs(24)), "y": ((4,), "i8", [0, 1, 2, 1]),
                     "x_eval": ((4, 6), "f4", xs(24, 0.5)), "y_eval": ((4,), "i8", [2, 2, 0, 1])})
# savez_compressed's archive, with held-out arrays of their own batch count (3, not 1).
held = {"x": ((4, 6), "f4", xs(24)), "y": ((4,), "i8", [0, 1, 2, 1]),
        "x_eval": ((3, 4, 6), "f4", xs(72, 0.5)), "y_eval": ((3, 4), "i8", [i % 3 for i in range(12)])}
npz("cls_held3.npz", held)
npz("cls_held3_deflated.npz", held, zipfile.ZIP_DEFLATED)
npz("cls_wide.npz", {"x": ((4, 7), "f4", xs(28)), "y": ((4,), "i8", [0, 1, 2, 1])})
npz("cls_float_labels.npz", {"x": ((4, 6), "f4", xs(24)), "y": ((4,), "f4", [0, 1, 2, 1])})
npz("cls_label_range.npz", {"x": ((4, 6), "f4", xs(24)), "y": ((4,), "i8", [0, 1, 3, 1])})
npz("cls_no_labels.npz", {"x": ((4, 6), "f4", xs(24)), "labels": ((4,), "i8", [0, 1, 2, 1])})
npz("cls_step_mismatch.npz", {"x": ((5, 4, 6), "f4", xs(120)), "y": ((3, 4), "i8", [0] * 12)})
open("corrupt.npz", "wb").write(b"PK\x03\x04 this is not a zip archive")

# The language model of the UI tests: ids i32[4, 5], vocab 10.
npz("lm.npz", {"x": ((4, 5), "i4", [i % 10 for i in range(20)]), "y": ((4, 5), "i8", [(i + 1) % 10 for i in range(20)])})
npz("lm_id_range.npz", {"x": ((4, 5), "i4", [i % 10 for i in range(19)] + [12]), "y": ((4, 5), "i8", [0] * 20)})
npz("lm_float_ids.npz", {"x": ((4, 5), "f4", [float(i % 10) for i in range(20)]), "y": ((4, 5), "i8", [0] * 20)})
open("tiny.txt", "w").write("To be, or not to be, that is the question:\n" * 4)
open("short.txt", "w").write("Too short.\n")

# A bag-of-ids model's data: ragged samples padded with -1 (not looked up).
npz("bag.npz", {"x": ((4, 3), "i4", [1, 5, -1, 7, -1, -1, 2, 3, 4, 0, -1, -1]), "y": ((4,), "i8", [0, 1, 1, 0])})

# A regression (`loss: mse`): x f32[4, 6] -> targets f32[4, 2], any numbers.
npz("reg.npz", {"x": ((4, 6), "f4", xs(24)), "y": ((4, 2), "f4", xs(8, 0.5))})
npz("reg_steps.npz", {"x": ((3, 4, 6), "f8", xs(72)), "y": ((3, 4, 2), "f8", xs(24, 0.1))})
