"""The NumPy backend: the complete reference implementation of every kernel."""
