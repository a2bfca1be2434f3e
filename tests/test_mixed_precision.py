"""Mixed-precision training: the loss-scale state machine, static scaling against unscaled
gradients, float32 master weights around a half-precision forward, pure half precision (resume:
tests/test_train.py), and (slow) the article's run in bfloat16 and float16 against float32."""
import dataclasses

import numpy as np
import pytest

from experiments import tasks, train
from kernels import loss_scale as L
from kernels import model as M

TINY = train.Config(task="sort", max_tokens=4, batches=6, batch=8, d_model=12, heads=2,
                    ff_mult=2, epochs=3, steps=4, warmup=2, dtype="bfloat16")
DYNAMIC = L.LossScalePolicy("dynamic", init=2.0 ** 10, growth_interval=3, max_scale=2.0 ** 12)


def test_overflow_halves_the_scale_and_skips_the_step():
    state = L.LossScaleState(2.0 ** 10, good=2, skipped=0)
    state, apply = L.update(state, False, DYNAMIC)
    assert not apply and state == L.LossScaleState(2.0 ** 9, 0, 1)
    state, apply = L.update(state, False, DYNAMIC)
    assert not apply and state == L.LossScaleState(2.0 ** 8, 0, 2)


def test_growth_after_n_good_steps_up_to_the_cap():
    state, applied = L.init_state(DYNAMIC), []
    for _ in range(9):
        state, apply = L.update(state, True, DYNAMIC)
        applied.append(apply)
    assert all(applied) and state.skipped == 0
    assert state.scale == 2.0 ** 12                 # doubled at steps 3 and 6, capped at step 9
    state, _ = L.update(L.LossScaleState(2.0 ** 10, 1, 0), True, DYNAMIC)
    assert state == L.LossScaleState(2.0 ** 10, 2, 0)  # one short of the interval: unchanged


@pytest.mark.parametrize("kind", ["none", "static"])
def test_none_and_static_never_skip_nor_change(kind):
    policy = DYNAMIC._replace(kind=kind)
    state = L.init_state(policy)
    assert state.scale == (1.0 if kind == "none" else 2.0 ** 10)
    for finite in (False, True, True, True):
        new, apply = L.update(state, finite, policy)
        assert apply and new == state


def test_largest_scale_and_policy_checks():
    assert L.largest_scale(np.float16) == 2.0 ** 15            # 65504 < 2^16
    assert L.largest_scale("bfloat16") == L.largest_scale(np.float32) == 2.0 ** 127
    with pytest.raises(ValueError, match="loss_scale: expected one of none, static, dynamic"):
        L.check_policy(DYNAMIC._replace(kind="auto"))
    with pytest.raises(ValueError, match="loss_scale_init: expected at most 4096"):
        L.check_policy(DYNAMIC._replace(init=2.0 ** 13))
    with pytest.raises(ValueError, match="loss_scale_growth_interval: expected a positive"):
        L.check_policy(DYNAMIC._replace(growth_interval=0))


def _gradients(dtype, scale):
    """The tiny model's gradients with the loss's upstream gradient S, in float32, divided by S."""
    config = TINY.model_config()
    data = tasks.make_dataset("sort", batches=1, batch=8, T=4, seed=0)
    params = train.as_format(M.init_params(config, seed=0), dtype)
    _, cache = M.model_forward(data[0, 0], data[0, 1], params,
                               embedding=M.embedding_table(config))
    _, grads = M.model_backward(np.dtype(dtype).type(scale), cache)
    return L.unscale(grads, scale, np.float32)


def test_static_scaling_recovers_the_unscaled_gradient():
    """bfloat16 (float32's range: nothing underflows here): bit-identical, because a power of
    two commutes with every rounding.  float16: the same roundings except where the unscaled
    backward falls below 2^-14, where float16 keeps only an absolute spacing of 2^-24; so the
    two agree within 2^-9 of the tensor's largest entry (float16's own gradients are 3e-4 to
    2e-2 from float32's, relative) plus 2^-24 (measured: about half of 2^-24 on the tensors
    that lie below 2^-14, at most 0.31 x 2^-9 of the largest entry elsewhere).  On those
    tensors, the encoder's WQ and WK, the scaled gradient is the closer one to float32's: what
    the scaling is for."""
    scaled, plain = _gradients("bfloat16", 2.0 ** 12), _gradients("bfloat16", 1.0)
    assert all(np.array_equal(scaled[k], plain[k]) for k in plain)
    scaled, plain = _gradients("float16", 2.0 ** 10), _gradients("float16", 1.0)
    exact = _gradients("float32", 1.0)
    for key in plain:
        tol = 2.0 ** -9 * np.abs(plain[key]).max() + 2.0 ** -24
        assert np.abs(scaled[key] - plain[key]).max() <= tol, key
    error = lambda g, keys: sum(np.abs(g[k] - exact[k]).sum() for k in keys)  # noqa: E731
    tiny = [k for k in exact if np.abs(exact[k]).max() < 2.0 ** -14]
    assert tiny and error(scaled, tiny) < error(plain, tiny)


def test_master_weights_stay_float32_and_the_forward_runs_in_the_half_format(tmp_path,
                                                                            monkeypatch):
    seen = set()

    def recording_watch(step):
        def watch(layer, direction, value):
            seen.add((direction, str(np.asarray(value).dtype)))
        return watch
    monkeypatch.setattr(train, "finite_watch", recording_watch)  # debug mode's watch
    for dtype in ("bfloat16", "float16"):
        seen.clear()
        fit = train.fit(dataclasses.replace(TINY, dtype=dtype, debug=True), tmp_path / "m.npz")
        assert {p.dtype for p in fit.params.values()} == {np.dtype(np.float32)}
        assert {m.dtype for m in (*fit.adam.m.values(), *fit.adam.v.values())} == \
            {np.dtype(np.float32)}
        assert seen == {("forward", dtype), ("backward", dtype)}
        assert fit.history[-1]["train_loss"] < fit.history[0]["train_loss"]  # it learns
        assert fit.scale.scale == (2.0 ** 15 if dtype == "float16" else 1.0)


def test_pure_half_precision_keeps_parameters_and_adam_in_the_format(tmp_path):
    fit = train.fit(dataclasses.replace(TINY, master_weights=False), tmp_path / "p.npz")
    arrays = (*fit.params.values(), *fit.adam.m.values(), *fit.adam.v.values())
    assert {a.dtype for a in arrays} == {np.dtype("bfloat16")}
    unchanged = [s["unchanged"] for s in fit.steps]
    assert all(0 <= u <= 1 for u in unchanged) and max(unchanged) > 0  # updates rounded away


def test_dynamic_scale_skips_overflowing_steps_then_trains(tmp_path):
    """float16 with large initial weights (std 2: the backward amplifies): at S = 2^15 the first
    step's scaled gradients overflow 65504, the step is skipped, S halves, and the run learns."""
    config = dataclasses.replace(TINY, dtype="float16", loss_scale="dynamic", init_std=2.0,
                                 epochs=4)
    fit = train.fit(config, tmp_path / "d.npz")
    skipped = [s["skipped"] for s in fit.steps]
    assert skipped[0] == 1 and fit.scale.skipped == sum(skipped) < len(skipped)
    assert fit.scale.scale == 2.0 ** 15 / 2 ** fit.scale.skipped   # halved once per skip
    assert [s["scale"] for s in fit.steps][:2] == [2.0 ** 15, 2.0 ** 14]
    assert np.isnan(fit.steps[0]["unchanged"])                   # no update to measure
    assert fit.history[-1]["train_loss"] < fit.history[0]["train_loss"]


@pytest.mark.parametrize("change, match", [
    ({"dtype": "float8"}, "dtype: expected one of float64, float32, float16, bfloat16"),
    ({"loss_scale": "auto2"}, "loss_scale: expected one of auto, none, static, dynamic"),
    ({"dtype": "float16", "loss_scale_init": 65536.0}, "loss_scale_init: expected at most 32768"),
    ({"loss_scale_init": -1.0}, "loss_scale_init: expected a positive finite number"),
    ({"loss_scale_growth_interval": 0}, "loss_scale_growth_interval: expected a positive"),
])
def test_config_validation_names_the_field(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **change)


def test_auto_loss_scale_is_dynamic_for_float16_only():
    kinds = {d: dataclasses.replace(TINY, dtype=d).loss_scale_policy().kind
             for d in ("float64", "float32", "bfloat16", "float16")}
    assert kinds == {"float64": "none", "float32": "none", "bfloat16": "none",
                     "float16": "dynamic"}


@pytest.mark.slow  # three runs of the article's configuration, about 2 minutes on 2 cores
def test_article_run_in_half_precision_within_twice_the_float32_loss(tmp_path):
    """The goal: bfloat16 mixed precision and float16 with dynamic loss scaling end at a valid
    loss at most twice the float32 run's (same data, seed, initial weights)."""
    ref = train.fit(train.Config(dtype="float32"), tmp_path / "f32.npz")
    limit = 2 * ref.history[-1]["valid_loss"]
    for change in ({"dtype": "bfloat16"}, {"dtype": "float16", "loss_scale": "dynamic"}):
        fit = train.fit(train.Config(**change), tmp_path / "half.npz")
        assert fit.history[-1]["valid_loss"] <= limit, change


def test_what_adams_constants_become_in_each_format():
    """The reasons the docs give for pure half precision, computed: float16 rounds eps = 1e-8
    to 0, bfloat16 rounds beta2 = 0.999 to 1; an update below half the spacing at a weight of
    0.1 (2^-4 <= 0.1 < 2^-3: spacing 2^(-4 - fraction bits)) rounds away."""
    from experiments.mixed_precision import constants_rows
    rows = {r["format"]: r for r in constants_rows()}
    assert rows["float16"]["eps 1e-8"] == 0 and rows["float32"]["eps 1e-8"] > 0
    assert rows["bfloat16"]["beta2 0.999"] == 1 and rows["float16"]["beta2 0.999"] < 1
    assert rows["float16"]["half ulp at 0.1"] == 2.0 ** -15
    assert rows["bfloat16"]["half ulp at 0.1"] == 2.0 ** -12
    assert rows["float16"]["smallest positive"] == 2.0 ** -24


@pytest.mark.slow  # six short runs of the article's model, with validation
def test_mixed_precision_study_tables_and_headlines(tmp_path, monkeypatch):
    from experiments import common, mixed_precision
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    result = mixed_precision.run(mixed_precision.Config(epochs=1, steps=2))
    runs = {r["run"]: r for r in result.rows}
    assert list(runs) == [v.name for v in mixed_precision.VARIANTS]
    assert runs["float32"]["x float32"] == 1 and runs["bfloat16 pure"]["weights, Adam"] == "bfloat16"
    assert runs["float16 pure, dynamic loss scale"]["stopped"].startswith("the loss became non-finite")
    assert runs["float16 pure, dynamic loss scale"]["v = 0, m ≠ 0"] > 0.5   # the division by 0
    assert [h.quantity for h in result.headlines] == [
        f"final valid loss, {name}" for name in mixed_precision.GOALS]
    assert (tmp_path / "mixed_precision" / "loss_and_unchanged.png").exists()
