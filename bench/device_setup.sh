# Shared setup of the device scripts (bench/device_scaling.sh, device_gil.sh,
# device_envs.sh, device_procs.sh), sourced after bench/device_common.sh
# (PY, OUT, stamp) and WHL are set:
# installs the wheels in WHL (if any) under /tmp/a3c_site, builds the Cython
# extensions in place (no install; the lent machine has no package
# registry) and points PYTHONPATH and the Numba cache at the result.
if [ -n "$WHL" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/a3c_site "$WHL"/*.whl || exit 1
    export PYTHONPATH=/tmp/a3c_site${PYTHONPATH:+:$PYTHONPATH}
    export PATH=/tmp/a3c_site/bin:$PATH
fi
$PY -c "import sys, numpy, numba, Cython, setuptools, vizdoom, gymnasium; print(sys.version.split()[0], 'numpy', numpy.__version__, 'numba', numba.__version__, 'Cython', Cython.__version__, 'vizdoom', vizdoom.__version__)" || exit 1
stamp build
$PY setup.py -q build_ext --inplace -j 8 >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export NUMBA_CACHE_DIR=/tmp/a3c_numba_cache
