"""Heat maps of a failing tensor's error: hand minus trusted over its axes, one PNG per tensor.

The last two axes make the image (a 1-D tensor is one row); leading axes fold into a grid of
panels, one per index (rank 3: a panel per head or batch element; rank 4 and above: rows over
the leading axes but one, columns over that one).  A stripe, a triangle or one wrong head shows
at a glance.  The colour scale is symmetric about zero (red: hand too large, blue: too small).
"""
from __future__ import annotations

import itertools
import os
import pathlib

import numpy as np

from checks.localise import axis_labels

MAX_PANELS = 64  # beyond this many panels, the first ones are drawn and the title says so


def _panels(diff):
    """(rows, cols, [(title suffix index, 2-D image)]) of the folded tensor."""
    if diff.ndim <= 2:
        return 1, 1, [((), np.atleast_2d(diff))]
    lead = diff.shape[:-2]
    cols = lead[-1]
    rows = int(np.prod(lead[:-1])) if len(lead) > 1 else 1
    images = [(index, diff[index]) for index in itertools.product(*map(range, lead))]
    return rows, cols, images


def plot_tensor(diff, path, *, title, axes=None):
    """Save the heat map of one error tensor diff (hand minus trusted) to path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    diff = np.asarray(diff, dtype=np.float64)
    labels = axis_labels(diff.shape, axes)
    rows, cols, images = _panels(diff)
    shown = images[:MAX_PANELS]
    rows = min(rows, -(-len(shown) // cols))
    height = 2.8 * rows + 1.2                       # inches: the panels and a two-line title
    fig, grid = plt.subplots(rows, cols, figsize=(min(3.2 * cols, 16) + 1, height),
                             squeeze=False)
    fig.subplots_adjust(top=1 - 1.0 / height, hspace=0.5, wspace=0.35)
    vmax = float(np.max(np.abs(diff))) or 1.0
    image = None
    for ax, (index, panel) in zip(grid.ravel(), shown):
        image = ax.imshow(panel, cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto",
                          interpolation="nearest")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if diff.ndim >= 2:
            ax.set_ylabel(labels[-2])
        ax.set_xlabel(labels[-1])
        if diff.ndim == 1:
            ax.set_yticks([])
        if index:
            ax.set_title(", ".join(f"{labels[a]} {i}" for a, i in enumerate(index)), fontsize=9)
    for ax in grid.ravel()[len(shown):]:
        ax.axis("off")
    more = f" (first {MAX_PANELS} of {len(images)} panels)" if len(images) > len(shown) else ""
    fig.suptitle(title + more, fontsize=10)
    fig.colorbar(image, ax=grid.ravel().tolist(), shrink=0.8, label="hand − trusted")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def plot_report(report, out_dir) -> list:
    """One PNG per failing tensor of the report that has an error to show: the paths."""
    paths = []
    for t in report.tensors:
        if t.ok or t.difference is None or np.ndim(t.difference) == 0:
            continue
        title = f"{report.layer}.{t.name} [{report.dtype}]: hand − trusted"
        if t.diagnosis:
            title += "\n" + (t.diagnosis if len(t.diagnosis) <= 110 else t.diagnosis[:107] + "...")
        name = f"{report.layer}.{t.name}.{report.dtype}.png".replace("/", "_")
        paths.append(plot_tensor(t.difference, pathlib.Path(out_dir) / name, title=title,
                                 axes=t.axes))
    return paths
