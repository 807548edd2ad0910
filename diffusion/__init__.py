"""diffusion: pipelines built on tensorcore; for now the bundled digits and a demo run."""

from .datasets import load_digits, train_test_split

__all__ = ["load_digits", "train_test_split"]
