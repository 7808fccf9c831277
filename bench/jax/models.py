# The JAX side of the side-by-side benchmark of issue 17 (bench/jax/README.md):
# the benchmark's configurations written in JAX / Flax / optax, following the
# seeds' code (/work/shared/seeds: 000 next-word model, 001 GPT-J, 003 FSDP
# classifier), so that run.py can time them next to the same models in .shard.
#
# One process serves one device count: run.py starts it with
# XLA_FLAGS=--xla_force_host_platform_device_count=N and sends it one JSON
# command per line on stdin ({"cmd": "run", "config": ..., "steps": ...} or
# {"cmd": "peak"}); it answers one JSON line per command on stdout. Everything
# else it prints goes to stderr. `python models.py selfcheck` (8 devices) checks
# that the sharded models compute what the same models compute on one device.

import functools
import json
import os
import re
import sys
import time
from collections import Counter
from typing import Any, Callable, Sequence

import numpy as np

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "..", "data", "tinyshakespeare.txt")
PyTree = Any


# ---------------------------------------------------------------------------
# Data: tiny Shakespeare as word ids, formed as shardc's `shakespeare_words`
# forms them (docs/language.md, "Data sources"): lowercased, split on
# non-letters, the vocab-1 most frequent words get ids 1.. (ties alphabetical),
# 0 is every other word; example i of step s starts at ((s*batch+i)*seq) mod
# (n-seq-1) in the first 90% of the ids. Both sides see the same batches.
# ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def shakespeare_words(vocab: int) -> np.ndarray:
    with open(CORPUS, encoding="utf-8") as f:
        words = re.findall(r"[a-z]+", f.read().lower())
    counts = Counter(words)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: vocab - 1]
    ids = {w: i + 1 for i, (w, _) in enumerate(ranked)}
    return np.array([ids.get(w, 0) for w in words], dtype=np.int32)


def word_batch(vocab: int, seq: int, batch: int, step: int, per_position: bool):
    ids = shakespeare_words(vocab)
    ids = ids[: len(ids) * 9 // 10]
    n = max(len(ids), seq + 2)
    starts = ((step * batch + np.arange(batch)) * seq) % (n - seq - 1)
    window = ids[starts[:, None] + np.arange(seq + 1)[None, :]]
    x = window[:, :seq]
    y = window[:, 1:] if per_position else window[:, seq]
    return x, y


# ---------------------------------------------------------------------------
# A runner: one configuration, built once, stepped many times.
# ---------------------------------------------------------------------------

class Runner:
    """`step(i)` trains one step on batch i and returns the loss as a float
    (which waits for the step to finish, as a training loop that logs every
    step does)."""

    def __init__(self, step_fn: Callable[[int], float]):
        self.step = step_fn
        self.steps_done = 0

    def run(self, steps: int):
        """Times `steps` steps: each time is from the end of the previous step
        (or the start) to the end of this one, as shardc's `step_ms` is."""
        times, losses = [], []
        last = time.perf_counter()
        for _ in range(steps):
            loss = self.step(self.steps_done)
            self.steps_done += 1
            now = time.perf_counter()
            times.append((now - last) * 1e3)
            losses.append(loss)
            last = now
        return times, losses


def make_mesh(shape: Sequence[int], names: Sequence[str]) -> Mesh:
    need = int(np.prod(shape))
    devices = jax.devices()
    if len(devices) < need:
        raise SystemExit(
            f"this configuration needs {need} devices and JAX sees {len(devices)}: "
            f"run with XLA_FLAGS=--xla_force_host_platform_device_count={need}"
        )
    return Mesh(np.array(devices[:need]).reshape(shape), tuple(names))


# ---------------------------------------------------------------------------
# Seed 000: the Shakespeare next-word model, with a plain dense embedding
# (flax nn.Embed) where the seed has the SparseCore table. Data parallel: the
# batch split over `device`, parameters replicated, jit with NamedShardings as
# the seed does. Adam 0.005, batch 256, 16 context words, vocab 2048, emb 16.
# ---------------------------------------------------------------------------

SH_VOCAB, SH_SEQ, SH_EMB, SH_BATCH, SH_LR = 2048, 16, 16, 256, 0.005


class ShakespeareModel(nn.Module):
    vocab_size: int
    embedding_size: int
    mesh: Mesh
    sharding_axis: str = "device"

    def add_sharding_constraint(self, x, names):
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, P(*names)))

    @nn.compact
    def __call__(self, ids):
        x = nn.Embed(self.vocab_size, self.embedding_size,
                     embedding_init=jax.nn.initializers.normal(1.0))(ids)
        x = jnp.reshape(x, (ids.shape[0], -1))
        x = self.add_sharding_constraint(x, (self.sharding_axis,))
        x = nn.Dense(self.embedding_size)(x)
        x = self.add_sharding_constraint(x, (self.sharding_axis,))
        x = nn.Dense(self.vocab_size)(x)
        x = self.add_sharding_constraint(x, (self.sharding_axis,))
        return x


def build_shakespeare(n_devices: int, seed: int = 42) -> Runner:
    mesh = make_mesh((n_devices,), ("device",))
    data_sharding = NamedSharding(mesh, P("device"))
    replicated = NamedSharding(mesh, P())
    model = ShakespeareModel(SH_VOCAB, SH_EMB, mesh)
    tx = optax.adam(learning_rate=SH_LR)
    x0, _ = word_batch(SH_VOCAB, SH_SEQ, SH_BATCH, 0, per_position=False)

    @functools.partial(jax.jit, out_shardings=replicated)
    def init(rng, ids):
        params = model.init(rng, ids)
        return params, tx.init(params)

    params, opt_state = init(jax.random.key(seed), jax.device_put(x0, data_sharding))

    @functools.partial(
        jax.jit,
        in_shardings=(replicated, replicated, data_sharding, data_sharding),
        out_shardings=(replicated, replicated, replicated),
        donate_argnums=(0, 1),
    )
    def train_step(params, opt_state, ids, labels):
        def forward_pass(params):
            logits = model.apply(params, ids)
            xent = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=labels)
            return jnp.mean(xent)

        loss, grads = jax.value_and_grad(forward_pass)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    state = {"params": params, "opt": opt_state}

    def step(i: int) -> float:
        x, y = word_batch(SH_VOCAB, SH_SEQ, SH_BATCH, i, per_position=False)
        x = jax.device_put(x, data_sharding)
        y = jax.device_put(y, data_sharding)
        state["params"], state["opt"], loss = train_step(state["params"], state["opt"], x, y)
        return float(loss)

    return Runner(step)


# ---------------------------------------------------------------------------
# Seed 003: the classifier 784 -> 512 (silu, dropout 0.1) -> 10 with FSDP over
# `data`, as the seed writes it: shard_map, parameters over 2**4 elements kept
# as nn.Partitioned slices, gathered around each use with a custom gradient
# (psum_scatter / axis size), replicated ones' gradients pmean'd; batch 128 of
# one fixed synthetic batch in 4 accumulated minibatches; adamw 1e-3. The seed
# computes in bfloat16; here in float32, as shardc does.
# ---------------------------------------------------------------------------

CL_INPUT, CL_HIDDEN, CL_CLASSES, CL_BATCH, CL_MINIBATCHES = 784, 512, 10, 128, 4
CL_MIN_WEIGHT_SIZE = 2**4
Parameter = jax.Array | nn.Partitioned


class Batch(struct.PyTreeNode):
    inputs: jax.Array
    labels: jax.Array


class TrainState(train_state.TrainState):
    rng: jax.Array


def fold_rng_over_axis(rng, axis_name):
    return jax.random.fold_in(rng, jax.lax.axis_index(axis_name))


def shard_params(params: PyTree, axis_name: str, min_weight_size: int = 2**18) -> PyTree:
    axis_idx = jax.lax.axis_index(axis_name)
    axis_size = jax.lax.psum(1, axis_name)

    def _split(x: Parameter) -> Parameter:
        if isinstance(x, nn.Partitioned):
            value, names = x.value, x.names
        else:
            value, names = x, (None,) * x.ndim
        if axis_name in names or value.size <= min_weight_size:
            return x
        shape = value.shape
        for i in np.argsort(shape)[::-1]:  # shard along the largest possible axis
            if shape[i] % axis_size == 0 and names[i] is None:
                split_size = shape[i] // axis_size
                return nn.Partitioned(
                    value=jax.lax.dynamic_slice_in_dim(value, axis_idx * split_size, split_size, axis=i),
                    names=names[:i] + (axis_name,) + names[i + 1:],
                )
        return x

    return jax.tree.map(_split, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def gather_array_with_mean_grads(x: jax.Array, axis: int, axis_name: str):
    axis_size = jax.lax.psum(1, axis_name)

    @jax.custom_gradient
    def f(x):
        def grad_fn(g):
            return jax.lax.psum_scatter(g, axis_name, scatter_dimension=axis, tiled=True) / axis_size

        return jax.lax.all_gather(x, axis_name, axis=axis, tiled=True), grad_fn

    return f(x)


def gather_params(params: PyTree, axis_name: str) -> PyTree:
    def _gather(p: Parameter) -> Parameter:
        if isinstance(p, nn.Partitioned) and axis_name in p.names:
            names = p.names
            shard_axis = names.index(axis_name)
            value = gather_array_with_mean_grads(p.value, axis=shard_axis, axis_name=axis_name)
            names = names[:shard_axis] + (None,) + names[shard_axis + 1:]
            if any(n is not None for n in names):
                return nn.Partitioned(value, names)
            return value
        return p

    return jax.tree.map(_gather, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def shard_module_params(target, axis_name: str, min_weight_size: int = 2**18):
    return nn.map_variables(
        target,
        trans_in_fn=functools.partial(gather_params, axis_name=axis_name),
        trans_out_fn=functools.partial(shard_params, axis_name=axis_name, min_weight_size=min_weight_size),
        mapped_collections="params",
        mutable=True,
    )


class FSDPClassifier(nn.Module):
    hidden_size: int
    num_classes: int
    dropout_rate: float
    data_axis_name: str
    min_weight_size: int

    @nn.compact
    def __call__(self, x, train: bool):
        sharded_dense = shard_module_params(
            nn.Dense, axis_name=self.data_axis_name, min_weight_size=self.min_weight_size)
        x = sharded_dense(features=self.hidden_size, dtype=jnp.float32, name="input_dense")(x)
        x = nn.silu(x)
        x = nn.Dropout(rate=self.dropout_rate, deterministic=not train)(x)
        x = sharded_dense(features=self.num_classes, dtype=jnp.float32, name="output_dense")(x)
        return x.astype(jnp.float32)


def accumulate_gradients(state, batch, rng, num_minibatches, loss_fn):
    """The seed's helper (from its single_gpu_optimizations module): the batch
    in `num_minibatches` slices, one after the other; gradients averaged,
    metrics summed."""
    batch_size = batch.inputs.shape[0]
    minibatch_size = batch_size // num_minibatches
    rngs = jax.random.split(rng, num_minibatches)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    grads = metrics = None
    for k in range(num_minibatches):
        start, end = k * minibatch_size, (k + 1) * minibatch_size
        minibatch = jax.tree.map(lambda x: x[start:end], batch)
        (_, step_metrics), step_grads = grad_fn(state.params, state.apply_fn, minibatch, rngs[k])
        if grads is None:
            grads, metrics = step_grads, step_metrics
        else:
            grads = jax.tree.map(jnp.add, grads, step_grads)
            metrics = jax.tree.map(jnp.add, metrics, step_metrics)
    grads = jax.tree.map(lambda g: g / num_minibatches, grads)
    return grads, metrics


def sync_gradients(grads: PyTree, axis_names: Sequence[str]) -> PyTree:
    def sync_grad(g: Parameter) -> Parameter:
        if isinstance(g, nn.Partitioned):
            replication = [n for n in axis_names if n not in jax.tree_util.tree_leaves(g.names)]
            if not replication:
                return g
            return g.replace(value=jax.lax.pmean(g.value, axis_name=replication))
        return jax.lax.pmean(g, axis_name=axis_names)

    return jax.tree.map(sync_grad, grads, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def build_classifier(n_devices: int, seed: int = 42) -> Runner:
    axis = "data"
    mesh = make_mesh((n_devices,), (axis,))
    model = FSDPClassifier(CL_HIDDEN, CL_CLASSES, 0.1, axis, CL_MIN_WEIGHT_SIZE)
    optimizer = optax.adamw(learning_rate=1e-3)

    rng = jax.random.PRNGKey(seed)
    model_init_rng, data_inputs_rng, data_labels_rng = jax.random.split(rng, 3)
    batch = Batch(
        inputs=jax.random.normal(data_inputs_rng, (CL_BATCH, CL_INPUT)),
        labels=jax.random.randint(data_labels_rng, (CL_BATCH,), 0, CL_CLASSES),
    )

    def init_fsdp(rng, x):
        init_rng, rng = jax.random.split(rng)
        variables = model.init({"params": init_rng}, x, train=False)
        params = variables.pop("params")
        return TrainState.create(apply_fn=model.apply, params=params, tx=optimizer, rng=rng)

    def loss_fn(params, apply_fn, batch, rng):
        dropout_rng = fold_rng_over_axis(rng, axis)
        logits = apply_fn({"params": params}, batch.inputs, train=True, rngs={"dropout": dropout_rng})
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
        metrics = {"loss": (loss.sum(), batch.inputs.shape[0])}
        return loss.mean(), metrics

    def train_step_fsdp(state, batch):
        rng, step_rng = jax.random.split(state.rng)
        grads, step_metrics = accumulate_gradients(state, batch, step_rng, CL_MINIBATCHES, loss_fn)
        grads = sync_gradients(grads, (axis,))
        new_state = state.apply_gradients(grads=grads, rng=rng)
        step_metrics = jax.tree.map(lambda x: jax.lax.psum(x, axis_name=axis), step_metrics)
        return new_state, step_metrics

    shmap = functools.partial(jax.shard_map, mesh=mesh, check_vma=False)
    init_abstract = shmap(init_fsdp, in_specs=(P(), P(axis)), out_specs=P())
    specs = nn.get_partition_spec(jax.eval_shape(init_abstract, model_init_rng, batch.inputs))
    init_fn = jax.jit(shmap(init_fsdp, in_specs=(P(), P(axis)), out_specs=specs))
    state = init_fn(model_init_rng, batch.inputs)
    step_fn = jax.jit(
        shmap(train_step_fsdp, in_specs=(specs, P(axis)), out_specs=(specs, P())),
        donate_argnames=("state",),
    )
    batch = jax.device_put(batch, NamedSharding(mesh, P(axis)))
    holder = {"state": state}

    def step(i: int) -> float:
        holder["state"], metrics = step_fn(holder["state"], batch)
        total, count = metrics["loss"]
        return float(total) / float(count)

    return Runner(step)


# ---------------------------------------------------------------------------
# Seed 001: GPT-J's block structure, as the seed writes it per shard (Haiku +
# xmap there; Flax + shard_map here) and as models/gptj.shard writes it: a
# vocabulary-parallel embedding (each mp shard embeds the ids in its window,
# then psum), blocks with one shared LayerNorm, attention heads split over mp
# (column-parallel q, k, v, row-parallel output), an MLP split over mp, one
# psum per block with the residual and the row-parallel bias added after it,
# a final LayerNorm, a vocab-parallel head and the seed's sharded softmax
# cross-entropy (pmax and psum of the row max and sum-exp only). dp 4 x mp 2,
# batch 16, T 32, vocab 5000, 4 heads, 2 layers, Adam 1e-5. The differences
# from the seed are those models/gptj.shard lists (residual outside the psum,
# no positional embedding, no z-loss, embedding by gather, not one-hot matmul).
# shard_map checks varying/invariant values (check_vma), so the transposes of
# psum and of the implicit broadcasts give exact gradients (Megatron's f / g).
# ---------------------------------------------------------------------------

GJ_VOCAB, GJ_T, GJ_LAYERS, GJ_HEADS, GJ_BATCH, GJ_LR = 5000, 32, 2, 4, 16, 1e-5
normal02 = jax.nn.initializers.normal(0.02)


# How each GPT-J parameter is split: by its name, for the parameters and for
# Adam's moments alike (everything else is replicated).
GJ_SPLIT = {
    "embed": P("mp", None), "head": P(None, "mp"),
    "wq": P(None, "mp", None), "wk": P(None, "mp", None), "wv": P(None, "mp", None),
    "wo": P("mp", None, None), "w1": P(None, "mp"), "b1": P("mp"), "w2": P("mp", None),
}


def gptj_specs(tree: PyTree) -> PyTree:
    def spec(path, _):
        last = path[-1] if path else None
        return GJ_SPLIT.get(getattr(last, "key", None), P())

    return jax.tree_util.tree_map_with_path(spec, tree)


def mp_param(module: nn.Module, name: str, shape, init=normal02):
    """A parameter split over mp (its local shape is `shape`; GJ_SPLIT says
    which dim): each mp shard initializes its piece from its own key."""
    def fold(key, *a):
        return init(jax.random.fold_in(key, jax.lax.axis_index("mp")), *a)

    return module.param(name, fold, shape)


class GPTJBlock(nn.Module):
    d_model: int
    heads: int
    shards: int

    @nn.compact
    def __call__(self, x):  # x: [b, T, D] (this dp shard's batch)
        d, hl, dh = self.d_model, self.heads // self.shards, self.d_model // self.heads
        ffl = 4 * d // self.shards
        h = nn.LayerNorm(epsilon=1e-5, name="ln")(x)
        wq = mp_param(self, "wq", (d, hl, dh))
        wk = mp_param(self, "wk", (d, hl, dh))
        wv = mp_param(self, "wv", (d, hl, dh))
        wo = mp_param(self, "wo", (hl, dh, d))
        w1 = mp_param(self, "w1", (d, ffl))
        b1 = mp_param(self, "b1", (ffl,), jax.nn.initializers.zeros)
        w2 = mp_param(self, "w2", (ffl, d))
        b2 = self.param("b2", jax.nn.initializers.zeros, (d,))
        q = jnp.einsum("btd,dhe->bthe", h, wq)
        k = jnp.einsum("btd,dhe->bthe", h, wk)
        v = jnp.einsum("btd,dhe->bthe", h, wv)
        t = x.shape[1]
        logits = jnp.einsum("bthe,bThe->bhtT", q, k) / np.sqrt(dh).astype(np.float32)
        causal = np.tril(np.ones((t, t), dtype=bool))
        logits = logits + np.where(causal, 0.0, -1e10).astype(np.float32)
        a = jnp.einsum("bhtT,bThe->bthe", jax.nn.softmax(logits, axis=-1), v)
        attn = jnp.einsum("bthe,hed->btd", a, wo)
        ff = jax.nn.gelu(h @ w1 + b1) @ w2
        return x + jax.lax.psum(attn + ff, "mp") + b2


class GPTJ(nn.Module):
    vocab: int
    d_model: int
    heads: int
    layers: int
    shards: int

    def setup(self):
        vl = self.vocab // self.shards
        self.embed = mp_param(self, "embed", (vl, self.d_model))
        self.blocks = [GPTJBlock(self.d_model, self.heads, self.shards, name=f"layer_{i}")
                       for i in range(self.layers)]
        self.ln_f = nn.LayerNorm(epsilon=1e-5)
        self.head = mp_param(self, "head", (self.d_model, vl))

    def window(self, ids):
        vl = self.vocab // self.shards
        local = ids - jax.lax.axis_index("mp") * vl
        inside = (local >= 0) & (local < vl)
        return jnp.clip(local, 0, vl - 1), inside

    def __call__(self, ids, targets):
        local, inside = self.window(ids)
        x = jnp.take(self.embed, local, axis=0) * inside[..., None]
        x = jax.lax.psum(x, "mp")
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.head  # [b, T, V/mp]
        # The seed's sharded loss: only the row max and the sum of exps cross shards.
        row_max = jax.lax.pmax(jax.lax.stop_gradient(logits.max(-1, keepdims=True)), "mp")
        logits = logits - row_max
        tl, tin = self.window(targets)
        picked = jnp.take_along_axis(logits, tl[..., None], axis=-1)[..., 0] * tin
        picked = jax.lax.psum(picked, "mp")
        sum_exp = jax.lax.psum(jnp.exp(logits).sum(-1), "mp")
        return jnp.mean(jnp.log(sum_exp) - picked)


def build_gptj(n_devices: int, d_model: int, seed: int = 42, mesh_shape=(4, 2), tx=None) -> Runner:
    dp, mp = mesh_shape
    if n_devices < dp * mp:
        raise SystemExit(f"GPT-J runs on dp {dp} x mp {mp}; this process has {n_devices} devices")
    mesh = make_mesh((dp, mp), ("dp", "mp"))
    model = GPTJ(GJ_VOCAB, d_model, GJ_HEADS, GJ_LAYERS, mp)
    tx = tx or optax.adam(GJ_LR)
    x0, y0 = word_batch(GJ_VOCAB, GJ_T, GJ_BATCH, 0, per_position=True)
    data = NamedSharding(mesh, P("dp"))

    def init(rng, x, y):
        params = model.init(rng, x, y)["params"]
        return {"params": params, "opt": tx.init(params)}

    abstract = jax.eval_shape(
        jax.shard_map(init, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=P(), check_vma=False),
        jax.random.key(seed), x0, y0)
    specs = gptj_specs(abstract)
    init_fn = jax.jit(jax.shard_map(init, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=specs))

    def train_step(state, x, y):
        def loss_fn(params):
            return jax.lax.pmean(model.apply({"params": params}, x, y), "dp")

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt = tx.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

    step_fn = jax.jit(
        jax.shard_map(train_step, mesh=mesh, in_specs=(specs, P("dp"), P("dp")), out_specs=(specs, P())),
        donate_argnums=(0,),
    )
    holder = {"state": init_fn(jax.random.key(seed), jax.device_put(x0, data), jax.device_put(y0, data))}

    def step(i: int) -> float:
        x, y = word_batch(GJ_VOCAB, GJ_T, GJ_BATCH, i, per_position=True)
        holder["state"], loss = step_fn(holder["state"], jax.device_put(x, data), jax.device_put(y, data))
        return float(loss)

    r = Runner(step)
    r.mesh, r.model, r.step_fn, r.holder, r.specs = mesh, model, step_fn, holder, specs
    return r


# ---------------------------------------------------------------------------
# The configurations run.py knows, and the matmul peak.
# ---------------------------------------------------------------------------

BUILDERS = {
    "shakespeare": build_shakespeare,
    "classifier": build_classifier,
    "gptj_256": functools.partial(build_gptj, d_model=256),
    "gptj_768": functools.partial(build_gptj, d_model=768),
}


def matmul_peak(n: int = 2048, reps: int = 10) -> dict:
    """The best of `reps` timings of a jitted n x n float32 matmul on one device."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    mm = jax.jit(jnp.matmul)
    mm(a, b).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        mm(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return {"n": n, "seconds": best, "flops_per_s": 2.0 * n**3 / best}


def serve():
    """One JSON command per stdin line, one JSON answer per stdout line."""
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed goes to stderr
    runners = {}
    n_devices = len(jax.devices())
    out.write(json.dumps({"ready": True, "devices": n_devices, "jax": jax.__version__}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "peak":
                reply = matmul_peak(cmd.get("n", 2048))
            elif cmd["cmd"] == "run":
                name = cmd["config"]
                if name not in runners:
                    runners[name] = BUILDERS[name](n_devices)
                times, losses = runners[name].run(int(cmd["steps"]))
                reply = {"times_ms": times, "losses": losses}
            else:
                reply = {"error": f"unknown command {cmd['cmd']!r}"}
        except Exception as e:  # reported to run.py, which stops with it
            reply = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def selfcheck():
    """The sharded GPT-J trains as the same parameters do on a 1 x 1 mesh (with
    SGD, whose steps are proportional to the gradients, so that a gradient
    summed once too often shows), and the FSDP classifier runs."""
    sgd = optax.sgd(0.5)
    big = build_gptj(len(jax.devices()), d_model=64, tx=sgd)
    params = jax.tree.map(np.asarray, big.holder["state"])
    one = build_gptj(len(jax.devices()), d_model=64, mesh_shape=(1, 1), tx=sgd)
    one.holder["state"] = jax.tree.map(jnp.asarray, params)
    # A 1 x 1 model has its whole vocabulary in one shard: the same global arrays.
    _, a = big.run(3)
    _, b = one.run(3)
    print("gptj dp4 x mp2:", a, "\ngptj 1 x 1:   ", b)
    assert np.allclose(a, b, rtol=1e-4), "sharded GPT-J differs from one device"
    _, c8 = build_classifier(len(jax.devices())).run(1)
    print("classifier, first loss on", len(jax.devices()), "devices:", c8)
    print("selfcheck passed")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "selfcheck":
        selfcheck()
    elif len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve()
    else:
        sys.exit("usage: models.py serve | selfcheck   (run.py starts `serve` itself)")
