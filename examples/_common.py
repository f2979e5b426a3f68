"""Shared bits of the examples: synthetic test images, PSNR, and a PNG writer.

The PNG writer is a few lines of ``zlib`` (8-bit grayscale), so the examples
write their figures with no plotting package installed.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np


def shapes_image(n: int) -> np.ndarray:
    """A piecewise-constant ``n x n`` test image in [0, 1]: rectangles, a disk, a ramp."""
    img = np.full((n, n), 0.2)
    yy, xx = np.mgrid[0:n, 0:n] / n
    img[(yy > 0.15) & (yy < 0.45) & (xx > 0.1) & (xx < 0.6)] = 0.8
    img[(yy - 0.65) ** 2 + (xx - 0.6) ** 2 < 0.05] = 0.55
    img[(yy > 0.7) & (xx < 0.3)] = 1.0
    img += 0.15 * xx * (yy < 0.1)
    return img


def psnr(x: np.ndarray, ref: np.ndarray, peak: float = 1.0) -> float:
    """Peak signal-to-noise ratio of ``x`` against ``ref`` in dB."""
    mse = float(np.mean((np.asarray(x) - np.asarray(ref)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(peak * peak / mse)


def write_png(path, image: np.ndarray) -> Path:
    """Write a 2-d array (values in [0, 1], clipped) as an 8-bit grayscale PNG."""
    a = (np.clip(np.asarray(image, dtype=np.float64), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    h, w = a.shape
    raw = b"".join(b"\x00" + a[r].tobytes() for r in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
    return path


def side_by_side(*images: np.ndarray, gap: int = 4) -> np.ndarray:
    """Images of equal height next to each other, separated by white gaps."""
    h = max(im.shape[0] for im in images)
    parts = []
    for k, im in enumerate(images):
        pad = np.ones((h, im.shape[1]))
        pad[:im.shape[0]] = im
        parts.append(pad)
        if k + 1 < len(images):
            parts.append(np.ones((h, gap)))
    return np.concatenate(parts, axis=1)
