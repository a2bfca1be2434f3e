"""The benchmark's plumbing (its numbers are ratios measured by `make bench`, never asserted)."""
import pytest

from experiments import bench, timing


def test_compare_measures_every_candidate_round_robin():
    calls = []
    medians = timing.compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                             repeats=3, warmup=1)
    assert set(medians) == {"a", "b"} and all(m >= 0 for m in medians.values())
    assert calls == ["a", "b"] + ["a", "b"] * 3  # warm-up, then interleaved repeats


@pytest.mark.parametrize("field, value, message", [
    ("sizes", ("huge",), "sizes: expected names"), ("backend", "tpu", "backend: expected"),
    ("repeats", 0, "repeats: expected"), ("dtype", "float16", "dtype: expected")])
def test_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        bench.Config(**{field: value})
