"""The generated calibration and sensitivity tables in docs/ are not only parsed: a cheap slice
of each is recomputed here and compared with what the docs say, within a stated band, so a
change to the tolerance model that leaves them stale fails here (rewrite them with their
commands; `python -m checks docs --layer NAME` for one row)."""
import pytest

from checks import docs
from checks.calibrate import calibrate_one, shape_pool
from checks.registry import BY_NAME
from checks.sensitivity import sensitivity

# the slice recomputed: one analytic row and one with a reduction, both dtypes of the main page
ROWS = ("linear", "softmax")
DTYPES = ("float64", "float32")
# A rerun's worst fraction of tolerance over 3 of the documented 200 seeds is at most the
# documented worst on the machine that wrote it; elsewhere the rounding noise over its own
# Monte Carlo estimate moves by a small factor (SAMPLES = 64: the spread's relative SE is about
# 1/sqrt(128) = 9 %), so 2x the documented worst is the band.
WORST_BAND = 2.0
# The smallest error caught is the bisection's threshold against that same spread, to 1/240 of
# a decade: within a factor of 2 of the documented one (about 4 SE of the spread estimate).
SENSITIVITY_BAND = 2.0


def _cells(section: str, page: str = "tolerances.md"):
    """{(row, dtype, first other cell...): [cells]} of every pipe-table line in a section."""
    out = {}
    for line in docs.section(docs.DOCS / page, section).splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and cells[0] in ROWS and cells[1] in DTYPES:
            out.setdefault((cells[0], cells[1]), []).append(cells)
    return out


@pytest.mark.parametrize("row", ROWS)
def test_a_calibration_slice_reruns_within_the_documented_margin(row):
    documented = _cells("calibration")
    pool = shape_pool(0)[:3]
    for dtype in DTYPES:
        cells = documented[(row, dtype)][0]          # the random-shapes table comes first
        checks, alarms, worst = int(cells[2]), int(cells[3]), float(cells[-1])
        assert checks >= 200 and alarms == 0
        margin = calibrate_one(row, dtype, 3, pool)
        assert margin.false_alarms == 0
        assert margin.worst <= WORST_BAND * worst, (
            f"{row} {dtype}: a 3-seed rerun reaches {margin.worst:.3f} of the tolerance, the docs "
            f"say the worst of {checks} is {worst:.3f}: the table is stale")


def test_a_sensitivity_slice_reruns_within_the_documented_thresholds():
    documented = {(c[0], c[1], c[3]): c for cs in _cells("sensitivity").values() for c in cs
                  if c[2] == "registry"}
    for s in sensitivity([BY_NAME["linear"]], list(DTYPES), progress=False):
        cells = documented[(s.layer, s.dtype, s.pattern)]
        doc_eps = float(cells[4])
        ratio = s.eps / doc_eps
        assert 1 / SENSITIVITY_BAND <= ratio <= SENSITIVITY_BAND, (
            f"{s.layer} {s.dtype} {s.pattern}: the smallest error caught is {s.eps:.1e} now, "
            f"{doc_eps:.1e} in the docs: the table is stale")
        assert s.where.split()[0] == cells[7].split()[0]      # the same hardest tensor
