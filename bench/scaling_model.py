"""Project training throughput to 4-32 worker threads from one `a3c bench` run.

    a3c bench --json bench.json && python bench/scaling_model.py bench.json [--t-max 20]

Three ceilings, each from a figure the bench measured on this machine
(``--processes``: two, worker processes share no GIL):

* **cores**: a worker and its env alternate (the worker waits for the env
  step, the env waits for the action), so one worker keeps about one core
  busy and N workers on N cores run at ``N x steps/s(1 worker)``;
* **GIL**: the GIL-held time per agent step ``g`` (the probe's ``GIL us/step``,
  or with ``--gil-row`` its noise-subtracted row, which leaves out the
  probe's own jitter, see ``bench/gil_calibrate.py``; or ``--gil-us`` a
  figure from elsewhere, e.g. ``bench/gil_budget.py``'s bound) serializes: all workers together cannot exceed ``1 / g`` steps/s (Amdahl);
  below that a worker also waits while the N - 1 others hold it, modelled as
  an M/D/1 queue: each step is slowed by the mean wait ``g u / (2 (1 - u))``
  at the others' GIL utilization ``u`` (solved as a fixed point);
* **memory bandwidth**: bytes moved per agent step ``B`` over the machine's
  copy bandwidth (``memory bandwidth`` row).  ``B`` counts what no cache
  holds: once the workers' local copies (4 bytes x n_params each) exceed the
  last-level cache (``--l3-mb``, 32 here: 7 doom-lstm copies) the forward
  reads the weights from memory each step (4n); and per update (every t_max steps) the backward reads them
  again and writes the gradient (8n), the norm pass reads it (4n) and the
  fused Adam apply reads grads, m, v, params and writes m, v, params and the
  local copy (32n): ``B = 4n + 44n / t_max``.

The projection is the smallest ceiling, with the GIL queueing slow-down
applied to the core ceiling.  It ignores the shared L3, SMT and the main
thread; the 2-worker point measured on this machine is printed beside its
projection as the check.  Bandwidth scales with the machine: pass
``--bandwidth`` to project for another (e.g. a 16-core server's STREAM copy).
"""
from __future__ import annotations

import argparse
import json
import sys


def rows_by_name(doc):
    return {r["name"]: r for r in doc["rows"]}


def project(sps1, gil_us, bw_gbs, n_params, t_max, workers, l3_mb=32.0):
    g = gil_us * 1e-6
    out = []
    for n in workers:
        # the per-step weight reads come from DRAM once the workers' local
        # copies no longer fit in the last-level cache
        fits = n * 4 * n_params <= l3_mb * (1 << 20)
        B = (0 if fits else 4 * n_params) + 44 * n_params / t_max
        cores = n * sps1
        # a step waits for the GIL held by the n - 1 others: fixed point of
        # s = s0 + wait(u), u = (n - 1) g / s (M/D/1 mean wait g u / (2 (1 - u)))
        s0 = s = 1 / sps1
        for _ in range(200):
            u = min((n - 1) * g / s, 0.99)
            s = s0 + g * u / (2 * (1 - u))
        cores_q = n / s
        gil = 1 / g if g > 0 else float("inf")
        mem = bw_gbs * 1e9 / B
        best = min(cores_q, gil, mem)
        bound = {cores_q: "cores (+GIL wait)", gil: "GIL", mem: "memory bandwidth"}[best]
        out.append({"workers": n, "cores": cores, "cores_gil_wait": cores_q, "gil": gil,
                    "memory": mem, "projected": best, "bound": bound,
                    "gil_utilization": cores * g, "bytes_per_step": B})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bench_json")
    p.add_argument("--t-max", type=int, default=20)
    p.add_argument("--n-params", type=int, default=1_200_436, help="doom-lstm's 1,200,436")
    p.add_argument("--bandwidth", type=float, default=None,
                   help="GB/s to project with (default: the bench's memory bandwidth row)")
    p.add_argument("--workers", default="1,2,4,8,16,32")
    p.add_argument("--l3-mb", type=float, default=32.0, help="last-level cache, MB (32 here)")
    p.add_argument("--gil-row", default="GIL us/step",
                   help="the bench row that gives g: 'GIL us/step' (the probe's raw figure, "
                        "the default) or 'GIL us/step (probe noise subtracted)'")
    p.add_argument("--gil-us", type=float, default=None,
                   help="g in us per agent step instead of a bench row, e.g. the bound "
                        "bench/gil_budget.py gives plus the env's share")
    p.add_argument("--processes", action="store_true",
                   help="worker processes (--worker-processes): no GIL is shared, g = 0")
    a = p.parse_args(argv)
    if a.gil_us is not None and not a.gil_us > 0:
        p.error(f"--gil-us must be > 0, got {a.gil_us}")
    if a.processes:
        if a.gil_us is not None:
            p.error("--processes shares no GIL: not with --gil-us")
        a.gil_us = 0.0
    with open(a.bench_json) as f:
        rows = rows_by_name(json.load(f))
    need = ["train steps/s w1"] + ([] if a.gil_us is not None else [a.gil_row])
    missing = [k for k in need if k not in rows]
    if missing:
        p.error(f"{a.bench_json} has no {missing} rows (run a3c bench without --skip-e2e/--skip-gil)")
    sps1 = rows["train steps/s w1"]["median"]
    gil = a.gil_us if a.gil_us is not None else rows[a.gil_row]["median"]
    bw = a.bandwidth or (rows["memory bandwidth"]["median"] if "memory bandwidth" in rows else None)
    if bw is None:
        p.error("no memory bandwidth row in the JSON; pass --bandwidth GB/s")
    workers = [int(x) for x in a.workers.split(",")]
    res = project(sps1, gil, bw, a.n_params, a.t_max, workers, a.l3_mb)
    print(f"inputs: {sps1:,.0f} steps/s with 1 worker, GIL {gil:.1f} us/step, "
          f"bandwidth {bw:.1f} GB/s (n_params {a.n_params:,}, t_max {a.t_max}, L3 {a.l3_mb:g} MB)\n")
    print("| workers | MB/step | cores ceiling | with GIL wait | GIL ceiling | memory ceiling | projected | bound by |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in res:
        print(f"| {r['workers']} | {r['bytes_per_step'] / 1e6:.2f} | {r['cores']:,.0f} | "
              f"{r['cores_gil_wait']:,.0f} | {r['gil']:,.0f} | {r['memory']:,.0f} | "
              f"**{r['projected']:,.0f}** | {r['bound']} |")
    for n in (2,):
        key = f"train steps/s w{n}"
        if key in rows:
            proj = next(r["projected"] for r in res if r["workers"] == n) if n in workers else None
            if proj:
                print(f"\ncheck: {n} workers measured {rows[key]['median']:,.0f} steps/s, "
                      f"projected {proj:,.0f} ({rows[key]['median'] / proj:.2f} of it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
