#!/usr/bin/env bash
# Measure the first Policy.act in a new process of a READ-ONLY install (README
# "Python API"): install the wheel into a fresh venv, run `a3c compile`, then
# run a fresh process with the venv and $HOME bind-mounted read-only (root
# ignores file modes, so modes are not enough; needs root and `unshare -m`).
# Not part of CI. Usage: .ci/readonly_first_act.sh [WHEEL] [--no-compile]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wheel=${1:-}
if [[ -z "$wheel" || "$wheel" == --* ]]; then
    python3 -m pip wheel -q --no-deps -w "$work/dist" "$root"
    wheel=$(ls "$work"/dist/a3c_core-*.whl)
fi
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$wheel"
if [[ " $* " != *" --no-compile "* ]]; then
    "$work/venv/bin/a3c" compile
fi
mkdir -p "$work/home" "$work/data"
"$work/venv/bin/python" - "$work/data" <<'PY'
import sys, numpy as np
from a3c_core import Policy, build_network
d = sys.argv[1]
# a doom-lstm checkpoint as `a3c train --env doom:basic` writes it (random weights)
Policy.from_network(build_network("doom-lstm", (1, 84, 84), 3), (120, 160), env_id="doom:basic").save(d + "/p.npz")
np.save(d + "/frame.npy", np.random.default_rng(0).integers(0, 256, (120, 160), dtype=np.uint8))
PY
cat > "$work/data/act.py" <<'PY'
import sys, time
t0 = time.perf_counter()
import numpy as np
from a3c_core import Policy
p = Policy.load(sys.argv[1] + "/p.npz")
frame = np.load(sys.argv[1] + "/frame.npy")
t1 = time.perf_counter()
a, s = p.act(frame, p.initial_state(), greedy=True)
t2 = time.perf_counter()
print(f"import + load {t1 - t0:.2f} s, first act {t2 - t1:.3f} s")
PY
for i in 1 2 3; do
    unshare -m --propagation private sh -c '
        mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" &&
        mount --bind "$2" "$2" && mount -o remount,bind,ro "$2" &&
        exec env -u NUMBA_CACHE_DIR -u XDG_CACHE_HOME HOME="$2" "$1/bin/python" "$3/act.py" "$3"' \
        sh "$work/venv" "$work/home" "$work/data" 2>&1 | grep -v "^ *warnings.warn\|RuntimeWarning" || true
done
