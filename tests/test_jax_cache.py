"""The persistent compilation cache: where it lives, how it is turned off, and that a second
process loads the check's programs instead of compiling them."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from checks import jax_cache


def test_the_folder_follows_the_environment():
    assert jax_cache.folder({jax_cache.ENV: "/some/where"}) == pathlib.Path("/some/where")
    assert jax_cache.folder({jax_cache.ENV: "off"}) is None
    assert jax_cache.folder({jax_cache.ENV: ""}) is None
    assert jax_cache.folder({"XDG_CACHE_HOME": "/xdg"}) == pathlib.Path("/xdg/gradlab/jax")
    assert jax_cache.folder({}) == pathlib.Path.home() / ".cache" / "gradlab" / "jax"


# one check of a registry row in a fresh process; prints the cache's hits and misses (JAX's
# monitoring events) and the report's verdict
CHILD = """
import json, jax, numpy as np
events = {}
jax.monitoring.register_event_listener(lambda name, **kw: events.__setitem__(name, events.get(name, 0) + 1))
import checks
from checks.registry import BY_NAME, run_row
report = run_row(BY_NAME["mha"], np.float64)
print(json.dumps({"ok": report.ok, "dir": jax.config.jax_compilation_cache_dir,
                  "hits": events.get("/jax/compilation_cache/cache_hits", 0),
                  "requests": events.get("/jax/compilation_cache/compile_requests_use_cache", 0),
                  "misses": events.get("/jax/compilation_cache/cache_misses", 0)}))
"""


@pytest.mark.slow
def test_a_second_process_loads_the_checks_programs_from_the_cache(tmp_path):
    env = {**os.environ, jax_cache.ENV: str(tmp_path / "jax")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    runs = [json.loads(subprocess.run([sys.executable, "-c", CHILD], env=env, check=True,
                                      capture_output=True, text=True).stdout.splitlines()[-1])
            for _ in range(2)]
    written = sorted((tmp_path / "jax").glob("*-cache"))
    assert all(run["ok"] and run["dir"] == str(tmp_path / "jax") for run in runs)
    assert written, "the first process wrote the programs that took long to compile"
    assert runs[0]["hits"] == 0
    # every program the check compiles comes from the cache but the oracle's own vjp, which
    # compiles in about MIN_COMPILE_SECONDS and may or may not have been written (on a loaded
    # machine the first process wrote it and the second still compiled it: 3 hits of 4
    # written), so every written program but that one is read back, and none is written again;
    # an input moved with jnp.asarray instead of jax.device_put compiles a small program per
    # shape (a dozen in this check, tens of milliseconds each, below the threshold, never cached)
    assert runs[1]["hits"] >= max(1, len(written) - 1), (runs[1], len(written))
    assert sorted((tmp_path / "jax").glob("*-cache")) == written
    assert runs[1]["requests"] - runs[1]["hits"] <= 1, runs[1]


@pytest.mark.slow
def test_off_writes_nothing(tmp_path):
    env = {**os.environ, jax_cache.ENV: "off", "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    run = json.loads(subprocess.run([sys.executable, "-c", CHILD], env=env, check=True,
                                    capture_output=True, text=True).stdout.splitlines()[-1])
    assert run["ok"] and run["dir"] is None and run["hits"] == 0
    assert not list(tmp_path.rglob("*-cache"))
