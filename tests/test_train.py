"""Training: Adam against JAX, the schedules, determinism, checkpoints, resume, debug mode,
config validation.  Tiny models and a few steps: the article's run is a command, not a test."""
import dataclasses
import io
import pathlib
import zipfile

import jax.numpy as jnp
import numpy as np
import pytest

from experiments import checkpoint, train
from experiments.__main__ import main
from kernels import model as M
from kernels.optim import adam_init, adam_step, article_rate, intended_rate

TINY = train.Config(task="sort", max_tokens=4, batches=6, batch=8, d_model=12, heads=2,
                    ff_mult=2, epochs=3, steps=4, warmup=2, dropout=0.1)


def jax_adam(p, g, m, v, t, rate, b1=0.9, b2=0.999, eps=1e-8):
    """The same step written independently in jax.numpy."""
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * jnp.square(g)
    m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
    return p - rate * m_hat / (jnp.sqrt(v_hat) + eps), m, v


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-15), (np.float32, 1e-6)])
def test_adam_step_matches_jax(dtype, tol):
    """Two steps from zero moments, then one with a bias-correction step chosen by the caller.
    tol: a few roundings of the update's own dtype relative to the parameter (u64 1e-16, u32 6e-8
    times the ~10 operations of one step)."""
    rng = np.random.default_rng(0)
    params = {"W": rng.standard_normal((3, 4)).astype(dtype), "b": rng.standard_normal(4).astype(dtype)}
    state = adam_init(params)
    ref = {k: (jnp.asarray(p, jnp.float64), jnp.zeros(p.shape), jnp.zeros(p.shape)) for k, p in params.items()}
    for step, t in ((1, None), (2, None), (3, 1)):      # t=1 on the third: the article's restart
        grads = {k: rng.standard_normal(p.shape).astype(dtype) for k, p in params.items()}
        params, state = adam_step(params, grads, state, 1e-2, t=t)
        ref = {k: jax_adam(*ref[k][:1], jnp.asarray(grads[k], jnp.float64), *ref[k][1:],
                           step if t is None else t, 1e-2) for k in ref}
        assert state.t == step
        for k in params:
            assert params[k].dtype == dtype
            err = np.max(np.abs(params[k] - np.asarray(ref[k][0]))) / np.max(np.abs(np.asarray(ref[k][0])))
            assert err < tol, (step, k, err)


def test_intended_schedule_warms_up_decays_and_stays_positive():
    total, start, finish, warmup = 640, 1e-2, 1e-5, 128
    rates = np.array([intended_rate(s, total, start, finish, warmup) for s in range(total + 50)])
    assert rates[0] == pytest.approx(start / warmup) and rates[warmup - 1] == pytest.approx(start)
    assert np.all(np.diff(rates[:warmup]) > 0) and np.all(np.diff(rates[warmup:]) <= 0)
    assert rates[total - 1] == pytest.approx(finish) and rates.min() >= finish


def test_article_schedule_turns_negative_and_restarts_each_epoch():
    total, start, finish, warmup = 640, 1e-2, 1e-5, 128
    rates = np.array([article_rate(s, total, start, finish, warmup) for s in range(total)])
    zero = np.argmax(rates[warmup:] <= 0) + warmup
    assert warmup < zero < total - 1 and rates[-1] < 0              # zero before the end, then < 0
    config = train.Config(schedule="article")
    per_epoch = [train.rate_and_t(config, e, i) for e in (0, 3) for i in (0, 63)]
    assert per_epoch[0] == per_epoch[2] == (0.0, 1)                 # the counter restarts
    assert per_epoch[1] == per_epoch[3] and per_epoch[1][0] < start  # warm-up never finishes
    intended = train.Config()
    assert train.rate_and_t(intended, 3, 0) == (intended_rate(192, 640, start, finish, warmup), 193)


def params_of(fit):
    return {k: v.copy() for k, v in fit.params.items()}


def test_same_seed_bit_identical_and_training_learns(tmp_path):
    a = train.fit(TINY, tmp_path / "a.npz")
    b = train.fit(TINY, tmp_path / "b.npz")
    c = train.fit(dataclasses.replace(TINY, seed=1), tmp_path / "c.npz")
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    assert a.history == [dict(r, seconds=s["seconds"]) for r, s in zip(b.history, a.history)]
    assert not np.array_equal(a.params["out.W"], c.params["out.W"])
    no_dropout = train.fit(dataclasses.replace(TINY, dropout=0.0), tmp_path / "d.npz")
    assert not np.array_equal(a.params["out.W"], no_dropout.params["out.W"])   # dropout acts
    assert a.history[-1]["train_loss"] < a.history[0]["train_loss"]


@pytest.mark.parametrize("config", [
    TINY,
    dataclasses.replace(TINY, dtype="float16", loss_scale_init=2.0 ** 10,
                        loss_scale_growth_interval=3),           # S doubles across the stop
    dataclasses.replace(TINY, dtype="bfloat16", master_weights=False),  # stored as float32
], ids=["float64", "float16-dynamic", "bfloat16-pure"])
def test_stopped_run_keeps_checkpoint_and_resume_is_bit_identical(tmp_path, config):
    whole = train.fit(config, tmp_path / "whole.npz")
    path = tmp_path / "stopped.npz"

    def stop(epoch, row):
        if epoch == 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        train.fit(config, path, on_epoch=stop)
    saved = checkpoint.load(path)
    assert saved.epoch == 2 and saved.adam.t == 2 * config.steps and len(saved.history) == 2
    resumed = train.fit(dataclasses.replace(config, resume=True), path)
    assert all(np.array_equal(whole.params[k], resumed.params[k]) for k in whole.params)
    assert {p.dtype for p in resumed.params.values()} == {config.formats()[1]}
    assert resumed.scale == whole.scale                    # the loss scale's state resumes too
    assert [r["valid_loss"] for r in resumed.history] == [r["valid_loss"] for r in whole.history]
    with pytest.raises(ValueError, match=r"resume: the checkpoint .* other settings: .*epochs"):
        train.fit(dataclasses.replace(TINY, resume=True, epochs=5, seed=0, steps=4,
                                      task="sort", batch=8, warmup=3), path)


def test_checkpoint_round_trip_and_refusals(tmp_path):
    fit = train.fit(dataclasses.replace(TINY, epochs=1), tmp_path / "ok.npz")
    good = (tmp_path / "ok.npz").read_bytes()
    loaded = checkpoint.load(tmp_path / "ok.npz")
    assert all(np.array_equal(loaded.params[k], fit.params[k]) for k in fit.params)
    assert M.config_of(loaded.params) == TINY.model_config()

    (tmp_path / "cut.npz").write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        checkpoint.load(tmp_path / "cut.npz")

    with np.load(tmp_path / "ok.npz") as npz:                        # change one weight, keep the digest
        arrays = {k: npz[k] for k in npz.files}
    arrays["param/out.b"] = arrays["param/out.b"] + 1e-3
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    (tmp_path / "tampered.npz").write_bytes(buffer.getvalue())
    with pytest.raises(ValueError, match="do not match the SHA-256 digest"):
        checkpoint.load(tmp_path / "tampered.npz")

    arrays["config"] = np.array([{"pickled": True}], dtype=object)   # would need pickle
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    (tmp_path / "pickle.npz").write_bytes(buffer.getvalue())
    with pytest.raises(ValueError, match="not a readable checkpoint.*allow_pickle"):
        checkpoint.load(tmp_path / "pickle.npz")
    with pytest.raises(FileNotFoundError, match="checkpoint: no file"):
        checkpoint.load(tmp_path / "missing.npz")
    assert zipfile.is_zipfile(tmp_path / "ok.npz")


def test_debug_mode_names_layer_direction_and_step(tmp_path):
    params = M.init_params(TINY.model_config(), seed=0, dtype=np.float64)
    params["dec0.ff.W2"][1, 2] = np.inf
    debug = dataclasses.replace(TINY, debug=True)
    with pytest.raises(train.NonFiniteError, match=r"at step 0: layer dec0.ff, forward pass"):
        train.fit(debug, tmp_path / "d.npz", params=params)
    with pytest.raises(train.NonFiniteError, match=r"loss became non-finite at step 0.*--debug"):
        train.fit(TINY, tmp_path / "d.npz", params=params)
    watch = train.finite_watch(7)
    with pytest.raises(train.NonFiniteError, match=r"at step 7: layer enc0.attn, backward pass"):
        watch("enc0.attn", "backward", np.array([1.0, np.nan]))


@pytest.mark.parametrize("change, match", [
    ({"task": "pointer_index", "max_tokens": 8}, "max_tokens: the pointer_index task needs at least 10"),
    ({"d_model": 30}, "d_model: 30 is not divisible by heads = 4"),
    ({"d_model": 8, "heads": 2}, r"d_model: the orthogonal embeddings need V = 12 <= d_model"),
    ({"schedule": "cosine"}, "schedule: expected one of intended, article"),
    ({"dropout": 1.0}, r"dropout: expected a rate in \[0, 1\)"),
    ({"epochs": 0}, "epochs: expected a positive integer"),
])
def test_config_validation_names_the_argument(change, match):
    with pytest.raises(ValueError, match=match):
        train.Config(**change)


def test_cli_rejects_bad_options_in_one_line(capsys):
    assert main(["train", "--task", "pointer_index", "--max-tokens", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: max_tokens:") and "\n" not in err


def test_train_command_writes_its_files_and_generate_reads_the_checkpoint(tmp_path, monkeypatch):
    """The study end to end on a tiny run: files written, answers graded, checkpoint reusable."""
    from experiments import common, generate, registry
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    assert {"train", "generate", "schedule", "pointer", "length"} <= set(registry.BY_NAME)
    result = train.run(TINY)
    out = tmp_path / "train"
    assert {"history.csv", "steps.csv", "loss.png", "answers.txt", "meta.json",
            "checkpoint.npz"} <= {p.name for p in out.iterdir()}
    answers = result.extra["answers"]
    assert len(answers) == 9 and answers[0][0].shape == (4,)
    assert result.headlines[0].predicted == 9 and result.headlines[1].kind == "shown"
    assert (out / "history.csv").read_text().count("\n") == TINY.epochs + 1
    again = generate.run(generate.Config(checkpoint=str(out / "checkpoint.npz"),
                                         requests="1 2 3 4; 4 3 2 1", pad=0))
    tokens = again.extra["tokens"]
    assert tokens.shape[0] == 2 and tokens[0, 0] == 10
    with pytest.raises(ValueError, match="requests: expected digits 0-9"):
        generate.parse_requests("1 2 x")
    with pytest.raises(ValueError, match="requests: expected one or more requests of equal length"):
        generate.parse_requests("1 2; 3")


@pytest.mark.slow  # starts and kills a training process
def test_killed_process_keeps_its_checkpoint_and_resumes_to_the_same_parameters(tmp_path):
    """SIGKILL (no chance to clean up) mid-run: the last checkpoint is whole, and --resume
    ends bit-identical to an uninterrupted run with the same settings."""
    import os
    import signal
    import subprocess
    import sys
    import time
    long = dataclasses.replace(TINY, epochs=150)  # long enough to be killed part-way
    path = tmp_path / "killed.npz"
    options = ["--task", "sort", "--max-tokens", "4", "--batches", "6", "--batch", "8",
               "--d-model", "12", "--heads", "2", "--epochs", "150"]
    options += [f"--{f.replace('_', '-')}={getattr(TINY, f)}" for f in
                ("ff_mult", "steps", "warmup", "dropout", "seed", "start_rate", "dtype")]
    env = {**os.environ, "GRADLAB_QUIET": "1", "GRADLAB_RESULTS": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "experiments", "train", *options,
                             "--checkpoint", str(path)], env=env, cwd=pathlib.Path(__file__).parents[1],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.2)  # let a few more epochs (and checkpoint writes) go by, then kill mid-run
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = checkpoint.load(path)  # whole and readable: writes are atomic
    assert 1 <= saved.epoch < long.epochs
    resumed = train.fit(dataclasses.replace(long, resume=True), path)
    whole = train.fit(long, tmp_path / "whole.npz")
    assert all(np.array_equal(whole.params[k], resumed.params[k]) for k in whole.params)


def test_generate_decodes_a_post_norm_checkpoint_as_post_norm(tmp_path, monkeypatch):
    """A checkpoint records the model's norm position, and generate decodes with it (a tiny
    model's tokens may not tell the two readings apart, so the decoder's calls are recorded)."""
    from experiments import common, generate
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    train.run(dataclasses.replace(TINY, norm_position="post", epochs=1))
    path = tmp_path / "train" / "checkpoint.npz"
    assert checkpoint.load(path).config["norm_position"] == "post"
    positions, decode = [], M.generate

    def recording(*args, norm_position="pre", **kwargs):
        positions.append(norm_position)
        return decode(*args, norm_position=norm_position, **kwargs)

    monkeypatch.setattr(M, "generate", recording)
    generate.run(generate.Config(checkpoint=str(path), requests="1 2 3 4; 4 3 2 1", pad=0))
    generate.run(generate.Config(checkpoint=str(path)))           # the task's nine, graded
    assert positions and set(positions) == {"post"}
