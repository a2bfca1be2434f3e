"""The numerics studies: one module per study, each writing results/NAME/ (data.csv, meta.json, PNG)."""
from experiments import common  # noqa: F401
