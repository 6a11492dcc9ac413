# The common start of the device scripts (bench/device_*.sh), sourced once
# OUT is set: unbuffered Python output, PY (PYTHON or python3), OUT made,
# stamp "what" (seconds since the start), and facts: the machine's lscpu,
# memory and THP settings into OUT/machine.txt, its main lines printed.
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "== $(( $(date +%s) - t0 )) s: $*"; }
facts() {
    stamp facts
    { nproc; lscpu; free -g; cat /sys/kernel/mm/transparent_hugepage/enabled \
      /sys/kernel/mm/transparent_hugepage/shmem_enabled; } >"$OUT/machine.txt" 2>&1
    grep -E "^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\)|L2|L3)" \
        "$OUT/machine.txt"
}
