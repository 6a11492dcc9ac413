#!/usr/bin/env bash
# The device runner: training throughput on a lent many-core machine, the
# trainer's worker threads against its worker processes, one prepared
# command for a machine with Python, numpy, numba, Cython and setuptools
# but no package registry.
#
#   bash bench/device.sh OUT_DIR [WHEEL_DIR] [TRAINED_RUN]
#   bash bench/device.sh --help
#
# WHEEL_DIR: wheels the machine lacks (vizdoom, gymnasium,
# farama-notifications for its Python; setuptools >= 77 where its own is
# older, for pyproject's license string), installed under /tmp/a3c_site.
# TRAINED_RUN: a trained doom:basic run directory (for the converged rows).
# JOBS=FILE (environment) runs training jobs instead of steps 1-3: each line
# "NAME CORES ARGS..." is `a3c train ARGS` pinned to its own CORES cores
# (taskset, consecutive ranges), all at once, each in JOB_DIR/NAME (default
# /tmp/a3c_runs);
# their logs, configs, episodes.csv and metrics.csv come back as
# OUT/runs.tar.gz (checkpoints and TensorBoard files left out).
# BUDGET=S (with JOBS) runs the jobs one after another instead, each on
# cores 0..CORES-1, within S seconds from the first job's start: a job
# without --total-seconds, or whose --total-seconds runs past what is
# left, gets what is left (its start, a few seconds, comes on top), and
# one is skipped with under MIN_JOB (default 60) seconds left.
# A job "NAME CORES --resume JOB_DIR/NAME --total-seconds T ..." goes on
# with a run an earlier call left on a still-warm machine: its log is
# appended to, and under BUDGET its T (the run's training time in all, as
# `a3c train --resume` counts it) is capped at what it had plus what is left.
# COMPILE_SPECS: the network specs the Numba cache is built for before
# the jobs (default "doom-lstm").
#
# Steps (the shared start first: machine facts into OUT/machine.txt, the
# wheels, the Cython extensions built in place, a Numba cache in /tmp):
# 1. for each worker count in WORKERS (default "1 8 16"): `a3c bench`'s
#    end-to-end rows (doom:basic from scratch, SECONDS_RUN seconds, default
#    6), one per envs per worker in ENVS (default "1 8": the paper's worker
#    and the batched one), as threads, processes, processes, threads
#    (T1 P1 P2 T2), each as OUT/e2e_w<W>_<tag>.json;
# 2. with TRAINED_RUN: converged throughput at CONV_WORKERS (default 16)
#    workers, threads and processes (bench/converged_throughput.py);
# 3. one table: steps/s per worker count, envs per worker and pair,
#    processes / threads.
# About 4 minutes on a 16-core Xeon with ENVS=1 (each K adds about as much). docs/benchmarks.md says how to use it.
set -u
case "${1:-}" in
    -h|--help|"") sed -n '2,/^set -u/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; [ -n "${1:-}" ]; exit $? ;;
esac
OUT=$1
WHL=${2:-}
if [ -n "${JOBS:-}" ]; then     # a bad jobs file fails here, before the build spends device time
    [ -r "$JOBS" ] || { echo "device.sh: JOBS file not readable: $JOBS" >&2; exit 2; }
    while read -r name cores _; do
        case "$name" in ""|\#*) continue ;; esac
        [[ "$cores" =~ ^[1-9][0-9]*$ ]] || {
            echo "device.sh: $JOBS: job '$name' needs a core count > 0 after its name, got '$cores'" >&2
            exit 2; }
    done <"$JOBS"
    for v in BUDGET MIN_JOB; do
        [ -z "${!v:-}" ] || [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || {
            echo "device.sh: $v must be a whole number of seconds > 0, got '${!v}'" >&2; exit 2; }
    done
fi
RUN=${3:-}
WORKERS=${WORKERS:-1 8 16}
ENVS=${ENVS:-1 8}
[[ "$ENVS" =~ ^[1-9][0-9]*( +[1-9][0-9]*)*$ ]] || {
    echo "device.sh: ENVS must be envs-per-worker counts > 0 separated by spaces, got '$ENVS'" >&2; exit 2; }
SECS=${SECONDS_RUN:-6}
B=$(cd "$(dirname "$0")" && pwd)
cd "$B/.." || exit 1

# --- shared start ---------------------------------------------------------
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "== $(( $(date +%s) - t0 )) s: $*"; }
stamp facts
{ nproc; lscpu; free -g; cat /sys/kernel/mm/transparent_hugepage/enabled \
  /sys/kernel/mm/transparent_hugepage/shmem_enabled; } >"$OUT/machine.txt" 2>&1
grep -E "^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|L2|L3)" \
    "$OUT/machine.txt"
if [ -n "$WHL" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/a3c_site "$WHL"/*.whl || exit 1
    export PYTHONPATH=/tmp/a3c_site${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -c "import sys, numpy, numba, vizdoom; print(sys.version.split()[0], 'numpy', numpy.__version__, 'numba', numba.__version__, 'vizdoom', vizdoom.__version__)" || exit 1
stamp build
$PY setup.py -q build_ext --inplace -j 8 >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export NUMBA_CACHE_DIR=/tmp/a3c_numba_cache

# --- training jobs (JOBS=FILE) -------------------------------------------------
if [ -n "${JOBS:-}" ]; then
    stamp "numba cache"          # once, before the jobs would compile side by side
    specs=()
    for sp in ${COMPILE_SPECS:-doom-lstm}; do specs+=(--spec "$sp"); done
    $PY -m a3c_core compile "${specs[@]}" | tail -1
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "device.sh: the Numba cache failed (COMPILE_SPECS='${COMPILE_SPECS:-doom-lstm}'); no job was started" >&2; exit 2; }
    jd=${JOB_DIR:-/tmp/a3c_runs}
    mkdir -p "$jd"
    # shellcheck disable=SC2086  # ARGS is a flag list
    job() {   # a resumed run's log goes on; any other job's starts empty
        [[ " $3 " =~ \ --resume[\ =] ]] || : >"$jd/$2.log"
        taskset -c "$1" $PY -m a3c_core train $3 --quiet --run-dir "$jd/$2" >>"$jd/$2.log" 2>&1; }
    pack() { tar czf "$OUT/runs.tar.gz" --exclude=checkpoints --exclude=tb -C "$(dirname "$jd")" "$(basename "$jd")"; }
    core=0
    tj=$(date +%s)
    while read -r name cores args; do
        case "$name" in ""|\#*) continue ;; esac
        if [ -n "${BUDGET:-}" ]; then   # one after another, within BUDGET seconds
            left=$(( BUDGET - ($(date +%s) - tj) ))
            if [ "$left" -lt "${MIN_JOB:-60}" ]; then stamp "$name skipped: ${left} s left"; continue; fi
            cap=$left   # a resumed run's --total-seconds counts its training so far as well
            if [[ " $args " =~ \ --resume[\ =]([^ ]+) ]]; then
                done_s=$(sed -n 's/^ *"seconds": *\([0-9]*\).*/\1/p' "${BASH_REMATCH[1]}/summary.json" 2>/dev/null)
                cap=$((left + ${done_s:-0}))
            fi
            if ! [[ " $args " =~ --total-seconds[\ =]([0-9]+) ]] || [ "${BASH_REMATCH[1]}" -gt "$cap" ]; then
                args="$args --total-seconds $cap"   # argparse: the last one counts
            fi
            stamp "$name on cores 0-$((cores - 1)): a3c train $args"
            job "0-$((cores - 1))" "$name" "$args"
            stamp "$name done (rc $?)"
            pack      # after each job, so a call cut short still returns the finished ones
            continue
        fi
        last=$((core + cores - 1))
        stamp "$name on cores $core-$last: a3c train $args"
        job "$core-$last" "$name" "$args" &
        core=$((last + 1))
    done <"$JOBS"
    wait
    stamp "jobs done"
    tail -n 3 "$jd"/*.log
    pack
    exit 0
fi

# --- 1. end-to-end rows, T P P T -------------------------------------------
for w in $WORKERS; do
    for tag in T1 P1 P2 T2; do
        mode=()
        [ "${tag:0:1}" = P ] && mode=(--worker-processes)
        stamp "e2e, $w workers, $tag"
        $PY -m a3c_core bench --quick --skip-env --skip-gil --repeat 1 --workers "$w" \
            --envs-per-worker "${ENVS// /,}" \
            --seconds "$SECS" "${mode[@]}" --json "$OUT/e2e_w${w}_$tag.json" \
            | grep -E "train steps/s" || exit 1
    done
done

# --- 2. converged throughput -----------------------------------------------
if [ -n "$RUN" ]; then
    cw=${CONV_WORKERS:-16}
    stamp "converged, $cw workers"
    $PY "$B/converged_throughput.py" "$RUN" --workers "$cw" --seconds 8 --warmup 3 \
        --repeats 2 --modes auto,auto+p --json "$OUT/converged.json" 2>&1 | tail -8
fi

# --- 3. table ---------------------------------------------------------------
stamp table
$PY - "$OUT"/e2e_w*_*.json <<'EOF'
import json, re, sys
got = {}
for path in sys.argv[1:]:
    m = re.search(r"_w(\d+)_([TP])(\d)\.json$", path)
    doc = json.load(open(path))
    rows = doc["rows"] if isinstance(doc, dict) else doc
    for r in rows:
        k = re.fullmatch(r"train steps/s w\d+(?: k(\d+))?", r["name"])
        if k:
            key = (int(m.group(1)), int(k.group(1) or 1))
            got.setdefault(key, {})[(m.group(2), int(m.group(3)))] = r["median"]
for w, k in sorted(got):
    d = got[w, k]
    cells = "  ".join(f"T{p} {d[('T', p)]:8.0f}  P{p} {d[('P', p)]:8.0f}  P/T {d[('P', p)] / d[('T', p)]:.2f}"
                      for p in (1, 2) if ("T", p) in d and ("P", p) in d)
    print(f"{w:3d} workers, K = {k:2d} envs each: {cells}")
EOF
stamp done
