#!/usr/bin/env bash
# This tree against an older one (BASE_DIR, e.g. `git archive 99a4ddf`, the
# tree of the first 16-core measurements) on a lent 16-core machine, in one
# call, alternating the two so that the machine's state hits both alike
# (issue 12).  Each tree is built in place and run with PYTHONPATH at it.
#
#   bash bench/device_compare.sh OUT_DIR WHEEL_DIR TRAINED_RUN BASE_DIR [WORKERS]
#
# WHEEL_DIR and TRAINED_RUN as in device_scaling.sh.  WORKERS defaults to
# 1,4,8,12,16.  Steps, each logged under OUT_DIR:
#   1. machine facts; build both trees (in parallel);
#   2. the GIL probe (this tree's `bench_gil`, 1 worker) on each tree;
#   3. end-to-end training steps/s (`bench_e2e`: doom:basic from scratch,
#      long episodes) at WORKERS, base then new, then new then base;
#   4. converged throughput (trained checkpoint, ~6-step episodes, the
#      paper's rollouts in both trees) at 2, 8 and 16 workers, alternating;
#   5. the new tree's micro-benchmarks (`a3c bench --quick --skip-e2e`);
#   6. the new tree's default rollouts (`auto`), converged, at 8 and 16.
# E2E_SECONDS, CONV_WORKERS and AUTO_WORKERS shorten it for a dry run.
# STEPS="holds model" runs instead bench/gil_holds.py on base, new, base,
# new (the new tree's script on both engines), then the new tree's quick
# `a3c bench` at WORKERS and bench/scaling_model.py on its JSON.
set -u
OUT=${1:?usage: device_compare.sh OUT_DIR WHEEL_DIR TRAINED_RUN BASE_DIR [WORKERS]}
WHL=${2:-}
RUN=${3:?TRAINED_RUN}
BASE=$(cd "${4:?BASE_DIR}" && pwd)
WORKERS=${5:-1,4,8,12,16}
SECONDS_E2E=${E2E_SECONDS:-8}
NEW=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "$0")/device_common.sh"

facts
if [ -n "$WHL" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/a3c_site "$WHL"/*.whl || exit 1
    export PYTHONPATH=/tmp/a3c_site${PYTHONPATH:+:$PYTHONPATH}
fi
SITE=${PYTHONPATH:-}
stamp build
(cd "$NEW" && $PY setup.py -q build_ext --inplace -j 4 >"$OUT/build_new.log" 2>&1) &
(cd "$BASE" && $PY setup.py -q build_ext --inplace -j 4 >"$OUT/build_base.log" 2>&1) &
wait
for t in new base; do
    tail -3 "$OUT/build_$t.log"
done
export NUMBA_CACHE_DIR=/tmp/a3c_numba_cache

# run TREE(new|base) PYTHON-ARGS...: python with that tree first on the path
run() {
    local tree=$1; shift
    local dir=$NEW; [ "$tree" = base ] && dir=$BASE
    (cd "$dir" && PYTHONPATH=$dir${SITE:+:$SITE} $PY "$@")
}
for t in new base; do
    run $t -c "import a3c_core, numpy, numba; print('$t', a3c_core.__file__, a3c_core.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__)" || exit 1
done

e2e() {  # e2e TREE WORKERS TAG
    stamp "e2e $1 $2"
    run "$1" "$NEW/bench/device_rows.py" e2e "$2" "$SECONDS_E2E" 3.0 1 "$OUT/e2e_$1_$3.json"
}
gil() {  # gil TREE
    stamp "gil $1"
    # the new tree's probe (bench.py loaded by path) on either tree's engine,
    # so that both are read by the same estimator
    run "$1" "$NEW/bench/device_rows.py" gil 8.0 3.0 1 "$OUT/gil_$1.json" "$NEW/a3c_core/bench.py"
}
conv() {  # conv TREE WORKERS MODE
    stamp "converged $1 w$2 $3"
    run "$1" bench/converged_throughput.py "$RUN" --workers "$2" --seconds 6 --warmup 3 \
        --repeats 1 --modes "$3" --json "$OUT/conv_$1_w$2_$3.json" 2>&1 | tail -2
}

# warm the Numba caches (first compile) outside the timed windows
stamp warm
run new -c "from a3c_core import bench; bench.bench_e2e('doom:basic', 'doom-lstm', [1], 1.0, 0.5)" >/dev/null 2>&1 &
run base -c "from a3c_core import bench; bench.bench_e2e('doom:basic', 'doom-lstm', [1], 1.0, 0.5)" >/dev/null 2>&1 &
wait

holds() {  # holds TREE: direct GIL timing of a worker (stand-in env), the new tree's script
    stamp "gil_holds $1"
    run "$1" "$NEW/bench/gil_holds.py" --rollouts 200 --repeats 3 2>&1 | tee "$OUT/holds_$1.txt" | head -1
}
model() {  # model: the new tree's quick a3c bench at WORKERS, then scaling_model.py on it
    stamp "bench $WORKERS"
    run new -m a3c_core bench --quick --seconds 4 --workers "$WORKERS" --json "$OUT/bench_new.json" \
        >"$OUT/bench_new.log" 2>&1
    grep -E "^(train steps/s|GIL us|learner us/agent step  )" "$OUT/bench_new.log"
    run new bench/scaling_model.py "$OUT/bench_new.json" --workers "$WORKERS" 2>&1 \
        | tee "$OUT/model_new.txt" | tail -12
}
comparison() {
    gil base; gil new
    e2e base "$WORKERS" a; e2e new "$WORKERS" a
    e2e new "$WORKERS" b; e2e base "$WORKERS" b
    RUNABS=$(cd "$RUN" && pwd); RUN=$RUNABS
    for w in ${CONV_WORKERS-2 8 16}; do
        conv base $w default; conv new $w paper
    done
    stamp micro
    run new -m a3c_core bench --quick --skip-e2e --skip-env --json "$OUT/micro_new.json" 2>&1 \
        | tee "$OUT/micro_new.log" | grep -E "step|learner|update|GIL" | head -30
    for w in ${AUTO_WORKERS-8 16}; do
        conv new $w auto
    done
}
# STEPS: "comparison" (the default), "holds" (gil_holds base, new, base, new),
# "model" (quick a3c bench + scaling model), or several, space-separated
for step in ${STEPS:-comparison}; do
    case $step in
        comparison) comparison ;;
        holds) holds base; holds new; holds base; holds new ;;
        model) model ;;
        *) echo "unknown step $step"; exit 2 ;;
    esac
done
stamp done
