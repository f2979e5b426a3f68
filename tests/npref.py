"""Independent numpy reference helpers for the polyad tests (no polyad import).

Boundary modes of polyad map onto ``numpy.pad`` modes:
clamped -> 'edge', circular -> 'wrap', mirror -> 'reflect', zero -> 'constant' (0).
"""

import numpy as np

NP_PAD_MODE = {
    "clamped": "edge",
    "circular": "wrap",
    "mirror": "reflect",
    "zero": "constant",
}


def shifted(x, offsets, mode):
    """r[idx] = x_mode[idx + offsets] for every idx in x's index space.

    ``offsets`` has one integer per axis; ``mode`` is a polyad mode name.
    """
    x = np.asarray(x)
    offsets = tuple(int(o) for o in offsets)
    assert len(offsets) == x.ndim
    p = max([abs(o) for o in offsets] + [0])
    padded = np.pad(x, p, mode=NP_PAD_MODE[mode])
    sl = tuple(slice(p + o, p + o + n) for o, n in zip(offsets, x.shape))
    return padded[sl]


def map_index(i, n, mode):
    """Index ``i`` of an axis of length ``n`` under a boundary mode.

    Returns None for an out-of-range index in mode 'zero' (read gives 0,
    write is dropped).  Single reflection / wrap only (|offset| < n).
    """
    if 0 <= i < n:
        return i
    if mode == "clamped":
        return min(max(i, 0), n - 1)
    if mode == "circular":
        return i % n
    if mode == "mirror":
        return -i if i < 0 else 2 * (n - 1) - i
    if mode == "zero":
        return None
    raise ValueError(mode)


def python_erf(x):
    """Vectorised math.erf (numpy has no erf)."""
    import math

    return np.vectorize(math.erf, otypes=[np.float64])(np.asarray(x, np.float64))


def python_erfc(x):
    import math

    return np.vectorize(math.erfc, otypes=[np.float64])(np.asarray(x, np.float64))
