# cython: language_level=3
"""Flush-to-zero for the calling thread's floating-point arithmetic.

A float32 below ~1.2e-38 is *subnormal*; x86 cores take a microcode assist
on every operation that reads or produces one, tens of times the cost of a
normal one.  The LSTM backward makes them: a gradient carried back through
many steps decays geometrically, and self-imitation replays whole episodes
(200 steps and more on defend_the_line) from the zero state.  In
``a3c bench``'s self-imitation row, replaying 200-row episodes cost 300 us
per row at first and 1,500 us per row once the gate gradients held
subnormals (13k of the 205k in one replay); with them flushed the update
with its replays costs 2.5x the plain update instead of 3.8x
(docs/results.md, "Subnormal floats").

The mode is a per-thread register (x86-64: MXCSR's FTZ and DAZ bits, which
flush results and read inputs as zero; aarch64: FPCR's FZ bit), so setting
it in a worker thread changes nothing in any other thread.  Workers train
inside :func:`flush_denormals` (``Worker.run`` and the worker processes'
loop), which restores the thread's previous mode on exit.  Values this
small carry nothing an A3C update can use; TensorFlow's CPU thread pools
flush them the same way.
"""
import contextlib

cdef extern from *:
    """
    #if defined(__x86_64__) || defined(_M_X64) || defined(__SSE2__)
    #include <xmmintrin.h>
    #define A3C_FP_HAVE 1
    #define A3C_FP_FLUSH 0x8040u  /* MXCSR: FTZ (bit 15) | DAZ (bit 6) */
    static unsigned int a3c_fp_get(void) { return _mm_getcsr(); }
    static void a3c_fp_set(unsigned int v) { _mm_setcsr(v); }
    #elif defined(__aarch64__)
    #define A3C_FP_HAVE 1
    #define A3C_FP_FLUSH (1u << 24)  /* FPCR: FZ */
    static unsigned int a3c_fp_get(void) {
        unsigned long v; __asm__ __volatile__("mrs %0, fpcr" : "=r"(v)); return (unsigned int)v; }
    static void a3c_fp_set(unsigned int v) {
        unsigned long w = v; __asm__ __volatile__("msr fpcr, %0" : : "r"(w)); }
    #else
    #define A3C_FP_HAVE 0
    #define A3C_FP_FLUSH 0u
    static unsigned int a3c_fp_get(void) { return 0u; }
    static void a3c_fp_set(unsigned int v) { (void)v; }
    #endif
    """
    int A3C_FP_HAVE
    unsigned int A3C_FP_FLUSH
    unsigned int a3c_fp_get() noexcept nogil
    void a3c_fp_set(unsigned int v) noexcept nogil


#: True where this build can set the mode (x86-64, aarch64); elsewhere
#: :func:`flush_denormals` leaves the thread as it is
SUPPORTED = bool(A3C_FP_HAVE)
#: the mode bits :func:`flush_denormals` sets
FLUSH_BITS = int(A3C_FP_FLUSH)


def get_mode():
    """The calling thread's floating-point control register (0 where unsupported)."""
    return int(a3c_fp_get())


def set_mode(unsigned int mode):
    """Write the calling thread's floating-point control register."""
    a3c_fp_set(mode)


def flushing():
    """True when the calling thread flushes subnormal floats to zero."""
    return SUPPORTED and (a3c_fp_get() & A3C_FP_FLUSH) == A3C_FP_FLUSH


@contextlib.contextmanager
def flush_denormals():
    """Flush subnormal floats to zero in the calling thread for the ``with``
    block (results and inputs); the thread's previous flush bits come back
    after (the rest of the register, status flags included, is left as the
    block left it)."""
    cdef unsigned int old = a3c_fp_get() & A3C_FP_FLUSH
    a3c_fp_set(a3c_fp_get() | A3C_FP_FLUSH)
    try:
        yield
    finally:
        a3c_fp_set((a3c_fp_get() & ~A3C_FP_FLUSH) | old)
