"""Frame preprocessing for the conv encoder (Cython, nogil).

uint8 frame, (H, W) gray / (H, W, 1) gray / (H, W, 3) RGB channels-last
  -> RGB to luma with ITU-R BT.601 weights 0.299 R + 0.587 G + 0.114 B
  -> optional crop (top, bottom, left, right) pixel margins
  -> exact area-averaging resize to out_shape (any ratio, up or down)
  -> / 255 -> float32 in [0, 1], written into a preallocated C-contiguous
     float32 ``out`` ((Ho, Wo), (1, Ho, Wo) or (Ho*Wo,), e.g. obs[t]).

Use a :class:`Preprocessor` per input shape (it caches the weight tables and
is reusable across frames and threads); ``preprocess_frame`` is a
convenience that keeps a small cache of Preprocessors.  ``spec()`` /
``Preprocessor.from_spec`` round-trip through JSON for checkpoints.
"""
import threading

from a3c_core._preprocess import LUMA, Preprocessor, area_table

__all__ = ["Preprocessor", "preprocess_frame", "LUMA", "area_table"]

_cache = {}
_cache_lock = threading.Lock()


def preprocess_frame(frame, out, crop=None):
    """Preprocess ``frame`` into ``out`` (shape (Ho, Wo) decides the size); returns out."""
    shape = getattr(out, "shape", None)
    if shape is None:
        raise TypeError(f"out must be a float32 numpy array, got {type(out).__name__}")
    if len(shape) == 3 and shape[0] == 1:
        shape = shape[1:]
    if len(shape) != 2:
        raise ValueError(f"out must have shape (Ho, Wo) or (1, Ho, Wo), got {out.shape}")
    fshape = getattr(frame, "shape", None)
    if fshape is None:
        raise TypeError(f"frame must be a uint8 numpy array, got {type(frame).__name__}")
    key = (tuple(fshape), tuple(shape), None if crop is None else tuple(crop))
    pre = _cache.get(key)
    if pre is None:
        pre = Preprocessor(fshape, shape, crop)
        with _cache_lock:
            if len(_cache) > 32:
                _cache.clear()
            _cache[key] = pre
    return pre(frame, out)
