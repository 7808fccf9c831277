#!/usr/bin/env bash
# Creates bench/jax/.venv with JAX, Flax and optax from PyPI for the side-by-side
# benchmark against JAX (issue 17; bench/jax/README.md). Idempotent: a venv that
# already has the pinned versions is left as it is. Needs python3 (3.11+, with
# the venv module) and access to PyPI; nothing else is downloaded.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
python="${PYTHON:-python3}"

# The versions the README's figures were taken with (jax 0.10.2 is the version
# issue 17's figures name). flax 0.12.8 is the newest flax pip resolves for it.
pins=("jax[cpu]==0.10.2" "jaxlib==0.10.2" "flax==0.12.8" "optax==0.2.8")

if ! command -v "$python" >/dev/null; then
  echo "error: $python not found; install Python 3.11+ (or set PYTHON=/path/to/python3)" >&2
  exit 1
fi

if [ -x "$venv/bin/python" ] && "$venv/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
want = {"jax": "0.10.2", "jaxlib": "0.10.2", "flax": "0.12.8", "optax": "0.2.8"}
sys.exit(0 if all(m.version(k) == v for k, v in want.items()) else 1)
PY
then
  echo "bench/jax/.venv is ready ($("$venv/bin/python" -c 'import jax; print("jax", jax.__version__)'))"
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv" || {
    echo "error: could not create $venv (on Debian: apt-get install python3-venv)" >&2
    exit 1
  }
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "${pins[@]}"
# A first check that this CPU runs it: 8 virtual devices, one jitted op.
XLA_FLAGS=--xla_force_host_platform_device_count=8 "$venv/bin/python" -c '
import jax, jax.numpy as jnp, flax, optax
assert len(jax.devices()) == 8, jax.devices()
jax.jit(lambda x: x @ x)(jnp.ones((4, 4))).block_until_ready()
print("bench/jax/.venv is ready: jax", jax.__version__, "flax", flax.__version__, "optax", optax.__version__)
'
