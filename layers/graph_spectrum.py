"""Host-side linear algebra for graph diffusion: eigenpairs of a Laplacian, with or without mass.

Everything here runs once per graph in float64 NumPy (SciPy for sparse Laplacians when it
is installed); the layer then moves the results to its device.  For a mass M the problem
is the generalized ``L φ = λ M φ``, whose eigenvectors are M-orthonormal (ΦᵀMΦ = I), so
heat diffusion ``M du/dt = -L u`` is ``u(t) = Φ diag(exp(-λt)) ΦᵀM u(0)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    import scipy.sparse as sparse
    import scipy.sparse.linalg as sparse_linalg
except ImportError:
    sparse = None
    sparse_linalg = None


def is_sparse(a: Any) -> bool:
    return sparse is not None and sparse.issparse(a)


def check_laplacian(laplacian: Any) -> Any:
    """A square symmetric [V, V] matrix: a scipy sparse matrix (kept sparse) or a dense float64 array."""
    if is_sparse(laplacian):
        matrix = sparse.csr_matrix(laplacian, dtype=np.float64)
        asymmetry = abs(matrix - matrix.T).max() if matrix.nnz else 0.0
        scale = abs(matrix).max() if matrix.nnz else 0.0
    else:
        matrix = np.asarray(laplacian, dtype=np.float64)
        if matrix.ndim != 2:
            raise ValueError(f"DiffusionConv: the Laplacian must be a [V, V] matrix, got shape {matrix.shape}")
        asymmetry, scale = np.abs(matrix - matrix.T).max(initial=0.0), np.abs(matrix).max(initial=0.0)
    if matrix.shape[0] != matrix.shape[1] or matrix.shape[0] == 0:
        raise ValueError(f"DiffusionConv: the Laplacian must be a non-empty square [V, V] matrix, got shape {matrix.shape}")
    if asymmetry > 1e-10 * max(scale, 1.0):
        raise ValueError(f"DiffusionConv: the Laplacian must be symmetric (max |L - Lᵀ| = {asymmetry:.3g})")
    return matrix


def check_mass(mass: Any, size: int) -> Any:
    """None, a positive [V] vector (diagonal mass), or a symmetric positive-definite [V, V] matrix.

    A diagonal sparse matrix becomes a vector; another sparse matrix stays sparse.
    """
    if mass is None:
        return None
    if is_sparse(mass):
        matrix = sparse.csr_matrix(mass, dtype=np.float64)
        if matrix.shape != (size, size):
            raise ValueError(f"DiffusionConv: mass must be [{size}] or [{size}, {size}], got shape {matrix.shape}")
        diagonal = matrix.diagonal()
        if abs(matrix - sparse.diags(diagonal)).max() == 0:
            mass = diagonal
        else:
            return matrix
    mass = np.asarray(mass, dtype=np.float64)
    if mass.shape not in ((size,), (size, size)):
        raise ValueError(f"DiffusionConv: mass must be [{size}] or [{size}, {size}], got shape {mass.shape}")
    if mass.ndim == 1 and not np.all(mass > 0):
        raise ValueError("DiffusionConv: a mass vector must be strictly positive")
    if mass.ndim == 2 and not np.allclose(mass, mass.T):
        raise ValueError("DiffusionConv: a mass matrix must be symmetric")
    return mass


@dataclass(frozen=True)
class Spectrum:
    """``eigenvalues [k]`` (ascending, >= 0), ``eigenvectors Φ [V, k]`` and ``projection ΦᵀM [k, V]``."""

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    projection: np.ndarray


def smallest_eigenpairs(laplacian: Any, mass: Any, k: int) -> Spectrum:
    """The k smallest eigenpairs of ``L φ = λ M φ`` (M = I when mass is None).

    A sparse Laplacian with k < V - 1 uses SciPy's shift-invert Lanczos (``eigsh``);
    otherwise the dense symmetric problem is solved by ``numpy.linalg.eigh``.
    """
    size = laplacian.shape[0]
    if not 1 <= k <= size:
        raise ValueError(f"DiffusionConv: k must be in [1, {size}] for a graph of {size} vertices, got {k}")
    if is_sparse(laplacian) and k < size - 1:
        values, vectors = _sparse_eigenpairs(laplacian, mass, k)
    else:
        values, vectors = _dense_eigenpairs(_dense(laplacian), None if mass is None else _dense(mass))
        values, vectors = values[:k], vectors[:, :k]
    order = np.argsort(values)
    values, vectors = np.maximum(values[order], 0.0), vectors[:, order]
    return Spectrum(values, vectors, _project(vectors, mass))


def generator_matrix(laplacian: Any, mass: Any) -> np.ndarray:
    """The dense operator ``M⁻¹L`` of ``du/dt = -M⁻¹L u`` (just L without mass)."""
    dense = _dense(laplacian)
    if mass is None:
        return dense
    if mass.ndim == 1:
        return dense / mass[:, None]
    return np.linalg.solve(_dense(mass), dense)


def _dense(a: Any) -> np.ndarray:
    return a.toarray() if is_sparse(a) else a


def _dense_eigenpairs(laplacian: np.ndarray, mass: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """All eigenpairs, through the symmetric matrix R⁻¹LR⁻ᵀ where M = RRᵀ (R = sqrt(M) for a vector)."""
    if mass is None:
        return np.linalg.eigh(laplacian)
    if mass.ndim == 1:
        inv_sqrt = 1.0 / np.sqrt(mass)
        values, vectors = np.linalg.eigh(laplacian * inv_sqrt[:, None] * inv_sqrt[None, :])
        return values, vectors * inv_sqrt[:, None]
    try:
        factor = np.linalg.cholesky(mass)
    except np.linalg.LinAlgError as exc:
        raise ValueError("DiffusionConv: the mass matrix must be positive definite") from exc
    half = np.linalg.solve(factor, laplacian)  # R⁻¹L
    symmetric = np.linalg.solve(factor, half.T)  # R⁻¹LR⁻ᵀ
    values, vectors = np.linalg.eigh(0.5 * (symmetric + symmetric.T))
    return values, np.linalg.solve(factor.T, vectors)


def _sparse_eigenpairs(laplacian: Any, mass: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    mass_matrix = None if mass is None else sparse.diags(mass) if mass.ndim == 1 else sparse.csc_matrix(mass)
    # A small negative shift makes L - σM positive definite (L itself is singular).
    shift = -1e-8 * max(abs(laplacian.diagonal()).max(), 1.0)
    return sparse_linalg.eigsh(laplacian.tocsc(), k=k, M=mass_matrix, sigma=shift, which="LM")


def _project(vectors: np.ndarray, mass: Any) -> np.ndarray:
    """ΦᵀM, which maps a signal to its spectral coefficients."""
    if mass is None:
        return np.ascontiguousarray(vectors.T)
    if mass.ndim == 1:
        return np.ascontiguousarray((vectors * mass[:, None]).T)
    return np.ascontiguousarray(np.asarray(mass @ vectors).T)
