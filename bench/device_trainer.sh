#!/usr/bin/env bash
# The trainer's worker threads against its worker processes
# (`--worker-processes`) on a many-core machine (issue 12): what
# bench/device_procs.sh measured with bench/standin_scaling.py's bare
# workers, measured through the trainer itself (monitor, episode pipes,
# shared counters and normalizers).  One prepared command for a lent
# machine with Python, numpy, numba, Cython and setuptools but no package
# registry:
#
#   bash bench/device_trainer.sh OUT_DIR [WHEEL_DIR] [TRAINED_RUN]
#
# WHEEL_DIR and TRAINED_RUN as in device_scaling.sh.  For each worker count
# in WORKERS (default "8 16"): `a3c bench`'s end-to-end row (doom:basic
# from scratch, SECONDS_RUN seconds, default 6, after 2 s; `python
# bench/device_rows.py e2e`) as threads, processes, processes, threads,
# each written as JSON.  With TRAINED_RUN also the
# converged throughput at CONV_WORKERS (default 16) workers, threads and
# processes alternating (bench/converged_throughput.py --modes
# auto,auto+p).  Then one table of steps/s per mode and pair.  About 4
# minutes on the 16-core Xeon of the earlier sessions.
set -u
OUT=${1:?usage: device_trainer.sh OUT_DIR [WHEEL_DIR] [TRAINED_RUN]}
WHL=${2:-}
RUN=${3:-}
WORKERS=${WORKERS:-8 16}
SECS=${SECONDS_RUN:-6}
. "$(dirname "$0")/device_common.sh"

facts
. "$(dirname "$0")/device_setup.sh"
B=$(cd "$(dirname "$0")" && pwd)

for w in $WORKERS; do
    for tag in T1 P1 P2 T2; do
        mode=()
        [ "${tag:0:1}" = P ] && mode=(processes)
        stamp "e2e, $w workers, $tag"
        $PY "$B/device_rows.py" e2e "$w" "$SECS" 2 1 "$OUT/e2e_w${w}_$tag.json" "${mode[@]}" \
            || exit 1
    done
done
if [ -n "$RUN" ]; then
    cw=${CONV_WORKERS:-16}
    stamp "converged, $cw workers"
    $PY "$B/converged_throughput.py" "$RUN" --workers "$cw" --seconds 8 --warmup 3 \
        --repeats 2 --modes auto,auto+p --json "$OUT/converged.json" 2>&1 | tail -8
fi
stamp table
$PY "$B/device_rows.py" table "$OUT"/e2e_w*_*.json
stamp done
