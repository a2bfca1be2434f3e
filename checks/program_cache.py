"""Traced programs kept on disk: the rounding model's programs exported once (``jax.export``) and
read back by the next process, which then neither traces nor lowers them again.

JAX's persistent compilation cache (``checks.jax_cache``) saves only the compilation: a process
still traces and lowers every program before it looks the compiled one up.  The rounding model's
programs are the costly ones to trace, since they interpret the oracle's program equation by
equation with a noise term per operation: 4.4 s of the whole model's 8.4 s check at the registry's
size went to tracing, about 0.5 s of an attention check's first call.  ``jit`` keeps each such
program as a serialized StableHLO module in a folder beside the compilation cache
(``jax_cache.programs_folder``), named by a digest of everything the trace depends on:

- what the caller names the program by (the oracle's jaxpr, its constants' bytes, the function);
- the signature of the call: the pytree of its arguments, every leaf's type and shape, the static
  arguments' values;
- the source of the ``checks`` package (the interpreter and its constants), and JAX's version,
  backend and float64 setting.

Beside each traced program its compiled executable is kept (``jax.experimental.
serialize_executable``), named also by what it was compiled for: the processor (model and
instruction sets), ``XLA_FLAGS`` and the compiler options.  A later process loads it and neither
traces, lowers nor looks up JAX's compilation cache: a self-attention check's first call at the
registry's size in a process that had run it before took 0.52-0.69 s instead of 0.63-0.95 s
(alternating processes, the 2-core machine without AVX-512).  The oracle's values are one of
these programs too (``RoundingModel.exact``: the model's exact run, from its trace of the
oracle), so such a check lowers and compiles nothing: 0.36-0.56 s against 0.51-0.69 s with the
oracle jitted and traced on its own (five alternating processes each, the same machine; then
from a program of its own, ``RoundingModel.oracle_run``, which a check now leaves to later
runs of the oracle, one executable less to load).  The executables a check loaded are noted
under its oracle's name (``read_ahead``), and a later process starts loading them on a thread as
soon as it builds that oracle, beside the oracle's tracing: 0.42 s (0.36-0.45) against 0.46 s
(0.35-0.55), the medians of ten alternating processes each on the same machine; ``python -m
checks`` (every row, float64 and float32) in a later process 11.9-12.1 s against 14.6-15.3 s
(three alternating runs each; 46.8 s from empty caches).  A program that calls a library
through a custom call (LAPACK on the CPU: the process must set the library up first, which
lowering its traced program does) keeps no executable.  An executable JAX read from its own
cache serializes without its compiled functions (a process loading it fails); JAX's cache
serves a program whose traced form has no executable beside it, after any change of this
package (the programs' names change) or of the programs' folder, so such a program is compiled
once more here with JAX's cache set aside (``_compiled_here``) and that executable is kept.
Measured on the 2-core machine with AVX-512 (one cache folder filled by a check of
self-attention, then this package's digest changed; the sequence run twice each way,
alternating, with a throwaway script): the first process after the change took 1.16 and 1.50 s
(it compiles), the later ones 0.15-0.23 s, against 0.84-0.91 s and 0.36-0.47 s when the served
executable was used and not kept; ``python -m checks`` after a line added to this package, in a
clone whose caches one run had filled: 20.0 s in the first process, 4.7 and 5.0 s in the next
two, against 11.8, 7.5 and 8.5 s (one sequence each; a run from empty caches compiled nothing
twice).  An executable that loads but cannot run is deleted, and
its program compiled again from the traced form.

A program that cannot be exported (a host callback) runs as a plain ``jax.jit``; an unreadable
file is exported (or compiled) again.  The folder is bounded (MAX_BYTES, the least recently
used files go first); with the compilation cache off (``GRADLAB_JAX_CACHE=off``) it is off
too, and ``GRADLAB_PROGRAM_CACHE=off`` turns it off alone.  The first process pays for it:
exporting lowers each program once more.  Measured on the 2-core machine, ``python -m checks``
(every row, float64 and float32): 40.7 s from empty caches against 36.7 s without this module,
9.7 s in a later process against 13.2-14.7 s (before executables were kept; with them, on the
slower machine without AVX-512: 56.5 s from empty caches, 15.1 s in a later process, the same
report).  The suite starts cold by design and runs with it off
(``tests/conftest.py``); ``tests/test_program_cache.py`` tests it.
"""
from __future__ import annotations

import collections
import concurrent.futures
import functools
import hashlib
import os
import pathlib
import pickle
import tempfile
import threading

import jax

MAX_BYTES = 256 * 2 ** 20  # the whole model's programs take a few MB, an attention check's 100s kB
SUFFIX = ".jaxexp"       # a traced program (``jax.export``)
EXECUTABLE = ".jaxexe"   # its compiled executable, for this machine
GROUP = ".jaxset"        # the executables a group of programs loaded, in the order it used them


@functools.cache
def _code() -> str:
    """A digest of what a traced program depends on besides its caller's key: this package's
    source, JAX's version, backend and float64 setting."""
    h = hashlib.sha256()
    here = pathlib.Path(__file__).parent
    for path in sorted(here.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(f"{jax.__version__} {jax.default_backend()} x64={jax.config.jax_enable_x64}".encode())
    return h.hexdigest()


ENV = "GRADLAB_PROGRAM_CACHE"  # "off": trace every program in every process (the suite's default)


def _folder() -> pathlib.Path | None:
    from checks import jax_cache
    if os.environ.get(ENV, "").strip().lower() == "off":
        return None
    path = jax_cache.programs_folder()
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path


def fingerprint(*parts) -> str:
    """A digest of parts: strings, bytes or arrays (their dtype, shape and bytes)."""
    import numpy as np
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, str):
            p = p.encode()
        elif not isinstance(p, bytes):
            a = np.asarray(p)
            h.update(f"{a.dtype}{a.shape}".encode())
            p = a.tobytes()
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


SHARED_PROGRAMS = 512  # programs this process keeps by key for a later jit of the same key
_SHARED: collections.OrderedDict = collections.OrderedDict()  # key -> (plain, calls, loaded)


class jit:
    """``jax.jit(fn, static_argnums=..., compiler_options=...)`` whose traced program is kept on
    disk under ``key`` (a string naming everything fn's trace depends on besides its arguments'
    types and this package's code); key None: a plain ``jax.jit``.

    Within a process, a second jit of the same key (another oracle object with the same
    program: a user's oracle written twice, a test's case built again) shares the first one's
    traced and compiled programs, on disk or not: the key promises the same program, so it is
    neither traced nor compiled again (the ``SHARED_PROGRAMS`` most recently made)."""

    def __init__(self, fn, key: str | None, *, static_argnums=(), compiler_options=None,
                 group: str | None = None):
        self.fn, self.key, self.static, self.group = fn, key, tuple(static_argnums), group
        self.options = compiler_options or {}
        name = None if key is None else (key, self.static, repr(sorted(self.options.items())))
        shared = _SHARED.get(name) if name is not None else None
        if shared is None:
            shared = (jax.jit(fn, static_argnums=self.static, compiler_options=self.options),
                      {}, {})
            if name is not None:
                _SHARED[name] = shared
                while len(_SHARED) > SHARED_PROGRAMS:
                    _SHARED.popitem(last=False)
        else:
            _SHARED.move_to_end(name)
        # signature -> the jitted exported program (or self.plain); signature -> the
        # executable's file, for a call read from disk
        self.plain, self.calls, self.loaded = shared

    def __call__(self, *args):
        statics = tuple(args[i] for i in self.static)
        dynamic = [a for i, a in enumerate(args) if i not in self.static]
        leaves, tree = jax.tree_util.tree_flatten(dynamic)
        signature = f"{tree} {[str(jax.typeof(x)) for x in leaves]} {statics!r}"
        call = self.calls.get(signature)
        if call is None:
            call = self.calls[signature] = self._program(signature, dynamic, statics)
        if call is self.plain:
            return self.plain(*args)
        try:
            return call(*dynamic)
        except Exception:
            loaded = self.loaded.pop(signature, None)
            if loaded is None:
                raise
            # an executable read from disk that cannot run here: compiled again, in its place
            loaded.unlink(missing_ok=True)
            call = self.calls[signature] = self._program(signature, dynamic, statics)
            return self.plain(*args) if call is self.plain else call(*dynamic)

    def _program(self, signature, dynamic, statics):
        folder = None if self.key is None else _folder()
        if folder is None:
            return self.plain
        name = fingerprint(_code(), self.key, signature)
        executable = folder / (name + _machine(self.options) + EXECUTABLE)
        ahead = _AHEAD.pop(executable, None)
        compiled = ahead.result() if ahead is not None else _read(executable, _load_executable)
        if compiled is not None:
            self.loaded[signature] = executable
            _note(self.group, executable)
            return compiled
        path = folder / (name + SUFFIX)
        exported = _read(path)
        if exported is None:
            bound = self.fn
            if self.static:  # the static arguments bound by position, the others passed on
                bound = _bind(self.fn, dict(zip(self.static, statics)))
            try:
                exported = jax.export.export(jax.jit(bound))(*dynamic)
            except Exception:  # noqa: BLE001  (a program export cannot hold: a plain jit)
                return self.plain
            _write(path, exported.serialize())
        program = jax.jit(exported.call, compiler_options=self.options)
        hits = _CACHE_HITS[0]
        try:
            lowered = program.lower(*dynamic)
            compiled = lowered.compile()
        except Exception:  # noqa: BLE001  (the call itself says what is wrong)
            return program
        kept = None
        if _keepable(compiled):  # the program's text read once, for both cases below
            # compiled here, or served by JAX's cache (its cache holds the program from before
            # a change of this package, or of the programs' folder): such an executable cannot
            # be kept, so the program is compiled here once, and later processes load that one
            kept = compiled if _CACHE_HITS[0] == hits else _compiled_here(lowered)
        if kept is not None:
            compiled = kept
            _write_executable(executable, kept)
            if executable.exists():
                _note(self.group, executable)
        _prune(folder)
        return compiled


@functools.cache
def _cpu() -> str:
    """What an executable compiled here needs of the processor: its model and instruction sets
    (Linux's /proc/cpuinfo; elsewhere the platform's name for it)."""
    import platform
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _machine(options) -> str:
    """The part of an executable's name a compiled program depends on besides its traced
    program: the processor, XLA's flags, the compiler options and jaxlib (".", then a digest)."""
    import jaxlib
    flags = os.environ.get("XLA_FLAGS", "")
    return "." + fingerprint(_cpu(), flags, repr(sorted(options.items())),
                             getattr(jaxlib, "__version__", ""))[:16]


# programs read from JAX's compilation cache in this process, so far (a read by another thread
# during a compilation only makes that compilation keep nothing: the safe side)
_CACHE_HITS = [0]


def _count_hit(event: str, **_):
    if event == "/jax/compilation_cache/cache_hits":
        _CACHE_HITS[0] += 1


# An executable JAX read from its compilation cache serializes without its compiled functions
# (a later process loading it fails: "Function ... not found"), so only one compiled in this
# process is kept (``jit._program``).
jax.monitoring.register_event_listener(_count_hit)


def _load_executable(data: bytes):
    """A compiled program from ``_write_executable``'s bytes."""
    from jax.experimental.serialize_executable import deserialize_and_load
    return deserialize_and_load(*pickle.loads(data))


def _keepable(compiled) -> bool:
    """Whether a later process can load this compiled program: not if it calls into a library
    through a custom call (LAPACK on the CPU: the process must set that library up first, which
    the traced program's own call does)."""
    try:
        return "custom_call" not in compiled.as_text()
    except Exception:  # noqa: BLE001  (no text to read: not kept)
        return False


def _write_executable(path: pathlib.Path, compiled):
    """Keep a compiled program for a later process (one ``_keepable`` says it can load)."""
    from jax.experimental.serialize_executable import serialize
    try:
        _write(path, pickle.dumps(serialize(compiled)))
    except Exception:  # noqa: BLE001  (not serializable here: the traced program is kept)
        pass


SAME_CODE = {"xla_embed_ir_in_executable": False}  # XLA's default: no debugging copy of the IR
_SET_ASIDE = threading.Lock()  # one compilation at a time with JAX's cache set aside


def _compiled_here(lowered):
    """lowered compiled again with JAX's persistent cache set aside (a real compilation, whose
    executable serializes whole), or None where that fails.  JAX decides once per process
    whether its cache is in use, so the switch is reset on both sides of the compilation
    (``reset_cache``, JAX's public reset); a compilation on another thread meanwhile may miss
    the cache, which costs time and changes no result.  JAX also keeps, in memory, the
    executable of each lowering and set of options: one option is passed at its default value
    (``SAME_CODE``), which makes the compilation a new one and the code the same."""
    from jax.experimental.compilation_cache import compilation_cache
    with _SET_ASIDE:
        was = jax.config.jax_enable_compilation_cache
        hits = _CACHE_HITS[0]
        try:
            jax.config.update("jax_enable_compilation_cache", False)
            compilation_cache.reset_cache()
            compiled = lowered.compile(compiler_options=SAME_CODE)
        except Exception:  # noqa: BLE001  (the executable JAX read is used, and not kept)
            compiled = None
        finally:
            jax.config.update("jax_enable_compilation_cache", was)
            compilation_cache.reset_cache()
    return compiled if _CACHE_HITS[0] == hits else None


def _bind(fn, statics: dict):
    def bound(*dynamic):
        rest, args = iter(dynamic), []
        for i in range(len(dynamic) + len(statics)):
            args.append(statics[i] if i in statics else next(rest))
        return fn(*args)
    return bound


def _read(path: pathlib.Path, load=lambda data: jax.export.deserialize(bytearray(data))):
    """What load makes of the file at path (a traced program; ``_load_executable``: a compiled
    one), or None when there is none or it cannot be read (it is then made again)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        made = load(data)
    except Exception:  # noqa: BLE001  (a truncated or foreign file: made again)
        return None
    try:
        os.utime(path)  # recently used: pruned last
    except OSError:
        pass
    return made


def _write(path: pathlib.Path, data: bytes):
    """Written whole or not at all: a parallel reader never sees half a file."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass


def _prune(folder: pathlib.Path, max_bytes: int = MAX_BYTES):
    """Delete the least recently used files until the folder holds at most max_bytes."""
    try:
        files = [(p.stat().st_mtime, p.stat().st_size, p) for p in folder.iterdir()
                 if p.suffix in (SUFFIX, EXECUTABLE, GROUP)]
    except OSError:
        return
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= max_bytes:
            break
        try:
            path.unlink()
            total -= size
        except OSError:
            pass


# --- reading a group's executables ahead -----------------------------------------------------
# A check's first call in a later process loads its rounding model's executables one by one as
# it reaches them (about 50 ms each for the registry's attention check, most of it the loader's
# relocations, which run without the interpreter's lock).  A group (the programs of one
# rounding model) notes which executables it loaded, in order of use; the next process that
# builds the same group starts loading them on one thread at once, beside its own work (the
# finite differences, the oracle's run), and a program takes its executable from there.

_AHEAD: dict = {}   # executable's path -> future of its loaded program (None: unreadable)
_GROUPS: dict = {}  # group's file -> the executables it lists, as this process knows them


@functools.cache
def _reader() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that reads ahead, made on first use."""
    return concurrent.futures.ThreadPoolExecutor(1, "gradlab-read-ahead")


def _group_file(group: str | None) -> pathlib.Path | None:
    folder = None if group is None else _folder()
    return None if folder is None else folder / (fingerprint(_code(), group) + _machine({})
                                                 + GROUP)


def read_ahead(group: str | None):
    """Start loading the executables an earlier process noted for group, the first time this
    process builds the group (a later build shares the programs already loaded: ``jit``)."""
    path = _group_file(group)
    if path is None or path in _GROUPS:
        return
    listed = _read(path, lambda data: data.decode().split())
    _GROUPS[path] = listed or []
    if not listed:
        return
    for name in listed:
        executable = path.parent / name
        if executable not in _AHEAD:
            _AHEAD[executable] = _reader().submit(_read, executable, _load_executable)


def _note(group: str | None, executable: pathlib.Path):
    """Add executable to its group's list, on disk, the first time the group uses it."""
    path = _group_file(group)
    if path is None:
        return
    listed = _GROUPS.setdefault(path, [])
    if executable.name not in listed:
        listed.append(executable.name)
        _write(path, "\n".join(listed).encode())
