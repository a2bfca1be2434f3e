"""Adam and the learning-rate schedules: the lab's intended one and the article's, by name.

Adam (Kingma & Ba 2015): m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
p -= rate * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), with t the step used for the bias
correction.  The lab counts t globally (1, 2, ... over the whole run); the article's training loop
restarts its step counter every epoch, so its bias correction restarts while m and v carry over.
The trainer chooses t; the optimiser only applies it.

Schedules map a 0-based step to a rate:

* ``intended``: linear warm-up to start over ``warmup`` steps (the first step already gets
  start / warmup), then linear decay to ``finish`` at the last step (total - 1); clamped to
  [finish, start], so never negative.
* ``article``: the same warm-up from 0 (its first step has rate 0), then
  ``start - (start - finish) * step / (total - warmup)``.  The article (docs/article.md) gives its
  behaviour, not its expression: this decay uses the step instead of the steps since the
  warm-up, so it reaches 0 at step (total - warmup) * start / (start - finish), before the end,
  and is negative afterwards, as described.  Called with the epoch's step counter (as the
  article's loop does) it never leaves the warm-up when an epoch is shorter than ``warmup``.
"""
from __future__ import annotations

from typing import NamedTuple

from kernels.backend import array_module


class AdamState(NamedTuple):
    m: dict  # first moments, keys of params
    v: dict  # second moments
    t: int   # optimiser steps taken so far (the global count)


def adam_init(params) -> AdamState:
    """Zero moments with the parameters' shapes and dtypes."""
    return AdamState({k: array_module(p).zeros_like(p) for k, p in params.items()},
                     {k: array_module(p).zeros_like(p) for k, p in params.items()}, 0)


def adam_step(params, grads, state: AdamState, rate, *, beta1=0.9, beta2=0.999, eps=1e-8,
              t=None):
    """One Adam update.  Returns (new params, new state); nothing is modified in place.
    t: the step of the bias correction (1-based); by default the global count state.t + 1.

    The parameters of one dtype and array module are updated together, as one flat vector
    (their concatenation), so that each operation of the update is one call for all of them
    rather than one per parameter: the lab's model has 22 parameters, most of them small, and
    the per-call cost dominated the update.  Element-wise, the operations and their order are
    those of the formula in the module docstring; the new parameters and moments are views of
    fresh flat arrays (the caller's params and state are only read)."""
    if set(grads) != set(params):
        raise ValueError(f"grads: expected the keys of params, missing {sorted(set(params) - set(grads))}, "
                         f"extra {sorted(set(grads) - set(params))}")
    t = state.t + 1 if t is None else int(t)
    if t < 1:
        raise ValueError(f"t: the bias-correction step counts from 1, got {t}")
    correct1, correct2 = 1 / (1 - beta1 ** t), 1 / (1 - beta2 ** t)  # Python floats: dtype-neutral
    groups = {}
    for key, p in params.items():
        g = grads[key]
        if g.shape != p.shape or g.dtype != p.dtype:
            raise ValueError(f"grads[{key!r}]: expected {p.shape} {p.dtype}, got {g.shape} {g.dtype}")
        groups.setdefault((p.dtype, array_module(p)), []).append(key)
    new_params, new_m, new_v = {}, {}, {}
    for (_, xp), keys in groups.items():
        flat = lambda arrays: xp.concatenate([arrays[k] for k in keys], axis=None)  # (N,) fresh
        g = flat(grads)
        m = flat(state.m)
        m *= beta1
        m += (1 - beta1) * g                                # first moment
        v = flat(state.v)
        v *= beta2
        g *= g                                              # g^2, in place on the fresh copy
        g *= (1 - beta2)
        v += g                                              # second moment
        step = m * correct1
        step *= rate
        denom = v * correct2
        xp.sqrt(denom, out=denom)
        denom += eps
        step /= denom                                       # rate * m_hat / (sqrt(v_hat) + eps)
        p = flat(params)
        p -= step
        start = 0
        for key in keys:                                    # views of the flat arrays
            shape = params[key].shape
            end = start + params[key].size
            new_params[key] = p[start:end].reshape(shape)
            new_m[key], new_v[key] = m[start:end].reshape(shape), v[start:end].reshape(shape)
            start = end
    new_params = {key: new_params[key] for key in params}   # the caller's key order
    return new_params, AdamState({key: new_m[key] for key in params},
                                 {key: new_v[key] for key in params}, state.t + 1)


def intended_rate(step, total, start, finish, warmup):
    """Warm-up to start, then linear decay to finish at step total - 1, never below finish."""
    if step < warmup:
        return start * (step + 1) / warmup
    span = max(total - 1 - warmup, 1)
    frac = min(max((step - warmup) / span, 0.0), 1.0)
    return finish + (start - finish) * (1 - frac)  # exactly finish at the end


def article_rate(step, total, start, finish, warmup):
    """The article's behaviour (see the module docstring): zero before the end, then negative."""
    if step < warmup:
        return start * step / warmup
    return start - (start - finish) * step / (total - warmup)


SCHEDULES = {"intended": intended_rate, "article": article_rate}
