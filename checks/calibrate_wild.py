"""``python -m checks calibrate --wild``: verdicts on cases as users bring them.

The registry's calibration checks its own rows; this one checks what the registry does not tune
(``checks.wild``): plain random inputs at the registry's, the article's and the bench's sizes,
leaky ReLU's kink wherever the draws put it, an attention oracle masking with -inf, scalar
losses (the lab's and the article's float32-summing one), a recurrence oracle under
``lax.scan``, and planted localised bugs (one element x1.5, one element negated, one slice of
the first axis x1.05: a row, or a head of WQ).  Each task is one check, seeded by its own
description; the confusion table counts

    correct kernels   ok | noted (ok, with a finding) | FAIL blaming the hand / the oracle / other
    planted bugs      blamed on the hand | on the oracle | unresolved (another failing verdict)
                      | missed (the planted tensor passed)

Plain-NumPy kernels (``checks.wild_plain``: in float16 and bfloat16 products accumulate in
float32, every other result and sum rounds in the format) are among the cases in every format,
the linear one also at the bench's size (the feed-forward block there, with its kinks, takes
minutes a check on two shared cores: ``tests`` and the registry's calibration check it).
"""
from __future__ import annotations

import collections
import dataclasses
import zlib

import numpy as np

from checks.verdict import Kind

SIZES = {
    "registry": {"B": 2, "T": 5, "D": 8, "H": 2, "F": 12, "V": 6},
    "article": {"B": 4, "T": 16, "D": 32, "H": 4, "F": 128, "V": 12},
    "bench": {"B": 32, "T": 64, "D": 256, "H": 8, "F": 1024, "V": 12},
}
HALF = ("float16", "bfloat16")
ALL = ("float64", "float32") + HALF


def _normal(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def _ff(rng, dtype, s):
    import kernels
    import reference
    from checks.wild import plain_ff
    x, p = plain_ff(rng, dtype, s["B"], s["T"], s["D"], s["F"])
    return kernels.ff_forward, kernels.ff_backward, reference.ff, [x], p, {}, ["x"]


def _leaky_relu(rng, dtype, s):
    import kernels
    import reference
    return (kernels.leaky_relu_forward, kernels.leaky_relu_backward, reference.leaky_relu,
            [_normal(rng, (s["B"], s["T"], s["F"]), dtype)], {}, {}, ["x"])


def _linear(rng, dtype, s):
    import kernels
    import reference
    return (kernels.linear_forward, kernels.linear_backward, reference.linear,
            [_normal(rng, (s["B"], s["T"], s["D"]), dtype)],
            {"W": _normal(rng, (s["D"], s["F"]), dtype, 1 / np.sqrt(s["D"])),
             "b": _normal(rng, (s["F"],), dtype, 0.1)}, {}, ["x"])


def _mha_inf(rng, dtype, s):
    import kernels
    from checks.wild import attention_params, mha_inf_oracle
    return (kernels.mha_forward, kernels.mha_backward, mha_inf_oracle,
            [_normal(rng, (s["B"], s["T"], s["D"]), dtype)],
            attention_params(rng, dtype, s["D"], s["H"]), {"causal": True}, ["x"])


def _cross_entropy(rng, dtype, s):
    import kernels
    import reference
    return (kernels.cross_entropy_forward, kernels.cross_entropy_backward,
            reference.cross_entropy,
            [_normal(rng, (s["B"], s["T"], s["V"]), dtype, 2.0),
             rng.integers(0, s["V"], (s["B"], s["T"]))], {}, {}, ["logits", "targets"])


def _rnn(rng, dtype, s):
    from checks.wild import rnn_backward, rnn_case, rnn_forward, rnn_oracle
    x, p = rnn_case(rng, dtype, s["B"], min(s["T"], 16), min(s["D"], 32))
    return rnn_forward, rnn_backward, rnn_oracle, [x], p, {}, ["x"]


def _article_loss(rng, dtype, s):
    import reference
    from checks.wild import article_cross_entropy, article_cross_entropy_backward
    return (article_cross_entropy, article_cross_entropy_backward, reference.cross_entropy,
            [2 * rng.standard_normal((s["B"], s["T"], s["V"])),
             rng.integers(0, s["V"], (s["B"], s["T"]))], {}, {}, ["logits", "targets"])


def _plain(layer):
    """A plain-NumPy kernel (``checks.wild_plain``) with its oracle and plain draws."""
    def make(rng, dtype, s):
        import reference
        from checks import wild_plain
        B, T, D, F, V = (s[k] for k in "BTDFV")
        inputs, params, names = {
            "linear": ([_normal(rng, (B, T, D), dtype)],
                       {"W": _normal(rng, (D, F), dtype, 1 / np.sqrt(D)),
                        "b": _normal(rng, (F,), dtype, 0.1)}, ["x"]),
            "ff": ([_normal(rng, (B, T, D), dtype)],
                   {"W1": _normal(rng, (D, F), dtype, 1 / np.sqrt(D)),
                    "b1": _normal(rng, (F,), dtype, 0.1),
                    "W2": _normal(rng, (F, D), dtype, 1 / np.sqrt(F)),
                    "b2": _normal(rng, (D,), dtype, 0.1)}, ["x"]),
            "layernorm": ([_normal(rng, (B, T, D), dtype)],
                          {"g": (1 + 0.5 * rng.standard_normal(D)).astype(dtype),
                           "b": _normal(rng, (D,), dtype, 0.1)}, ["x"]),
            "softmax": ([_normal(rng, (B, T, V), dtype, 2.0)], {}, ["x"]),
            "cross_entropy": ([_normal(rng, (B, T, V), dtype, 2.0),
                               rng.integers(0, V, (B, T))], {}, ["logits", "targets"]),
        }[layer]
        return (getattr(wild_plain, f"{layer}_forward"), getattr(wild_plain, f"{layer}_backward"),
                getattr(reference, layer), inputs, params, {}, names)
    return make


# name -> (make, dtypes, sizes, tensors a bug is planted in)
CASES = {
    "ff": (_ff, ALL, ("registry", "article"), ("W1", "x")),
    "leaky_relu": (_leaky_relu, ALL, ("registry", "article"), ("x",)),
    "linear": (_linear, ALL, ("registry", "article"), ("W", "x")),
    "mha -inf mask": (_mha_inf, ALL, ("registry", "article"), ("WQ", "x")),
    "cross_entropy": (_cross_entropy, ALL, ("registry", "article"), ("logits",)),
    "rnn (lax.scan)": (_rnn, ("float64", "float32"), ("registry", "article"), ("U", "x")),
    "article's loss": (_article_loss, ("float64",), ("registry", "article"), ()),
    "plain linear": (_plain("linear"), ALL, ("registry", "article", "bench"), ("W", "x")),
    "plain ff": (_plain("ff"), ALL, ("registry", "article"), ("W1", "x")),
    "plain layernorm": (_plain("layernorm"), ALL, ("registry", "article"), ("g", "x")),
    "plain softmax": (_plain("softmax"), ALL, ("registry", "article"), ("x",)),
    "plain cross_entropy": (_plain("cross_entropy"), ALL, ("registry", "article"), ("logits",)),
}


@dataclasses.dataclass(frozen=True)
class Task:
    case: str
    dtype: str
    size: str
    seed: int
    bug: str = ""      # "" for the correct kernel, else one of checks.wild.BUGS
    tensor: str = ""


def tasks(seeds: int, cases=None, dtypes=ALL, bench_seeds=1):
    """Every case x dtype x size x seed (``bench_seeds`` at the bench's size, minutes each on
    two cores): the correct kernel, and each bug in a tensor chosen by the seed."""
    from checks.wild import BUGS
    out = []
    for name in cases or CASES:
        _, allowed, sizes, tensors = CASES[name]
        for dtype in [d for d in dtypes if d in allowed]:
            for size in sizes:
                for seed in range(bench_seeds if size == "bench" else seeds):
                    out.append(Task(name, dtype, size, seed))
                    for k, bug in enumerate(BUGS if tensors else ()):
                        out.append(Task(name, dtype, size, seed, bug,
                                        tensors[(seed + k) % len(tensors)]))
    return out


def run_task(task: Task) -> tuple:
    """(task, outcome): "ok", "noted", "FAIL hand", "FAIL oracle" or "FAIL other" for a correct
    kernel; "hand", "oracle", "unresolved" or "missed" for a planted bug."""
    from checks.engine import check_layer
    from checks.wild import plant
    make = CASES[task.case][0]
    rng = np.random.default_rng([task.seed, zlib.crc32(f"{task.case}/{task.size}".encode())])
    dtype = np.dtype(task.dtype)
    forward, backward, oracle, inputs, params, static, names = make(rng, dtype,
                                                                   SIZES[task.size])
    if task.bug:
        backward = plant(backward, task.tensor, task.bug, task.seed, tuple(names))
    report = check_layer(forward, backward, oracle, inputs, params, static=static,
                         seed=task.seed, input_names=names, name=task.case)
    return task, _outcome(task, report)


def _outcome(task, report):
    if not task.bug:
        if report.ok:
            return "noted" if report.notes else "ok"
        kinds = {t.verdict.kind for t in report.tensors if not t.ok and t.verdict}
        if Kind.HAND_WRONG in kinds:
            return "FAIL hand"
        return "FAIL oracle" if Kind.ORACLE_WRONG in kinds else "FAIL other"
    planted = next(t for t in report.tensors if t.name == task.tensor)
    if planted.ok:
        return "missed"
    return {Kind.HAND_WRONG: "hand", Kind.ORACLE_WRONG: "oracle"}.get(planted.verdict.kind,
                                                                      "unresolved")


CORRECT = ("ok", "noted", "FAIL hand", "FAIL oracle", "FAIL other")
BUGGY = ("hand", "oracle", "unresolved", "missed")


def confusion(results) -> str:
    """The table: one row per case x dtype, the correct kernels' outcomes, then the bugs'."""
    counts = collections.defaultdict(collections.Counter)
    for task, outcome in results:
        counts[(task.case, task.dtype)][outcome] += 1
    head = ("case", "dtype", "correct", *CORRECT, "bugs", *BUGGY)
    rows = []
    for (case, dtype), c in counts.items():
        rows.append((case, dtype, sum(c[k] for k in CORRECT), *(c[k] for k in CORRECT),
                     sum(c[k] for k in BUGGY), *(c[k] for k in BUGGY)))
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    line = lambda r: "  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip()
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def summary(results) -> str:
    c = collections.Counter(outcome for _, outcome in results)
    correct, bugs = sum(c[k] for k in CORRECT), sum(c[k] for k in BUGGY)
    share = 100.0 * c["hand"] / bugs if bugs else 0.0
    return (f"{len(results)} checks: {correct} correct kernels, {c['FAIL hand']} false \"hand is "
            f"wrong\", {c['FAIL oracle']} false \"oracle is wrong\", {c['FAIL other']} other "
            f"FAILs; {bugs} planted bugs, {c['hand']} blamed on the hand ({share:.1f} %), "
            f"{c['oracle']} on the oracle, {c['unresolved']} unresolved, {c['missed']} missed")


def calibrate_wild(seeds: int, *, cases=None, dtypes=ALL, bench_seeds=1, workers=0,
                   scheduler=None):
    from checks.parallel import map_tasks
    return map_tasks(run_task, tasks(seeds, cases, dtypes, bench_seeds), workers=workers,
                     scheduler=scheduler, desc="calibrate --wild")


SEEDS = 9  # about 3,000 checks over the four formats


def main(args, on_cluster) -> int:
    """The --wild run of ``python -m checks calibrate``: the table, the summary, and with
    --write-docs the section "wild" of docs/tolerances.md.  Exit status 1 on a false alarm."""
    from checks.docs import DOCS, write_section
    dtypes = tuple(args.dtype or ALL)
    results = on_cluster(args, calibrate_wild, args.seeds or SEEDS, dtypes=dtypes,
                         bench_seeds=args.large_seeds)
    table, line = confusion(results), summary(results)
    print(table + "\n\n" + line)
    if args.write_docs:
        path = DOCS / "tolerances.md"
        write_section(path, "wild", "\n".join(
            ["```", "$ python -m checks " + args.command_line, table, "", line, "```"]))
        print(f"wrote the table into {path}")
    c = collections.Counter(outcome for _, outcome in results)
    return 1 if c["FAIL hand"] or c["FAIL oracle"] or c["FAIL other"] else 0
