"""Upsample-into-conv fusion: a nearest upsampling whose result only a convolution reads
runs inside it.

``y = upsample_nearest2d(x, out_hw)`` followed by ``conv2d(y, w, ...)``, where the conv
is the only reader of y (no other call, no view, not a returned value; ``uses.Uses``) and
reads it as its input alone, becomes ``upsample_conv2d(x, out_hw, w, ...)`` with the
conv's epilogue keywords.  This is a decoder's or UNet's ``Upsample2D``.  A backend may
then convolve the small image directly: a 2x upsampling into a 3x3 convolution is a
stride-2 transposed convolution with 2x2 taps per output phase (16 multiply-adds per
output pixel and channel pair instead of 36), and the upsampled tensor, four times the
input, is never written (cupy/conv_igemm.upsample_forward); the others run the two calls.

In a training graph the weight gradient reads y, so the pass leaves it.  The fused call
takes the conv's place, so x must not be written in between.
"""

from __future__ import annotations

import inspect

from ...backends.base import Backend
from ..graph import Graph, Node, Ref
from .uses import Uses, call_arguments, conv_of_input, rewritten

_UPSAMPLE = inspect.signature(Backend.upsample_nearest2d)


def fuse_upsample_conv(graph: Graph) -> Graph:
    values = graph.values
    uses = Uses.of(graph, values)
    upsamplings: dict[int, tuple[int, dict]] = {}  # y value -> (position, its arguments)
    placed: dict[int, Node | None] = {}
    folded = 0
    for position, node in enumerate(graph.nodes):
        if node.writes or node.effect or type(node.out) is not Ref:
            continue
        if node.op == "upsample_nearest2d":
            params = call_arguments(_UPSAMPLE, node)
            if params is not None and type(params["x"]) is Ref:
                upsamplings[node.out.value] = (position, params)
        elif (conv := conv_of_input(node, position, uses, values, upsamplings)) is not None:
            x, geometry, epilogue = conv
            up_position, params = upsamplings.pop(x.value)
            if not uses.unwritten({values[params["x"].value].storage}, up_position, position):
                continue
            placed[up_position] = None
            placed[position] = Node(node.index, "upsample_conv2d", (params["x"], params["out_hw"], *geometry),
                                    epilogue, node.out)
            folded += 1
    if not folded:
        return graph
    return rewritten(graph, placed, "fuse_upsample_conv", folded)
