"""Raw environment observation -> network input, shared by trainer, eval and Policy.

The pipeline is described by the env's ``preprocess_spec`` (saved in every
checkpoint), so a deployed :class:`~a3c_core.Policy` applies exactly the
preprocessing the agent was trained with, including the image normalization
(``"norm"``) the trainer measured before training (:func:`estimate_image_norm`).
"""
from __future__ import annotations

import numpy as np

from a3c_core.core import Preprocessor


class ObservationError(ValueError, TypeError):
    """An observation of the wrong type, shape, dtype, or with NaN/inf values.

    A subclass of both ``ValueError`` and ``TypeError``, so either catches it.
    """


class ObsPipeline:
    """Turn raw observations of shape ``raw_shape`` into network inputs.

    * ``{"kind": "image", "out_shape": [84, 84], "crop": null}``: uint8 gray
      (H, W) or RGB (H, W, 3) frames -> float32 (1, 84, 84) in [0, 1] (area
      resize, Cython kernel, no GIL);
    * ``{"kind": "vector"}``: any real numeric array -> float32 (D,)
      (flattened); NaN or inf entries are rejected.

    An image spec may add ``"norm": {"mean": [...], "std": s}``: the resized
    frame ``x`` becomes ``(x - mean) / s``, ``mean`` the per-pixel mean frame
    (``out_shape`` row-major) and ``s`` one number, the frames' standard
    deviation around it (see :func:`estimate_image_norm`).  A static
    background then reads as ~0 and what moves (a monster, the view) stands
    out at unit scale.

    Array-likes (lists, tuples) are accepted; anything else, a wrong shape or
    a wrong dtype raises :class:`ObservationError` naming the expected shape
    and dtype.
    """

    def __init__(self, preprocess_spec: dict, raw_shape):
        self.spec = dict(preprocess_spec)
        self.raw_shape = tuple(int(s) for s in raw_shape)
        self.kind = self.spec.get("kind")
        self._image = self.kind == "image"
        if self.kind == "image":
            out_shape = tuple(int(s) for s in self.spec.get("out_shape", (84, 84)))
            crop = self.spec.get("crop")
            self._prep = Preprocessor(self.raw_shape, out_shape, crop=tuple(crop) if crop else None)
            self.net_obs_shape = (1,) + out_shape
            self._n_pix = out_shape[0] * out_shape[1]
            self._mean, self._inv_std = parse_norm(self.spec.get("norm"), out_shape)
            if self._mean is not None:
                # (x - mean) / std in the resize's own nogil pass
                self._prep.set_norm(self._mean, float(self._inv_std))
            self.expects = f"a uint8 array of shape {self.raw_shape}"
        elif self.kind == "vector":
            if self.spec.get("norm") is not None:
                raise ValueError("preprocess spec: 'norm' applies to image observations only")
            self._prep = None
            self._mean = None
            self.net_obs_shape = (int(np.prod(self.raw_shape)),)
            self.expects = f"a real-valued (float32) array of shape {self.raw_shape}"
        else:
            raise ValueError(f"unknown preprocess kind {self.kind!r} (expected 'image' or 'vector')")

    def c_entry(self):
        """``(function address, context)`` of the compiled preprocessing, for a
        compiled caller that preprocesses frames itself (the worker's fused
        act kernel, :meth:`a3c_core.nn.network.Network.actor`): the
        preprocessor's C entry point, which applies exactly what
        :meth:`__call__` does to a uint8 frame of ``raw_shape``.  None for a
        pipeline without one (vector observations)."""
        if self._prep is None:
            return None
        return self._prep.c_entry()

    def check(self, raw) -> np.ndarray:
        """``raw`` as an ndarray of ``raw_shape`` and a usable dtype, or :class:`ObservationError`."""
        if not isinstance(raw, np.ndarray):
            if raw is None or np.isscalar(raw) or not hasattr(raw, "__len__") and not hasattr(raw, "__array__"):
                raise ObservationError(
                    f"observation must be {self.expects} (the raw env observation), "
                    f"got {type(raw).__name__}"
                )
            try:
                raw = np.asarray(raw)
            except (ValueError, TypeError) as e:  # ragged nested lists
                raise ObservationError(f"observation must be {self.expects}; "
                                       f"cannot convert the {type(raw).__name__}: {e}") from None
            if self.kind == "image" and raw.dtype.kind in "iu" and raw.size \
                    and raw.min() >= 0 and raw.max() <= 255:
                raw = raw.astype(np.uint8)
        if raw.dtype.kind not in "biuf":
            raise ObservationError(f"observation must be {self.expects}, got dtype {raw.dtype}")
        if raw.shape != self.raw_shape:
            raise ObservationError(
                f"observation has shape {raw.shape}, but this policy expects raw "
                f"observations of shape {self.raw_shape} ({self.expects})"
            )
        if self.kind == "image" and raw.dtype != np.uint8:
            raise ObservationError(f"image observations must be uint8, got {raw.dtype} "
                                   f"(expected {self.expects})")
        return raw

    def __call__(self, raw, out=None) -> np.ndarray:
        """Write the network input for ``raw`` into ``out`` (allocated if None)."""
        if out is None:
            out = np.empty(self.net_obs_shape, np.float32)
        if type(raw) is not np.ndarray or raw.shape != self.raw_shape \
                or (self._image and raw.dtype != np.uint8):
            raw = self.check(raw)
        if self._image:
            try:       # the kernel takes (1, H, W), (H, W) or (H*W,) rows as they are
                self._prep(raw, out)
            except ValueError:
                # other shapes of H*W contiguous values are reshaped; anything
                # else keeps the kernel's error (a reshape of a non-contiguous
                # out would write into a copy)
                if not out.flags.c_contiguous or out.size != self._n_pix:
                    raise
                self._prep(raw, out.reshape(self.net_obs_shape[1:]))
        else:
            if raw.dtype.kind not in "biuf":
                self.check(raw)
            out[:] = np.ravel(raw)
            if not np.isfinite(out).all():
                bad = np.flatnonzero(~np.isfinite(out))
                raise ObservationError(
                    f"observation contains {bad.size} non-finite value(s) (NaN or inf), the "
                    f"first at index {int(bad[0])}; the network would turn them into a NaN "
                    f"state that poisons every later step"
                )
        return out


#: the smallest ``std`` a measured image norm uses (one gray level in [0, 1]):
#: frames that never change would otherwise divide by ~0
IMAGE_NORM_MIN_STD = 1.0 / 255.0


def parse_norm(norm, out_shape):
    """``(mean (1, H, W) float32, 1 / std float32)`` from a spec's ``"norm"``, or
    ``(None, None)``; ValueError naming the problem for a malformed one (a
    corrupt checkpoint)."""
    if norm is None:
        return None, None
    if not isinstance(norm, dict) or "mean" not in norm or "std" not in norm:
        raise ValueError("preprocess spec 'norm' must be a dict with 'mean' and 'std'")
    try:
        mean = np.asarray(norm["mean"], np.float32)
        std = float(norm["std"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"preprocess spec 'norm' is not numeric: {e}") from None
    n = int(np.prod(out_shape))
    if mean.size != n:
        raise ValueError(f"preprocess spec 'norm': mean has {mean.size} values, the "
                         f"{out_shape[0]}x{out_shape[1]} frame has {n}")
    if not np.isfinite(mean).all() or not (np.isfinite(std) and std > 0):
        raise ValueError("preprocess spec 'norm': mean and std must be finite, std > 0")
    return mean.reshape((1,) + tuple(out_shape)), np.float32(1.0 / std)


def estimate_image_norm(frames) -> dict:
    """The ``"norm"`` of an image spec from network-input frames (each
    ``(1, H, W)`` or ``(H, W)`` float32, already resized): the per-pixel mean
    frame and one standard deviation, that of every pixel around its own
    mean, ``sqrt(mean over frames and pixels of (x - mean)^2)``, at least
    :data:`IMAGE_NORM_MIN_STD`.  Accumulated in float64; the mean is stored
    as float32 values (exact through JSON)."""
    total = sq = None
    n = 0
    for f in frames:
        f = np.asarray(f, np.float64).reshape(-1)
        if total is None:
            total = np.zeros_like(f)
            sq = np.zeros_like(f)
        total += f
        sq += f * f
        n += 1
    if n == 0:
        raise ValueError("estimate_image_norm: no frames")
    mean = total / n
    var = np.maximum(sq / n - mean * mean, 0.0).mean()
    std = max(float(np.sqrt(var)), IMAGE_NORM_MIN_STD)
    return {"mean": [float(v) for v in mean.astype(np.float32)], "std": std, "frames": n}
