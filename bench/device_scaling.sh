#!/usr/bin/env bash
# Throughput scaling from 1 to 16 worker threads on a 16-core machine
# (issue 12), as one prepared command for a lent machine that has Python,
# numpy, numba, Cython and setuptools but no package registry.
#
#   bash bench/device_scaling.sh OUT_DIR [WHEEL_DIR] [TRAINED_RUN]
#
# WHEEL_DIR holds wheels the machine lacks (vizdoom, gymnasium and
# farama-notifications for its Python); TRAINED_RUN is a trained doom:basic
# run directory (config.toml + checkpoints/latest.npz) for the converged
# (short-episode) throughput.  Steps, each logged under OUT_DIR:
#   1. machine facts (lscpu, THP, versions);
#   2. build the Cython extensions in place (no install);
#   3. `a3c bench` with end-to-end points at 1, 2, 4, 8, 12, 16 workers
#      (JSON + log), then bench/scaling_model.py's projection from the same
#      JSON, so measured and projected sit side by side;
#   4. converged throughput at 1, 2, 4, 8, 16 workers (default rollout mode).
set -u
OUT=${1:?usage: device_scaling.sh OUT_DIR [WHEEL_DIR] [TRAINED_RUN]}
WHL=${2:-}
RUN=${3:-}
. "$(dirname "$0")/device_common.sh"

facts

. "$(dirname "$0")/device_setup.sh"

stamp bench
$PY -m a3c_core bench --workers 1,2,4,8,12,16 --json "$OUT/bench16.json" 2>&1 | tee "$OUT/bench16.log" | grep -vE "^\s*$" | tail -60
stamp model
$PY bench/scaling_model.py "$OUT/bench16.json" --workers 1,2,4,8,12,16 2>&1 | tee "$OUT/model_raw.txt"
$PY bench/scaling_model.py "$OUT/bench16.json" --workers 1,2,4,8,12,16 \
    --gil-row "GIL us/step (probe noise subtracted)" 2>&1 | tee "$OUT/model_net.txt"

if [ -n "$RUN" ]; then
    for w in 1 2 4 8 16; do
        stamp "converged w$w"
        $PY bench/converged_throughput.py "$RUN" --workers $w --seconds 8 --warmup 3 \
            --repeats 1 --modes default --json "$OUT/conv_w$w.json" 2>&1 | tail -4
    done
fi
stamp done
