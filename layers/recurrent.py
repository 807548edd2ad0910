"""LSTM and GRU: multi-layer recurrent networks with PyTorch's parameter names and gate order."""

from __future__ import annotations

from typing import Any

import tensorcore as tc
import tensorcore.functional as F
from tensorcore import Tensor

from . import init
from .module import Module
from .parameter import Parameter


class _RecurrentBase(Module):
    """Parameters ``weight_ih_l{k} [G*H, in]``, ``weight_hh_l{k} [G*H, H]``, ``bias_ih_l{k}``,
    ``bias_hh_l{k}`` ``[G*H]`` per layer k, with G gates; all start U(-1/sqrt(H), 1/sqrt(H)).

    A subclass sets ``gates`` and defines ``_initial_state`` (per-layer state tuples whose
    first entry is h) and ``_cell`` (one time step).
    """

    gates: int

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, dtype: Any = tc.float32,
                 device: str | None = None) -> None:
        super().__init__()
        kind = type(self).__name__
        if min(input_size, hidden_size, num_layers) < 1:
            raise ValueError(f"{kind}: input_size, hidden_size and num_layers must be positive")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{kind}: dropout must be in [0, 1), got {dropout}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, dropout
        rows = self.gates * hidden_size
        for layer in range(num_layers):
            in_size = input_size if layer == 0 else hidden_size
            setattr(self, f"weight_ih_l{layer}", Parameter(tc.empty(rows, in_size, dtype=dtype, device=device)))
            setattr(self, f"weight_hh_l{layer}", Parameter(tc.empty(rows, hidden_size, dtype=dtype, device=device)))
            if bias:
                setattr(self, f"bias_ih_l{layer}", Parameter(tc.empty(rows, dtype=dtype, device=device)))
                setattr(self, f"bias_hh_l{layer}", Parameter(tc.empty(rows, dtype=dtype, device=device)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in self.parameters():
            init.fan_in_uniform_(p, self.hidden_size)

    def _layer_parameters(self, layer: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        weights = getattr(self, f"weight_ih_l{layer}"), getattr(self, f"weight_hh_l{layer}")
        if not self.bias:
            return weights[0], weights[1], None, None
        return weights[0], weights[1], getattr(self, f"bias_ih_l{layer}"), getattr(self, f"bias_hh_l{layer}")

    def _run(self, x: Tensor, hx: Any) -> tuple[Tensor, list[tuple[Tensor, ...]], bool]:
        """Shared driver: returns the last layer's outputs (input layout) and each layer's final state."""
        kind = type(self).__name__
        if x.ndim not in (2, 3) or x.shape[-1] != self.input_size:
            raise ValueError(f"{kind}: expected input [T, B, {self.input_size}] (or batch_first / unbatched), got {x.shape}")
        batched = x.ndim == 3
        if not batched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        steps, batch = x.shape[0], x.shape[1]
        states = self._initial_state(x, batch, hx if batched or hx is None else _unsqueeze_state(hx))
        inputs = [x[t] for t in range(steps)]
        finals = []
        for layer in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = self._layer_parameters(layer)
            state, outputs = states[layer], []
            for x_t in inputs:
                x_part, h_part = x_t @ w_ih.T, state[0] @ w_hh.T
                if b_ih is not None:
                    x_part, h_part = x_part + b_ih, h_part + b_hh
                state = self._cell(x_part, h_part, state)
                outputs.append(state[0])
            finals.append(state)
            inputs = outputs
            if self.dropout > 0.0 and self.training and layer < self.num_layers - 1:
                inputs = [F.dropout(h, self.dropout, True) for h in inputs]
        out = tc.stack(inputs, 0)
        if not batched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, finals, batched

    def _check_state(self, h: Tensor, x: Tensor, batch: int, name: str) -> Tensor:
        expected = (self.num_layers, batch, self.hidden_size)
        if h.shape != expected:
            raise ValueError(f"{type(self).__name__}: {name} must be {list(expected)}, got {h.shape}")
        return h.to(dtype=x.dtype)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, batch_first={self.batch_first}"


def _unsqueeze_state(hx: Any) -> Any:
    return tuple(h.unsqueeze(1) for h in hx) if isinstance(hx, tuple) else hx.unsqueeze(1)


def _zeros(x: Tensor, batch: int, hidden: int) -> Tensor:
    return tc.zeros(batch, hidden, dtype=x.dtype, device=x.device)


class LSTM(_RecurrentBase):
    """Input ``[T, B, in]`` (``[B, T, in]`` with batch_first; ``[T, in]`` unbatched).

    ``forward(x, (h0, c0)) -> output [T, B, H], (h_n, c_n)`` with states ``[num_layers, B, H]``.
    Gates in PyTorch's order i, f, g, o: ``c' = f*c + i*g``, ``h' = o*tanh(c')``.
    """

    gates = 4

    def _initial_state(self, x: Tensor, batch: int, hx: Any) -> list[tuple[Tensor, ...]]:
        if hx is None:
            return [(_zeros(x, batch, self.hidden_size), _zeros(x, batch, self.hidden_size)) for _ in range(self.num_layers)]
        h0, c0 = (self._check_state(h, x, batch, name) for h, name in zip(hx, ("h0", "c0")))
        return [(h0[layer], c0[layer]) for layer in range(self.num_layers)]

    def _cell(self, x_part: Tensor, h_part: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        i, f, g, o = (x_part + h_part).chunk(4, axis=-1)
        c = F.sigmoid(f) * state[1] + F.sigmoid(i) * F.tanh(g)
        return F.sigmoid(o) * F.tanh(c), c

    def forward(self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        out, finals, batched = self._run(x, hx)
        h_n, c_n = tc.stack([s[0] for s in finals], 0), tc.stack([s[1] for s in finals], 0)
        return out, ((h_n, c_n) if batched else (h_n.squeeze(1), c_n.squeeze(1)))


class GRU(_RecurrentBase):
    """Input ``[T, B, in]`` (``[B, T, in]`` with batch_first; ``[T, in]`` unbatched).

    ``forward(x, h0) -> output [T, B, H], h_n [num_layers, B, H]``.  Gates in PyTorch's order
    r, z, n: ``n = tanh(W_in x + b_in + r*(W_hn h + b_hn))``, ``h' = (1-z)*n + z*h``.
    """

    gates = 3

    def _initial_state(self, x: Tensor, batch: int, hx: Any) -> list[tuple[Tensor, ...]]:
        if hx is None:
            return [(_zeros(x, batch, self.hidden_size),) for _ in range(self.num_layers)]
        h0 = self._check_state(hx, x, batch, "h0")
        return [(h0[layer],) for layer in range(self.num_layers)]

    def _cell(self, x_part: Tensor, h_part: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        x_r, x_z, x_n = x_part.chunk(3, axis=-1)
        h_r, h_z, h_n = h_part.chunk(3, axis=-1)
        r, z = F.sigmoid(x_r + h_r), F.sigmoid(x_z + h_z)
        n = F.tanh(x_n + r * h_n)
        return (n + z * (state[0] - n),)

    def forward(self, x: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        out, finals, batched = self._run(x, hx)
        h_n = tc.stack([s[0] for s in finals], 0)
        return out, (h_n if batched else h_n.squeeze(1))
