#!/usr/bin/env bash
# Where the GIL time goes on a 16-core machine, and e2e scaling with longer
# windows (issue 12); the second prepared command for a lent machine (see
# bench/device_setup.sh for the setup it shares with device_scaling.sh).
#
#   bash bench/device_gil.sh OUT_DIR [WHEEL_DIR]
#
# WHEEL_DIR as in device_scaling.sh, plus a py-spy wheel.  Steps:
#   1. single-core cache/memory read bandwidth at 0.5, 4.8 (doom-lstm's
#      float32 parameters) and 64 MB;
#   2. bench/gil_parts.py: the probe's GIL time per part of a worker step,
#      and bench/gil_budget.py: the bound without a probe;
#   3. py-spy --gil on a 1-worker doom:basic training run: which Python
#      frames hold the GIL (raw collapsed stacks);
#   4. a3c bench --quick --seconds 10 --skip-gil --skip-env at 1..16 workers.
set -u
OUT=${1:?usage: device_gil.sh OUT_DIR [WHEEL_DIR]}
WHL=${2:-}
. "$(dirname "$0")/device_common.sh"
. "$(dirname "$0")/device_setup.sh"

stamp bandwidth
$PY - <<'PY'
import time, numpy as np
from threadpoolctl import threadpool_limits
threadpool_limits(1)
for mb in (0.5, 4.8, 64):
    a = np.ones(int(mb * 2**20 / 4), np.float32); b = np.empty_like(a)
    n = max(5, int(2000 / mb))
    for name, f, k in (("dot", lambda: np.dot(a, a), 1), ("copy", lambda: np.copyto(b, a), 2)):
        for _ in range(3): f()
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n): f()
            ts.append((time.perf_counter() - t) / n)
        dt = sorted(ts)[2]
        print(f"1-core {name:4s} {mb:5.1f} MB: {k * a.nbytes / dt / 1e9:6.1f} GB/s ({dt * 1e6:.0f} us)")
PY

stamp gil_parts
$PY bench/gil_parts.py --seconds 3 2>&1 | tee "$OUT/gil_parts.txt" | tail -14
stamp gil_budget
$PY bench/gil_budget.py --json "$OUT/gil_budget.json" 2>&1 | tee "$OUT/gil_budget.txt" | tail -12

stamp py-spy
rm -rf /tmp/r1
$PY -m a3c_core train --workers 1 --total-seconds 40 --no-tensorboard --quiet --run-dir /tmp/r1 >"$OUT/train_w1.log" 2>&1 &
pid=$!
sleep 12
py-spy record --pid $pid --gil --nonblocking -r 400 -d 12 -f raw -o "$OUT/pyspy_gil_w1.txt" >"$OUT/pyspy.log" 2>&1 || tail -5 "$OUT/pyspy.log"
py-spy record --pid $pid --nonblocking -r 400 -d 8 -f raw -o "$OUT/pyspy_all_w1.txt" >>"$OUT/pyspy.log" 2>&1 || tail -5 "$OUT/pyspy.log"
kill -INT $pid; wait $pid
tail -3 "$OUT/train_w1.log"

stamp e2e
$PY -m a3c_core bench --quick --seconds 10 --skip-gil --skip-env --workers 1,4,6,8,10,12,16 \
    --json "$OUT/e2e.json" 2>&1 | tee "$OUT/e2e.log" | grep -E "^(train steps/s|scaling|step \(|learner us)"
stamp done
