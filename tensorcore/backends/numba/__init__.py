"""The Numba backend: the NumPy reference with hot CPU kernels replaced by parallel ``@njit`` kernels."""
