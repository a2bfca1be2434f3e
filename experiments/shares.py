"""Where the lab's training step spends its time: each layer's forward and backward, and Adam.

The step is the real one (kernels.model.model_forward, model_backward, then adam_step); while it
is measured, every kernel that kernels.model calls is wrapped in a timer (time.perf_counter around
the call), so each call of each layer is timed where the model makes it.  Repeats alternate an
instrumented step with a plain one (interleaved), and each figure is a median over the repeats;
what the kernels do not account for (residual additions, teacher forcing, parameter checks, the
timers themselves) is the ``glue`` row, the instrumented step less its layers' sum.  Shares are
of the instrumented step; the plain step's median is shown beside it (their difference is the
timers' cost plus the machine's drift).
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

# the kernels kernels.model calls, by the name it imports them under -> (layer, direction)
KERNELS = {
    "embedding_forward": ("embedding", "forward"),
    "posenc_forward": ("posenc", "forward"), "posenc_backward": ("posenc", "backward"),
    "rms_norm_forward": ("rms_norm", "forward"), "rms_norm_backward": ("rms_norm", "backward"),
    "mha_forward": ("self-attention", "forward"), "mha_backward": ("self-attention", "backward"),
    "mhca_forward": ("cross-attention", "forward"),
    "mhca_backward": ("cross-attention", "backward"),
    "ff_forward": ("ff", "forward"), "ff_backward": ("ff", "backward"),
    "linear_forward": ("output", "forward"), "linear_backward": ("output", "backward"),
    "cross_entropy_forward": ("loss", "forward"), "cross_entropy_backward": ("loss", "backward"),
}
LAYERS = ("embedding", "posenc", "rms_norm", "self-attention", "cross-attention", "ff", "output",
          "loss", "Adam")


@contextlib.contextmanager
def timed_kernels(module, seconds: dict, sync=None):
    """Within the block, module's kernels add their wall time to seconds[(layer, direction)]."""
    originals = {name: getattr(module, name) for name in KERNELS}

    def timer(fn, key):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if sync is not None:
                sync(out)
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - start
            return out
        return timed

    try:
        for name, fn in originals.items():
            setattr(module, name, timer(fn, KERNELS[name]))
        yield seconds
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)


def measure(step_parts, *, repeats: int, warmup: int, sync=None) -> dict:
    """Median seconds per (layer, direction), of the glue, of the instrumented step
    ("timed step", "") and of the plain step ("step", "").

    step_parts: (forward_backward, adam) callables; forward_backward() -> grads,
    adam(grads) -> anything.  Each repeat runs the step plain, then instrumented."""
    from kernels import model
    forward_backward, adam = step_parts
    done = sync or (lambda value: value)   # NumPy computes before it returns: no sync needed

    def plain():
        done(adam(forward_backward()))

    def instrumented():
        seconds = {}
        start = time.perf_counter()
        with timed_kernels(model, seconds, sync):
            grads = forward_backward()
        middle = time.perf_counter()
        done(adam(grads))
        end = time.perf_counter()
        seconds[("Adam", "update")] = end - middle
        seconds[("timed step", "")] = end - start
        seconds[("glue", "")] = end - start - sum(v for k, v in seconds.items() if k[0] in LAYERS)
        return seconds

    for _ in range(warmup):
        plain()
        instrumented()
    steps, parts = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        plain()
        steps.append(time.perf_counter() - start)
        parts.append(instrumented())
    keys = {k for p in parts for k in p}
    medians = {k: float(np.median([p.get(k, 0.0) for p in parts])) for k in keys}
    medians[("step", "")] = float(np.median(steps))
    return medians


def format_shares(by_size: dict) -> str:
    """One line per layer: forward and backward (or update) ms and the share of the step."""
    names = list(by_size)
    head = f"{'layer':16s}" + "".join(f" | {n + ' fwd ms':>15s} {'bwd ms':>8s} {'share':>6s}"
                                       for n in names)
    lines = [head, "-" * len(head)]
    for layer in LAYERS + ("glue",):
        cells = []
        for n in names:
            m = by_size[n]
            fwd = m.get((layer, "forward"), 0.0)
            bwd = sum(m.get((layer, d), 0.0) for d in ("backward", "update", ""))
            cells.append(f" | {1e3 * fwd:15.3f} {1e3 * bwd:8.3f} "
                         f"{(fwd + bwd) / m[('timed step', '')]:6.1%}")
        lines.append(f"{layer:16s}" + "".join(cells))
    for label, key in (("timed step", "timed step"), ("plain step", "step")):
        lines.append(f"{label:16s}" + "".join(
            f" | {1e3 * by_size[n][(key, '')]:24.3f} {by_size[n][(key, '')] / by_size[n][('timed step', '')]:6.0%}"
            for n in names))
    return "\n".join(lines)
