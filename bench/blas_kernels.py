"""Which OpenBLAS kernels numpy runs, and the sgemm rate of each choice.

    python bench/blas_kernels.py [--coretypes unset,Haswell,SkylakeX] [--n 1024] [--repeat 10]

For each ``OPENBLAS_CORETYPE`` value (``unset``: the variable removed, so
OpenBLAS picks the kernels for the CPU itself) a fresh Python process loads
numpy and reports the kernel set OpenBLAS chose (``threadpoolctl``'s
``architecture``) and the median float32 GEMM rate of one BLAS thread on
``n`` x ``n`` matrices (after 3 warm-up products).  OpenBLAS reads the
variable once, when it is loaded, which is why each value needs its own
process.  Never run it beside a training run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import json, statistics, sys, time
import numpy as np
import threadpoolctl
n, repeat = int(sys.argv[1]), int(sys.argv[2])
with threadpoolctl.threadpool_limits(1):
    arch = [d.get("architecture") for d in threadpoolctl.threadpool_info()
            if d.get("user_api") == "blas"]
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    c = np.empty_like(a)
    for _ in range(3):
        np.dot(a, a, out=c)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.dot(a, a, out=c)
        ts.append(time.perf_counter() - t0)
print(json.dumps({"architecture": arch, "gflops": 2 * n ** 3 / statistics.median(ts) / 1e9}))
"""


def measure(coretype, n, repeat):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype != "unset":
        env["OPENBLAS_CORETYPE"] = coretype
    out = subprocess.run([sys.executable, "-c", _CHILD, str(n), str(repeat)], env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"OPENBLAS_CORETYPE={coretype}: the measuring process failed "
                           f"(exit {out.returncode}): {tail}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--coretypes", default="unset,Haswell,SkylakeX",
                    help="comma-separated OPENBLAS_CORETYPE values ('unset': none)")
    ap.add_argument("--n", type=int, default=1024, help="matrix size (default 1024)")
    ap.add_argument("--repeat", type=int, default=10, help="timed products (default 10)")
    a = ap.parse_args(argv)
    if a.n < 1 or a.repeat < 1:
        ap.error("--n and --repeat must be >= 1")
    print(f"OPENBLAS_CORETYPE here: {os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    print(f"{'OPENBLAS_CORETYPE':>20}  {'kernels':>16}  sgemm {a.n}^3 GFLOP/s")
    for ct in [c.strip() for c in a.coretypes.split(",") if c.strip()]:
        try:
            r = measure(ct, a.n, a.repeat)
        except RuntimeError as e:
            print(f"blas_kernels: {e}", file=sys.stderr)
            continue
        arch = ",".join(str(x) for x in r["architecture"]) or "(no BLAS found)"
        print(f"{ct:>20}  {arch:>16}  {r['gflops']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
