"""The lab's transformer in PyTorch, a peer for the benchmark (optional: ``pip install -e '.[peers]'``).

The same maths as reference/transformer.py and kernels/model.py, written from the article:
fixed embedding table, sinusoidal positions, pre-norm blocks with RMS norm without parameters
(eps 1e-8), the per-head (H, P, P) attention projections and W_O (D, D) without biases, a causal
mask adding -1e9, leaky ReLU 0.1 in the feed-forward layer, the output layer and the mean
cross-entropy against target + Finish.  Same parameter names, so the lab's parameters load as is.
``train_step`` adds the lab's Adam update (kernels/optim.py) with the same constants.
"""
from __future__ import annotations

import math

import numpy as np

INSTALL_HINT = ("PyTorch not installed: make peers (the tested CPU build), "
                "or pip install -e '.[peers]'")


def available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _torch():
    import torch
    return torch


def posenc_table(T, D, dtype):
    """(T, D) sin at even, cos at odd features: angle = pos * 10000^(-2i/D), built in float64."""
    pos = np.arange(T, dtype=np.float64)[:, None]                   # (T, 1)
    angle = pos * 10000.0 ** (-2 * np.arange(D // 2) / D)           # (T, D/2)
    table = np.empty((T, D))
    table[:, 0::2], table[:, 1::2] = np.sin(angle), np.cos(angle)
    return _torch().as_tensor(table, dtype=dtype)


def rms_norm(x, eps=1e-8):
    return x / (x.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()


def attention(x, z, p, causal=False):
    """Queries from x (B, T, D), keys and values from z (B, S, D) -> (B, T, D)."""
    torch = _torch()
    B, T, D = x.shape
    S = z.shape[1]
    H, P, _ = p["WQ"].shape
    xh = x.reshape(B, T, H, P).transpose(1, 2)                       # (B, H, T, P)
    zh = z.reshape(B, S, H, P).transpose(1, 2)                       # (B, H, S, P)
    q, k, v = xh @ p["WQ"], zh @ p["WK"], zh @ p["WV"]               # (B, H, ., P) per-head P x P
    logits = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(P))        # (B, H, T, S)
    if causal:
        mask = torch.triu(torch.ones(T, S, dtype=torch.bool), diagonal=1)
        logits = logits + torch.where(mask, -1e9, 0.0).to(x.dtype)
    a = torch.softmax(logits, dim=-1)
    heads = (a @ v).transpose(1, 2).reshape(B, T, D)                 # (B, T, D)
    return heads @ p["WO"]


def ff(x, p):
    h = x @ p["W1"] + p["b1"]                                        # (B, T, F)
    return _torch().nn.functional.leaky_relu(h, 0.1) @ p["W2"] + p["b2"]


def _layer(params, prefix):
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def _stream(ids, table):
    return table[ids] + posenc_table(ids.shape[1], table.shape[1], table.dtype)


def loss(src, tgt, params, table):
    """Mean cross-entropy of decoder(Start + tgt, encoder(src)) against tgt + Finish."""
    torch = _torch()
    V = params["out.W"].shape[1]
    blocks = sum(1 for key in params if key.endswith(".attn.WQ"))
    B = tgt.shape[0]
    y_in = torch.cat([torch.full((B, 1), V - 2, dtype=tgt.dtype), tgt], dim=1)   # (B, T+1)
    y_out = torch.cat([tgt, torch.full((B, 1), V - 1, dtype=tgt.dtype)], dim=1)  # (B, T+1)
    x = _stream(src, table)                                                      # (B, S, D)
    for i in range(blocks):
        n = rms_norm(x)
        x = x + attention(n, n, _layer(params, f"enc{i}.attn."))
        x = x + ff(rms_norm(x), _layer(params, f"enc{i}.ff."))
    y = _stream(y_in, table)                                                     # (B, T+1, D)
    for i in range(blocks):
        n = rms_norm(y)
        y = y + attention(n, n, _layer(params, f"dec{i}.self."), causal=True)
        y = y + attention(rms_norm(y), x, _layer(params, f"dec{i}.cross."))
        y = y + ff(rms_norm(y), _layer(params, f"dec{i}.ff."))
    logits = rms_norm(y) @ params["out.W"] + params["out.b"]                     # (B, T+1, V)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), y_out.reshape(-1))


def to_torch(params: dict, src, tgt, embedding):
    """NumPy parameters, ids and table as tensors (parameters with requires_grad)."""
    torch = _torch()
    tensors = {k: torch.tensor(np.asarray(v)).requires_grad_() for k, v in params.items()}
    ids = torch.as_tensor(np.asarray(src)), torch.as_tensor(np.asarray(tgt))
    dtype = tensors["out.W"].dtype
    return tensors, ids, torch.as_tensor(np.asarray(embedding), dtype=dtype)


def adam_state(params):
    torch = _torch()
    return {"m": {k: torch.zeros_like(p) for k, p in params.items()},
            "v": {k: torch.zeros_like(p) for k, p in params.items()}, "t": 0}


def train_step(loss_fn, params, state, src, tgt, table, rate=1e-3, beta1=0.9, beta2=0.999,
               eps=1e-8):
    """Forward, backward and the lab's Adam update, in place on params and state."""
    torch = _torch()
    value = loss_fn(src, tgt, params, table)
    grads = torch.autograd.grad(value, list(params.values()))
    state["t"] += 1
    c1, c2 = 1 / (1 - beta1 ** state["t"]), 1 / (1 - beta2 ** state["t"])
    with torch.no_grad():
        for (key, p), g in zip(params.items(), grads):
            m = state["m"][key].mul_(beta1).add_(g, alpha=1 - beta1)
            v = state["v"][key].mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_(rate * (m * c1) / ((v * c2).sqrt() + eps))
    return value


def step_candidates(params: dict, src, tgt, embedding, *, threads: int = 1) -> tuple[dict, dict]:
    """Training steps to time, {"torch eager": fn, "torch.compile": fn}, each on its own copy of
    the parameters, and notes (the compile time, or why torch.compile is missing).
    threads: torch's intra-op threads (0: torch's default)."""
    import logging
    import time
    torch = _torch()
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "no CUDA runtime"
    if threads:
        torch.set_num_threads(threads)
    candidates, notes = {}, {}
    for name, fn in (("torch eager", loss), ("torch.compile", None)):
        tensors, (s, t), table = to_torch(params, src, tgt, embedding)
        state = adam_state(tensors)
        if fn is None:
            try:
                fn = torch.compile(loss)
                start = time.perf_counter()
                train_step(fn, tensors, state, s, t, table)  # compiles forward and backward
                notes[name] = f"compiled in {time.perf_counter() - start:.0f} s"
            except Exception as exc:  # a missing C compiler, an unsupported platform
                notes[name] = f"torch.compile failed: {type(exc).__name__}: {exc}".splitlines()[0]
                continue
        candidates[name] = (lambda fn=fn, p=tensors, st=state, s=s, t=t, tb=table:
                            train_step(fn, p, st, s, t, tb).detach())
    return candidates, notes
