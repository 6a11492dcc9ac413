"""Two threads applying the optimizer at once, per-update time vs one thread.

    python bench/two_thread_apply.py [adam|rmsprop] [--rounds 12]

Interleaved in one process, medians over rounds of K=20 applies per thread
(1.2M float32 params, the doom-lstm size):

* ``one``: one thread alone;
* ``same``: two threads on the shared arrays, both sweeps starting at element 0;
* ``stagger``: two threads on the shared arrays, thread i starting at i*n/2
  (what the trainer does);
* ``private``: two threads, each on its own arrays (no sharing: the memory
  bandwidth floor).
"""
import argparse
import threading
import time

import numpy as np

from a3c_core.core import make_optimizer

N, K = 1_200_436, 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("optimizer", nargs="?", default="adam")
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    grads = [np.random.default_rng(i).standard_normal(N).astype(np.float32) * 1e-3 for i in range(2)]
    shared_p, shared_opt = np.zeros(N, np.float32), make_optimizer(args.optimizer, N)
    own = [(np.zeros(N, np.float32), make_optimizer(args.optimizer, N)) for _ in range(2)]

    def work(k, mode, barrier, out):
        p, opt = own[k] if mode == "private" else (shared_p, shared_opt)
        off = k * N // 2 if mode == "stagger" else 0
        barrier.wait()
        t0 = time.perf_counter()
        for _ in range(K):
            opt.apply(p, grads[k], offset=off)
        out[k] = time.perf_counter() - t0

    def measure(n_threads, mode):
        barrier, out = threading.Barrier(n_threads), {}
        ts = [threading.Thread(target=work, args=(k, mode, barrier, out)) for k in range(n_threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return max(out.values()) / K * 1e6

    res = {m: [] for m in ("one", "same", "stagger", "private")}
    for _ in range(args.rounds):
        res["one"].append(measure(1, "same"))
        for m in ("same", "stagger", "private"):
            res[m].append(measure(2, m))
    one = np.median(res["one"])
    for m, v in res.items():
        print(f"{args.optimizer:8s} {m:8s} {np.median(v):7.0f} us/update  "
              f"(min {np.min(v):.0f}, max {np.max(v):.0f})  {np.median(v) / one:.2f}x one thread")


if __name__ == "__main__":
    main()
