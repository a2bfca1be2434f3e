"""The comparison engine, the registry pairing kernels with oracles, and the check table.

``jax_enable_x64`` is switched on here, once, where the checks start: the oracle runs in float64.
"""
import jax

jax.config.update("jax_enable_x64", True)
from checks import jax_cache; jax_cache.enable()  # noqa: E402,E702  compiled programs persist

from checks.engine import Report, TensorResult, check_layer, format_table  # noqa: E402
from checks.assertions import assert_layer  # noqa: E402
from checks.bisection import Bisection, Stage, Tape, bisect, bisect_model  # noqa: E402

__all__ = ["Bisection", "Report", "Stage", "Tape", "TensorResult", "assert_layer", "bisect",
           "bisect_model", "check_layer", "format_table"]
