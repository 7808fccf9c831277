"""shardc from Python: check, plan, show and train `.shard` models.

    >>> import shardc
    >>> shardc.check("models/fsdp_mlp.shard").ok
    True
    >>> run = shardc.run("models/fsdp_mlp.shard", steps=3)
    >>> run.losses, run.params["fc1.w"].shape

The native module (`shardc._shardc`) is the shardc library itself: `run`
trains exactly as `shardc run` does, with the GIL released while the devices
work. Diagnostics raise `ShardcError` (with `.code` and `.diagnostics`);
wrong arrays for `init=` or `data=` raise `ValueError`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import _shardc as _native
from ._types import (
    Diagnostic,
    Plan,
    Report,
    Run,
    RunError,
    ShardcError,
    Span,
    Step,
    _diagnostics,
)

__all__ = [
    "check",
    "plan",
    "show",
    "run",
    "Report",
    "Diagnostic",
    "Span",
    "Plan",
    "Run",
    "Step",
    "ShardcError",
    "RunError",
]
__version__: str = _native.__version__

PathLike = Union[str, "os.PathLike[str]"]
#: Mesh axis sizes that override the file's: `{"dp": 2, "mp": 4}`.
MeshArg = Optional[Mapping[str, int]]

# The data files' codes (E0304 unreadable, E0305 wrong arrays, E0306 ids out of
# range): wrong `data=` arrays, raised as ValueError.
_DATA_CODES = {"E0304", "E0305", "E0306"}


def _mesh(mesh: MeshArg) -> List[tuple]:
    if mesh is None:
        return []
    out = []
    for axis, n in mesh.items():
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise ValueError(f"mesh axis `{axis}`: a size is an integer of at least 1, not {n!r}")
        out.append((str(axis), int(n)))
    return out


def _allow(allow_path: Sequence[PathLike]) -> List[str]:
    return [os.fspath(p) for p in allow_path]


def _raise_compile(e: Exception) -> ShardcError:
    summary, json_text, rendered = e.args
    return ShardcError(summary, _diagnostics(json_text, rendered))


def _is_source(target: PathLike) -> bool:
    if not isinstance(target, str):
        return False
    return "\n" in target or ("{" in target and not os.path.exists(target))


def check(
    target: PathLike,
    *,
    name: str = "<source>.shard",
    strict: bool = False,
    mesh: MeshArg = None,
    allow_path: Sequence[PathLike] = (),
) -> Report:
    """Check a `.shard` file, or source text (a string with a newline or a
    brace that names no file; `name` is its file name, imports are found
    beside it). Returns every diagnostic; never raises for a model's errors."""
    if _is_source(target):
        path, source = name, str(target)
    else:
        path, source = os.fspath(target), None
    json_text, rendered, summary, _ = _native.check(
        path, source, strict, _mesh(mesh), _allow(allow_path)
    )
    return Report(path, _diagnostics(json_text, rendered), summary)


def plan(
    path: PathLike,
    *,
    mesh: MeshArg = None,
    device: Optional[str] = None,
    model: Optional[str] = None,
    allow_path: Sequence[PathLike] = (),
    profile: Optional[PathLike] = None,
) -> Union[Plan, List[Plan]]:
    """The per-device plan of the trained model (a list when the file trains
    several and `model` is not given), compared with `device` (`h100-80g`, ...)
    when given; a pipeline's passes timed by `profile` (the `profile.json` a
    `shardc run --profile` wrote) when given, else by their FLOPs."""
    prof = None if profile is None else os.fspath(profile)
    try:
        text = _native.plan(
            os.fspath(path), _mesh(mesh), device, model, _allow(allow_path), prof
        )
    except _native.CompileError as e:
        raise _raise_compile(e) from None
    plans = [Plan(p) for p in json.loads(text)]
    return plans[0] if len(plans) == 1 else plans


def show(
    path: PathLike,
    *names: str,
    mesh: MeshArg = None,
    model: Optional[str] = None,
    allow_path: Sequence[PathLike] = (),
) -> str:
    """How the named parameters or inputs lie on the mesh (`shardc show`), as text."""
    if not names:
        raise ValueError("show: name at least one parameter or input (or `input`, `output`)")
    try:
        return _native.show(os.fspath(path), list(names), _mesh(mesh), model, _allow(allow_path))
    except _native.CompileError as e:
        raise _raise_compile(e) from None


def _float_array(name: str, a: Any) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype.kind != "f" or arr.dtype.itemsize not in (2, 4, 8):
        raise ValueError(
            f"init: `{name}` has dtype {arr.dtype}; parameters are float16, float32 or float64"
        )
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))


def _write_init(
    init: Mapping[str, Any], params: Sequence[tuple], model: str, path: str
) -> None:
    shapes = {n: tuple(s) for n, s, _ in params}
    computed = {n for n, _, c in params if c}
    unknown = [n for n in init if n not in shapes]
    if unknown:
        import difflib

        hints = []
        for n in unknown:
            near = difflib.get_close_matches(n, list(shapes), n=1)
            hints.append(f"`{n}`" + (f" (did you mean `{near[0]}`?)" if near else ""))
        raise ValueError(f"init: {model} has no parameter {', '.join(hints)}")
    missing = [n for n in shapes if n not in init and n not in computed]
    if missing:
        raise ValueError(
            f"init: every parameter starts from `init` or none does; missing {', '.join(f'`{n}`' for n in missing)}"
        )
    tensors = []
    for n, a in init.items():
        arr = _float_array(n, a)
        if tuple(arr.shape) != shapes[n]:
            raise ValueError(
                f"init: `{n}` has shape {list(arr.shape)}, but {model} declares {list(shapes[n])}"
            )
        tensors.append((n, arr.dtype.str, list(arr.shape), arr.tobytes()))
    _native.write_safetensors(path, tensors)


def _write_data(data: Mapping[str, Any], inputs: Sequence[str], path: str) -> None:
    allowed = {"x", "y", "x_eval", "y_eval"} | set(inputs) | {f"{i}_eval" for i in inputs}
    arrays = {}
    for k, v in data.items():
        if k not in allowed:
            raise ValueError(
                f"data: `{k}` is not an array a run reads; it reads {', '.join(sorted(allowed))}"
            )
        arr = np.asarray(v)
        if arr.dtype.kind not in "iuf" or arr.dtype.itemsize > 8:
            raise ValueError(f"data: `{k}` has dtype {arr.dtype}; arrays are integers or floats")
        arrays[k] = np.ascontiguousarray(arr)
    np.savez(path, **arrays)


def run(
    path: PathLike,
    *,
    steps: Optional[int] = None,
    mesh: MeshArg = None,
    seed: Optional[int] = None,
    model: Optional[str] = None,
    init: Optional[Mapping[str, Any]] = None,
    data: Optional[Mapping[str, Any]] = None,
    out: Optional[PathLike] = None,
    on_step: Optional[Callable[[Step], Optional[bool]]] = None,
    f64: bool = False,
    resume: bool = False,
    overwrite: bool = False,
    quiet: bool = True,
    log: Optional[Sequence[str]] = None,
    allow_path: Sequence[PathLike] = (),
) -> Run:
    """Train a model as `shardc run` does, in this process, on the virtual mesh.

    `init` maps every parameter's dotted name to a numpy array (as `--init`);
    `data` maps `x`, `y` (and `x_eval`, `y_eval`, or the inputs' names) to
    arrays shaped `[batch, ...]` or `[steps, batch, ...]` (as `--data`). Both
    are written into the run directory (`out`, default `runs/MODEL`) as
    `inputs/init.safetensors` and `inputs/data.npz` and read from there.
    `log` chooses the run directory's logs (`["jsonl", "tensorboard"]`, `[]`)
    instead of the file's `log:`.
    `on_step(step)` sees every step; returning False ends the run after it.
    Ctrl-C ends it at the next step boundary; the run so far is returned
    with `interrupted` set. Everything the run writes is in its directory.
    """
    p = os.fspath(path)
    mesh_l, allow = _mesh(mesh), _allow(allow_path)
    try:
        name, params, inputs = _native.signature(p, mesh_l, model, allow)
    except _native.CompileError as e:
        raise _raise_compile(e) from None
    out_dir = os.fspath(out) if out is not None else os.path.join("runs", name)
    words = [p, "--out", out_dir]
    if init is not None or data is not None:
        os.makedirs(os.path.join(out_dir, "inputs"), exist_ok=True)
    if init is not None:
        init_path = os.path.join(out_dir, "inputs", "init.safetensors")
        _write_init(init, params, name, init_path)
        words += ["--init", init_path]
    if data is not None:
        data_path = os.path.join(out_dir, "inputs", "data.npz")
        _write_data(data, inputs, data_path)
        try:
            _native.signature(p, mesh_l, model, allow, data_path)
        except _native.CompileError as e:
            err = _raise_compile(e)
            if err.codes and all(c in _DATA_CODES for c in err.codes):
                msgs = []
                for d in err.diagnostics:
                    m = d.message.replace(f"`--data {data_path}`", "`data`")
                    if d.is_error and m not in msgs:
                        msgs.append(m)
                raise ValueError(f"data: {'; '.join(msgs)}") from err
            raise err from None
        words += ["--data", data_path]
    for flag, value in (("--steps", steps), ("--seed", seed), ("--model", model)):
        if value is not None:
            words += [flag, str(value)]
    if log is not None:
        words += ["--log", ",".join(log) if log else "none"]
    if mesh_l:
        words += ["--mesh", ",".join(f"{a}={n}" for a, n in mesh_l)]
    for flag, on in (("--f64", f64), ("--resume", resume), ("--overwrite", overwrite), ("--quiet", quiet)):
        if on:
            words.append(flag)
    for a in allow:
        words += ["--allow-path", a]

    def hook(record: str) -> bool:
        if on_step is None:
            return True
        return on_step(Step._from(record)) is not False

    try:
        r = _native.run(words, hook)
    except _native.RunFailed as e:
        raise RunError(e.args[0]) from None
    dtype = np.dtype(r["dtype"])
    arrays = {
        n: np.frombuffer(b, dtype=dtype).reshape(shape).copy() for n, (shape, b) in r["params"].items()
    }
    return Run(
        dir=r["dir"],
        losses=list(r["losses"]),
        steps=[Step._from(s) for s in r["records"]],
        params=arrays,
        stopped_at=r["stopped_at"],
        interrupted=r["interrupted"],
    )
