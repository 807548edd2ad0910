"""The two differentiable heat-diffusion ops behind DiffusionConv, with analytic gradients.

Both map ``x [B, V, C]`` and diffusion times ``t [S]`` to ``[B, S, V, C]`` (one diffused
copy of x per time) and use only backend methods, so they run on every backend.
"""

from __future__ import annotations

from tensorcore.autograd import Function


def _swap_last(backend, a):
    axes = list(range(a.ndim))
    axes[-2], axes[-1] = axes[-1], axes[-2]
    return backend.transpose(a, axes)


def _decay(backend, times, eigenvalues):
    """exp(-λ_j t_s) as [S, k]."""
    exponent = backend.binary("mul", backend.reshape(times, (times.shape[0], 1)),
                              backend.reshape(eigenvalues, (1, eigenvalues.shape[0])))
    return backend.unary("exp", backend.unary("neg", exponent))


class SpectralDiffusion(Function):
    """diffused_s = Φ diag(exp(-λ t_s)) ΦᵀM x, with Φ [V, k], ΦᵀM [k, V], λ [k].

    Backward, with ĝ_s = Φᵀ g_s and coefficients a = ΦᵀM x:
    dx = (ΦᵀM)ᵀ Σ_s exp(-λ t_s) ĝ_s and dt_s = -Σ λ exp(-λ t_s) ĝ_s a.
    """

    def forward(self, x, times, eigenvectors, projection, eigenvalues):
        be = self.backend
        batch, _, channels = x.shape
        k = eigenvalues.shape[0]
        self.eigenvectors, self.projection, self.eigenvalues = eigenvectors, projection, eigenvalues
        self.coefficients = be.matmul(projection, x)  # [B, k, C]
        self.decay = _decay(be, times, eigenvalues)  # [S, k]
        scaled = be.binary("mul", be.reshape(self.coefficients, (batch, 1, k, channels)),
                           be.reshape(self.decay, (1, times.shape[0], k, 1)))  # [B, S, k, C]
        return be.matmul(eigenvectors, scaled)  # [B, S, V, C]

    def backward(self, g):
        be = self.backend
        batch, scales, _, channels = g.shape
        k = self.eigenvalues.shape[0]
        spectral_grad = be.matmul(_swap_last(be, self.eigenvectors), g)  # [B, S, k, C]
        coefficients = be.reshape(self.coefficients, (batch, 1, k, channels))
        grad_decay = be.reduce("sum", be.binary("mul", spectral_grad, coefficients), (0, 3), False)  # [S, k]
        rate = be.binary("mul", self.decay, be.reshape(self.eigenvalues, (1, k)))
        grad_times = be.unary("neg", be.reduce("sum", be.binary("mul", grad_decay, rate), (1,), False))
        weighted = be.binary("mul", spectral_grad, be.reshape(self.decay, (1, scales, k, 1)))
        grad_x = be.matmul(_swap_last(be, self.projection), be.reduce("sum", weighted, (1,), False))
        return grad_x, grad_times, None, None, None


class DirectDiffusion(Function):
    """diffused_s = expm(-t_s G) x for G = M⁻¹L, the exact matrix exponential.

    ``expm(-t G)`` is formed as Φ diag(exp(-λt)) ΦᵀM from the full eigendecomposition
    (Φ [V, V]).  Backward: dx = Σ_s expm(-t_s G)ᵀ g_s, and since d/dt expm(-tG) = -G expm(-tG),
    dt_s = -Σ g_s ⊙ (G diffused_s), using G itself.
    """

    def forward(self, x, times, eigenvectors, projection, eigenvalues, generator):
        be = self.backend
        size, scales = eigenvalues.shape[0], times.shape[0]
        decay = _decay(be, times, eigenvalues)  # [S, V]
        columns = be.binary("mul", be.reshape(eigenvectors, (1, size, size)), be.reshape(decay, (scales, 1, size)))
        self.expm = be.matmul(columns, projection)  # [S, V, V]
        self.generator = generator
        self.diffused = be.matmul(be.reshape(self.expm, (1, scales, size, size)),
                                  be.reshape(x, (x.shape[0], 1) + tuple(x.shape[1:])))
        return self.diffused  # [B, S, V, C]

    def backward(self, g):
        be = self.backend
        size, scales = self.generator.shape[0], self.expm.shape[0]
        expm_t = be.reshape(_swap_last(be, self.expm), (1, scales, size, size))
        grad_x = be.reduce("sum", be.matmul(expm_t, g), (1,), False)
        rate = be.matmul(self.generator, self.diffused)  # G diffused_s
        grad_times = be.unary("neg", be.reduce("sum", be.binary("mul", g, rate), (0, 2, 3), False))
        return grad_x, grad_times, None, None, None, None
