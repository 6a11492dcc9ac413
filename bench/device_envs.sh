#!/usr/bin/env bash
# Several envs per worker (`--envs-per-worker K`) on a 16-core machine
# (issue 12), as one prepared command for a lent machine that has Python,
# numpy, numba, Cython and setuptools but no package registry.
#
#   bash bench/device_envs.sh OUT_DIR WHEEL_DIR TRAINED_RUN
#
# WHEEL_DIR and TRAINED_RUN as in device_scaling.sh.  Steps, each logged
# under OUT_DIR:
#   1. machine facts; build the Cython extensions in place; warm the Numba
#      cache (both LSTM backward variants) outside the timed windows;
#   2. ("probe") `a3c bench`'s GIL probe, one worker, K = 1, 8, 1, 8;
#   3. ("pairs") end-to-end training steps/s (doom:basic from scratch) at
#      WORKERS for K = 1 and KE (default 4), in the order K1 KE KE K1, each
#      window opening once every worker is updating;
#   4. ("conv") converged throughput (the trained checkpoint, ~6-step
#      episodes) at 16 workers: paper, paper@4, auto, auto@4.
# STEPS (default "probe pairs conv"; "k8" adds K = 8 at 12 and 16 workers;
# "nowarm" as the first step skips the warm-up), WORKERS (1,4,8,12,16),
# E2E_SECONDS (5) and PROBE_SECONDS (6) choose and shorten it.  On the
# 16-core Xeon of 2026-11-26 the steps took: build and warm-up ~40 s,
# probe ~70 s, pairs ~250 s, k8 ~75 s, conv over 2 minutes; give the call
# 9 minutes for the default, or split it.  It writes more files than the
# lent machine hands back (8): write OUT_DIR outside $OUT and tar it there.
set -u
OUT=${1:?usage: device_envs.sh OUT_DIR WHEEL_DIR TRAINED_RUN}
WHL=${2:-}
RUN=${3:?TRAINED_RUN}
case " ${STEPS:-probe pairs conv} " in    # checked before any device time is spent
    *" conv "*) [ -f "$RUN/checkpoints/latest.npz" ] && [ -f "$RUN/config.toml" ] || {
        echo "device_envs.sh: $RUN is not a trained run directory (config.toml, checkpoints/latest.npz)" >&2
        exit 2; } ;;
esac
RUN=$(cd "$RUN" && pwd)
WORKERS=${WORKERS:-1,4,8,12,16}
KE=${KE:-4}
SECONDS_E2E=${E2E_SECONDS:-5}
SECONDS_PROBE=${PROBE_SECONDS:-6}
. "$(dirname "$0")/device_common.sh"

facts
. "$(dirname "$0")/device_setup.sh"

[ "${STEPS:-}" = "${STEPS#nowarm}" ] && { stamp warm
for k in 1 2; do
    $PY -c "from a3c_core import bench; bench.bench_e2e('doom:basic', 'doom-lstm', [1], 1.0, 0.5, $k)" \
        >"$OUT/warm_k$k.log" 2>&1 &
done
wait; }

ROWS=$(cd "$(dirname "$0")" && pwd)/device_rows.py
probe() {  # probe K TAG
    stamp "probe K=$1"
    $PY "$ROWS" gil "$SECONDS_PROBE" 2.0 "$1" "$OUT/probe_k$1_$2.json"
}
e2e() {  # e2e K WORKERS TAG
    stamp "e2e K=$1 workers $2"
    $PY "$ROWS" e2e "$2" "$SECONDS_E2E" 2.0 "$1" "$OUT/e2e_k$1_$3.json"
}
for step in ${STEPS:-probe pairs conv}; do
    case $step in
        probe) probe 1 a; probe 8 a; probe 1 b; probe 8 b ;;
        pairs) e2e 1 "$WORKERS" a; e2e "$KE" "$WORKERS" a; e2e "$KE" "$WORKERS" b; e2e 1 "$WORKERS" b ;;
        k8) e2e 8 12,16 a ;;
        conv) stamp "converged w16"
              $PY bench/converged_throughput.py "$RUN" --workers 16 --seconds 5 --warmup 2 \
                  --repeats 1 --modes paper,paper@4,auto,auto@4 --json "$OUT/conv_w16.json" 2>&1 | tail -8 ;;
        nowarm) ;;
        *) echo "unknown step $step"; exit 2 ;;
    esac
done
stamp done
