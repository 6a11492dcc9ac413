"""`a3c bench`'s end-to-end and GIL rows for doom:basic as JSON, printed
short: the one Python step the device scripts (bench/device_*.sh) share.

    python bench/device_rows.py e2e WORKERS SECONDS WARMUP ENVS_PER_WORKER OUT_JSON
    python bench/device_rows.py gil SECONDS WARMUP ENVS_PER_WORKER OUT_JSON [BENCH_PY]

``e2e``: training steps/s from scratch at each of WORKERS (``1,4,8``);
``gil``: the GIL probe beside one worker.  BENCH_PY: read the probe from
that ``a3c_core/bench.py`` (loaded by path) instead of the imported
package's, so that one estimator reads two trees' engines.
"""
from __future__ import annotations

import importlib.util
import json
import sys


def _bench(path=None):
    if not path:
        from a3c_core import bench
        return bench
    spec = importlib.util.spec_from_file_location("a3c_probe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv):
    if len(argv) >= 6 and argv[0] == "e2e":
        _, workers, seconds, warmup, k, out = argv[:6]
        ws = [int(w) for w in workers.split(",")]
        more = (int(k),) if int(k) != 1 else ()     # (a tree before envs_per_worker takes none)
        rows = _bench().bench_e2e("doom:basic", "doom-lstm", ws, float(seconds), float(warmup), *more)
        shown = ("train steps", "scaling")
    elif len(argv) >= 5 and argv[0] == "gil":
        _, seconds, warmup, k, out = argv[:5]
        bench = _bench(argv[5] if len(argv) > 5 else None)
        more = (int(k),) if int(k) != 1 else ()
        rows = bench.bench_gil("doom:basic", "doom-lstm", float(seconds), float(warmup), *more)
        shown = ("",)
    else:
        print("usage:\n" + "\n".join(__doc__.strip().splitlines()[3:5]), file=sys.stderr)
        return 2
    dicts = [r.to_dict() for r in rows]
    for r in dicts:
        if r["name"].startswith(shown):
            print(f"{r['name']:40s} median {r['median']:9.2f} min {r['min']:9.2f} max {r['max']:9.2f}"
                  f"  {r['notes'][:160]}")
    with open(out, "w") as fh:
        json.dump(dicts, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
