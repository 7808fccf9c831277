#!/usr/bin/env python3
"""Hugging Face fixtures for shardc's weight maps (tests/hf.rs), written with
the real transformers and PyTorch. Run outside CI, where they are installed:

    python3 scripts/hf_fixtures.py            # (re)write tests/fixtures/hf/
    python3 scripts/hf_fixtures.py --check-export DIR [--model llama|gpt2] [--data BATCHES.npz]

The first writes a tiny LlamaForCausalLM (2 layers, width 64, GQA 4/2) saved in
f32 (`llama-f32/`), in bf16 (`llama-bf16/`) and sharded into two files
(`llama-sharded/`, with its `model.safetensors.index.json`), a tiny
GPT2LMHeadModel (2 layers, width 64, 4 heads, tied head) in f32 and bf16
(`gpt2-f32/`, `gpt2-bf16/`), fixed batches (`batches.npz`: x and y, [steps,
batch, T] int32), and what PyTorch computes from them (`expected.json`: per
model, AdamW losses from the f32 weights and from the bf16 weights upcast;
`grads-MODEL.safetensors`: the first step's gradients under HF's names).

The second loads an exported directory with `from_pretrained`, prints the
missing and unexpected keys, and the loss on each batch.
"""
import argparse
import json
import pathlib
import shutil

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf"
STEPS, BATCH, T, VOCAB = 5, 8, 16, 256
# shardc's adamw defaults (optax's): b1 0.9, b2 0.999, eps 1e-8; the .shard sets
# lr 0.003 and weight_decay 1e-4.
LR, WD = 0.003, 1e-4


def config():
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=T,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="eager",
    )


def gpt2_config():
    return GPT2Config(
        vocab_size=VOCAB,
        n_positions=T,
        n_embd=64,
        n_layer=2,
        n_head=4,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=True,
        attn_implementation="eager",
    )


MODELS = {"llama": (LlamaForCausalLM, config), "gpt2": (GPT2LMHeadModel, gpt2_config)}


def loss_of(model, x, y):
    logits = model(input_ids=torch.as_tensor(x, dtype=torch.long)).logits
    return F.cross_entropy(logits.reshape(-1, VOCAB).float(), torch.as_tensor(y, dtype=torch.long).reshape(-1))


def train(model, xs, ys):
    """Per-step losses (before each update) and the first step's gradients."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
    losses, grads = [], None
    for s in range(STEPS):
        opt.zero_grad()
        loss = loss_of(model, xs[s], ys[s])
        loss.backward()
        losses.append(loss.item())
        if grads is None:
            grads = {n: p.grad.detach().clone().contiguous() for n, p in model.named_parameters()}
        opt.step()
    return losses, grads


def write_model(name, xs, ys, sharded):
    cls, cfg = MODELS[name]
    model = cls(cfg()).float()
    dirs = [f"{name}-f32", f"{name}-bf16"] + ([f"{name}-sharded"] if sharded else [])
    for d in dirs:
        shutil.rmtree(OUT / d, ignore_errors=True)
    model.save_pretrained(OUT / f"{name}-f32", safe_serialization=True)
    if sharded:
        model.save_pretrained(OUT / f"{name}-sharded", safe_serialization=True, max_shard_size="250KB")
    half = cls(cfg())
    half.load_state_dict(model.state_dict())
    half.to(torch.bfloat16).save_pretrained(OUT / f"{name}-bf16", safe_serialization=True)
    for d in dirs:
        (OUT / d / "generation_config.json").unlink(missing_ok=True)

    losses, grads = train(model, xs, ys)
    upcast = cls.from_pretrained(OUT / f"{name}-bf16", torch_dtype=torch.bfloat16).float()
    losses_bf16, _ = train(upcast, xs, ys)
    # named_parameters() lists a tied head once, as the embedding (as saved).
    save_file({k: v.float() for k, v in grads.items()}, str(OUT / f"grads-{name}.safetensors"))
    print(name, "losses", losses, "bf16", losses_bf16)
    return {"losses_f32": losses, "losses_bf16": losses_bf16}


def write():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    xs = rng.integers(0, VOCAB, size=(STEPS, BATCH, T)).astype(np.int32)
    ys = rng.integers(0, VOCAB, size=(STEPS, BATCH, T)).astype(np.int32)
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez(OUT / "batches.npz", x=xs, y=ys)
    expected = {
        "about": "PyTorch AdamW on batches.npz (scripts/hf_fixtures.py)",
        "torch": torch.__version__,
        "llama": write_model("llama", xs, ys, sharded=True),
        "gpt2": write_model("gpt2", xs, ys, sharded=False),
    }
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    (OUT / "grads.safetensors").unlink(missing_ok=True)


def check_export(path, data, name):
    model, info = MODELS[name][0].from_pretrained(path, output_loading_info=True, torch_dtype=torch.float32)
    print("missing keys:", info["missing_keys"])
    print("unexpected keys:", info["unexpected_keys"])
    b = np.load(data)
    with torch.no_grad():
        for s in range(b["x"].shape[0]):
            print(f"loss on batch {s}: {loss_of(model, b['x'][s], b['y'][s]).item():.7f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-export")
    ap.add_argument("--data", default=str(OUT / "batches.npz"))
    ap.add_argument("--model", choices=sorted(MODELS), default="llama")
    a = ap.parse_args()
    if a.check_export:
        check_export(a.check_export, a.data, a.model)
    else:
        write()
