# cython: language_level=3
"""Direct float32 convolution for batched inference (``Network.step_batch``).

``conv_direct(x, w, stride, out)``: ``out[n, oy, ox, o] = sum over (ky, kx, c)
of x[n, c, oy*stride + ky, ox*stride + kx] * w[ky, kx, c, o]`` (no padding, no
bias).  ``x`` is any 4-D float32 ``(N, C, H, W)`` view (its strides are read,
so NCHW rows and an NHWC array seen through ``transpose(0, 3, 1, 2)`` both
work); ``w`` is ``(KH, KW, C, O)`` C-contiguous, ``out`` ``(N, OH, OW, O)``
C-contiguous (NHWC, the layout the rollout path's conv output has), and ``O``
a multiple of 16 (16, 32 or 64).

Why it exists: for the batched step the im2col + BLAS GEMM path spends its
time on the im2col copy and on a GEMM whose 16- or 32-column output keeps
OpenBLAS well below peak (docs/results.md#embedding).  Here each output
position's channels are one, two or four 16-float vectors held in registers
for a block of up to 10 positions along the row; the kernel window is walked
once per block, each step one weight-vector load and one broadcast FMA per
position (the register-blocked direct convolution oneDNN uses on x86).  The
block width is a compile-time constant per instantiation, so the
accumulators stay in registers.  The source is C with GCC vector extensions
(GCC and Clang) compiled for AVX-512 (one zmm per vector, blocks of up to 20
accumulators), run where ``__builtin_cpu_supports`` finds AVX-512F and FMA
(:data:`ISA`).  Elsewhere :data:`ISA` is None and callers keep im2col + GEMM:
the same source built for AVX2 (a 16-float vector as two ymm, 16 registers)
measured 73 and 677 us per image for the doom convs against 9.8 and 10.5 with
AVX-512 (2026-11-28), far slower than the GEMM path, so there is no AVX2
driver.
The kernel sums each output over (ky, kx, c) in the im2col column order.
Results agree with the im2col path to float32 rounding; they are not
promised bit for bit.
"""
import numpy as np

cimport numpy as cnp

cnp.import_array()

cdef extern from *:
    """
    #include <stddef.h>
    #if defined(__GNUC__) || defined(__clang__)
    #  define A3C_CONV_VEC 1
    typedef float a3c_v16 __attribute__((vector_size(64)));
    typedef float a3c_v16u __attribute__((vector_size(64), aligned(4), __may_alias__));
    #  define A3C_INLINE static inline __attribute__((always_inline))
    #else
    #  define A3C_CONV_VEC 0
    #  define A3C_INLINE static
    #endif

    #if A3C_CONV_VEC
    /* P output positions along a row x V 16-float channel vectors; xb points
       at the block's first input pixel (row oy*s, column ox0*s, channel 0),
       sp is the input distance between neighbouring output positions. */
    #define A3C_BLOCK(V, P)                                                        \\
    A3C_INLINE void a3c_conv_blk_##V##_##P(                                        \\
            const float *xb, ptrdiff_t sy, ptrdiff_t sx, ptrdiff_t sc,             \\
            ptrdiff_t sp, int KH, int KW, int C, const float *w, float *out) {     \\
        a3c_v16 acc[P][V];                                                         \\
        _Pragma("GCC unroll 16") for (int p = 0; p < P; p++)                       \\
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++)                    \\
                acc[p][v] = (a3c_v16){0};                                          \\
        for (int ky = 0; ky < KH; ky++) {                                          \\
            for (int kx = 0; kx < KW; kx++) {                                      \\
                const float *xk = xb + ky * sy + kx * sx;                          \\
                const float *wk = w + (ptrdiff_t)(ky * KW + kx) * C * (V * 16);    \\
                for (int c = 0; c < C; c++) {                                      \\
                    a3c_v16 wv[V];                                                 \\
                    _Pragma("GCC unroll 4") for (int v = 0; v < V; v++)            \\
                        wv[v] = *(const a3c_v16u *)(wk + c * (V * 16) + v * 16);   \\
                    const float *xc = xk + c * sc;                                 \\
                    _Pragma("GCC unroll 16") for (int p = 0; p < P; p++) {         \\
                        float xs = xc[p * sp];                                     \\
                        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++)        \\
                            acc[p][v] += xs * wv[v];                               \\
                    }                                                              \\
                }                                                                  \\
            }                                                                      \\
        }                                                                          \\
        _Pragma("GCC unroll 16") for (int p = 0; p < P; p++)                       \\
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++)                    \\
                *(a3c_v16u *)(out + (p * V + v) * 16) = acc[p][v];                 \\
    }
    #define A3C_BLOCKS_UPTO5(V) A3C_BLOCK(V, 1) A3C_BLOCK(V, 2) A3C_BLOCK(V, 3) \\
        A3C_BLOCK(V, 4) A3C_BLOCK(V, 5)
    A3C_BLOCKS_UPTO5(1) A3C_BLOCK(1, 6) A3C_BLOCK(1, 7) A3C_BLOCK(1, 8)
    A3C_BLOCK(1, 9) A3C_BLOCK(1, 10)
    A3C_BLOCKS_UPTO5(2) A3C_BLOCK(2, 6) A3C_BLOCK(2, 7) A3C_BLOCK(2, 8) A3C_BLOCK(2, 9)
    A3C_BLOCKS_UPTO5(4)

    #define A3C_CASE(V, P) case P: a3c_conv_blk_##V##_##P(xb, sy, sx, sc, sp, KH, KW, C, w, o); break;
    #endif

    /* The driver, with its block widths PB1, PB2, PB4 (positions per block
       for V = 1, 2, 4 channel vectors): the accumulators (P*V vectors) must
       fit AVX-512's 32 zmm registers (P*V <= 20).  Callers check
       a3c_conv_isa() first. */
    #if A3C_CONV_VEC
    #define A3C_DRIVER(NAME, ATTR, PB1, PB2, PB4)                                   \\
    ATTR static int NAME(                                                            \\
            const float *x, ptrdiff_t sn, ptrdiff_t sc, ptrdiff_t sy, ptrdiff_t sx,  \\
            int N, int C, int KH, int KW, int s, int OH, int OW, int O,              \\
            const float *w, float *out) {                                            \\
        int V = O / 16;                                                              \\
        if (O % 16 || !(V == 1 || V == 2 || V == 4)) return -1;                      \\
        int PB = V == 1 ? PB1 : V == 2 ? PB2 : PB4;                                  \\
        ptrdiff_t sp = (ptrdiff_t)s * sx;                                            \\
        for (int n = 0; n < N; n++) {                                                \\
            for (int oy = 0; oy < OH; oy++) {                                        \\
                const float *xr = x + n * sn + (ptrdiff_t)oy * s * sy;               \\
                float *orow = out + (((ptrdiff_t)n * OH + oy) * OW) * O;             \\
                for (int ox0 = 0; ox0 < OW; ox0 += PB) {                             \\
                    int P = OW - ox0 < PB ? OW - ox0 : PB;                           \\
                    const float *xb = xr + ox0 * sp;                                 \\
                    float *o = orow + (ptrdiff_t)ox0 * O;                            \\
                    if (V == 1) {                                                    \\
                        switch (P) {                                                 \\
                            A3C_CASE(1, 1) A3C_CASE(1, 2) A3C_CASE(1, 3)             \\
                            A3C_CASE(1, 4) A3C_CASE(1, 5) A3C_CASE(1, 6)             \\
                            A3C_CASE(1, 7) A3C_CASE(1, 8) A3C_CASE(1, 9)             \\
                            A3C_CASE(1, 10)                                          \\
                        }                                                            \\
                    } else if (V == 2) {                                             \\
                        switch (P) {                                                 \\
                            A3C_CASE(2, 1) A3C_CASE(2, 2) A3C_CASE(2, 3)             \\
                            A3C_CASE(2, 4) A3C_CASE(2, 5) A3C_CASE(2, 6)             \\
                            A3C_CASE(2, 7) A3C_CASE(2, 8) A3C_CASE(2, 9)             \\
                        }                                                            \\
                    } else {                                                         \\
                        switch (P) {                                                 \\
                            A3C_CASE(4, 1) A3C_CASE(4, 2) A3C_CASE(4, 3)             \\
                            A3C_CASE(4, 4) A3C_CASE(4, 5)                            \\
                        }                                                            \\
                    }                                                                \\
                }                                                                    \\
            }                                                                        \\
        }                                                                            \\
        return 0;                                                                    \\
    }
    #endif

    #if A3C_CONV_VEC && (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    A3C_DRIVER(a3c_conv_avx512, __attribute__((target("avx512f,avx2,fma"))), 10, 9, 5)
    /* 2: AVX-512F and FMA, 0: not (callers use the GEMM path) */
    static int a3c_conv_isa(void) {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return 2;
        return 0;
    }
    static int a3c_conv_direct(
            const float *x, ptrdiff_t sn, ptrdiff_t sc, ptrdiff_t sy, ptrdiff_t sx,
            int N, int C, int KH, int KW, int s, int OH, int OW, int O,
            const float *w, float *out, int isa) {
        if (isa == 2) return a3c_conv_avx512(x, sn, sc, sy, sx, N, C, KH, KW, s, OH, OW, O, w, out);
        return -1;
    }
    #else
    static int a3c_conv_isa(void) { return 0; }
    static int a3c_conv_direct(
            const float *x, ptrdiff_t sn, ptrdiff_t sc, ptrdiff_t sy, ptrdiff_t sx,
            int N, int C, int KH, int KW, int s, int OH, int OW, int O,
            const float *w, float *out, int isa) {
        return -1;
    }
    #endif
    """
    int a3c_conv_isa()
    int a3c_conv_direct(const float *x, Py_ssize_t sn, Py_ssize_t sc, Py_ssize_t sy,
                        Py_ssize_t sx, int N, int C, int KH, int KW, int s, int OH, int OW,
                        int O, const float *w, float *out, int isa) nogil


cdef int _ISA = a3c_conv_isa()

#: the instruction set the kernel runs with here: "avx512" (AVX-512F with FMA)
#: or None (no direct convolution: callers keep the im2col + GEMM path)
ISA = {2: "avx512"}.get(_ISA)


def supported(int out_channels):
    """Whether :func:`conv_direct` runs here for this many output channels."""
    return _ISA > 0 and out_channels in (16, 32, 64)


def conv_direct(const float[:, :, :, :] x, const float[:, :, :, ::1] w, int stride,
                float[:, :, :, ::1] out):
    """``out = conv(x, w)`` (see the module docstring); releases the GIL."""
    cdef Py_ssize_t n = x.shape[0], c = x.shape[1], h = x.shape[2], wd = x.shape[3]
    cdef int kh = <int>w.shape[0], kw = <int>w.shape[1], o = <int>w.shape[3]
    cdef int oh, ow, rc
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if w.shape[2] != c:
        raise ValueError(f"weight has {w.shape[2]} input channels, x has {c}")
    if h < kh or wd < kw:
        raise ValueError(f"input {h}x{wd} is smaller than the {kh}x{kw} kernel")
    oh = <int>((h - kh) // stride + 1)
    ow = <int>((wd - kw) // stride + 1)
    if out.shape[0] != n or out.shape[1] != oh or out.shape[2] != ow or out.shape[3] != o:
        raise ValueError(f"out must have shape {(n, oh, ow, o)}, got "
                         f"{(out.shape[0], out.shape[1], out.shape[2], out.shape[3])}")
    if n == 0:
        return
    cdef Py_ssize_t isz = sizeof(float)
    with nogil:
        rc = a3c_conv_direct(&x[0, 0, 0, 0], x.strides[0] // isz, x.strides[1] // isz,
                             x.strides[2] // isz, x.strides[3] // isz, <int>n, <int>c, kh, kw,
                             stride, oh, ow, o, &w[0, 0, 0, 0], &out[0, 0, 0, 0], _ISA)
    if rc != 0:
        raise ValueError(f"direct convolution runs on x86 with AVX-512 (and FMA) in a "
                         f"GCC/Clang build, for 16, 32 or 64 output channels (got {o}, "
                         f"instruction set {ISA})")
