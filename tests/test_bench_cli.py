"""Smoke tests of ``a3c bench`` and its FLOP counter (no throughput claims)."""
import json
import os

import numpy as np

import pytest

from a3c_core import timing
from a3c_core.bench import cli, e2e, gil, kernels, machine

# doom-lstm, 84x84 gray input, 3 actions: multiply-adds per step, by hand.
CONV1 = 20 * 20 * 16 * (1 * 8 * 8)      # (84-8)/4+1 = 20
CONV2 = 9 * 9 * 32 * (16 * 4 * 4)       # (20-4)/2+1 = 9
FC = 2592 * 256                         # 32*9*9 = 2592
LSTM = 4 * 256 * (256 + 256)
HEADS = 256 * 3 + 256 * 1
MACS = CONV1 + CONV2 + FC + LSTM + HEADS


def test_flops_doom_lstm_hand_count():
    fl = kernels.flops("doom-lstm", (1, 84, 84), 3, T=1)
    assert fl["forward"] == 2 * MACS
    # backward: input + weight grads for every layer, except conv1's input grad
    assert fl["backward"] == 2 * 2 * MACS - 2 * CONV1
    assert [L["name"] for L in fl["layers"]] == ["conv1", "conv2", "fc", "lstm", "policy", "value"]
    fl20 = kernels.flops("doom-lstm", (1, 84, 84), 3, T=20)
    assert fl20["total"] == 20 * fl["total"]


def test_flops_atari_lstm_hand_count():
    # four 3x3 stride-2 padding-1 convs: 42 -> 21 -> 11 -> 6 -> 3
    convs = [21 * 21 * 32 * 9, 11 * 11 * 32 * 32 * 9, 6 * 6 * 32 * 32 * 9, 3 * 3 * 32 * 32 * 9]
    macs = sum(convs) + 4 * 256 * (288 + 256) + 256 * 6 + 256
    fl = kernels.flops("atari-lstm", (1, 42, 42), 6, T=1)
    assert fl["forward"] == 2 * macs
    assert fl["backward"] == 2 * 2 * macs - 2 * convs[0]
    layers = fl["layers"]
    assert [L["name"] for L in layers] == ["conv1", "conv2", "conv3", "conv4", "lstm", "policy",
                                          "value"]
    assert layers[3]["out_shape"] == (32, 3, 3) and layers[0]["pad"] == 1
    assert [L["macs"] for L in layers[:4]] == convs


def test_layer_table_follows_the_network():
    from a3c_core.nn import build_network

    net = build_network("mlp-lstm", (5,), 2, hidden=(16, 8), lstm_size=12)
    table = kernels.layer_table(net)
    assert [(L["kind"], L["name"]) for L in table] == [
        ("dense", "fc1"), ("dense", "fc2"), ("lstm", "lstm"), ("dense", "policy"),
        ("dense", "value")]
    assert [L["macs"] for L in table] == [5 * 16, 16 * 8, 48 * (8 + 12), 12 * 2, 12]


def test_bench_quick_table_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = cli.main(["--quick", "--skip-e2e", "--skip-env", "--repeat", "2", "--sgemm-n", "128",
                     "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    rows = {r["name"]: r for r in doc["rows"]}
    assert "doom-lstm (fused doom_step)" in rows["step (batch 1)"]["notes"]
    expected = ["sgemm peak", "step (batch 1)", "loss_and_grad T=20", "loss_and_grad T=20 GFLOP/s",
                "update T=20", "rmsprop apply", "adam apply", "adam apply (amsgrad)", "preprocess"]
    for name in expected:
        assert name in rows, name
        assert name in text
        r = rows[name]
        assert r["median"] > 0 and r["min"] > 0 and r["max"] >= r["median"] >= r["min"], r
    assert 0 < rows["loss_and_grad T=20 GFLOP/s"]["fraction_of_peak"]
    for key in ("cpu_model", "cpu_count", "python", "numpy", "numba"):
        assert doc["machine"][key]
    from a3c_core.nn.blas import gemm_handle
    assert doc["machine"]["backward"] == ("compiled" if gemm_handle() else "numpy")
    assert f"{doc['machine']['backward']} backward" in text
    assert doc["flops"]["per_step"]["forward"] == 2 * MACS
    header = next(line for line in text.splitlines() if line.startswith("name"))
    assert header.split() == ["name", "median", "min", "max", "unit", "notes"]


def _info(isa, arch, coretype=None, api="openblas"):
    return {"cpu_isa": isa, "openblas_coretype": coretype,
            "blas": [{"internal_api": api, "version": "0.3", "num_threads": 1,
                      "architecture": arch}]}


def test_blas_note_flags_avx2_kernels_on_an_avx512_cpu():
    note = timing.blas_note(_info(["avx2", "avx512f", "fma"], "Haswell", "Haswell"))
    assert "Haswell (AVX2) kernels on this AVX-512 CPU" in note
    assert "OPENBLAS_CORETYPE=Haswell selects them" in note
    chosen = timing.blas_note(_info(["avx2", "avx512f"], "Zen"))
    assert "OpenBLAS chose them" in chosen and "Zen (AVX2)" in chosen
    # nothing to say: AVX-512 kernels, an AVX2-only CPU, or not OpenBLAS
    assert timing.blas_note(_info(["avx2", "avx512f"], "SkylakeX")) is None
    assert timing.blas_note(_info(["avx2", "avx512f"], "SapphireRapids", "SapphireRapids")) is None
    assert timing.blas_note(_info(["avx2", "fma"], "Haswell", "Haswell")) is None
    assert timing.blas_note(_info(["avx2", "avx512f"], None, api="mkl")) is None
    assert timing.blas_note({"cpu_isa": []}) is None


def test_blas_kernel_note_reads_this_process(monkeypatch):
    import threadpoolctl

    blas = [{"user_api": "blas", "internal_api": "openblas", "architecture": "Haswell"},
            {"user_api": "openmp", "internal_api": "openmp"}]
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: blas)
    monkeypatch.setattr(timing, "cpu_info", lambda: ("cpu", {"avx2", "avx512f"}))
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert "OPENBLAS_CORETYPE=Haswell selects them" in timing.blas_kernel_note()
    monkeypatch.setattr(timing, "cpu_info", lambda: ("cpu", {"avx2"}))
    assert timing.blas_kernel_note() is None


def test_machine_info_records_the_blas_kernels():
    info = machine.machine_info()
    assert info["openblas_coretype"] == os.environ.get("OPENBLAS_CORETYPE")
    assert all("architecture" in d for d in info["blas"])
    assert info["blas_note"] == timing.blas_note(info)


def test_gil_held_share_counts_the_requests_that_waited():
    waits = np.array([0.1e-6, 0.3e-6, 1.9e-6, 2.1e-6, 25e-6, 400e-6, 0.2e-6, 0.0])
    assert gil.gil_held_share(waits) == 3 / 8            # over the 2 us threshold
    assert gil.gil_held_share(waits, threshold=1e-6) == 4 / 8
    assert gil.gil_held_share(np.array([])) == 0.0


def test_gil_waits_off_without_a_usable_counter(monkeypatch):
    monkeypatch.setattr(gil, "_TSC", None)
    monkeypatch.setattr(gil.platform, "machine", lambda: "aarch64")
    assert gil._tsc_probe() is None
    assert gil.gil_waits(0.01) is None
    monkeypatch.setattr(gil, "_TSC", None)
    monkeypatch.setattr(gil.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(gil, "_cpuinfo", lambda: ("cpu", {"avx2"}))     # no constant_tsc
    assert gil._tsc_probe() is None


def test_gil_waits_returns_one_wait_per_request():
    w = gil.gil_waits(0.05)
    if w is None:
        pytest.skip("no usable time-stamp counter on this machine")
    assert w.ndim == 1 and w.size > 10          # ~200 us per request
    assert np.all(np.isfinite(w)) and np.all(w > -1e-6)


@pytest.mark.parametrize("counter", [True, False])
def test_bench_gil_rows_with_either_probe(monkeypatch, counter):
    """bench_gil on a short CartPole run: three rows from the waits probe, or
    from the cycles probe where no time-stamp counter can be used (the
    figures themselves are benchmarks, not checked)."""
    import math

    pytest.importorskip("gymnasium")
    if not counter:
        monkeypatch.setattr(gil, "gil_waits", lambda *a, **k: None)
    elif gil.gil_waits(0.01) is None:
        pytest.skip("no usable time-stamp counter on this machine")
    rows = gil.bench_gil("CartPole-v1", "mlp", 0.6, 0.2)
    assert [r.name for r in rows] == ["GIL held (1 worker)", "GIL us/step",
                                      "GIL us/step (probe noise subtracted)"]
    held = rows[0].extra
    assert held["estimator"] == ("waits" if counter else "cycles")
    assert ("waited >2us" in rows[0].notes) == counter
    assert 0.0 <= held["fraction"] <= 1.0 and held["probe_cycles"] > 0
    for r in rows[1:]:
        assert all(math.isfinite(v) and v >= 0 for v in (r.median, r.min, r.max))
    assert rows[2].median <= rows[1].median + 1e-9


def test_blas_kernels_reports_each_setting(capsys, monkeypatch):
    """bench/blas_kernels.py: one row per OPENBLAS_CORETYPE value with a
    positive rate; a failing measurement is named and skipped; bad sizes
    are refused."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "blas_kernels", os.path.join(os.path.dirname(__file__), "..", "bench", "blas_kernels.py"))
    bk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bk)
    assert bk.main(["--coretypes", "unset,Haswell", "--n", "64", "--repeat", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["unset", "Haswell"]
    assert all(float(r[-1]) > 0 for r in rows)
    monkeypatch.setattr(bk, "_CHILD", "raise SystemExit('no BLAS here')")
    assert bk.main(["--coretypes", "unset", "--n", "64", "--repeat", "1"]) == 0
    err = capsys.readouterr().err
    assert "OPENBLAS_CORETYPE=unset: the measuring process failed (exit 1): no BLAS here" in err
    with pytest.raises(SystemExit):
        bk.main(["--n", "0"])


def test_importing_bench_leaves_the_trainer_and_the_optional_peers_out():
    """``import a3c_core.bench`` (what ``a3c bench --help`` pays) loads
    neither the trainer nor the exporter, the torch twin or the Doom adapter
    at module level: the rows that need them import them when they run."""
    import subprocess
    import sys

    heavy = ("a3c_core.train.trainer", "a3c_core.train.worker", "a3c_core.export",
             "a3c_core.nn.torch_twin", "torch", "onnxruntime", "vizdoom")
    code = ("import sys, a3c_core.bench\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_bench_modules_stay_small():
    """One module per topic, none over 400 lines."""
    pkg = os.path.dirname(machine.__file__)
    sizes = {}
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py"):
            with open(os.path.join(pkg, name)) as fh:
                sizes[name] = sum(1 for _ in fh)
    assert {"cli.py", "machine.py", "gil.py"} <= set(sizes)
    assert max(sizes.values()) <= 400, sizes


def test_bench_rejects_bad_workers():
    with pytest.raises(SystemExit):
        cli.main(["--workers", "0,x"])
    for bad in ("0", "65", "two"):
        with pytest.raises(SystemExit):
            cli.main(["--envs-per-worker", bad])


def test_bench_e2e_with_several_envs_per_worker(monkeypatch):
    """The training rows of a worker with 2 envs: its worker really played
    2 envs, and the notes say so."""
    pytest.importorskip("gymnasium")
    seen = []

    class Spy(e2e._TrainerRun):
        def stop(self):
            seen.append([w.n_envs for w in self.trainer.workers if w is not None])
            return super().stop()

    monkeypatch.setattr(e2e, "_TrainerRun", Spy)
    rows = e2e.bench_e2e("CartPole-v1", "mlp", [1], 0.6, 0.2, envs_per_worker=2,
                         env_step_us=50.0)
    assert seen == [[2]]
    train = [r for r in rows if r.name.startswith("train steps/s")]
    assert train[0].name == "train steps/s w1 k2" and "2 envs each" in train[0].notes
    assert train[0].median > 0
    # where its agent steps went: env, forward, backward, apply, glue
    parts = {r.name.split()[1]: r for r in rows if r.name.startswith("step ")}
    assert set(parts) == {"env", "forward", "backward", "apply", "glue"}
    assert all(parts[k].median > 0 for k in ("env", "forward", "backward", "apply"))
    assert sum(r.extra["share"] for r in parts.values()) == pytest.approx(1.0)
    # the env-only ceiling: one core stepping the env alone at 50 us a step
    (ceil,) = [r for r in rows if r.name == "env-only ceiling w1 k2"]
    assert ceil.median == pytest.approx(20_000.0)
    assert ceil.extra["train_share"] == pytest.approx(train[0].extra["mean"] / 20_000.0)
    assert f"{100 * ceil.extra['train_share']:.0f}% of it" in ceil.notes


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_one_core_pins_the_thread_and_what_it_starts_then_restores():
    """The single-thread rows run on one core, with what they start (an
    engine inherits it): a child process started inside reports the same
    single core; the thread's old affinity is back afterwards."""
    import subprocess
    import sys

    from a3c_core.bench.machine import one_core
    before = os.sched_getaffinity(0)
    with one_core() as core:
        assert core == max(before)
        assert os.sched_getaffinity(0) == {core}
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True)
        assert child.stdout.strip() == f"[{core}]"
    assert os.sched_getaffinity(0) == before


def test_network_alone_against_pytorch_rows():
    """Our network alone and the torch twin on the same preprocessed input,
    at a batched worker's K = 16 and at 64: both rows per N, torch's as a
    ratio to ours (the twin's outputs match ours: tests/test_torch_parity.py)."""
    pytest.importorskip("torch")
    from a3c_core.bench import embed
    from a3c_core.nn.network import build_network
    net = build_network("doom-lstm", (1, 84, 84), 3)
    policy = embed._embed_policy(net, (120, 160), {"kind": "image", "out_shape": [84, 84]})
    frames = np.random.default_rng(0).integers(0, 256, (64, 120, 160), dtype=np.uint8)
    rows = {r.name: r for r in embed._bench_embed_peers(policy, frames, 1, 0.001, {})}
    for n in embed.TORCH_NS:
        ours, theirs = rows[f"network N={n} per agent"], rows[f"pytorch N={n} per agent"]
        assert ours.median > 0 and theirs.median > 0
        assert theirs.extra["ratio_to_network"] == pytest.approx(theirs.median / ours.median)


def _second_worker_late(at_window):
    """A _TrainerRun whose worker 1 starts 0.6 s late (in its thread or its
    process) and that calls ``at_window(trainer)`` as its window opens."""
    import time as _time

    class Slow(e2e._TrainerRun):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            make = self.trainer.make_worker

            def late(wid, store=None, **kw):
                if wid == 1:
                    _time.sleep(0.6)
                return make(wid, store, **kw)
            self.trainer.make_worker = late

        def sample_rates(self, seconds, tick=0.5):
            at_window(self.trainer)
            return super().sample_rates(seconds, tick)
    return Slow


def test_bench_e2e_window_waits_for_every_worker(monkeypatch):
    """The envs start one at a time, so the last worker can start well after
    the first: the timed window opens only once every worker has updated,
    and the row gives the ramp.  Worker 1 is held back 0.6 s here."""
    pytest.importorskip("gymnasium")
    at_window = []
    monkeypatch.setattr(e2e, "_TrainerRun", _second_worker_late(
        lambda tr: at_window.append([w is not None and w.stats.updates > 0 for w in tr.workers])))
    rows = e2e.bench_e2e("CartPole-v1", "mlp", [2], 0.5, 0.1)
    assert at_window == [[True, True]]
    ramp = rows[0].extra["ramp_s"]
    assert 0.5 <= ramp < 5.0
    assert f"all workers updating {ramp:.1f}s after the first" in rows[0].notes


def test_bench_e2e_with_worker_processes(monkeypatch):
    """--worker-processes: the rows time worker processes (their steps read
    from the shared counters), the window opens once every process has
    updated (worker 1 held back 0.6 s in its process), the notes say so."""
    pytest.importorskip("gymnasium")
    at_window = []
    monkeypatch.setattr(e2e, "_TrainerRun", _second_worker_late(
        lambda tr: at_window.append(tr.worker_updates())))
    rows = e2e.bench_e2e("CartPole-v1", "mlp", [2], 0.5, 0.1, processes=True)
    assert len(at_window) == 1 and min(at_window[0]) > 0
    assert 0.5 <= rows[0].extra["ramp_s"] < 5.0 and rows[0].extra["processes"] is True
    assert "2 worker process(es)" in rows[0].notes and rows[0].median > 0


def _load_bench(name):
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        name, os.path.join(os.path.dirname(__file__), "..", "bench", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _image_pipe(env):
    from a3c_core.obs import ObsPipeline
    return ObsPipeline({"kind": "image", "out_shape": [84, 84]}, env.obs_shape)


def test_converged_throughput_measures_threads_and_processes(tmp_path):
    """bench/converged_throughput.py resumes a copy of a run (left as it was)
    with worker threads or, with ``+p``, worker processes, and counts their
    steps; bad modes are refused."""
    pytest.importorskip("gymnasium")
    from a3c_core.train.config import Config
    from a3c_core.train.trainer import Trainer

    run = str(tmp_path / "run")
    Trainer(Config(env="CartPole-v1", spec="mlp", workers=2, total_steps=1500, run_dir=run,
                        quiet=True, tensorboard=False)).run()
    before = sorted(os.listdir(run))
    ct = _load_bench("converged_throughput")
    assert ct._split("auto@4+p") == ("auto", 4, True) and ct._split("paper") == ("paper", 1, False)
    for mode in ("paper", "paper+p"):
        r = ct.measure(run, mode, 2, 0.4, 0.2)
        assert r["mode"] == mode and r["steps_per_s"] > 0 and r["episodes"] > 0
    assert sorted(os.listdir(run)) == before
    for bad in ("paper+q", "auto@0+p", "fast"):
        with pytest.raises(SystemExit):
            ct.main([run, "--modes", bad])


BENCH = os.path.join(os.path.dirname(__file__), "..", "bench")
TOOLS = ("scenarios", "reliability", "torch_compare", "blas_kernels", "converged_throughput")


@pytest.mark.parametrize("tool", TOOLS)
def test_bench_tool_has_help_and_a_docstring(tool):
    """Every maintained script in bench/ answers --help (exit 0, a usage line)
    and starts with a docstring that says what it is for."""
    import ast
    import subprocess
    import sys

    path = os.path.join(BENCH, tool + ".py")
    with open(path) as fh:
        assert ast.get_docstring(ast.parse(fh.read())), f"{tool}.py has no module docstring"
    r = subprocess.run([sys.executable, path, "--help"], capture_output=True, text=True, timeout=120,
                       cwd=os.path.join(BENCH, ".."))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:"), r.stdout[:200]


def test_bench_holds_only_maintained_tools():
    """bench/'s top level: at most 12 files besides results/, each one listed
    in bench/README.md."""
    names = sorted(n for n in os.listdir(BENCH) if n not in ("results", "__pycache__", "out", ".benchmarks"))
    assert len(names) <= 12, names
    with open(os.path.join(BENCH, "README.md")) as fh:
        readme = fh.read()
    missing = [n for n in names if n != "README.md" and n not in readme]
    assert not missing, f"bench/README.md does not mention {missing}"


def test_device_runner_help_and_syntax():
    """bench/device.sh: valid bash, --help prints its usage and exits 0,
    no arguments is a usage error."""
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    path = os.path.join(BENCH, "device.sh")
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    r = subprocess.run(["bash", path, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "bash bench/device.sh OUT_DIR" in r.stdout, r.stdout
    r = subprocess.run(["bash", path], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "bash bench/device.sh OUT_DIR" in r.stdout


def _device_stand_in(tmp_path):
    """A stand-in "python" for bench/device.sh that prints the cores it runs
    on and its arguments instead of training (skips where taskset or cores
    0 and 1 are missing), and a runner of device.sh with an environment."""
    import shutil
    import subprocess

    if shutil.which("bash") is None or shutil.which("taskset") is None:
        pytest.skip("no bash or taskset")
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("cores 0 and 1 are not both ours")
    py = tmp_path / "py"
    py.write_text('#!/bin/sh\necho "cores $(taskset -cp $$ | sed \'s/.*: //\') args $*"\n')
    py.chmod(0o755)

    def run(out, env):
        return subprocess.run(["bash", os.path.join(BENCH, "device.sh"), str(out)], env=env,
                              capture_output=True, text=True, timeout=60)
    return py, run


def test_device_runner_jobs_pins_each_job_and_packs_the_logs(tmp_path):
    """bench/device.sh with JOBS=FILE: each job line becomes one `a3c train`
    on its own consecutive cores (taskset), comment lines are skipped, and
    the job logs come back in OUT/runs.tar.gz.  A stand-in "python" records
    its arguments instead of training."""
    import tarfile

    py, run = _device_stand_in(tmp_path)
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("# a comment\na 1 --env doom:basic --seed 0\n\nb 1 --env doom:basic --seed 1\n")
    out, jd = tmp_path / "out", tmp_path / "runs"
    env = dict(os.environ, PYTHON=str(py), JOBS=str(jobs), JOB_DIR=str(jd))
    r = run(out, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cores 0 args -m a3c_core train --env doom:basic --seed 0 --quiet" in (jd / "a.log").read_text()
    assert "cores 1 args -m a3c_core train --env doom:basic --seed 1 --quiet" in (jd / "b.log").read_text()
    assert f"--run-dir {jd}/b" in (jd / "b.log").read_text()
    with tarfile.open(out / "runs.tar.gz") as t:
        assert {"runs/a.log", "runs/b.log"} <= set(t.getnames())
    # a bad jobs file is refused up front, naming the job and the file
    jobs.write_text("a 1 --seed 0\nb x --seed 1\n")
    r = run(tmp_path / "out2", env)
    assert r.returncode == 2 and "job 'b' needs a core count > 0 after its name, got 'x'" in r.stderr
    assert not (tmp_path / "out2").exists()
    env["JOBS"] = str(tmp_path / "nope.txt")
    r = run(tmp_path / "out2", env)
    assert r.returncode == 2 and "JOBS file not readable" in r.stderr


def test_device_runner_budget_runs_jobs_in_turn_within_the_budget(tmp_path):
    """bench/device.sh with JOBS and BUDGET: the jobs run one after another,
    each on cores 0..CORES-1; a job asking for more --total-seconds than is
    left, or none, gets what is left (appended, argparse keeps the last), a
    shorter one keeps its own, with under MIN_JOB seconds left a job is
    skipped and says so, a resumed run's log is appended to and its
    --total-seconds capped at its own time plus what is left, and a malformed
    BUDGET is refused up front.  A stand-in "python" records its arguments."""
    import re
    import tarfile

    py, run = _device_stand_in(tmp_path)
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("a 2 --seed 0 --total-seconds 600\nb 1 --seed 1 --total-seconds 5\nc 1 --seed 2\n")
    out, jd = tmp_path / "out", tmp_path / "runs"
    env = dict(os.environ, PYTHON=str(py), JOBS=str(jobs), JOB_DIR=str(jd), BUDGET="100")
    r = run(out, env)
    assert r.returncode == 0, r.stdout + r.stderr
    a, b = (jd / "a.log").read_text(), (jd / "b.log").read_text()
    m = re.search(r"cores 0[,-]1 args -m a3c_core train --seed 0 --total-seconds 600 --total-seconds (\d+) --quiet", a)
    assert m and 90 <= int(m.group(1)) <= 100, a
    assert re.search(r"cores 0 args -m a3c_core train --seed 1 --total-seconds 5 --quiet", b), b
    c = (jd / "c.log").read_text()      # no --total-seconds of its own: what is left
    assert re.search(r"cores 0 args -m a3c_core train --seed 2 --total-seconds (9\d|100) --quiet", c), c
    assert r.stdout.index("a done") < r.stdout.index("b on cores 0-0")   # in turn, not at once
    with tarfile.open(out / "runs.tar.gz") as t:
        assert {"runs/a.log", "runs/b.log"} <= set(t.getnames())
    # a resumed run: its log goes on, and its --total-seconds (the run's time
    # in all) is capped at the 150.2 s it had plus what is left, not at what is left
    (jd / "r").mkdir()
    (jd / "r" / "summary.json").write_text('{\n "steps": 10,\n "seconds": 150.2,\n "status": "done"\n}\n')
    (jd / "r.log").write_text("the first call's log\n")
    (jd / "s.log").write_text("an old log\n")
    jobs.write_text(f"r 1 --resume {jd}/r --total-seconds 900\ns 1 --seed 3 --total-seconds 5\n")
    r = run(tmp_path / "out_r", env)
    assert r.returncode == 0, r.stdout + r.stderr
    log = (jd / "r.log").read_text()
    assert log.startswith("the first call's log\n"), log
    m = re.search(rf"args -m a3c_core train --resume {jd}/r --total-seconds 900 --total-seconds (\d+) --quiet", log)
    assert m and 240 <= int(m.group(1)) <= 250, log
    assert "an old log" not in (jd / "s.log").read_text()    # not a resume: the log starts again
    jobs.write_text("a 2 --seed 0 --total-seconds 600\nb 1 --seed 1 --total-seconds 5\nc 1 --seed 2\n")
    env.update(MIN_JOB="1000", JOB_DIR=str(tmp_path / "runs2"))
    r = run(tmp_path / "out2", env)
    assert r.returncode == 0 and "a skipped:" in r.stdout and "b skipped:" in r.stdout, r.stdout
    assert not (tmp_path / "runs2" / "a.log").exists()
    # a budget that is not a whole number of seconds is refused before anything runs
    env.update(BUDGET="8m")
    r = run(tmp_path / "out3", env)
    assert r.returncode == 2 and "BUDGET must be a whole number of seconds > 0, got '8m'" in r.stderr
    assert not (tmp_path / "out3").exists()


def test_device_runner_times_each_envs_per_worker_and_tabulates_them(tmp_path):
    """bench/device.sh's timing steps: each tag (T1 P1 P2 T2) runs one `a3c
    bench` over the ENVS counts (processes for P), and the table has one
    line per worker count and envs per worker with its processes / threads
    ratios; a malformed ENVS is refused before anything runs.  A stand-in
    "python" writes a bench JSON (steps/s = 100 x workers x K, x 1.5 for
    processes) and runs the table with the real interpreter."""
    import subprocess
    import sys

    py = tmp_path / "py"
    py.write_text(f"""#!{sys.executable}
import json, os, re, sys
a = sys.argv[1:]
if a[:1] == ["-"]:
    os.execv({sys.executable!r}, [{sys.executable!r}] + a)
if a[:2] == ["-m", "a3c_core"] and a[2] == "bench":
    opt = {{a[i]: a[i + 1] for i in range(3, len(a) - 1) if a[i].startswith("--")}}
    w, proc = int(opt["--workers"]), "--worker-processes" in a
    rows = [{{"name": f"train steps/s w{{w}}" + (f" k{{k}}" if k > 1 else ""),
              "median": 100.0 * w * k * (1.5 if proc else 1.0)}}
            for k in map(int, opt["--envs-per-worker"].split(","))]
    json.dump({{"rows": rows}}, open(opt["--json"], "w"))
    print("train steps/s", opt["--envs-per-worker"], "processes" if proc else "threads")
""")
    py.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=str(py), WORKERS="1 4", ENVS="1 8")
    r = subprocess.run(["bash", os.path.join(BENCH, "device.sh"), str(out)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.glob("e2e_*.json")) == sorted(
        f"e2e_w{w}_{t}.json" for w in (1, 4) for t in ("T1", "P1", "P2", "T2"))
    lines = [ln for ln in r.stdout.splitlines() if "envs each" in ln]
    import re
    assert [re.match(r" *(\d+) workers, K = +(\d+) envs", ln).groups() for ln in lines] == [
        ("1", "1"), ("1", "8"), ("4", "1"), ("4", "8")], r.stdout
    assert "T1     3200  P1     4800  P/T 1.50" in lines[3], lines[3]
    env["ENVS"] = "1,8"
    r = subprocess.run(["bash", os.path.join(BENCH, "device.sh"), str(tmp_path / "out2")],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "ENVS must be envs-per-worker counts" in r.stderr
    assert not (tmp_path / "out2").exists()


def test_scenario_table_reads_runs_at_marks_and_counts_runs_below_random(tmp_path):
    """bench/scenarios.py's table from three finished run dirs: the avg100 of
    the episodes finished by each mark, median and range over the seeds, a
    mark past a run's end left out and said so, and the runs whose final
    avg100 is below random play."""
    import json

    sc = _load_bench("scenarios")
    runs = []
    for seed, rets in ((0, [1.0] * 50 + [3.0] * 150), (1, [1.0] * 200), (2, [2.0] * 100)):
        d = tmp_path / f"health_gathering-s{seed}"
        d.mkdir()
        with open(d / "episodes.csv", "w") as fh:
            # seed 1's run predates the end column; seed 0's wrote it from its
            # 101st episode on (a resumed old run); seed 2's from the start
            if seed == 1:
                fh.write("episode,wall_time,step,worker,return,length\n")
            else:
                fh.write("episode,wall_time,step,worker,return,length,end\n")
            for i, r in enumerate(rets):     # one episode every 3 s: 100 by 300 s
                end = ("" if seed == 1 else "," if seed == 0 and i < 100
                       else ",ended alive" if r == 3.0 else ",died" if seed == 0 or i % 4 else ",timed out")
                fh.write(f"{i + 1},{3.0 * (i + 1):.1f},{10 * (i + 1)},0,{r},10{end}\n")
        final = float(np.mean(rets[-100:]))
        (d / "summary.json").write_text(json.dumps(
            {"steps": 10 * len(rets), "episodes": len(rets), "seconds": 3.0 * len(rets) + 0.4,
             "moving_avg": final, "long_avg": float(np.mean(rets))}))
        runs.append(sc.run_summary(str(d), seed, [5, 10], "a3c train ...", None))
    assert runs[0]["avg_at"] == {"5": 2.0, "10": 3.0}     # by 300 s: 50 x 1 and 50 x 3
    assert runs[1]["avg_at"] == {"5": 1.0, "10": 1.0}
    # seed 2 stopped at 300 s: at 10 minutes it has no figure (not its last one)
    assert runs[2]["avg_at"] == {"5": 2.0, "10": None}
    # steps and episodes count to the last mark: a longer run read at 5 minutes
    assert (runs[0]["steps"], runs[0]["episodes"]) == (2000, 200)
    early = sc.run_summary(str(tmp_path / "health_gathering-s0"), 0, [5], "a3c train ...", None)
    assert (early["steps"], early["episodes"]) == (1000, 100)
    assert sc.avg_at(np.array([5.0]), np.array([1.0]), 4.0) is None
    table = sc.markdown([{"scenario": "health_gathering", "random_avg": 2.5, "marks": [5, 10],
                          "runs": runs}])
    row = [ln for ln in table.splitlines() if ln.startswith("| health_gathering")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:5] == ["2.00 [1.00 – 2.00]", "2.00 [1.00 – 3.00] (2 of 3 seeds)"]
    assert cells[6] == "2 of 3"
    # how the last mark's windows ended, counted where recorded: seed 0's
    # last 100 all reached the goal, seed 2's 75 died and 25 timed out
    assert [r["ends"] for r in runs] == [{"ended alive": 100}, {}, {"died": 75, "timed out": 25}]
    assert cells[5] == "ended alive 50 %, died 38 %, timed out 12 %"
    assert "how those episodes ended (at 10 min, seeds pooled)" in table
    # at 5 minutes seed 0's window is its 100 episodes from before the column
    assert sc.ends_by(str(tmp_path / "health_gathering-s0"), 300.0) == {}
    assert sc._ends_cell([early]) == "–"


def test_scenario_results_merge_by_scenario(tmp_path):
    """A suite run one scenario at a time keeps the others' results, in the
    suite's order, and replaces a scenario measured again."""
    sc = _load_bench("scenarios")
    out = str(tmp_path)
    sc.save([{"scenario": "my_way_home", "v": 1}], out)
    sc.save([{"scenario": "basic", "v": 1}], out)
    sc.save([{"scenario": "my_way_home", "v": 2}], out)
    assert [(r["scenario"], r["v"]) for r in sc.load(out)] == [("basic", 1), ("my_way_home", 2)]
    assert sorted(os.listdir(out)) == ["results.json"]


def test_scenario_random_play_uses_the_actions_the_defaults_train_with(monkeypatch):
    """Random play is uniform over the actions the agent would have: 54
    combinations on deadly_corridor (its default), 3 buttons on basic."""
    pytest.importorskip("vizdoom")
    import a3c_core.envs as envs

    sc = _load_bench("scenarios")
    seen, real = {}, envs.make_env

    def spy(env_id, **kw):
        env = real(env_id, **kw)
        seen[env_id] = env.n_actions
        return env

    monkeypatch.setattr(envs, "make_env", spy)
    for scenario in ("deadly_corridor", "basic"):
        mean, std = sc.random_policy_average(scenario, 1)
        assert np.isfinite(mean) and std == 0.0
    assert seen == {"doom:deadly_corridor": 54, "doom:basic": 3}


def test_scenario_suite_resumes_a_shorter_finished_run_to_its_minutes(tmp_path, monkeypatch):
    """A run dir holding a finished 10-minute run, read by a 30-minute suite,
    is resumed to 30 minutes (``a3c train --resume``) and then read; a run
    that already reached 30 minutes is only read; a resume that fails is
    reported and the other seeds' results are kept."""
    import json

    sc = _load_bench("scenarios")

    def write_run(d, seconds):
        d.mkdir(exist_ok=True)
        n = int(seconds // 3)               # one episode (return 1.0) every 3 s
        with open(d / "episodes.csv", "w") as fh:
            fh.write("episode,wall_time,step,worker,return,length,end\n")
            for i in range(n):
                fh.write(f"{i + 1},{3.0 * (i + 1):.1f},{10 * (i + 1)},0,1.0,10,died\n")
        (d / "summary.json").write_text(json.dumps(
            {"steps": 10 * n, "episodes": n, "seconds": seconds, "moving_avg": 1.0, "long_avg": 1.0}))

    write_run(tmp_path / "basic-s0", 600.3)      # a 10-minute suite's run
    write_run(tmp_path / "basic-s1", 1800.2)     # already at 30 minutes
    write_run(tmp_path / "basic-s2", 600.4)
    assert sc.short_of(str(tmp_path / "basic-s0"), 10) == 0.0
    assert sc.short_of(str(tmp_path / "basic-s0"), 30) == pytest.approx(1199.7)
    assert sc.short_of(str(tmp_path / "basic-s1"), 30) == 0.0

    calls = []

    def fake_extend(run_dir, minutes):
        calls.append((os.path.basename(run_dir), minutes))
        if run_dir.endswith("s2"):
            raise RuntimeError("a3c train --resume ... failed (1)")
        write_run(tmp_path / os.path.basename(run_dir), minutes * 60 + 0.2)
        return f"a3c train --resume {run_dir} --total-seconds {minutes * 60:g}", 1200.0

    monkeypatch.setattr(sc, "extend", fake_extend)
    monkeypatch.setattr(sc, "random_policy_average", lambda name, episodes, seed=0: (0.0, 1.0))
    rc = sc.main(["--minutes", "30", "--marks", "10,30", "--only", "basic", "--seeds", "0,1,2",
                  "--out", str(tmp_path)])
    assert rc == 1                                  # seed 2's resume failed
    assert calls == [("basic-s0", 30.0), ("basic-s2", 30.0)]
    runs = {r["seed"]: r for r in sc.load(str(tmp_path))[0]["runs"]}
    assert sorted(runs) == [0, 1]
    assert runs[0]["avg_at"] == {"10": 1.0, "30": 1.0} and runs[0]["episodes"] == 600
    # the command as run: the 10-minute budget, then the resume
    assert runs[0]["command"] == ("a3c train --env doom:basic --workers 2 --seed 0 --total-steps 0 "
                                  "--total-seconds 600; then a3c train --resume "
                                  f"{tmp_path / 'basic-s0'} --total-seconds 1800")
    assert runs[0]["wall_s"] == 1200.0
    assert "--resume" not in runs[1]["command"] and runs[1]["wall_s"] is None
    # a 30-minute run read by a 10-minute suite shows the budget it ran (its
    # config.toml), not --minutes; without a readable config, --minutes
    from a3c_core.train.config import Config

    rc = sc.main(["--minutes", "10", "--only", "basic", "--seeds", "1", "--out", str(tmp_path)])
    assert rc == 0 and "--total-seconds 600" in sc.load(str(tmp_path))[0]["runs"][0]["command"]
    (tmp_path / "basic-s1" / "config.toml").write_text(
        Config(env="doom:basic", total_seconds=1800.0).to_toml())
    rc = sc.main(["--minutes", "10", "--only", "basic", "--seeds", "1", "--out", str(tmp_path)])
    run = sc.load(str(tmp_path))[0]["runs"][0]
    assert rc == 0 and calls == [("basic-s0", 30.0), ("basic-s2", 30.0)]   # nothing resumed
    assert "--total-seconds 1800 " in run["command"] + " " and run["avg_at"] == {"10": 1.0}
    # a corrupt summary is refused by name, and nothing is resumed or written over
    (tmp_path / "basic-s2" / "summary.json").write_text("{not json")
    calls.clear()
    with pytest.raises(SystemExit):
        sc.main(["--minutes", "30", "--only", "basic", "--seeds", "2", "--out", str(tmp_path)])
    assert calls == [] and (tmp_path / "basic-s2" / "summary.json").read_text() == "{not json"
    (tmp_path / "basic-s2" / "summary.json").write_text("[600.4]")    # JSON, but not a summary
    with pytest.raises(SystemExit):
        sc.main(["--minutes", "30", "--only", "basic", "--seeds", "2", "--out", str(tmp_path)])
    assert calls == [] and (tmp_path / "basic-s2" / "summary.json").read_text() == "[600.4]"
