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


@pytest.mark.parametrize("cout, narrow", [(3, True), (4, True), (128, False)])
def test_a_few_output_channels_take_the_narrow_tile_on_sm90(cout, narrow):
    """A GEMM of 3 columns at an SD VAE's size (its last convolution's shape, 128 -> 3 at
    512², float16; the forward itself runs conv_halo, the input gradient of a 3-channel
    input such a GEMM) wastes 125 of a wgmma tile's 128 columns; the 128 x 32 tile runs
    it, and 128 columns stay on wgmma."""
    m, k = 512 * 512, 9 * 128
    plan = conv_plan.choose(conv_plan.FPROP, conv_plan.PREC_16, 2, m, cout, k, 1, m * cout, 132, True)
    assert (plan.tile.bn == 32 and not plan.tile.wgmma) == narrow
    assert plan.walks_taps_inner != plan.tile.wgmma


@pytest.mark.parametrize("kernel", [conv_plan.FPROP, conv_plan.WGRAD])
def test_every_wgmma_tile_has_a_copying_warpgroup_variant(kernel):
    """lookahead 0 adds one warpgroup that copies (128 threads) and two 8-byte barriers
    per stage after the stages; the kernel's template then gets AHEAD 0, and the block
    still fits an SM's shared memory (227 KiB) and 1024 threads."""
    for _, prec in conv_plan.VARIANTS:
        for tile in conv_plan.tiles(kernel, prec, True):
            if not tile.wgmma:
                continue
            producer = dataclasses.replace(tile, lookahead=0)
            assert producer.producer and not tile.producer
            assert producer.threads == tile.threads + 128 <= 1024
            assert producer.smem_bytes(kernel, 2) == tile.smem_bytes(kernel, 2) + 16 * tile.stages <= 227 * 1024
            assert producer.expression(kernel, "half_t", prec).endswith(f"{tile.stages}, 0>")


@pytest.mark.parametrize("prec", [conv_plan.PREC_16, conv_plan.PREC_TF32])
@pytest.mark.parametrize("m, n, channels, bn", [
    (2 * 64 * 64, 320, 320, 160),    # SD-1.5 UNet, 320 channels at 64², batch 2: no idle columns
    (2 * 64 * 64, 320, 960, 160),    # its up block's 960 -> 320
    (512 * 512, 128, 128, 128),      # the SD VAE's 128 channels at 512²: 256 x 128
    (128 * 128, 512, 512, 256),      # its 512 channels at 128²: 128 x 256
])
def test_the_160_wide_tile_takes_channels_it_divides(prec, m, n, channels, bn):
    """On sm_90 the forward's 128 x 160 wgmma tile runs 320-channel outputs (128 x 256
    would leave 192 of 512 columns idle); channel counts that 128 or 256 divide keep
    those tiles."""
    plan = conv_plan.choose(conv_plan.FPROP, prec, 2 if prec == conv_plan.PREC_16 else 4, m, n,
                            9 * channels, 1, m * n, 132, True)
    assert plan.tile.wgmma and plan.tile.bn == bn
