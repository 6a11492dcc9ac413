# cython: language_level=3
"""Frame preprocessing: uint8 gray/RGB -> crop -> exact area resize -> float32 [0,1].

Area resize = box filter of each output pixel's footprint in source
coordinates: output pixel o along an axis of n_in source pixels and n_out
output pixels covers [o*n_in/n_out, (o+1)*n_in/n_out); each source pixel i
contributes the length of its overlap with that interval divided by
n_in/n_out.  Weights are computed exactly in integer units (lengths scaled by
n_out) and sum to 1, so any ratio (integer or not, odd sizes, upsampling)
works, and a constant image stays constant (up to float32 rounding).

The resize is separable: a vertical pass (uint8 rows -> one float32 row per
output row, vectorizable over columns, with the 1/255 scale and the RGB
luminance weights folded into the row weights) then a horizontal pass with a
fixed number of taps per output column.  Tables are built once per
:class:`Preprocessor`; ``__call__`` only validates and runs the nogil loop.
"""
import numpy as np

cimport numpy as cnp
from libc.stdlib cimport malloc, free

cnp.import_array()

# ITU-R BT.601 luma weights (the same as PIL's "L" conversion and OpenCV).
LUMA = (0.299, 0.587, 0.114)


def area_table(int n_in, int n_out):
    """(start[n_out] int32, weights[n_out, K] float64) for an exact area resize.

    Row o reads source pixels start[o] .. start[o]+K-1 with those weights
    (zero-padded, and start clamped so every read stays inside [0, n_in)).
    """
    if n_in < 1 or n_out < 1:
        raise ValueError(f"sizes must be >= 1, got n_in={n_in}, n_out={n_out}")
    taps = []
    for o in range(n_out):
        lo, hi = o * n_in, (o + 1) * n_in            # output span, units of 1/n_out
        i0, i1 = lo // n_out, -(-hi // n_out)         # source pixels touched
        ws = []
        for i in range(i0, i1):
            ov = min(hi, (i + 1) * n_out) - max(lo, i * n_out)
            if ov > 0:
                ws.append((i, ov / n_in))
        taps.append(ws)
    K = max(len(t) for t in taps)
    start = np.zeros(n_out, np.int32)
    weights = np.zeros((n_out, K), np.float64)
    for o, ws in enumerate(taps):
        s = min(ws[0][0], n_in - K)
        start[o] = s
        for i, w in ws:
            weights[o, i - s] = w
    return start, weights


cdef struct PrepTables:
    # everything the nogil resize reads: the frame geometry and the tables
    int H, W, C, Ho, Wo, top, left, Hc, Wc, Kr, Kc
    float lw[3]
    const int* rs
    const float* rw
    const int* cs
    const float* cw
    const float* nmean          # NULL: no normalization
    float ninv


cdef int _prep_entry(void* tables, const unsigned char* src, float* dst) noexcept nogil:
    """The C entry point :meth:`Preprocessor.c_entry` hands out: one frame
    through the tables at ``tables`` (a ``PrepTables``); 1, or 0 when the
    scratch row could not be allocated."""
    return _prep_run(<const PrepTables*>tables, src, dst)


cdef class Preprocessor:
    """Reusable frame preprocessor with cached area-resize tables.

    Parameters
    ----------
    in_shape : (H, W) for gray, (H, W, 1) gray, or (H, W, 3) RGB uint8 frames
        (channels last).  RGB is converted with luma 0.299 R + 0.587 G + 0.114 B.
    out_shape : (Ho, Wo), default (84, 84); smaller or larger than the crop.
    crop : optional (top, bottom, left, right) pixel margins removed first.

    ``pre(frame, out=None)`` writes float32 values in [0, 1] into ``out``
    (C-contiguous float32 with shape (Ho, Wo), (1, Ho, Wo) or (Ho*Wo,),
    e.g. a row of a rollout buffer) and returns it; without ``out`` a new
    (Ho, Wo) array is returned.  The call holds no per-call state on the
    instance, so one Preprocessor may be shared by threads.
    """
    cdef readonly tuple in_shape, out_shape
    cdef readonly object crop
    cdef int H, W, C, Ho, Wo, top, left, Hc, Wc, Kr, Kc
    cdef float lw[3]
    cdef cnp.ndarray _rs, _rw, _cs, _cw       # int32 / float32 tables
    cdef cnp.ndarray _nmean                   # float32 (Ho*Wo,) mean frame, or None
    cdef float _ninv
    cdef PrepTables _t                        # the above, as the nogil loop reads them

    def __init__(self, in_shape, out_shape=(84, 84), crop=None):
        in_shape = tuple(int(x) for x in in_shape)
        if len(in_shape) == 2:
            C = 1
        elif len(in_shape) == 3 and in_shape[2] in (1, 3):
            C = in_shape[2]
        else:
            raise ValueError(f"in_shape must be (H, W), (H, W, 1) or (H, W, 3), got {in_shape}")
        out_shape = tuple(int(x) for x in out_shape)
        if len(out_shape) != 2 or min(out_shape) < 1:
            raise ValueError(f"out_shape must be (Ho, Wo) with positive sizes, got {out_shape}")
        H, W = in_shape[0], in_shape[1]
        if H < 1 or W < 1:
            raise ValueError(f"in_shape must have positive sizes, got {in_shape}")
        if crop is None:
            t = b = l = r = 0
        else:
            crop = tuple(int(x) for x in crop)
            if len(crop) != 4 or min(crop) < 0:
                raise ValueError(f"crop must be (top, bottom, left, right) margins >= 0, got {crop}")
            t, b, l, r = crop
            if t + b >= H or l + r >= W:
                raise ValueError(f"crop {crop} leaves nothing of a {H}x{W} frame")
        self.in_shape, self.out_shape, self.crop = in_shape, out_shape, crop
        self.H, self.W, self.C = H, W, C
        self.Ho, self.Wo = out_shape
        self.top, self.left = t, l
        self.Hc, self.Wc = H - t - b, W - l - r
        rs, rw = area_table(self.Hc, self.Ho)
        cs, cw = area_table(self.Wc, self.Wo)
        self.Kr, self.Kc = rw.shape[1], cw.shape[1]
        self._rs = np.ascontiguousarray(rs, np.int32)
        self._rw = np.ascontiguousarray(rw / 255.0, np.float32)   # 1/255 folded in
        self._cs = np.ascontiguousarray(cs, np.int32)
        self._cw = np.ascontiguousarray(cw, np.float32)
        if C == 3:
            self.lw[0], self.lw[1], self.lw[2] = LUMA
        else:
            self.lw[0], self.lw[1], self.lw[2] = 1.0, 0.0, 0.0
        self._nmean = None
        self._ninv = 1.0
        self._fill_tables()

    cdef void _fill_tables(self):
        cdef PrepTables* t = &self._t
        t.H, t.W, t.C, t.Ho, t.Wo = self.H, self.W, self.C, self.Ho, self.Wo
        t.top, t.left, t.Hc, t.Wc, t.Kr, t.Kc = (self.top, self.left, self.Hc, self.Wc,
                                                 self.Kr, self.Kc)
        t.lw[0], t.lw[1], t.lw[2] = self.lw[0], self.lw[1], self.lw[2]
        t.rs = <const int*>cnp.PyArray_DATA(self._rs)
        t.rw = <const float*>cnp.PyArray_DATA(self._rw)
        t.cs = <const int*>cnp.PyArray_DATA(self._cs)
        t.cw = <const float*>cnp.PyArray_DATA(self._cw)
        t.nmean = NULL
        if self._nmean is not None:
            t.nmean = <const float*>cnp.PyArray_DATA(self._nmean)
        t.ninv = self._ninv

    def c_entry(self):
        """``(fn, tables)``: the address of a C function
        ``int fn(void* tables, const uint8_t* frame, float* out) nogil`` and of
        this instance's tables, for compiled callers (the worker's fused act
        kernel, ``nn.kernels.doom_act_packed``) that preprocess a frame
        inside their own GIL-free call.  ``frame``: a C-contiguous uint8
        frame of ``in_shape``; ``out``: ``Ho * Wo`` float32 values; nothing
        is checked there (check the arrays first, as ``__call__`` does).
        ``fn`` returns 1, or 0 when its scratch row could not be allocated.
        Valid while this instance lives; ``set_norm`` rewrites the tables in
        place (set it before another thread uses them, as for ``__call__``)."""
        return <size_t><void*>_prep_entry, <size_t><void*>&self._t

    def set_norm(self, mean, float inv_std=1.0):
        """Normalize every frame this writes: ``(x - mean) * inv_std``, ``mean``
        an (Ho, Wo) (or Ho*Wo) float32 mean frame, in the same nogil pass as
        the resize.  ``set_norm(None)`` turns it off.  Set it before the
        instance is shared by threads."""
        if mean is None:
            self._nmean = None
            self._fill_tables()
            return
        m = np.ascontiguousarray(mean, np.float32).reshape(-1)
        if m.shape[0] != self.Ho * self.Wo:
            raise ValueError(f"norm mean has {m.shape[0]} values, the {self.Ho}x{self.Wo} "
                             f"output has {self.Ho * self.Wo}")
        if not (inv_std > 0 and inv_std < float("inf")):
            raise ValueError(f"inv_std must be finite and > 0, got {inv_std}")
        self._nmean = m
        self._ninv = inv_std
        self._fill_tables()

    def spec(self):
        """JSON-able description, enough to rebuild it with :meth:`from_spec`."""
        return {"kind": "area", "in_shape": list(self.in_shape),
                "out_shape": list(self.out_shape),
                "crop": None if self.crop is None else list(self.crop)}

    @classmethod
    def from_spec(cls, d):
        if not isinstance(d, dict) or d.get("kind") != "area":
            raise ValueError(f"not a Preprocessor spec (need kind='area'): {d!r}")
        return cls(d["in_shape"], d.get("out_shape", (84, 84)), d.get("crop"))

    def __repr__(self):
        return (f"Preprocessor(in_shape={self.in_shape}, out_shape={self.out_shape}, "
                f"crop={self.crop})")

    def __call__(self, frame, out=None):
        cdef cnp.ndarray f, o
        if not cnp.PyArray_Check(frame):
            raise TypeError(f"frame must be a numpy.ndarray of uint8, got {type(frame).__name__}")
        f = <cnp.ndarray>frame
        if cnp.PyArray_TYPE(f) != cnp.NPY_UINT8:
            raise TypeError(f"frame must have dtype uint8, got {f.dtype}")
        if not self._shape_is(f, self.in_shape):
            raise ValueError(f"frame has shape {frame.shape}, this Preprocessor expects {self.in_shape}")
        if not cnp.PyArray_IS_C_CONTIGUOUS(f):
            raise ValueError("frame must be C-contiguous (use np.ascontiguousarray)")
        if out is None:
            o = cnp.PyArray_EMPTY(2, [self.Ho, self.Wo], cnp.NPY_FLOAT32, 0)
        else:
            if not cnp.PyArray_Check(out):
                raise TypeError(f"out must be a numpy.ndarray of float32, got {type(out).__name__}")
            o = <cnp.ndarray>out
            if cnp.PyArray_TYPE(o) != cnp.NPY_FLOAT32:
                raise TypeError(f"out must have dtype float32, got {o.dtype}")
            if not (self._shape_is(o, self.out_shape) or self._shape_is(o, (1,) + self.out_shape)
                    or self._shape_is(o, (self.Ho * self.Wo,))):
                raise ValueError(f"out has shape {out.shape}, expected {self.out_shape}")
            if not cnp.PyArray_IS_C_CONTIGUOUS(o) or not cnp.PyArray_ISALIGNED(o):
                raise ValueError("out must be C-contiguous and aligned")
            if not cnp.PyArray_ISWRITEABLE(o):
                raise ValueError("out must be writeable")
        cdef const unsigned char* src = <const unsigned char*>cnp.PyArray_DATA(f)
        cdef float* dst = <float*>cnp.PyArray_DATA(o)
        cdef int ok
        with nogil:
            ok = _prep_run(&self._t, src, dst)
        if not ok:
            raise MemoryError("preprocess scratch row")
        return o

    cdef bint _shape_is(self, cnp.ndarray a, tuple shape):
        cdef int nd = cnp.PyArray_NDIM(a), i
        if nd != len(shape):
            return False
        for i in range(nd):
            if cnp.PyArray_DIM(a, i) != <cnp.npy_intp>shape[i]:
                return False
        return True


cdef int _prep_run(const PrepTables* p, const unsigned char* src, float* dst) noexcept nogil:
    cdef int Wc = p.Wc, Wo = p.Wo, Kr = p.Kr, Kc = p.Kc, C = p.C
    cdef Py_ssize_t row_stride = <Py_ssize_t>p.W * C
    cdef const int* rs = p.rs
    cdef const float* rw = p.rw
    cdef const int* cs = p.cs
    cdef const float* cw = p.cw
    cdef const unsigned char* base = src + <Py_ssize_t>p.left * C
    cdef const unsigned char* row
    cdef float* tmp = <float*>malloc(<size_t>(Wc if Wc > 0 else 1) * sizeof(float))
    cdef float* orow
    cdef const float* cwo
    cdef const float* tp
    cdef float w, w0, w1, w2, acc
    cdef int oy, ox, k, x
    cdef const float* nmean = p.nmean
    cdef const float* nrow
    cdef float ninv = p.ninv
    if tmp == NULL:
        return 0
    for oy in range(p.Ho):
        # vertical pass: tmp[x] = sum_k rw[oy,k] * src[top+rs[oy]+k, left+x]
        for k in range(Kr):
            w = rw[oy * Kr + k]
            row = base + (p.top + rs[oy] + k) * row_stride
            if C == 3:
                w0 = w * p.lw[0]
                w1 = w * p.lw[1]
                w2 = w * p.lw[2]
                if k == 0:
                    for x in range(Wc):
                        tmp[x] = w0 * row[3 * x] + w1 * row[3 * x + 1] + w2 * row[3 * x + 2]
                else:
                    for x in range(Wc):
                        tmp[x] += w0 * row[3 * x] + w1 * row[3 * x + 1] + w2 * row[3 * x + 2]
            else:
                if k == 0:
                    for x in range(Wc):
                        tmp[x] = w * row[x]
                else:
                    for x in range(Wc):
                        tmp[x] += w * row[x]
        # horizontal pass: out[oy,ox] = sum_k cw[ox,k] * tmp[cs[ox]+k], clamped to 1
        orow = dst + <Py_ssize_t>oy * Wo
        if Kc == 2:                     # unrolled common cases (2-3 taps)
            for ox in range(Wo):
                cwo = cw + 2 * ox
                tp = tmp + cs[ox]
                acc = cwo[0] * tp[0] + cwo[1] * tp[1]
                orow[ox] = acc if acc < 1.0 else 1.0
        elif Kc == 3:
            for ox in range(Wo):
                cwo = cw + 3 * ox
                tp = tmp + cs[ox]
                acc = cwo[0] * tp[0] + cwo[1] * tp[1] + cwo[2] * tp[2]
                orow[ox] = acc if acc < 1.0 else 1.0
        else:
            for ox in range(Wo):
                cwo = cw + ox * Kc
                tp = tmp + cs[ox]
                acc = 0.0
                for k in range(Kc):
                    acc = acc + cwo[k] * tp[k]
                orow[ox] = acc if acc < 1.0 else 1.0
        if nmean != NULL:               # set_norm: the row is still in L1
            nrow = nmean + <Py_ssize_t>oy * Wo
            for ox in range(Wo):
                orow[ox] = (orow[ox] - nrow[ox]) * ninv
    free(tmp)
    return 1
