"""The convolution tile tables (``backends/cupy/conv_plan.py``) are written with keyword
fields, and every tile is one the kernels can launch."""

import dataclasses

import pytest

from tensorcore.backends.cupy import conv_plan


def test_tiles_take_keyword_fields_only():
    with pytest.raises(TypeError):
        conv_plan.Tile(128, 128, 32, 2, 4, 3, 1, 1.0)  # positional fields are refused


@pytest.mark.parametrize("kernel", [conv_plan.FPROP, conv_plan.WGRAD])
@pytest.mark.parametrize("wgmma", [False, True])
def test_every_tile_is_consistent(kernel, wgmma):
    for _, prec in conv_plan.VARIANTS:
        for tile in conv_plan.tiles(kernel, prec, wgmma):
            fields = dataclasses.asdict(tile)
            assert 0 < fields["efficiency"] <= 1.0 and tile.stages >= 2 and tile.min_blocks >= 1
            if tile.wgmma:  # BM / 16 warps in one column (warpgroups of 4 warps along M)
                assert tile.warps_m * 16 == tile.bm and tile.warps_n == 1
            else:  # every warp covers a whole multiple of the 16 x 8 MMA shape
                assert tile.bm % (16 * tile.warps_m) == 0 and tile.bn % (8 * tile.warps_n) == 0
            assert tile.threads <= 1024
