"""The tasks: exactly as specified, the article's layout and split, seeded, and user-extensible."""
import pathlib
import re

import numpy as np
import pytest

from experiments import tasks


def test_palindrome_as_specified():
    data = tasks.make_dataset("palindrome", batches=4, batch=8, T=16, seed=1)
    assert data.shape == (4, 2, 8, 16) and data.dtype == np.int64
    src, tgt = data[:, 0].reshape(-1, 16), data[:, 1].reshape(-1, 16)
    assert (src[:, 0] != 0).all()                                  # first digit non-zero
    assert np.array_equal(src[:, :8], src[:, 8:])                  # the number written twice
    assert np.array_equal(tgt[:, :8], src[:, :8])                  # target: the number ...
    assert np.array_equal(tgt[:, 8:], src[:, 7::-1])               # ... then its reverse
    article = np.array([[1, 2, 3, 4, 5, 6, 7, 8] * 2])
    assert tasks.get("palindrome").target(article).tolist() == [[1, 2, 3, 4, 5, 6, 7, 8,
                                                                  8, 7, 6, 5, 4, 3, 2, 1]]


def test_pointer_index_as_specified():
    example = np.array([[5, 5, 5, 5, 5, 0, 9, 9, 9, 1, 9, 9, 5, 9, 9, 6]])   # the article's example
    assert tasks.get("pointer_index").target(example).tolist() == [
        [0, 0, 0, 0, 0, 5, 1, 1, 1, 5, 1, 1, 0, 1, 1, 9]]
    data = tasks.make_dataset("pointer_index", batches=2, batch=16, T=12, seed=0)
    src, tgt = data[:, 0].reshape(-1, 12), data[:, 1].reshape(-1, 12)
    rows, cols = np.indices(src.shape)
    assert np.array_equal(tgt, src[rows, src])
    assert set(np.unique(src)) == set(range(10))                   # uniform digits: all appear


def test_split_is_the_articles_and_seeded():
    data = tasks.make_dataset("sort", batches=256, batch=2, T=4, seed=0)
    train, valid = tasks.split(data, seed=5)
    assert (len(train), len(valid)) == (171, 85)
    again = tasks.split(data, seed=5)
    assert np.array_equal(train, again[0]) and np.array_equal(valid, again[1])
    other = tasks.split(data, seed=6)
    assert not np.array_equal(valid, other[1])
    seen = {b.tobytes() for b in np.concatenate([train, valid])}
    assert len(seen) == 256                                        # disjoint, nothing lost
    assert np.array_equal(tasks.make_dataset("sort", batches=3, batch=2, T=4, seed=9),
                          tasks.make_dataset("sort", batches=3, batch=2, T=4, seed=9))


@pytest.mark.parametrize("name, T, match", [("pointer_index", 9, "at least 10 tokens"),
                                            ("palindrome", 15, "even length"),
                                            ("nope", 4, "task: expected one of")])
def test_bad_task_settings_name_the_argument(name, T, match):
    with pytest.raises(ValueError, match=match):
        tasks.make_dataset(name, batches=1, batch=1, T=T)


def test_the_documented_way_to_add_a_task_works():
    """docs/tasks.md's example, run as written: it registers a task the trainer can use."""
    text = (pathlib.Path(__file__).parents[1] / "docs" / "tasks.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    try:
        exec(compile(block, "docs/tasks.md", "exec"), {})
        data = tasks.make_dataset("reverse", batches=2, batch=3, T=6)
        assert np.array_equal(data[:, 1], data[:, 0, :, ::-1])
    finally:
        tasks.TASKS.pop("reverse", None)


def test_the_labs_own_task_sorts():
    data = tasks.make_dataset("sort", batches=1, batch=50, T=8, seed=3)
    assert np.array_equal(data[0, 1], np.sort(data[0, 0], axis=1))
    assert not np.array_equal(data[0, 1], data[0, 0])
