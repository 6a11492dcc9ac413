#!/usr/bin/env bash
# What the GIL costs at N workers on a many-core machine (issue 12): the
# stand-in worker as N threads of one process against N processes sharing
# the parameters and Adam's moments (bench/standin_scaling.py --mode), and
# where one worker holds the GIL with the real doom:basic engine
# (bench/gil_holds.py --doom).  One prepared command for a lent machine
# with Python, numpy, numba, Cython and setuptools but no package registry:
#
#   bash bench/device_procs.sh OUT_DIR [WHEEL_DIR]
#
# WHEEL_DIR as in device_scaling.sh (vizdoom, gymnasium wheels).  WORKERS
# (default 1,8,16) and SECONDS_RUN (4) choose the points; each N runs
# threads, processes, processes, threads.  ENV_ID (e.g. doom:basic) plays
# that env instead of the stand-in; KS (default "1") the envs per worker,
# each K in turn; HOLDS=0 skips gil_holds.  ~3 minutes on the 16-core Xeon
# for the defaults.
set -u
OUT=${1:?usage: device_procs.sh OUT_DIR [WHEEL_DIR]}
WHL=${2:-}
WORKERS=${WORKERS:-1,8,16}
SECS=${SECONDS_RUN:-4}
. "$(dirname "$0")/device_common.sh"

facts
. "$(dirname "$0")/device_setup.sh"
B=$(cd "$(dirname "$0")" && pwd)

ENVARG=()
[ -n "${ENV_ID:-}" ] && ENVARG=(--env "$ENV_ID")
for k in ${KS:-1}; do
    for modes in threads,processes processes,threads; do
        stamp "${ENV_ID:-stand-in}, $k env(s) per worker: $modes at $WORKERS"
        $PY "$B/standin_scaling.py" --workers "$WORKERS" --seconds "$SECS" --warmup 2 \
            --mode $modes --envs-per-worker "$k" "${ENVARG[@]}"
    done
done
if [ "${HOLDS:-1}" = 1 ]; then
    stamp "gil_holds --doom (one worker, direct timing)"
    $PY "$B/gil_holds.py" --doom --rollouts 300 --repeats 3
fi
stamp done
