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


def _run(env, child=CHILD) -> dict:
    """One check in a fresh process: its printed cache events and verdict."""
    return json.loads(subprocess.run([sys.executable, "-c", child], env=env, check=True,
                                     capture_output=True, text=True).stdout.splitlines()[-1])


@pytest.mark.slow
def test_a_second_process_loads_the_checks_programs_from_the_cache(tmp_path):
    """With the default threshold the programs that took long to compile are written and a second
    process reads them.  Which programs pass the threshold depends on the machine's speed and
    load, so the exact claim (every program the check compiles is written, and the second process
    reads every one of them back, recompiling none) is made with the threshold at 0."""
    env = {**os.environ, jax_cache.ENV: str(tmp_path / "jax")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    runs = [_run(env), _run(env)]
    written = sorted((tmp_path / "jax").glob("*-cache"))
    assert all(run["ok"] and run["dir"] == str(tmp_path / "jax") for run in runs)
    assert written and runs[0]["hits"] == 0 and runs[1]["hits"] >= 1
    assert sorted((tmp_path / "jax").glob("*-cache")) == written       # none written again

    every = tmp_path / "every"
    env[jax_cache.ENV] = str(every)
    child = CHILD.replace("import checks\n", "import checks\n"
                          "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)\n")
    first = _run(env, child)
    written = sorted(every.glob("*-cache"))
    read_before = {p.name: p.read_bytes() for p in every.glob("*-atime")}
    second = _run(env, child)
    assert first["ok"] and second["ok"] and first["hits"] == 0
    assert len(written) == first["requests"]             # every program the check compiles
    assert second["hits"] == second["requests"] == len(written), second   # all read, none compiled
    assert sorted(every.glob("*-cache")) == written
    assert all(p.read_bytes() != read_before[p.name] for p in every.glob("*-atime"))  # each read


@pytest.mark.slow
def test_off_writes_nothing(tmp_path):
    env = {**os.environ, jax_cache.ENV: "off", "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    run = _run(env)
    assert run["ok"] and run["dir"] is None and run["hits"] == 0
    assert not list(tmp_path.rglob("*-cache"))
