"""Images out of the pipelines: [0, 1] arrays to uint8 / Pillow images, and PNG grids."""

from __future__ import annotations

import io
import os
from typing import Any, Sequence

import numpy as np
from PIL import Image, ImageDraw

from tensorcore.atomic import write_atomic


def to_uint8(images: Any) -> np.ndarray:
    """``[N, C, H, W]`` values in [0, 1] (a Tensor or array) to uint8 ``[N, H, W, C]``."""
    array = np.asarray(images.numpy() if hasattr(images, "numpy") else images, dtype=np.float32)
    if array.ndim != 4:
        raise ValueError(f"to_uint8: expected images [N, C, H, W], got shape {array.shape}")
    scaled = np.clip(array * 255.0, 0.0, 255.0)
    return np.rint(np.nan_to_num(scaled)).astype(np.uint8).transpose(0, 2, 3, 1)


def to_pil(images: Any) -> list[Image.Image]:
    """One Pillow image per sample (mode ``L`` for one channel, ``RGB`` for three)."""
    pixels = to_uint8(images)
    if pixels.shape[-1] not in (1, 3):
        raise ValueError(f"to_pil: images need 1 or 3 channels, got {pixels.shape[-1]}")
    return [Image.fromarray(p[..., 0] if p.shape[-1] == 1 else p) for p in pixels]


def image_grid(images: Any, rows: int, scale: int = 1, padding: int = 2) -> Image.Image:
    """Tile ``[N, C, H, W]`` images row by row (``N = rows * columns``) into one image,
    each enlarged ``scale`` times with nearest-neighbour pixels, ``padding`` white pixels apart."""
    tiles = to_pil(images)
    if rows < 1 or len(tiles) % rows:
        raise ValueError(f"image_grid: {len(tiles)} images do not fill {rows} rows")
    if scale < 1 or padding < 0:
        raise ValueError(f"image_grid: need scale >= 1 and padding >= 0, got scale={scale}, padding={padding}")
    columns = len(tiles) // rows
    width, height = tiles[0].width * scale, tiles[0].height * scale
    grid = Image.new(tiles[0].mode, (columns * (width + padding) + padding, rows * (height + padding) + padding),
                     "white")
    for i, tile in enumerate(tiles):
        row, column = divmod(i, columns)
        enlarged = tile.resize((width, height), Image.NEAREST)
        grid.paste(enlarged, (padding + column * (width + padding), padding + row * (height + padding)))
    return grid


def save_image_grid(images: Any, path: str | os.PathLike, rows: int, scale: int = 1, padding: int = 2) -> str:
    """Write :func:`image_grid` as a PNG (atomically: a temporary file renamed into place)."""
    return save_png(image_grid(images, rows, scale, padding), path)


def save_png(image: Image.Image, path: str | os.PathLike) -> str:
    """Save ``image`` as PNG at ``path`` atomically (a synced temporary file renamed); returns the path."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    write_atomic(path, buffer.getvalue())
    return os.fspath(path)


def labelled_rows(images: Any, labels: Sequence[str], scale: int = 1) -> Image.Image:
    """An :func:`image_grid` with one row per label and the label written left of each row."""
    grid = image_grid(images, len(labels), scale).convert("RGB")
    row_height = grid.height / len(labels)
    margin = 8 + 7 * max(len(text) for text in labels)
    framed = Image.new("RGB", (grid.width + margin, grid.height), "white")
    framed.paste(grid, (margin, 0))
    draw = ImageDraw.Draw(framed)
    for i, text in enumerate(labels):
        draw.text((4, int(i * row_height + row_height / 2 - 5)), text, fill="black")
    return framed
