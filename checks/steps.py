"""The step-size picture: finite-difference error against step size for one layer.

For one tensor of the layer (its first parameter, else its first differentiable input) and one
random direction v, the exact directional derivative <g, v> comes from autodiff of the oracle in
float64.  Against it, the relative error |D(h) - <g, v>| / (|g| |v|) of

* central differences (L(x + hv) - L(x - hv)) / 2h: truncation h^2 L''' / 6, rounding u |L| / h,
  best at h ~ u^(1/3), error ~ u^(2/3);
* forward differences (L(x + hv) - L(x)) / h: truncation h L'' / 2, best at h ~ u^(1/2);
* the complex step Im L(x + ihv) / h (analytic layers, on the oracle): no subtraction, so the
  error stays at ~u for every small h;

each with the hand forward (or the oracle, for the complex step) in float32 and in float64.
The theoretical optima are marked and the rounding law u·Σ|f·dout| / h is drawn beside the
measurements.  ``python -m checks steps LAYER`` saves the PNG into results/steps/.
"""
from __future__ import annotations

import os
import pathlib

import numpy as np

from checks import tolerances
from checks.legs import FiniteDifferences, Oracle
from checks.registry import BY_NAME

STEPS = np.logspace(-16, 0, 65)


def _setup(row, dtype, seed):
    rng = np.random.default_rng(seed)
    inputs, params, static = row.case(rng, dtype)
    diff_idx = [i for i, x in enumerate(inputs) if x.dtype.kind == "f" and i not in row.nondiff]
    return inputs, params, static, diff_idx


def measure(layer: str, seed: int = 0, steps=STEPS) -> dict:
    """{(scheme, dtype name): relative errors at STEPS} and what the figure needs besides."""
    row = BY_NAME[layer]
    inputs64, params64, static, diff_idx = _setup(row, np.float64, seed)
    key = next(iter(params64), diff_idx[0] if diff_idx else None)
    if key is None:
        raise ValueError(f"layer: {layer} has no differentiable tensor")
    oracle64 = Oracle(row.oracle, inputs64, params64, static, diff_idx)
    out_shape = np.shape(row.forward(*inputs64, params64, **static)[0])
    rng = np.random.default_rng([seed, 1])
    dout = rng.standard_normal(out_shape)
    _, g_in, g_params = oracle64.vjp(dout)
    g = g_params[key] if isinstance(key, str) else g_in[key]
    v = rng.standard_normal(g.shape)
    exact = float(np.sum(g * v))
    scale = float(np.linalg.norm(g) * np.linalg.norm(v))
    curves, rounding = {}, {}
    for dtype in (np.float32, np.float64):
        inputs, params = ([x.astype(dtype) if x.dtype.kind == "f" else x for x in inputs64],
                          {k: p.astype(dtype) for k, p in params64.items()})
        fd = FiniteDifferences(row.forward, inputs, params, static, dout)
        x = params[key] if isinstance(key, str) else inputs[key]
        name = np.dtype(dtype).name
        # theory: rounding in L(x +- hv) costs about u sum|f * dout| / h, whatever the scheme
        u = tolerances.unit_roundoff(np.dtype(dtype))
        rounding[name] = u * fd.value(key, x.astype(np.float64))[1] / (np.asarray(steps) * scale)
        for scheme, method in (("central", fd.central), ("forward", fd.forward_difference)):
            curves[(scheme, name)] = np.array(
                [abs(method(key, x.astype(np.float64), v, h)[0] - exact) / scale for h in steps])
        if row.analytic:
            cdtype = np.complex64 if dtype == np.float32 else np.complex128
            oracle = Oracle(row.oracle, inputs, params, static, diff_idx)
            curves[("complex step", name)] = np.array(
                [abs(oracle.loss(key, (x + 1j * h * v).astype(cdtype), dout).imag / h - exact)
                 / scale for h in steps])
    size = float(np.sqrt(np.mean(np.square(params64[key] if isinstance(key, str)
                                           else inputs64[key]))))
    return {"curves": curves, "rounding": rounding, "steps": np.asarray(steps), "size": size,
            "tensor": key if isinstance(key, str) else row.input_names[key]}


def draw(layer: str, out_dir="results/steps", seed: int = 0, steps=STEPS) -> pathlib.Path:
    """Measure and save results/steps/LAYER.png (written to a temporary file, then renamed)."""
    if layer not in BY_NAME:
        raise ValueError(f"layer: unknown layer {layer!r}; known: {', '.join(BY_NAME)}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = measure(layer, seed, steps)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    colours = {"float32": "tab:orange", "float64": "tab:blue"}
    styles = {"central": "-", "forward": "--", "complex step": ":"}
    for (scheme, dtype), err in m["curves"].items():
        ax.loglog(m["steps"], np.maximum(err, 1e-18), styles[scheme], color=colours[dtype],
                  label=f"{scheme}, {dtype}")
    for dtype, colour in colours.items():
        ax.loglog(m["steps"], m["rounding"][dtype], color=colour, lw=3, alpha=0.25,
                  label=f"theory: rounding u·Σ|f·dout| / h, {dtype}")
        u = tolerances.unit_roundoff(np.dtype(dtype))
        for scheme, h in (("central", tolerances.fd_step(m["size"], u)),
                          ("forward", u ** 0.5 * max(1.0, m["size"]))):
            ax.axvline(h, color=colour, ls=styles[scheme], lw=0.8, alpha=0.6)
            ax.annotate(f"{scheme} optimum u^{'1/3' if scheme == 'central' else '1/2'}",
                        (h, 1e-17), rotation=90, fontsize=7, color=colour, va="bottom")
    ax.set_xlabel("step size h (relative to the tensor's scale)")
    ax.set_ylabel("relative error of the directional derivative, |D(h) − ⟨g, v⟩| / (|g| |v|)")
    ax.set_title(f"Finite-difference error against step size: {layer}, tensor "
                 f"{m['tensor']}\n(exact derivative from JAX autodiff in float64)")
    ax.set_ylim(1e-18, 1e2)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{layer}.png"
    tmp = out / f".{layer}.png.tmp"
    fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path
