"""depth: signals and gradients through stacks of attention + feed-forward blocks.

Stacks of L = 1...24 blocks built from the lab's kernels (mha, ff, rms_norm), in the variants
{pre-norm, post-norm, no norm} x {residual, no residual}, plus pure attention (no norm, no
residual, no feed-forward), over independent trials (weights and inputs).

Activations (Xiong et al. 2020, Lemma 2).  The lemma's band 1 + l/2 <= E|x_l|^2/d <= 1 + 3l/2 for
pre-norm is drawn, not tested: it follows from each sublayer adding a mean square between 1/2
and 3/2, so it holds almost by construction.  The sharper prediction is the feed-forward
sublayer's own increment: its input u is normalised (mean square 1), W1 is independent of it, so
u W1 is N(0, 1) per unit, the leaky ReLU (slope a = 0.1) keeps E[h^2] = (1 + a^2)/2, and W2
(variance 1/F) passes that mean square on, while the cross term x.FF(u) has mean zero: every
feed-forward sublayer adds exactly (1 + a^2)/2 = 0.505 to |x|^2/d.  Post-norm: Xiong et al. speak
of x + F(x) before the norm (the norm's own output is 1 by construction); at a feed-forward
sublayer its mean square is predicted to be 1 + 0.505.

Gradients (Theorem 1).  Pre-norm's last block sees the read-out's gradient through the final norm,
which divides by the root mean square of x_L: its |dW2| is predicted to scale as ms_L^(-1/2),
i.e. the exponent of |dW2| against L is minus half that of the measured ms_L (Theorem 1's
O(1/sqrt(L)) is the limit where ms_L grows linearly).  Post-norm's last block is predicted
independent of L (its final norm fixes the scale: an Identity).  Gradients across layers
(Xiong et al. 2020, Fig. 3): at initialisation a Post-LN block's gradient norm grows with its
layer index and a Pre-LN block's stays about the same; per trial the slope of log |grad_l| (all
of block l's parameters, the deepest stack) against l, tested as inequalities: Post-LN's slope
above 0 and above Pre-LN's (each beyond 3 SE).  Xiong et al.'s other finding, that Post-LN needs
a learning-rate warm-up, is the warmup study's (experiments/warmup.py): the lab's model trained
with norm_position "pre" and "post", with and without warm-up; these stacks are not trained.
Rank collapse (the mean cosine between tokens) is drawn for every variant; its rate is
the rank_collapse study's subject.

Init (stated, as Xiong's lemma assumes Xavier-like weights): every weight N(0, 1/fan_in) -- W_Q,
W_K, W_V (P x P) variance 1/P, W_O 1/D, W1 1/D, W2 1/F -- and zero biases; for the square
matrices this is Xiong's N(0, 1/d).  (The article's std 0.1 is init_scale's subject.)
Input tokens N(0, 1), so |x_0|^2/d = 1.  The read-out is <out, g> with a fixed random g, after a
final RMS norm for the pre-norm stacks (Xiong's Pre-LN has one).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

import kernels
from experiments import common

NAME = "depth"
VARIANTS = [("pre", True), ("post", True), ("none", True), ("pre", False), ("post", False),
            ("none", False), ("attention only", False)]


@dataclasses.dataclass(frozen=True)
class Config:
    width: int = 64               # D, the model width
    heads: int = 4                # H, attention heads
    tokens: int = 16              # T, tokens per sequence
    batch: int = 2                # sequences per trial
    max_depth: int = 24           # blocks in the deepest stack
    grad_depths: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24)  # depths L whose last-block gradient is taken
    trials: int = 16              # independent trials (weights and inputs)
    seed: int = 0                 # seed of every draw

    def __post_init__(self):
        common.validate(self, ints={"width": 2, "heads": 1, "tokens": 2, "batch": 1, "max_depth": 1,
                                 "trials": 1, "seed": 0},
                     tuples={"grad_depths": (1, self.max_depth)})
        if self.width % self.heads:
            raise ValueError(f"heads: expected a divisor of width = {self.width}, got {self.heads}")


def label_of(variant):
    norm, res = variant
    if norm == "attention only":
        return "pure attention"
    return f"{'no' if norm == 'none' else norm}-norm, {'residual' if res else 'no residual'}"


def init_block(rng, D, H):
    """One attention + feed-forward block, every weight N(0, 1/fan_in), zero biases."""
    P, F = D // H, 4 * D
    attn = {k: rng.standard_normal((H, P, P)) / math.sqrt(P) for k in ("WQ", "WK", "WV")}  # (H, P, P)
    attn["WO"] = rng.standard_normal((D, D)) / math.sqrt(D)                  # (D, D)
    ff = {"W1": rng.standard_normal((D, F)) / math.sqrt(D), "b1": np.zeros(F),   # (D, F), (F,)
          "W2": rng.standard_normal((F, D)) / math.sqrt(F), "b2": np.zeros(D)}   # (F, D), (D,)
    return [(kernels.mha_forward, kernels.mha_backward, attn),
            (kernels.ff_forward, kernels.ff_backward, ff)]


def sublayer_forward(x, layer, norm, res):
    """One sublayer f in the variant's wiring: pre x + f(N(x)), post N(x + f(x)), none x + f(x);
    without residual the x + is dropped.  Returns the output and what backward needs."""
    forward, _, params = layer
    if norm == "pre":
        u, ncache = kernels.rms_norm_forward(x, {})          # (B, T, D)
        y, fcache = forward(u, params)
        return (x + y if res else y), (ncache, fcache)
    y, fcache = forward(x, params)                           # (B, T, D)
    s = x + y if res else y
    if norm == "post":
        out, ncache = kernels.rms_norm_forward(s, {})        # (B, T, D)
        return out, (ncache, fcache)
    return s, (None, fcache)


def sublayer_backward(dout, layer, cache, norm, res):
    """The hand backward of sublayer_forward: (dx, grads of f's params)."""
    _, backward, _ = layer
    ncache, fcache = cache
    if norm == "pre":
        du, grads = backward(dout, fcache)
        dx, _ = kernels.rms_norm_backward(du, ncache)        # (B, T, D) through N
        return (dx + dout if res else dx), grads
    if norm == "post":
        dout, _ = kernels.rms_norm_backward(dout, ncache)    # (B, T, D) through the outer N
    dx, grads = backward(dout, fcache)
    return (dx + dout if res else dx), grads


def mean_square(x):
    """|x|^2 / d averaged over tokens: (B, T, D) -> float."""
    return float((x * x).mean())


def token_cosine(x):
    """Mean cosine similarity between distinct tokens of each sequence: (B, T, D) -> float."""
    u = x / np.linalg.norm(x, axis=-1, keepdims=True)        # (B, T, D) unit tokens
    g = u @ u.transpose(0, 2, 1)                             # (B, T, T) cosines
    T = x.shape[1]
    return float(((g.sum(axis=(1, 2)) - T) / (T * (T - 1))).mean())


def stack_forward(x, blocks, norm, res, trace=None):
    """x (B, T, D) through every block: the states after each block (L + 1 of them, x first) and
    the caches of every sublayer in order.  trace, a list, receives per feed-forward sublayer
    (|x|^2/d before it, |x + FF|^2/d before any post-norm, |FF|^2/d of its own output)."""
    states, caches = [x], []
    for block in blocks:
        for layer in block:
            before = x
            x, cache = sublayer_forward(x, layer, norm, res)
            caches.append(cache)
            if trace is not None and layer[0] is kernels.ff_forward and res:
                y = layer[0](kernels.rms_norm_forward(before, {})[0] if norm == "pre" else before,
                             layer[2])[0]                          # (B, T, D) FF's own output
                trace.append((mean_square(before), mean_square(before + y), mean_square(y)))
        states.append(x)
    return states, caches


def stack_backward(g, blocks, states, caches, norm, res, L):
    """Backward of the read-out <out, g> of the first L blocks (out = N(x_L) for pre-norm, x_L
    otherwise): the input gradient (B, T, D) and, per block, the list of its sublayers' grads."""
    dx = g
    if norm == "pre":
        _, fcache = kernels.rms_norm_forward(states[L], {})      # the final norm of Xiong's Pre-LN
        dx, _ = kernels.rms_norm_backward(g, fcache)
    per_block = len(blocks[0])
    grads = [[None] * per_block for _ in range(L)]
    for i in reversed(range(L * per_block)):
        b, s = divmod(i, per_block)
        dx, grads[b][s] = sublayer_backward(dx, blocks[b][s], caches[i], norm, res)
    return dx, grads


def make_stack(rng, config, variant):
    """The variant's blocks (max_depth of them) and its wiring (norm, residual)."""
    norm, res = variant
    blocks = [init_block(rng, config.width, config.heads) for _ in range(config.max_depth)]
    if norm == "attention only":
        norm, blocks = "none", [b[:1] for b in blocks]
    return blocks, norm, res


def one_trial(rng, config, variant):
    """Forward the deepest stack once; backward from every depth L in grad_depths, reusing the
    first L layers' caches.  Returns per-layer mean-square and cosine (max_depth + 1,), per-block
    gradient norms of the deepest stack (max_depth,), and the last block's |dW2| per L."""
    blocks, norm, res = make_stack(rng, config, variant)
    x = rng.standard_normal((config.batch, config.tokens, config.width))  # (B, T, D) tokens N(0, 1)
    g = rng.standard_normal(x.shape)                                       # (B, T, D) read-out
    trace = []
    states, caches = stack_forward(x, blocks, norm, res, trace)
    grad_last, grad_layers = {}, None
    for L in sorted(set(config.grad_depths) | {config.max_depth}):
        _, grads = stack_backward(g, blocks, states, caches, norm, res, L)
        top = grads[-1][-1]                                    # the last sublayer's grads
        grad_last[L] = float(np.linalg.norm(top.get("W2", top.get("WO"))))
        if L == config.max_depth:
            grad_layers = np.array([math.sqrt(sum(float((v * v).sum()) for sub in block
                                                  for v in sub.values())) for block in grads])  # (L,)
    return (np.array([mean_square(s) for s in states]),         # (max_depth + 1,)
            np.array([token_cosine(s) for s in states]),        # (max_depth + 1,)
            grad_layers, np.array([grad_last[L] for L in config.grad_depths]),  # (max_depth,), (Ls,)
            np.array(trace).reshape(-1, 3))                         # (FF sublayers, 3)


def xiong_band(l):
    """Xiong et al. 2020, Lemma 2: pre-norm 1 + l/2 <= E|x_l|^2/d <= 1 + 3l/2."""
    l = np.asarray(l, float)
    return 1 + l / 2, 1 + 3 * l / 2


def measure(config):
    """Every variant, averaged over trials: dict variant -> arrays (mean and standard error)."""
    rng = np.random.default_rng(config.seed)
    out = {}
    for variant in common.progress(VARIANTS, desc=NAME):
        runs = [one_trial(rng, config, variant) for _ in range(config.trials)]
        stacked = [np.array(part) for part in zip(*runs)]       # each (trials, ...)
        se = (lambda a: a.std(axis=0, ddof=1) / math.sqrt(len(a))) if config.trials > 1 \
            else (lambda a: np.zeros(a.shape[1:]))
        out[variant] = {k: (a.mean(axis=0), se(a)) for k, a in
                        zip(("ms", "cos", "grad_layers", "grad_last"), stacked[:4])}
        out[variant]["trials"] = {k: a for k, a in zip(("ms", "cos", "grad_layers", "grad_last", "ff"),
                                                       stacked)}       # per trial, for the tests
    return out


FF_INCREMENT = (1 + 0.1 ** 2) / 2  # E[leaky_relu(z)^2], z ~ N(0, 1), slope 0.1


def _slopes(logL, y):
    """Per trial, the least-squares slope of log y against log L: (trials,)."""
    return np.array([common.fit_slope(logL, np.log(row))[0] for row in y])


def _headlines(m, config):
    heads, df = [], config.trials - 1
    pre, post = m[("pre", True)]["trials"], m[("post", True)]["trials"]
    # the increment |x + FF|² − |x|² is |FF|² plus a zero-mean cross term 2 x·FF that only adds
    # noise: the FF output's own mean square estimates the same (1 + a²)/2 several times sharper
    inc = pre["ff"][:, :, 2].mean(axis=1)                                  # (trials,) |FF(u)|²/d
    heads.append(common.test("pre-norm: |FF(x)|²/d, what each feed-forward sublayer adds to |x|²/d",
                             *common.mean_se(inc), FF_INCREMENT, "(1 + a²)/2 for the leaky ReLU, "
                             "a = 0.1 (exact; the cross term x·FF has mean zero); Xiong et al. 2020, "
                             "Lemma 2's mechanism", df=df))
    before = post["ff"][:, :, 1].mean(axis=1)                              # (trials,)
    heads.append(common.test("post-norm: |x + FF(x)|²/d before the norm", *common.mean_se(before),
                             1 + FF_INCREMENT, "1 + (1 + a²)/2 (Xiong et al. 2020 use x + F(x) before "
                             "the norm)", df=df))
    Ls = np.array(config.grad_depths, float)
    deep = Ls >= 4 if (Ls >= 4).sum() >= 2 else Ls > 0                   # the asymptotic end
    if deep.sum() >= 2:
        logL = np.log(Ls[deep])
        grad = _slopes(logL, pre["grad_last"][:, deep])                     # (trials,)
        ms_L = pre["ms"][:, np.array(config.grad_depths)[deep]]            # (trials, Ls) x_L's ms
        predicted = -0.5 * _slopes(logL, ms_L)                              # (trials,)
        # both exponents come from the same trials: the test is on their paired difference
        (g_mean, g_se), (p_mean, p_se) = common.mean_se(grad), common.mean_se(predicted)
        heads.append(common.test(f"pre-norm: exponent of the last block's |dW2| against L "
                                 f"(L = {int(Ls[deep][0])}…{int(Ls[deep][-1])}) minus −½ × that of "
                                 f"ms_L, paired by trial", *common.mean_se(grad - predicted), 0.0,
                                 f"the final norm divides by sqrt(ms_L) (Xiong et al. 2020, Theorem 1: "
                                 f"→ −1/2); exponents {g_mean:.3f} ± {g_se:.2g} and "
                                 f"{p_mean:.3f} ± {p_se:.2g}", df=df))
        heads.extend(_xiong_layers(m, config))
        heads.append(common.test("post-norm: exponent of the last block's |dW2| against L",
                                 *common.mean_se(_slopes(np.log(Ls), post["grad_last"])), 0.0,
                                 "Xiong et al. 2020, Theorem 1 (independent of L); the final norm "
                                 "fixes the scale, so it holds by construction", df=df, kind="identity"))
    return heads


def _xiong_layers(m, config):
    """Xiong et al. 2020, Fig. 3: at initialisation the gradient norm of a Post-LN block grows with
    its layer index, a Pre-LN block's stays about the same.  Per trial, the slope of log |grad_l|
    (every parameter of block l, the deepest stack) against l; the two stacks are independent
    draws, so their SEs combine as such."""
    l = np.arange(1, config.max_depth + 1, dtype=float)
    slope = {v: np.array([common.fit_slope(l, np.log(row))[0] for row in m[v, True]["trials"]["grad_layers"]])
             for v in ("pre", "post")}
    (post, post_se), (pre, pre_se) = common.mean_se(slope["post"]), common.mean_se(slope["pre"])
    heads = [common.bound(f"post-norm: growth of the block gradient norm towards the output, slope of "
                          f"log |grad_l| against l (L = {config.max_depth})", post, common.K_SIGMA * post_se,
                          "Xiong et al. 2020, Fig. 3: Post-LN gradients grow with the layer index",
                          "slope ≥ 3 SE: positive beyond its noise", se=post_se, lower=True),
             common.shown(f"pre-norm: slope of log |grad_l| against l (L = {config.max_depth})", pre, pre_se,
                          "about 0 (Xiong et al. 2020, Fig. 3: about the same at every layer)",
                          "the final norm divides by the growing |x_L|, the identity paths pass it down")]
    diff, diff_se = post - pre, math.hypot(post_se, pre_se)
    heads.append(common.bound("post-norm minus pre-norm slope of log |grad_l| against l", diff,
                              common.K_SIGMA * diff_se, "Xiong et al. 2020, Fig. 3: Post-LN's gradients "
                              "lean towards the output more than Pre-LN's", "difference ≥ 3 SE",
                              se=diff_se, lower=True))
    return heads


def _charts(m, config, figures):
    l = np.arange(config.max_depth + 1)                        # (L+1,)
    lo, hi = xiong_band(l)
    fig, (a1, a2) = common.figure(2, width=5.6)
    for i, v in enumerate(VARIANTS):
        a1.plot(l, m[v]["ms"][0], "o-" if v[1] else "s:", color=f"C{i}", ms=3, lw=1, label=label_of(v))
    a1.fill_between(l, lo, hi, color="C0", alpha=0.15, label="Xiong Lemma 2 band (pre-norm)")
    a1.axhline(1, color="C1", ls="--", lw=1, label="post-norm theory: 1")
    common.label(a1, "activation mean-square through depth", "layer l",
              "|x_l|²/d (input units²)", logy=True)
    for i, v in enumerate(VARIANTS[:2]):  # no-norm residual (geometric) is on the log panel
        mean, se = m[v]["ms"]
        a2.errorbar(l, mean, yerr=3 * se, fmt="o-", color=f"C{i}", ms=3, capsize=2, lw=1,
                    label=label_of(v))
    a2.fill_between(l, lo, hi, color="C0", alpha=0.15, label="1 + l/2 … 1 + 3l/2")
    a2.set_ylim(0.5, 2 * hi[-1])
    common.label(a2, "pre- and post-norm residual, linear scale (±3 SE)", "layer l", "|x_l|²/d (input units²)")
    common.save(fig, NAME, "activations.png",
                "Mean-square activation per layer: pre-norm grows linearly inside Xiong's band (drawn "
                "for reference: it holds by construction), post-norm's output is pinned at 1 by its "
                "norm, no-norm residual stacks grow geometrically and no-residual stacks without norm "
                "shrink geometrically.", figures)

    fig, (b1, b2) = common.figure(2, width=5.6)
    Ls = np.array(config.grad_depths, float)
    for i, v in enumerate(VARIANTS):
        if v[0] in ("none", "attention only"):
            continue  # geometric growth or decay: off the scale of the normalised stacks
        mean, _ = m[v]["grad_layers"]
        b1.semilogy(np.arange(1, config.max_depth + 1), mean, "o-" if v[1] else "s:",
                    color=f"C{i}", ms=3, lw=1, label=label_of(v))
        b2.loglog(Ls, m[v]["grad_last"][0], "o-" if v[1] else "s:", color=f"C{i}", ms=4, lw=1,
                  label=label_of(v))
    pre = m[("pre", True)]["grad_last"][0]
    b2.loglog(Ls, pre[0] * np.sqrt(Ls[0] / Ls), "k--", lw=1, label="∝ 1/sqrt(L) (Theorem 1)")
    common.label(b1, f"gradient norm per block, stack of L = {config.max_depth}", "block l",
              "‖∂loss/∂θ_l‖ (loss units)")
    common.label(b2, "last block's |∂loss/∂W2| vs depth", "stack depth L", "‖∂loss/∂W2‖_F (loss units)")
    blocks = {v: m[v]["grad_layers"][0] for v in (("pre", True), ("post", True))}
    fall = {v: b[0] / b[-1] for v, b in blocks.items()}
    common.save(fig, NAME, "gradients.png",
                "Gradient norms from the hand backward with a random read-out (read-out units). Left: "
                f"per block of the deepest stack; the first block's gradient is {fall['pre', True]:.2g}× "
                f"the last block's in pre-norm and {fall['post', True]:.2g}× in post-norm. Right: the "
                "last block's |dW2| against the stack depth: pre-norm's falls, close to 1/sqrt(L) "
                "(Theorem 1), post-norm's is flat. The no-norm stacks (off this scale, growing or "
                "decaying geometrically) are in data.csv.", figures)

    fig, (c1,) = common.figure(1, width=6.4)
    for i, v in enumerate(VARIANTS):
        c1.plot(l, m[v]["cos"][0], "o-" if v[1] else "s:", color=f"C{i}", ms=3, lw=1,
                label=label_of(v))
    c1.axhline(1, color="k", ls="--", lw=1, label="rank one (all tokens parallel)")
    c1.set_ylim(-0.05, 1.05)
    common.label(c1, "rank collapse: mean cosine between tokens", "layer l", "mean token cosine (unitless)")
    merged = [label_of(v) for v in VARIANTS if v[1] and m[v]["cos"][0][-1] > 0.99]
    apart = [label_of(v) for v in VARIANTS if v[1] and m[v]["cos"][0][-1] <= 0.99]
    common.save(fig, NAME, "rank_collapse.png",
                "Mean pairwise cosine between the tokens of a sequence: without residuals the tokens "
                "become parallel within a few layers (Dong et al. 2021). With residuals, after "
                f"{config.max_depth} layers: " + (f"{', '.join(merged)} reach a cosine above 0.99; "
                                                  if merged else "") +
                (f"{', '.join(apart)} stay below it." if apart else "none stays below 0.99."),
                figures)


def _rows(m, config):
    rows = []
    for v in VARIANTS:
        rows += [{"variant": label_of(v), "layer": l, "mean_square": m[v]["ms"][0][l],
                  "mean_square_se": m[v]["ms"][1][l], "token_cosine": m[v]["cos"][0][l],
                  "grad_norm_block_in_deepest": m[v]["grad_layers"][0][l - 1] if l else ""}
                 for l in range(config.max_depth + 1)]
        rows += [{"variant": label_of(v), "stack_depth": L, "last_block_grad_W2": g}
                 for L, g in zip(config.grad_depths, m[v]["grad_last"][0])]
    return rows


def _tables(m, config):
    l = np.arange(config.max_depth + 1)
    lo, hi = xiong_band(l)
    rows = [{"l": int(i), "pre-norm |x_l|²/d": f"{m[('pre', True)]['ms'][0][i]:.4g} ± {m[('pre', True)]['ms'][1][i]:.2g}",
             "Lemma 2 band": f"[{lo[i]:g}, {hi[i]:g}]",
             "token cosine ± SE, pre / post / no norm (residual)": " / ".join(
                 f"{m[(n, True)]['cos'][0][i]:.3f} ± {m[(n, True)]['cos'][1][i]:.1g}" for n in ("pre", "post", "none"))}
            for i in l if i in (0, 1, 2, 4, 8, 12, 16, 24) or i == config.max_depth]
    grads = [{"L": L, "pre-norm last |dW2|": f"{m[('pre', True)]['grad_last'][0][j]:.4g} ± {m[('pre', True)]['grad_last'][1][j]:.2g}",
              "post-norm last |dW2|": f"{m[('post', True)]['grad_last'][0][j]:.4g} ± {m[('post', True)]['grad_last'][1][j]:.2g}"}
             for j, L in enumerate(config.grad_depths)]
    return [(f"per layer ({config.trials} trials, ± SE)", rows), ("last block's gradient per depth", grads)]


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, _headlines, _charts, _rows, tables=_tables,
                       meta=lambda m: {"init": "every weight N(0, 1/fan_in), biases 0"})
