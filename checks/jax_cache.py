"""JAX's persistent compilation cache: compiled oracle programs kept in a user cache folder, so a
second process (the suite, ``python -m checks``, a calibration) loads them instead of compiling.

Folder: ``$GRADLAB_JAX_CACHE`` when set (``off`` or an empty value turns the cache off), else
``$XDG_CACHE_HOME/gradlab/jax`` (``~/.cache/gradlab/jax``).  A folder already chosen through JAX's
own setting (``JAX_COMPILATION_CACHE_DIR``) is left as it is.  Only programs that took at least
MIN_COMPILE_SECONDS to compile are written: reading a file costs about as much as compiling a
tiny program again.  With the ``filelock`` package installed the cache is bounded (MAX_BYTES,
least recently used entries go first) and JAX locks the folder around reads and writes, so
parallel test workers never read a half-written entry; without it the folder grows without a
bound and an entry read while another process writes it fails its checksum: JAX warns and
compiles the program again.

Only the XLA compilation is saved here: tracing and lowering still run in every process (except
for the rounding model's programs, whose traces ``checks.program_cache`` keeps beside), and a
program under the threshold compiles again in each: a check therefore moves its arrays with
``jax.device_put`` (a transfer), never ``jnp.asarray`` (a small program per shape and dtype:
thirteen in the first call of the registry's attention check, tens of milliseconds each), and
skips programs whose result it already knows (no kink moves when nothing flips,
``checks.rounding``).
"""
from __future__ import annotations

import os
import pathlib

ENV = "GRADLAB_JAX_CACHE"
# the check's vjp and rounding programs take 0.3-2 s to compile, two smaller ones of the
# registry's attention check 0.05-0.1 s (kept since the threshold came down from 0.1 s: its first
# call in a second process went from about 0.57 s to 0.46 s on the quiet 2-core machine; 0 kept
# no more files than 0.02); its small ones < 0.02 s
MIN_COMPILE_SECONDS = 0.02
MAX_BYTES = 512 * 2 ** 20  # entries of the registry's checks are 10-100 kB each


def folder(environ=None) -> pathlib.Path | None:
    """The cache folder the environment asks for, or None when the cache is off."""
    environ = os.environ if environ is None else environ
    if ENV in environ:
        value = environ[ENV].strip()
        return None if value.lower() in ("", "off") else pathlib.Path(value).expanduser()
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "gradlab" / "jax"


def programs_folder() -> pathlib.Path | None:
    """The folder of traced programs (``checks.program_cache``): inside the compilation cache's
    folder (whose bound counts JAX's own files only), and off when it is off."""
    import jax
    base = jax.config.jax_compilation_cache_dir
    return pathlib.Path(base) / "programs" if base else None


def enable(environ=None) -> pathlib.Path | None:
    """Switch the persistent cache on (once, where the checks start); the folder in use, or None
    when it is off or cannot be created."""
    import jax
    if jax.config.jax_compilation_cache_dir:  # the user chose one through JAX itself
        return pathlib.Path(jax.config.jax_compilation_cache_dir)
    path = folder(environ)
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable home: compile as before
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    try:
        import filelock  # noqa: F401  (JAX's bounded cache locks the folder with it)
    except ImportError:
        return path
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return path
