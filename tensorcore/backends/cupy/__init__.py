"""The CuPy backend: every kernel on the GPU, hot ones as hand-written CUDA RawKernels (``cuda/``)."""
