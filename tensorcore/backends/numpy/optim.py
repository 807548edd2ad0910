"""Reference optimizer updates over flat 1-D buffers, written against ``self.xp``.

Every update works in place on a flat parameter buffer ``p`` and its state buffers
(same length and dtype).  ``lr`` and ``step`` are 1-element device arrays, so a step
needs no host round trip; the scalar coefficients derived from them (bias
corrections, decayed learning rates) are computed in float64 and then cast to the
parameters' dtype, as ``torch.optim`` does with its Python-float coefficients.
``ranges`` (LAMB, LARS) is an int64 array [K, 2] of each tensor's (start, stop) in
the flat buffer; gaps between ranges hold zeros and stay zero.
"""

from __future__ import annotations

from typing import Any

Array = Any


SLICE = 1 << 17  # elements per slice of an update done slice by slice


def _slices(n: int) -> list[slice]:
    """Consecutive slices covering n elements.  Updating a flat buffer slice by slice
    keeps each temporary small and cache-resident instead of allocating (and page
    faulting) buffer-sized temporaries."""
    return [slice(lo, lo + SLICE) for lo in range(0, n, SLICE)]


class NumpyOptimKernels:
    """Optimizer updates matching ``torch.optim`` step for step (LAMB, LARS, Lion
    after their papers)."""

    xp: Any

    def _f64(self, scalar: Array) -> Array:
        """A 1-element device scalar as float64, for coefficient arithmetic."""
        return scalar.astype(self.xp.float64).reshape(1)

    def sgd_update_(self, p: Array, g: Array, buf: Array | None, lr: Array, momentum: float,
                    dampening: float, nesterov: bool, weight_decay: float, first_step: Array) -> None:
        """SGD: d = g + wd·p; buf = d on the first step, else momentum·buf +
        (1 - dampening)·d; d = d + momentum·buf (Nesterov) or buf; p -= lr·d."""
        xp, t = self.xp, p.dtype.type
        rate, first = lr.astype(p.dtype), first_step.reshape(1) != 0
        for s in _slices(p.size):  # temporaries of one slice stay in cache
            d = g[s] + t(weight_decay) * p[s] if weight_decay else g[s]
            if buf is not None and momentum != 0:
                blended = t(momentum) * buf[s] + t(1 - dampening) * d
                buf[s] = xp.where(first, d, blended)
                d = d + t(momentum) * buf[s] if nesterov else buf[s]
            p[s] -= rate * d

    def adam_update_(self, p: Array, g: Array, m: Array, v: Array, vmax: Array | None, lr: Array,
                     step: Array, beta1: float, beta2: float, eps: float, weight_decay: float,
                     decoupled: bool) -> None:
        """Adam / AdamW (``decoupled``), amsgrad when ``vmax`` is given."""
        xp, t = self.xp, p.dtype.type
        lr64, step64 = self._f64(lr), self._f64(step)
        if decoupled:
            p *= (1.0 - lr64 * weight_decay).astype(p.dtype)
        elif weight_decay:
            g = g + t(weight_decay) * p
        m[...] = t(beta1) * m + t(1 - beta1) * g
        v[...] = t(beta2) * v + t(1 - beta2) * g * g
        if vmax is not None:
            xp.maximum(vmax, v, out=vmax)
        second = v if vmax is None else vmax
        step_size = (lr64 / (1.0 - beta1 ** step64)).astype(p.dtype)
        inv_bc2_sqrt = (1.0 / xp.sqrt(1.0 - beta2 ** step64)).astype(p.dtype)
        p -= step_size * m / (xp.sqrt(second) * inv_bc2_sqrt + t(eps))

    def rmsprop_update_(self, p: Array, g: Array, square_avg: Array, grad_avg: Array | None,
                        buf: Array | None, lr: Array, alpha: float, eps: float, weight_decay: float,
                        momentum: float, centered: bool) -> None:
        """RMSProp; ``grad_avg`` is required when ``centered``, ``buf`` when momentum > 0."""
        xp, t = self.xp, p.dtype.type
        if weight_decay:
            g = g + t(weight_decay) * p
        square_avg[...] = t(alpha) * square_avg + t(1 - alpha) * g * g
        if centered:
            grad_avg[...] = t(alpha) * grad_avg + t(1 - alpha) * g
            avg = xp.sqrt(square_avg - grad_avg * grad_avg) + t(eps)
        else:
            avg = xp.sqrt(square_avg) + t(eps)
        lr_t = lr.astype(p.dtype)
        if momentum > 0:
            buf[...] = t(momentum) * buf + g / avg
            p -= lr_t * buf
        else:
            p -= lr_t * (g / avg)

    def adagrad_update_(self, p: Array, g: Array, state_sum: Array, lr: Array, step: Array,
                        lr_decay: float, weight_decay: float, eps: float) -> None:
        """Adagrad with the learning rate lr / (1 + (step - 1) * lr_decay)."""
        xp, t = self.xp, p.dtype.type
        if weight_decay:
            g = g + t(weight_decay) * p
        clr = (self._f64(lr) / (1.0 + (self._f64(step) - 1.0) * lr_decay)).astype(p.dtype)
        state_sum += g * g
        p -= clr * (g / (xp.sqrt(state_sum) + t(eps)))

    def lamb_update_(self, p: Array, g: Array, m: Array, v: Array, ranges: Array, lr: Array,
                     step: Array, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
        """LAMB: u = m̂ / (√v̂ + eps) + wd·p; p -= lr · (‖p‖ / ‖u‖) · u per tensor
        (trust ratio 1 when either norm is zero)."""
        xp, t = self.xp, p.dtype.type
        step64 = self._f64(step)
        m[...] = t(beta1) * m + t(1 - beta1) * g
        v[...] = t(beta2) * v + t(1 - beta2) * g * g
        inv_bc1 = (1.0 / (1.0 - beta1 ** step64)).astype(p.dtype)
        inv_bc2 = (1.0 / (1.0 - beta2 ** step64)).astype(p.dtype)
        u = (m * inv_bc1) / (xp.sqrt(v * inv_bc2) + t(eps)) + t(weight_decay) * p
        lr64 = self._f64(lr)
        for start, stop in self.to_numpy(ranges).tolist():
            p_norm = xp.sqrt(xp.sum(p[start:stop].astype(xp.float64) ** 2))
            u_norm = xp.sqrt(xp.sum(u[start:stop].astype(xp.float64) ** 2))
            trust = xp.where((p_norm > 0) & (u_norm > 0), p_norm / xp.where(u_norm > 0, u_norm, 1.0), 1.0)
            p[start:stop] -= (lr64 * trust).astype(p.dtype) * u[start:stop]

    def lars_update_(self, p: Array, g: Array, buf: Array, ranges: Array, lr: Array, momentum: float,
                     weight_decay: float, trust_coefficient: float, eps: float) -> None:
        """LARS: per tensor λ = η‖p‖ / (‖g‖ + wd‖p‖ + eps) (1 when ‖p‖ or ‖g‖ is zero);
        buf = momentum·buf + lr·λ·(g + wd·p); p -= buf."""
        xp, t = self.xp, p.dtype.type
        lr64 = self._f64(lr)
        for start, stop in self.to_numpy(ranges).tolist():
            ps, gs = p[start:stop], g[start:stop]
            p_norm = xp.sqrt(xp.sum(ps.astype(xp.float64) ** 2))
            g_norm = xp.sqrt(xp.sum(gs.astype(xp.float64) ** 2))
            local = trust_coefficient * p_norm / (g_norm + weight_decay * p_norm + eps)
            local = xp.where((p_norm > 0) & (g_norm > 0), local, 1.0)
            scale = (lr64 * local).astype(p.dtype)
            buf[start:stop] = t(momentum) * buf[start:stop] + scale * (gs + t(weight_decay) * ps)
            ps -= buf[start:stop]

    def lion_update_(self, p: Array, g: Array, m: Array, lr: Array, beta1: float, beta2: float,
                     weight_decay: float) -> None:
        """Lion: p *= 1 - lr·wd; p -= lr·sign(β1·m + (1-β1)·g); m = β2·m + (1-β2)·g."""
        xp, t = self.xp, p.dtype.type
        lr64 = self._f64(lr)
        if weight_decay:
            p *= (1.0 - lr64 * weight_decay).astype(p.dtype)
        p -= lr64.astype(p.dtype) * xp.sign(t(beta1) * m + t(1 - beta1) * g)
        m[...] = t(beta2) * m + t(1 - beta2) * g
