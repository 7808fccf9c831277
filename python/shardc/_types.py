"""The objects shardc's Python API returns: diagnostics and reports, plans,
runs and their steps, and the exceptions it raises."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class Span:
    """A place in a source file: 1-based lines and columns, end exclusive."""

    file: str
    line: int
    column: int
    end_line: int
    end_column: int
    label: str = ""

    @classmethod
    def _from(cls, d: Mapping[str, Any]) -> "Span":
        return cls(
            d["file"], d["line"], d["column"], d["end_line"], d["end_column"], d.get("label", "")
        )

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Diagnostic:
    """One error, warning or note, as `shardc check --format json` gives it.
    `str()` renders it as the command line does."""

    code: str
    severity: str
    message: str
    primary: Span
    secondary: List[Span] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    help: Optional[str] = None
    rendered: str = ""

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def __str__(self) -> str:
        return self.rendered or f"{self.severity}[{self.code}]: {self.message}\n  --> {self.primary}"


def _diagnostics(json_text: str, rendered: Sequence[str]) -> List[Diagnostic]:
    out = []
    for i, d in enumerate(json.loads(json_text)):
        out.append(
            Diagnostic(
                code=d["code"],
                severity=d["severity"],
                message=d["message"],
                primary=Span._from(d["primary"]),
                secondary=[Span._from(s) for s in d.get("secondary", [])],
                notes=list(d.get("notes", [])),
                help=d.get("help"),
                rendered=rendered[i] if i < len(rendered) else "",
            )
        )
    return out


@dataclass(frozen=True)
class Report:
    """What `shardc.check` found: every diagnostic, in source order."""

    file: str
    diagnostics: List[Diagnostic]
    summary: str

    @property
    def ok(self) -> bool:
        """No errors (warnings and notes allowed)."""
        return not any(d.is_error for d in self.diagnostics)

    @property
    def errors(self) -> List[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    @property
    def warnings(self) -> List[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "warning"]

    @property
    def codes(self) -> List[str]:
        return [d.code for d in self.diagnostics]

    def __iter__(self) -> Iterator[Diagnostic]:
        return iter(self.diagnostics)

    def __len__(self) -> int:
        return len(self.diagnostics)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "".join(str(d) for d in self.diagnostics) + self.summary


class ShardcError(Exception):
    """A model with errors. `.diagnostics` holds them (each with its `.code`),
    `.code` the first error's code; `str()` renders them as the CLI does."""

    def __init__(self, summary: str, diagnostics: List[Diagnostic]):
        self.summary = summary
        self.diagnostics = diagnostics
        errors = [d for d in diagnostics if d.is_error]
        self.code: Optional[str] = errors[0].code if errors else None
        super().__init__("".join(str(d) for d in errors) + summary)

    @property
    def codes(self) -> List[str]:
        return [d.code for d in self.diagnostics if d.is_error]


class RunError(RuntimeError):
    """A run that stopped with an error (the lines `shardc run` printed)."""


class Plan:
    """A model's per-device plan: memory in bytes, FLOPs and collectives per
    step, as `shardc plan --json` gives it. Every field of that JSON is an
    attribute; `to_dict()` is the whole of it (pandas-friendly:
    `pd.json_normalize(plan.to_dict())`)."""

    def __init__(self, d: Dict[str, Any]):
        self._d = d

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_d"][name]
        except KeyError:
            raise AttributeError(f"a plan has no field `{name}`; it has {', '.join(self._d)}") from None

    @property
    def collectives(self) -> List[Dict[str, Any]]:
        """Each collective of a step: kind, axes, bytes and where it comes from."""
        return list(self._d.get("comms", []))

    @property
    def memory(self) -> Dict[str, float]:
        """Per-device bytes by kind (params, grads, optimizer state, ...)."""
        keys = (
            "params",
            "grads",
            "grad_sum",
            "optimizer_state",
            "activations",
            "gathered_params",
            "gathered_grads",
            "master_params",
            "cotangents",
        )
        return {k: float(self._d[k]) for k in keys if k in self._d}

    def to_dict(self) -> Dict[str, Any]:
        return json.loads(json.dumps(self._d))

    @property
    def total_memory(self) -> float:
        """Bytes per device at the step's peak, as `shardc plan` totals them."""
        return float(self._d["total_memory"])

    def __repr__(self) -> str:
        return (
            f"Plan(model={self._d.get('model')!r}, mesh={self._d.get('mesh')!r}, "
            f"{self.total_memory / 2**20:.1f} MiB per device, {self._d['step_flops']:.3g} FLOPs per step)"
        )


@dataclass(frozen=True)
class Step:
    """One step's record, as a line of `metrics.jsonl`."""

    step: int
    loss: float
    lr: float
    grad_norm: float
    step_ms: float
    examples_per_s: float
    eval_loss: Optional[float] = None
    time: Optional[float] = None
    metrics: Dict[str, Any] = field(default_factory=dict)
    events: List[str] = field(default_factory=list)

    @classmethod
    def _from(cls, text: str) -> "Step":
        d = json.loads(text)
        known = {
            "step",
            "loss",
            "lr",
            "grad_norm",
            "step_ms",
            "examples_per_s",
            "eval_loss",
            "time",
            "events",
        }
        metrics = {k: v for k, v in d.items() if k not in known}
        return cls(
            step=d["step"],
            loss=d["loss"],
            lr=d["lr"],
            grad_norm=d["grad_norm"],
            step_ms=d["step_ms"],
            examples_per_s=d["examples_per_s"],
            eval_loss=d.get("eval_loss"),
            time=d.get("time"),
            metrics=metrics,
            events=list(d.get("events", [])),
        )


@dataclass
class Run:
    """A finished (or stopped) run: its losses, every step's record, and the
    trained parameters as numpy arrays by their dotted names."""

    dir: str
    losses: List[float]
    steps: List[Step]
    params: Dict[str, np.ndarray]
    #: The step the run ended before when `on_step` returned False or Ctrl-C
    #: stopped it (None when it ran to the end).
    stopped_at: Optional[int] = None
    interrupted: bool = False

    @property
    def metrics(self) -> Dict[str, List[Any]]:
        """Each metric and observed value by name, one entry per step."""
        out: Dict[str, List[Any]] = {}
        for s in self.steps:
            for k, v in s.metrics.items():
                out.setdefault(k, []).append(v)
        return out

    def __repr__(self) -> str:
        last = f", loss {self.losses[0]:.4f} → {self.losses[-1]:.4f}" if self.losses else ""
        return f"Run(dir={self.dir!r}, {len(self.losses)} steps{last}, {len(self.params)} parameters)"
