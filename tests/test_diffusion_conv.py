"""DiffusionConv: spectral and direct heat diffusion on graphs, their analytic gradients
(central differences in float64), agreement with each other and with a matrix exponential,
the eigenbasis cache, and a learning test that recovers a known diffusion time."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import layers
import optim
import tensorcore as tc
from layers import graph_spectrum



def grid_laplacian(n: int) -> np.ndarray:
    """L = D - A of an n x n 4-neighbour grid graph."""
    size = n * n
    adjacency = np.zeros((size, size))
    for r in range(n):
        for c in range(n):
            i = r * n + c
            if c + 1 < n:
                adjacency[i, i + 1] = adjacency[i + 1, i] = 1
            if r + 1 < n:
                adjacency[i, i + n] = adjacency[i + n, i] = 1
    return np.diag(adjacency.sum(1)) - adjacency


def random_laplacian(size: int, seed: int = 0) -> np.ndarray:
    """A weighted graph Laplacian with distinct eigenvalues."""
    rng = np.random.default_rng(seed)
    weights = np.triu(rng.uniform(0.1, 1.0, (size, size)) * (rng.uniform(size=(size, size)) < 0.6), 1)
    weights += np.diag(np.full(size - 1, 0.5), 1)  # connected
    weights = weights + weights.T
    return np.diag(weights.sum(1)) - weights


def masses(size: int) -> dict[str, object]:
    rng = np.random.default_rng(3)
    vector = rng.uniform(0.5, 2.0, size)
    root = rng.standard_normal((size, size)) * 0.1
    return {"none": None, "vector": vector, "matrix": np.diag(vector) + root @ root.T}


def layer(mode: str, mass: object = None, k: int | None = None, laplacian: np.ndarray | None = None,
          activation: str = "tanh") -> layers.DiffusionConv:
    laplacian = random_laplacian(7) if laplacian is None else laplacian
    tc.manual_seed(0)
    m = layers.DiffusionConv(2, 3, laplacian, mass=mass, num_scales=3, k=k, mode=mode, activation=activation,
                             t_min=0.05, t_max=0.8).double()
    with tc.no_grad():
        m.bias.copy_(tc.tensor([0.1, -0.2, 0.3], dtype=tc.float64))
    return m


def numeric_grad(loss, tensor: tc.Tensor, eps: float = 1e-6) -> np.ndarray:
    values = tensor.numpy()  # shares memory on the CPU: perturb in place
    grad = np.zeros_like(values)
    for index in np.ndindex(values.shape):
        saved = values[index]
        values[index] = saved + eps
        up = loss()
        values[index] = saved - eps
        down = loss()
        values[index] = saved
        grad[index] = (up - down) / (2 * eps)
    return grad


def check_gradients(m: layers.DiffusionConv) -> None:
    rng = np.random.default_rng(1)
    x = tc.tensor(rng.standard_normal((2, m.num_vertices, 2)), requires_grad=True)
    cotangent = tc.tensor(rng.standard_normal((2, m.num_vertices, 3)))
    (m(x) * cotangent).sum().backward()

    def loss() -> float:
        with tc.no_grad():
            return float((m(x) * cotangent).sum().item())
    for name, tensor in [("x", x), ("times", m.times), ("weight", m.weight), ("bias", m.bias)]:
        np.testing.assert_allclose(tensor.grad.numpy(), numeric_grad(loss, tensor), rtol=1e-6, atol=1e-8, err_msg=name)


@pytest.mark.parametrize("mass", ["none", "vector", "matrix"])
@pytest.mark.parametrize("mode", ["spectral", "direct"])
def test_gradients_match_central_differences(mode: str, mass: str) -> None:
    check_gradients(layer(mode, masses(7)[mass], k=4 if mode == "spectral" else None))


@pytest.mark.parametrize("mass", ["none", "vector", "matrix"])
def test_direct_equals_spectral_with_all_eigenpairs(mass: str) -> None:
    x = tc.tensor(np.random.default_rng(2).standard_normal((3, 7, 2)))
    spectral = layer("spectral", masses(7)[mass], k=7)(x).numpy()
    direct = layer("direct", masses(7)[mass])(x).numpy()
    np.testing.assert_allclose(direct, spectral, rtol=1e-10, atol=1e-12)


def identity_diffusion(mode: str, laplacian: object, mass: object, t: float, **kwargs: object) -> layers.DiffusionConv:
    """One channel, one scale, W = 1, b = 0: the layer's output is the diffused signal."""
    m = layers.DiffusionConv(1, 1, laplacian, mass=mass, num_scales=1, mode=mode, t_min=t, t_max=t, **kwargs).double()
    with tc.no_grad():
        m.weight.fill_(1.0)
        m.bias.fill_(0.0)
    return m


@pytest.mark.parametrize("mass", ["none", "vector", "matrix"])
def test_direct_mode_is_the_matrix_exponential(mass: str) -> None:
    linalg = pytest.importorskip("scipy.linalg")
    laplacian, m_ = random_laplacian(7), masses(7)[mass]
    generator = laplacian if m_ is None else np.linalg.solve(np.diag(m_) if np.ndim(m_) == 1 else m_, laplacian)
    x = np.random.default_rng(4).standard_normal((2, 7, 1))
    m = identity_diffusion("direct", laplacian, m_, 0.37)
    t = m.times.item()  # 0.37 rounded to float32 at construction
    np.testing.assert_allclose(m(tc.tensor(x)).numpy(), linalg.expm(-t * generator) @ x, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mass", ["none", "vector"])
def test_generalized_eigenpairs_are_mass_orthonormal(mass: str) -> None:
    laplacian, m_ = random_laplacian(9), masses(9)[mass]
    spectrum = graph_spectrum.smallest_eigenpairs(laplacian, graph_spectrum.check_mass(m_, 9), 5)
    phi, lam = spectrum.eigenvectors, spectrum.eigenvalues
    mass_matrix = np.eye(9) if m_ is None else np.diag(m_)
    np.testing.assert_allclose(phi.T @ mass_matrix @ phi, np.eye(5), atol=1e-10)
    np.testing.assert_allclose(laplacian @ phi, mass_matrix @ phi * lam, atol=1e-10)
    assert np.all(np.diff(lam) >= 0) and lam[0] == pytest.approx(0, abs=1e-10)


@pytest.mark.parametrize("mass", ["none", "vector"])
def test_sparse_laplacian_uses_eigsh_and_matches_dense(mass: str) -> None:
    sparse = pytest.importorskip("scipy.sparse")
    laplacian, m_ = random_laplacian(30, seed=5), masses(30)[mass]
    x = tc.tensor(np.random.default_rng(6).standard_normal((2, 30, 2)))
    dense = layer("spectral", m_, k=6, laplacian=laplacian)
    sparse_layer = layer("spectral", None if m_ is None else sparse.diags(m_), k=6, laplacian=sparse.csr_matrix(laplacian))
    assert graph_spectrum.is_sparse(sparse_layer.laplacian)
    np.testing.assert_allclose(sparse_layer.eigenpairs()[0].numpy(), dense.eigenpairs()[0].numpy(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(sparse_layer(x).numpy(), dense(x).numpy(), rtol=1e-8, atol=1e-10)


def test_basis_is_computed_once_across_threads_and_again_after_a_new_laplacian(monkeypatch) -> None:
    calls = []
    original = graph_spectrum.smallest_eigenpairs

    def counting(*args: object) -> graph_spectrum.Spectrum:
        calls.append(1)
        return original(*args)
    monkeypatch.setattr(graph_spectrum, "smallest_eigenpairs", counting)
    m = layer("spectral", k=4)
    x = tc.tensor(np.ones((1, 7, 2)))
    results: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: results.append(m(x).numpy())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and all(np.array_equal(r, results[0]) for r in results)
    version = m.structure_version
    m.laplacian = 2 * random_laplacian(7)
    assert m.structure_version != version
    fresh = layer("spectral", k=4, laplacian=2 * random_laplacian(7))
    np.testing.assert_allclose(m(x).numpy(), fresh(x).numpy(), rtol=1e-12)
    assert len(calls) == 3


def test_bad_graphs_and_inputs_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="symmetric"):
        layers.DiffusionConv(1, 1, np.triu(np.ones((3, 3))))
    with pytest.raises(ValueError, match="mass"):
        layers.DiffusionConv(1, 1, grid_laplacian(2), mass=np.ones(3))
    with pytest.raises(ValueError, match="k must be"):
        layers.DiffusionConv(1, 1, grid_laplacian(2), k=5)
    with pytest.raises(ValueError, match=r"expected input \[B, 4, 1\]"):
        layers.DiffusionConv(1, 1, grid_laplacian(2))(tc.zeros(2, 5, 1))


def test_times_carry_the_lower_bound_that_optimizers_apply() -> None:
    m = layer("spectral", k=4)
    assert m.times.bounds == (1e-6, None)
    opt = optim.SGD(m.parameters(), lr=100.0)
    m(tc.tensor(np.ones((1, 7, 2)))).sum().backward()
    with tc.no_grad():
        m.times.grad.fill_(1.0)  # a step that would drive every time far below zero
    opt.step()
    np.testing.assert_allclose(m.times.numpy(), 1e-6)


def test_learns_a_known_diffusion_time_on_a_grid_heat_equation() -> None:
    """Targets are exp(-t* L) x on a 6x6 grid; the layer starts at t = 0.02 and must find t* = 0.4."""
    laplacian, true_time = grid_laplacian(6), 0.4
    values, vectors = np.linalg.eigh(laplacian)
    heat = vectors @ np.diag(np.exp(-true_time * values)) @ vectors.T
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 36, 1))
    y = heat @ x
    m = layers.DiffusionConv(1, 1, laplacian, num_scales=1, k=36, t_min=0.02, t_max=0.02).double()
    opt = optim.Adam(m.parameters(), lr=0.05)
    xs, ys = tc.tensor(x), tc.tensor(y)
    for _ in range(300):
        opt.zero_grad()
        loss = ((m(xs) - ys) ** 2).mean()
        loss.backward()
        opt.step()
    assert float(loss.item()) < 1e-6
    assert m.times.item() == pytest.approx(true_time, rel=1e-2)
    assert m.weight.item() == pytest.approx(1.0, rel=1e-2)
