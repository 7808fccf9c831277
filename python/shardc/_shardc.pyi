"""Types of the native module (python/src/lib.rs). Use the `shardc` package's
functions; these are its building blocks."""

from typing import Callable, Dict, List, Optional, Sequence, Tuple

__version__: str

class CompileError(Exception):
    """args: (summary, diagnostics as JSON, each diagnostic rendered)."""

class RunFailed(Exception):
    """args: (the run's error lines,)."""

def check(
    path: str,
    source: Optional[str] = None,
    strict: bool = False,
    mesh: Sequence[Tuple[str, int]] = ...,
    allow: Sequence[str] = ...,
) -> Tuple[str, List[str], str, bool]: ...
def plan(
    path: str,
    mesh: Sequence[Tuple[str, int]] = ...,
    device: Optional[str] = None,
    model: Optional[str] = None,
    allow: Sequence[str] = ...,
) -> str: ...
def show(
    path: str,
    names: Sequence[str],
    mesh: Sequence[Tuple[str, int]] = ...,
    model: Optional[str] = None,
    allow: Sequence[str] = ...,
) -> str: ...
def signature(
    path: str,
    mesh: Sequence[Tuple[str, int]] = ...,
    model: Optional[str] = None,
    allow: Sequence[str] = ...,
    data: Optional[str] = None,
) -> Tuple[str, List[Tuple[str, List[int], bool]], List[str]]: ...
def write_safetensors(path: str, tensors: Sequence[Tuple[str, str, List[int], bytes]]) -> None: ...
def run(words: Sequence[str], hook: Optional[Callable[[str], bool]] = None) -> Dict[str, object]: ...
def cli(argv: Sequence[str]) -> None: ...
