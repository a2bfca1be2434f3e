"""Nothing unverified can hide: every public *_forward in kernels/ has its backward beside it,
its oracle in reference/ and at least one registry row."""
import importlib
import inspect
import pkgutil

import kernels
import reference
from checks.registry import ROWS


def kernel_forwards():
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"kernels.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.endswith("_forward") and not name.startswith("_") and fn.__module__ == module.__name__:
                yield module, name, fn


def test_discovery_finds_the_layers():
    names = {name for _, name, _ in kernel_forwards()}
    assert {"mha_forward", "mhca_forward", "rms_norm_forward", "embedding_forward"} <= names


def test_every_forward_has_backward_oracle_and_row():
    enrolled = {row.forward for row in ROWS}
    problems = []
    for module, name, fn in kernel_forwards():
        base = name[: -len("_forward")]
        if not hasattr(module, base + "_backward"):
            problems.append(f"{module.__name__}.{name} has no {base}_backward beside it")
        if not hasattr(reference, base):
            problems.append(f"{module.__name__}.{name} has no oracle reference.{base}")
        if fn not in enrolled:
            problems.append(f"{module.__name__}.{name} has no row in checks/registry.py")
    assert not problems, "\n".join(problems)


def test_reference_does_not_import_kernels():
    import pathlib
    for path in pathlib.Path(reference.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert "import kernels" not in text and "from kernels" not in text, path


def test_every_layer_follows_the_half_precision_policy():
    """Each layer's pair is wrapped by kernels.precision (float32 inside, results rounded once);
    a composition of layers (the model) inherits it from them."""
    missing = []
    for module, name, fn in kernel_forwards():
        if module.__name__ == "kernels.model":
            continue
        backward = getattr(module, name[: -len("_forward")] + "_backward", None)
        missing += [f"{module.__name__}.{f.__name__}" for f in (fn, backward)
                    if f is not None and not getattr(f, "half_precision", False)]
    assert not missing, "not wrapped by kernels.precision: " + ", ".join(missing)
