"""Raw environment observation -> network input, shared by trainer, eval and Policy.

The pipeline is described by the env's ``preprocess_spec`` (saved in every
checkpoint), so a deployed :class:`~a3c_core.Policy` applies exactly the
preprocessing the agent was trained with.
"""
from __future__ import annotations

import numpy as np


class ObsPipeline:
    """Turn raw observations of shape ``raw_shape`` into network inputs.

    * ``{"kind": "image", "out_shape": [84, 84], "crop": null}``: uint8 gray
      (H, W) or RGB (H, W, 3) frames -> float32 (1, 84, 84) in [0, 1] (area
      resize, Cython kernel, no GIL);
    * ``{"kind": "vector"}``: any numeric array -> float32 (D,) (flattened).
    """

    def __init__(self, preprocess_spec: dict, raw_shape, raw_dtype="uint8"):
        self.spec = dict(preprocess_spec)
        self.raw_shape = tuple(int(s) for s in raw_shape)
        self.kind = self.spec.get("kind")
        if self.kind == "image":
            from a3c_core.core import Preprocessor

            out_shape = tuple(int(s) for s in self.spec.get("out_shape", (84, 84)))
            crop = self.spec.get("crop")
            self._prep = Preprocessor(self.raw_shape, out_shape, crop=tuple(crop) if crop else None)
            self.net_obs_shape = (1,) + out_shape
        elif self.kind == "vector":
            self._prep = None
            self.net_obs_shape = (int(np.prod(self.raw_shape)),)
        else:
            raise ValueError(f"unknown preprocess kind {self.kind!r} (expected 'image' or 'vector')")

    def check(self, raw) -> np.ndarray:
        raw = np.asarray(raw)
        if raw.shape != self.raw_shape:
            raise ValueError(
                f"observation has shape {raw.shape}, but this policy expects raw "
                f"observations of shape {self.raw_shape} ({self.kind})"
            )
        return raw

    def __call__(self, raw, out=None) -> np.ndarray:
        """Write the network input for ``raw`` into ``out`` (allocated if None)."""
        if out is None:
            out = np.empty(self.net_obs_shape, np.float32)
        if self.kind == "image":
            if raw.shape != self.raw_shape or raw.dtype != np.uint8:
                raw = self.check(raw)
                if raw.dtype != np.uint8:
                    raise ValueError(f"image observations must be uint8, got {raw.dtype}")
            self._prep(raw, out.reshape(self.net_obs_shape[1:]))
        else:
            if raw.shape != self.raw_shape:
                self.check(raw)
            out[:] = np.ravel(raw)
        return out
