"""`a3c bench`'s end-to-end and GIL rows for doom:basic as JSON, printed
short: the one Python step the device scripts (bench/device_*.sh) share.

    python bench/device_rows.py e2e WORKERS SECONDS WARMUP ENVS_PER_WORKER OUT_JSON [processes]
    python bench/device_rows.py gil SECONDS WARMUP ENVS_PER_WORKER OUT_JSON [BENCH_PY]
    python bench/device_rows.py table E2E_JSON...

``e2e``: training steps/s from scratch at each of WORKERS (``1,4,8``),
worker threads, or worker processes with ``processes``;
``gil``: the GIL probe beside one worker.  BENCH_PY: read the probe from
that ``a3c_core/bench.py`` (loaded by path) instead of the imported
package's, so that one estimator reads two trees' engines.  ``table``:
the steps/s rows of several ``e2e`` files named ``..._T1.json``,
``..._P1.json`` (threads or processes, then the pair), one line per
worker count with the processes/threads ratio of each pair.
"""
from __future__ import annotations

import importlib.util
import json
import re
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
        if argv[6:7] == ["processes"]:
            more = (int(k), True)
        elif argv[6:]:
            print(f"device_rows.py e2e: unknown mode {argv[6]!r} (only 'processes')", file=sys.stderr)
            return 2
        rows = _bench().bench_e2e("doom:basic", "doom-lstm", ws, float(seconds), float(warmup), *more)
        shown = ("train steps", "scaling")
    elif len(argv) >= 5 and argv[0] == "gil":
        _, seconds, warmup, k, out = argv[:5]
        bench = _bench(argv[5] if len(argv) > 5 else None)
        more = (int(k),) if int(k) != 1 else ()
        rows = bench.bench_gil("doom:basic", "doom-lstm", float(seconds), float(warmup), *more)
        shown = ("",)
    elif len(argv) >= 2 and argv[0] == "table":
        return table(argv[1:])
    else:
        print("usage:\n" + "\n".join(__doc__.strip().splitlines()[2:5]), file=sys.stderr)
        return 2
    dicts = [r.to_dict() for r in rows]
    for r in dicts:
        if r["name"].startswith(shown):
            print(f"{r['name']:40s} median {r['median']:9.2f} min {r['min']:9.2f} max {r['max']:9.2f}"
                  f"  {r['notes'][:160]}")
    with open(out, "w") as fh:
        json.dump(dicts, fh, indent=1)
    return 0


def table(paths):
    """Print steps/s per worker count: threads and processes by pair
    (``_T1``/``_P1``, ``_T2``/``_P2``, ... from the file names), each pair's
    processes / threads ratio."""
    pat = re.compile(r"_([TP])(\d+)\.json$")
    got = {}                              # workers -> {(mode, pair): mean steps/s}
    for path in paths:
        m = pat.search(path)
        if not m:
            print(f"device_rows.py table: {path}: the name must end in _T<pair>.json or "
                  f"_P<pair>.json", file=sys.stderr)
            return 2
        try:
            with open(path) as fh:
                doc = json.load(fh)
            rows = doc["rows"] if isinstance(doc, dict) else doc
            found = [(r["workers"], r["mean"]) for r in rows
                     if r["name"].startswith("train steps/s w")]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"device_rows.py table: {path}: not an e2e rows file "
                  f"({type(exc).__name__}: {exc})", file=sys.stderr)
            return 2
        for w, mean in found:
            got.setdefault(w, {})[(m.group(1), int(m.group(2)))] = mean
    for w in sorted(got):
        d = got[w]
        pairs = sorted({p for _, p in d})
        cells = "  ".join(f"T{p} {d[('T', p)]:8.0f}  P{p} {d[('P', p)]:8.0f}  P/T {d[('P', p)] / d[('T', p)]:.2f}"
                          if ('T', p) in d and ('P', p) in d else f"pair {p} incomplete"
                          for p in pairs)
        print(f"{w:3d} workers: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
