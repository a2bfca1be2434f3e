"""Training checkpoints: one .npz of plain arrays, written atomically, read without pickle.

Contents: ``param/NAME``, ``adam_m/NAME``, ``adam_v/NAME`` for every parameter, ``adam_t`` and
``epoch`` (completed epochs), ``config`` and ``history`` as JSON text, ``loss_scale`` (the loss
scaling's state: scale, good steps, skipped steps) when the trainer gives it, and ``digest``: the
SHA-256 of every other entry's name, dtype, shape and bytes.  Loading refuses a file that is not a
readable .npz (truncated, overwritten), one that would need pickle, one with missing entries, and
one whose digest disagrees (changed after it was written).  The digest guards against accidents,
not against someone who rewrites the digest too.
"""
from __future__ import annotations

import hashlib
import io
import json
import zipfile
from typing import NamedTuple

import numpy as np

from experiments.common import atomic_write_bytes
from kernels.optim import AdamState


class Checkpoint(NamedTuple):
    params: dict
    adam: AdamState
    epoch: int       # epochs completed
    config: dict     # the training config that produced it
    history: list    # per-epoch rows so far
    loss_scale: tuple | None = None  # (scale, good steps in a row, skipped steps), or None


def _digest(arrays: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save(path, ckpt: Checkpoint) -> None:
    """Write the checkpoint to path atomically (a temporary file, then a rename)."""
    arrays = {f"param/{k}": np.asarray(v) for k, v in ckpt.params.items()}
    arrays.update({f"adam_m/{k}": np.asarray(v) for k, v in ckpt.adam.m.items()})
    arrays.update({f"adam_v/{k}": np.asarray(v) for k, v in ckpt.adam.v.items()})
    arrays["adam_t"] = np.array(ckpt.adam.t, dtype=np.int64)
    arrays["epoch"] = np.array(ckpt.epoch, dtype=np.int64)
    arrays["config"] = np.array(json.dumps(ckpt.config, sort_keys=True))
    arrays["history"] = np.array(json.dumps(ckpt.history))
    if ckpt.loss_scale is not None:
        arrays["loss_scale"] = np.array(ckpt.loss_scale, dtype=np.float64)
    arrays["digest"] = np.array(_digest(arrays))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())


def load(path) -> Checkpoint:
    """Read a checkpoint written by save(); ValueError with the reason if it cannot be trusted."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint: no file at {path}") from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise ValueError(f"checkpoint {path}: not a readable checkpoint (truncated or not an "
                         f".npz written by the lab): {exc}") from None
    required = {"adam_t", "epoch", "config", "history", "digest"}
    if not required <= set(arrays):
        raise ValueError(f"checkpoint {path}: missing entries {sorted(required - set(arrays))}")
    recorded = str(arrays.pop("digest"))
    if _digest(arrays) != recorded:
        raise ValueError(f"checkpoint {path}: contents do not match the SHA-256 digest recorded "
                         f"when it was written (modified or corrupted)")
    part = lambda prefix: {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
    params, m, v = part("param/"), part("adam_m/"), part("adam_v/")
    if not params or set(m) != set(params) or set(v) != set(params):
        raise ValueError(f"checkpoint {path}: parameters and optimiser moments do not match")
    return Checkpoint(params, AdamState(m, v, int(arrays["adam_t"])), int(arrays["epoch"]),
                      json.loads(str(arrays["config"])), json.loads(str(arrays["history"])),
                      tuple(arrays["loss_scale"].tolist()) if "loss_scale" in arrays else None)
