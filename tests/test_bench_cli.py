"""Smoke tests of ``a3c bench`` and its FLOP counter (no throughput claims)."""
import json
import os

import numpy as np

import pytest

from a3c_core import bench, timing

# doom-lstm, 84x84 gray input, 3 actions: multiply-adds per step, by hand.
CONV1 = 20 * 20 * 16 * (1 * 8 * 8)      # (84-8)/4+1 = 20
CONV2 = 9 * 9 * 32 * (16 * 4 * 4)       # (20-4)/2+1 = 9
FC = 2592 * 256                         # 32*9*9 = 2592
LSTM = 4 * 256 * (256 + 256)
HEADS = 256 * 3 + 256 * 1
MACS = CONV1 + CONV2 + FC + LSTM + HEADS


def test_flops_doom_lstm_hand_count():
    fl = bench.flops("doom-lstm", (1, 84, 84), 3, T=1)
    assert fl["forward"] == 2 * MACS
    # backward: input + weight grads for every layer, except conv1's input grad
    assert fl["backward"] == 2 * 2 * MACS - 2 * CONV1
    assert [L["name"] for L in fl["layers"]] == ["conv1", "conv2", "fc", "lstm", "policy", "value"]
    fl20 = bench.flops("doom-lstm", (1, 84, 84), 3, T=20)
    assert fl20["total"] == 20 * fl["total"]


def test_flops_atari_lstm_hand_count():
    # four 3x3 stride-2 padding-1 convs: 42 -> 21 -> 11 -> 6 -> 3
    convs = [21 * 21 * 32 * 9, 11 * 11 * 32 * 32 * 9, 6 * 6 * 32 * 32 * 9, 3 * 3 * 32 * 32 * 9]
    macs = sum(convs) + 4 * 256 * (288 + 256) + 256 * 6 + 256
    fl = bench.flops("atari-lstm", (1, 42, 42), 6, T=1)
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
    table = bench.layer_table(net)
    assert [(L["kind"], L["name"]) for L in table] == [
        ("dense", "fc1"), ("dense", "fc2"), ("lstm", "lstm"), ("dense", "policy"),
        ("dense", "value")]
    assert [L["macs"] for L in table] == [5 * 16, 16 * 8, 48 * (8 + 12), 12 * 2, 12]


def test_bench_quick_table_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--quick", "--skip-e2e", "--skip-env", "--repeat", "2", "--sgemm-n", "128",
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
    note = bench.blas_note(_info(["avx2", "avx512f", "fma"], "Haswell", "Haswell"))
    assert "Haswell (AVX2) kernels on this AVX-512 CPU" in note
    assert "OPENBLAS_CORETYPE=Haswell selects them" in note
    chosen = bench.blas_note(_info(["avx2", "avx512f"], "Zen"))
    assert "OpenBLAS chose them" in chosen and "Zen (AVX2)" in chosen
    # nothing to say: AVX-512 kernels, an AVX2-only CPU, or not OpenBLAS
    assert bench.blas_note(_info(["avx2", "avx512f"], "SkylakeX")) is None
    assert bench.blas_note(_info(["avx2", "avx512f"], "SapphireRapids", "SapphireRapids")) is None
    assert bench.blas_note(_info(["avx2", "fma"], "Haswell", "Haswell")) is None
    assert bench.blas_note(_info(["avx2", "avx512f"], None, api="mkl")) is None
    assert bench.blas_note({"cpu_isa": []}) is None


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
    info = bench.machine_info()
    assert info["openblas_coretype"] == bench.os.environ.get("OPENBLAS_CORETYPE")
    assert all("architecture" in d for d in info["blas"])
    assert info["blas_note"] == bench.blas_note(info)


def test_gil_held_share_counts_the_requests_that_waited():
    waits = np.array([0.1e-6, 0.3e-6, 1.9e-6, 2.1e-6, 25e-6, 400e-6, 0.2e-6, 0.0])
    assert bench.gil_held_share(waits) == 3 / 8            # over the 2 us threshold
    assert bench.gil_held_share(waits, threshold=1e-6) == 4 / 8
    assert bench.gil_held_share(np.array([])) == 0.0


def test_gil_waits_off_without_a_usable_counter(monkeypatch):
    monkeypatch.setattr(bench, "_TSC", None)
    monkeypatch.setattr(bench.platform, "machine", lambda: "aarch64")
    assert bench._tsc_probe() is None
    assert bench.gil_waits(0.01) is None
    monkeypatch.setattr(bench, "_TSC", None)
    monkeypatch.setattr(bench.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(bench, "_cpuinfo", lambda: ("cpu", {"avx2"}))     # no constant_tsc
    assert bench._tsc_probe() is None


def test_gil_waits_returns_one_wait_per_request():
    w = bench.gil_waits(0.05)
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
        monkeypatch.setattr(bench, "gil_waits", lambda *a, **k: None)
    elif bench.gil_waits(0.01) is None:
        pytest.skip("no usable time-stamp counter on this machine")
    rows = bench.bench_gil("CartPole-v1", "mlp", 0.6, 0.2)
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


def test_bench_rejects_bad_workers():
    with pytest.raises(SystemExit):
        bench.main(["--workers", "0,x"])
    for bad in ("0", "65", "two"):
        with pytest.raises(SystemExit):
            bench.main(["--envs-per-worker", bad])


def test_bench_e2e_with_several_envs_per_worker(monkeypatch):
    """The training rows of a worker with 2 envs: its worker really played
    2 envs, and the notes say so."""
    pytest.importorskip("gymnasium")
    seen = []

    class Spy(bench._TrainerRun):
        def stop(self):
            seen.append([w.n_envs for w in self.trainer.workers if w is not None])
            return super().stop()

    monkeypatch.setattr(bench, "_TrainerRun", Spy)
    rows = bench.bench_e2e("CartPole-v1", "mlp", [1], 0.6, 0.2, envs_per_worker=2)
    assert seen == [[2]]
    assert rows[0].name == "train steps/s w1" and "2 envs each" in rows[0].notes
    assert rows[0].median > 0


def _second_worker_late(at_window):
    """A _TrainerRun whose worker 1 starts 0.6 s late (in its thread or its
    process) and that calls ``at_window(trainer)`` as its window opens."""
    import time as _time

    class Slow(bench._TrainerRun):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            make = self.trainer._make_worker

            def late(wid):
                if wid == 1:
                    _time.sleep(0.6)
                return make(wid)
            self.trainer._make_worker = late

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
    monkeypatch.setattr(bench, "_TrainerRun", _second_worker_late(
        lambda tr: at_window.append([w is not None and w.stats.updates > 0 for w in tr.workers])))
    rows = bench.bench_e2e("CartPole-v1", "mlp", [2], 0.5, 0.1)
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
    monkeypatch.setattr(bench, "_TrainerRun", _second_worker_late(
        lambda tr: at_window.append(tr.worker_updates())))
    rows = bench.bench_e2e("CartPole-v1", "mlp", [2], 0.5, 0.1, processes=True)
    assert len(at_window) == 1 and min(at_window[0]) > 0
    assert 0.5 <= rows[0].extra["ramp_s"] < 5.0 and rows[0].extra["processes"] is True
    assert "2 worker process(es)" in rows[0].notes and rows[0].median > 0


def test_stay_check_on_a_known_run(tmp_path, capsys):
    """bench/stay_check.py against a hand-made episodes.csv: 200 episodes of
    -100, then 1,500 of 80 with one 50-episode dip to -200 in the middle."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "stay_check", os.path.join(os.path.dirname(__file__), "..", "bench", "stay_check.py"))
    sc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sc)
    ret = [-100.0] * 200 + [80.0] * 1500
    ret[1000:1050] = [-200.0] * 50
    with open(tmp_path / "episodes.csv", "w") as fh:
        fh.write("episode,wall_time,step,worker,return,length\n")
        for i, r in enumerate(ret):
            fh.write(f"{i + 1},{0.1 * (i + 1):.1f},{10 * (i + 1)},0,{r},10\n")
    assert sc.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # avg100 >= 75 first when <= 2 of the last 100 are -100: episode 298
    assert "first at 29.8 s, step 2980, episode 298" in out
    # from the crossing on, the lowest avg1000 is the crossing's own window
    # (its 298 episodes: 200 x -100 and 98 x 80 = -40.81); windows that start
    # after the crossing hold no -100: at worst 50 x -200 and 950 x 80 = 66.0
    assert "min avg1000 from the crossing: -40.81 at 29.8 s" in out
    assert "over windows entirely after it: 66.00" in out
    assert "final avg100 80.00, avg1000 66.00" in out
    assert "min avg100 after the crossing: -60.00" in out        # 50 x -200 + 50 x 80
    # one dip: avg100 < 50 from the 17th -200 (17 x -200 + 83 x 80 = -0.4 ... ) until
    # fewer than 11 of the last 100 are -200; its lowest point is the 50th -200
    assert "dips (avg100 < 50.0) after the crossing: 1 in 14020 steps: -60.0 at step 10500" in out
    assert sc.dip_stretches(np.array([60, 40, 40, 60, 30, 60]), 50, merge=1) == [(1, 3), (4, 5)]
    assert sc.dip_stretches(np.array([60, 40, 40, 60, 30, 60]), 50) == [(1, 5)]
    assert sc.dip_stretches(np.array([40, 60]), 50) == [(0, 1)]
    assert sc.dip_stretches(np.array([60.0]), 50) == []
    np.testing.assert_allclose(sc.trailing_mean(np.array([1.0, 3.0, 5.0]), 2), [1, 2, 4])
    with pytest.raises(SystemExit):
        sc.main([str(tmp_path / "missing")])


def test_adam_drift_on_a_known_run(tmp_path, capsys):
    """bench/adam_drift.py against hand-made metrics.csv and episodes.csv: 200
    episodes of -100 then 200 of 80 (avg100 >= 75 first at episode 298, 29.8 s);
    per-second scalars whose values before and after the crossing are known, and
    a walk of change / sqrt(change / per_apply) = 2 / sqrt(4) = 1.0 after it."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "adam_drift", os.path.join(os.path.dirname(__file__), "..", "bench", "adam_drift.py"))
    ad = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ad)
    with open(tmp_path / "episodes.csv", "w") as fh:
        fh.write("episode,wall_time,step,worker,return,length\n")
        for i, r in enumerate([-100.0] * 200 + [80.0] * 200):
            fh.write(f"{i + 1},{0.1 * (i + 1):.1f},{10 * (i + 1)},0,{r},10\n")
    with open(tmp_path / "metrics.csv", "w") as fh:
        fh.write("wall_time,step,name,value\n")
        for t in range(1, 121):
            after = t >= 29.8 + 30
            for name, v in (("losses/grad_norm", 2.0 if after else 40.0),
                            ("optim/param_change_rms", 2.0 if after else 9.0),
                            ("optim/param_change_per_apply", 0.5 if after else 1.0)):
                fh.write(f"{t:.3f},{100 * t},{name},{v}\n")
    assert ad.crossing_time(str(tmp_path), 75.0) == pytest.approx(29.8)
    table = {name: (b, a) for name, b, a in ad.phase_table(ad.read_metrics(tmp_path / "metrics.csv"), 29.8)}
    assert table["grad_norm"] == (40.0, 2.0)
    assert table["change/s (lr)"] == (9.0, 2.0)
    assert table["walk (lr)"] == pytest.approx((3.0, 1.0))     # 9 / sqrt(9) and 2 / sqrt(4)
    assert "sqrt(mean v_hat)" not in table                     # not logged, not shown
    assert ad.main([str(tmp_path)]) == 0
    assert "avg100 first >= 75 at 30 s" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        ad.main([str(tmp_path / "missing")])


def test_trace_updates_records_every_update(tmp_path):
    """bench/trace_updates.py on a short CartPole run (1 worker): one row per
    update, in order, whose step counts add up to the run's, whose per-layer
    gradient norms make up the global norm, whose rebuilt episode returns are
    the run's episodes.csv, and no staleness with one worker. The wrapped
    methods are put back afterwards."""
    import csv
    import importlib.util
    import os

    from a3c_core.nn.network import Network
    from a3c_core.train import worker as W

    spec = importlib.util.spec_from_file_location(
        "trace_updates", os.path.join(os.path.dirname(__file__), "..", "bench", "trace_updates.py"))
    tu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tu)
    before = (W.Worker._apply_update, W.Worker.rollout, W.ThreadStore.apply, Network.rollout_grad)
    out = tmp_path / "trace.npz"
    run = tmp_path / "run"
    rc = tu.main([str(out), "--", "--env", "CartPole-v1", "--workers", "1", "--total-steps",
                  "600", "--seed", "3", "--run-dir", str(run), "--quiet",
                  "--checkpoint-interval", "0", "--no-tensorboard"])
    assert rc == 0
    assert (W.Worker._apply_update, W.Worker.rollout, W.ThreadStore.apply,
            Network.rollout_grad) == before
    d = tu.load(out)
    k = len(d["t"])
    assert k > 10
    np.testing.assert_array_equal(d["seq"], np.arange(1, k + 1))
    assert np.all(d["stale"] == 0) and np.all(d["wid"] == 0)
    assert d["n"].sum() >= 600 and d["n"].sum() - d["n"][-1] < 600
    assert np.all(d["n"] <= 20) and np.all(d["applied"] == 1)
    parts = np.sqrt(d["g_conv"] ** 2 + d["g_fc"] ** 2 + d["g_lstm"] ** 2 + d["g_pol"] ** 2
                    + d["g_val"] ** 2)
    np.testing.assert_allclose(parts, d["gnorm"], rtol=1e-4)
    assert np.all((d["pmin"] > 0) & (d["pmin"] <= d["pmax_mean"] + 1e-6) & (d["pmax_mean"] <= 1))
    rows = list(csv.DictReader(open(run / "episodes.csv")))
    ended = np.where(d["ended"] == 1)[0]
    assert len(ended) == len(rows)
    starts = np.r_[0, ended[:-1] + 1]
    rebuilt = [d["raw"][a:b + 1].sum() for a, b in zip(starts, ended)]
    np.testing.assert_allclose(rebuilt, [float(r["return"]) for r in rows])
    assert tu.main([str(out), "--", "--env", "CartPole-v1", "--cross-episode"]) == 2
    assert tu.main([str(out), "--", "--env", "CartPole-v1", "--min-rollout", "10"]) == 2
    assert tu.main([str(out), "--", "--env", "CartPole-v1", "--min-rollout=5"]) == 2


def test_doom_reset_prints_its_figures(capsys):
    """bench/doom_reset.py: both start-time rows and the wall/CPU lines."""
    import importlib.util
    import os

    pytest.importorskip("vizdoom")
    spec = importlib.util.spec_from_file_location(
        "doom_reset", os.path.join(os.path.dirname(__file__), "..", "bench", "doom_reset.py"))
    dr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dr)
    assert dr.main(["--episodes", "2", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    for part in ("episode_start_time 14", "episode_start_time 0", "new_episode: wall",
                 "step (make_action + get_state): wall"):
        assert part in out, part


def test_trace_updates_burst_statistics():
    """bench/trace_updates.py --bursts on a hand-made trace: counts, rate,
    layer shares and the p_min buckets are the hand-computed ones."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "trace_updates", os.path.join(os.path.dirname(__file__), "..", "bench", "trace_updates.py"))
    tu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tu)
    n = 10
    d = {c: np.zeros(n) for c in tu.COLS}
    d["t"] = np.arange(n, dtype=float)              # 0..9 s
    d["gnorm"] = np.array([1, 1, 1, 50, 1, 100, 1, 1, 1, 1.0])
    d["g_val"] = np.where(d["gnorm"] < 2, 0.9, 0.1 * d["gnorm"])
    d["g_conv"] = np.where(d["gnorm"] < 2, 0.1, 0.9 * d["gnorm"])
    d["pmin"] = np.array([0.5, 0.5, 0.5, 0.0005, 0.5, 0.005, 0.5, 0.5, 0.5, 0.05])
    d["adam_exp"] = np.full(n, 7.0)
    b = tu.bursts(d, after=0.5, clip=40.0)          # drops t = 0
    assert b["updates"] == 9 and b["seconds"] == 8.0
    assert b["bursts"] == 2 and b["bursts_per_s"] == 0.25
    assert b["ordinary_g_val_share"] == pytest.approx(0.9)
    assert b["burst_g_conv_share"] == pytest.approx(0.9)
    assert b["burst_g_val_share"] == pytest.approx(0.1)
    assert b["adam_exp_median"] == 7.0
    by = {(lo, hi): (k, med, over) for lo, hi, k, med, over in b["by_pmin"]}
    assert by[(0.0, 1e-3)] == (1, 50.0, 1.0)
    assert by[(1e-3, 1e-2)] == (1, 100.0, 1.0)
    assert by[(1e-2, 0.1)] == (1, 1.0, 0.0)
    assert by[(0.1, 1.01)] == (6, 1.0, 0.0)


def test_ray_compare_phase_ratios_on_known_runs(tmp_path):
    """bench/ray_sync.py's phase-matched throughput on two hand-made
    metrics.csv: 'single' steps 100/s then 50/s after 40 s; 'ray' 90/s then
    40/s after 60 s.  Whole-run rates flatter the later learner; phases don't."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "ray_sync", os.path.join(os.path.dirname(__file__), "..", "bench", "ray_sync.py"))
    rs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rs)

    def write(name, fast, slow, t_cross):
        d = tmp_path / name
        d.mkdir()
        step = 0
        with open(d / "metrics.csv", "w") as fh:
            fh.write("wall_time,step,name,value\n")
            for t in range(0, 101):
                fh.write(f"{t},{step},charts/sps,0\n")
                fh.write(f"{t},{step},losses/grad_norm,1\n")
                step += fast if t < t_cross else slow
        return str(d)

    a, b = write("single", 100, 50, 40), write("ray", 90, 40, 60)
    assert rs.step_rate(a, 5, 40) == pytest.approx(100.0)
    assert rs.step_rate(b, 70, 100) == pytest.approx(40.0)
    assert rs.step_rate(a, 200, 300) is None
    ph = rs.phase_ratios(a, b, 40.0, 60.0, 100.0)
    assert [p["phase"] for p in ph] == ["learning", "converged"]
    assert ph[0]["lo"] == 5.0 and ph[0]["hi"] == 40.0 and ph[0]["ratio"] == pytest.approx(0.9)
    assert ph[1]["lo"] == 70.0 and ph[1]["ratio"] == pytest.approx(40.0 / 50.0)
    assert rs.phase_ratios(a, b, None, 60.0, 100.0) == []
    # a window under 10 s is left out
    assert [p["phase"] for p in rs.phase_ratios(a, b, 40.0, 95.0, 100.0)] == ["learning"]
    assert rs.phase_ratios(a, b, 12.0, 95.0, 100.0) == []


def test_learner_parts_runs_and_restores_the_layers(capsys):
    """bench/learner_parts.py: every part and every layer method of the
    backward gets a line, and the layer classes are unwrapped afterwards."""
    import importlib.util
    import os

    from a3c_core.nn import layers as L

    spec = importlib.util.spec_from_file_location(
        "learner_parts", os.path.join(os.path.dirname(__file__), "..", "bench", "learner_parts.py"))
    lp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lp)
    before = {(c, m): vars(c)[m] for c in (L.Conv2d, L.Dense, L.LSTM, L.Heads)
              for m in ("prepare_backward", "backward", "backward_compiled", "forward_loss")
              if m in vars(c)}
    assert lp.main(["--t-max", "3", "--repeat", "1", "--numpy-backward"]) == 0
    out = capsys.readouterr().out
    for part in ("3 recorded steps", "rollout_grad:", "fused tail", "per agent step"):
        assert out.count(part) == 2, part      # each alone, then in sequence
    assert "in sequence" in out
    for name in ("conv1.backward:", "conv1.prepare_backward", "conv2.backward:", "fc.backward:",
                 "lstm.backward:", "heads.forward_loss"):
        assert name in out, name
    assert "backward_compiled" not in out
    if lp.build_network("mlp", (3,), 2).compiled_backward:
        assert lp.main(["--t-max", "3", "--repeat", "1"]) == 0
        out = capsys.readouterr().out
        for name in ("conv1.backward_compiled", "conv2.backward_compiled",
                     "fc.backward_compiled", "lstm.backward_compiled", "heads.forward_loss"):
            assert name in out, name
        assert "prepare_backward" not in out
    assert all(vars(c)[m] is f for (c, m), f in before.items())


def test_gil_parts_prints_a_row_per_part(capsys):
    """bench/gil_parts.py: one row per part, each with a finite, non-negative
    GIL time per call (the figure itself is a benchmark, not checked here)."""
    import importlib.util
    import math
    import os

    pytest.importorskip("vizdoom")
    spec = importlib.util.spec_from_file_location(
        "gil_parts", os.path.join(os.path.dirname(__file__), "..", "bench", "gil_parts.py"))
    gp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gp)
    assert gp.main(["--seconds", "0.2", "--parts", "env,sample,update2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("probe: ")
    rows = [line.split() for line in out[2:]]
    assert [r[0] for r in rows] == ["env", "sample", "update2"]
    for r in rows:
        us = float(r[4])
        assert math.isfinite(us) and us >= 0.0
    with pytest.raises(SystemExit):
        gp.main(["--parts", "update99"])


def test_gil_calibrate_reports_known_holds(capsys):
    """bench/gil_calibrate.py: the synthetic worker's own held time per call is
    at least its busy-wait, the probe's figures are finite and the noise-subtracted
    one never exceeds the raw one; a malformed case is refused by name."""
    import importlib.util
    import math
    import os

    spec = importlib.util.spec_from_file_location(
        "gil_calibrate", os.path.join(os.path.dirname(__file__), "..", "bench", "gil_calibrate.py"))
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    rows = gc.main(["--seconds", "0.2", "--cases", "0/300,50/300"])
    assert [(r["hold_us"], r["gap_us"]) for r in rows] == [(0.0, 300.0), (50.0, 300.0)]
    assert rows[1]["true_us"] >= 50.0
    assert rows[0]["true_us"] < 50.0
    for r in rows:
        assert r["calls_per_s"] > 0
        for k in ("raw_us", "noise_subtracted_us"):
            assert math.isfinite(r[k]) and r[k] >= 0.0
        assert r["noise_subtracted_us"] <= r["raw_us"]
        if "waits_us" in r:        # the time-stamp-counter probe (x86-64)
            assert 0.0 <= r["waits_floor_subtracted_us"] <= r["waits_us"]
            assert 0.0 <= r["waits_share"] <= 1.0
    out = capsys.readouterr().out
    assert "cycles probe:" in out and "waits probe:" in out
    with pytest.raises(SystemExit, match="bad case '5-300'"):
        gc.main(["--cases", "5-300"])


def test_scaling_model_projects_from_either_gil_row(tmp_path, capsys):
    """bench/scaling_model.py: the GIL ceiling is 1 / g of the row it is told
    to use (raw by default, or the noise-subtracted one), and a missing row
    is named."""
    import importlib.util
    import json
    import os

    spec = importlib.util.spec_from_file_location(
        "scaling_model", os.path.join(os.path.dirname(__file__), "..", "bench", "scaling_model.py"))
    sm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sm)
    rows = [{"name": "train steps/s w1", "median": 2000.0},
            {"name": "GIL us/step", "median": 40.0},
            {"name": "GIL us/step (probe noise subtracted)", "median": 25.0},
            {"name": "memory bandwidth", "median": 50.0}]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"rows": rows}))
    assert sm.main([str(path), "--workers", "1,64"]) == 0
    raw = capsys.readouterr().out
    assert "GIL 40.0 us/step" in raw and "| 25,000 |" in raw       # 1 / 40 us
    assert sm.main([str(path), "--workers", "1,64",
                    "--gil-row", "GIL us/step (probe noise subtracted)"]) == 0
    sub = capsys.readouterr().out
    assert "GIL 25.0 us/step" in sub and "| 40,000 |" in sub       # 1 / 25 us
    path.write_text(json.dumps({"rows": rows[:1] + rows[3:]}))
    with pytest.raises(SystemExit):
        sm.main([str(path)])
    assert "GIL us/step" in capsys.readouterr().err
    # --gil-us replaces the row (which may then be missing); it must be > 0
    assert sm.main([str(path), "--workers", "1,64", "--gil-us", "10"]) == 0
    given = capsys.readouterr().out
    assert "GIL 10.0 us/step" in given and "| 100,000 |" in given   # 1 / 10 us
    with pytest.raises(SystemExit):
        sm.main([str(path), "--gil-us", "0"])
    assert "--gil-us" in capsys.readouterr().err
    # worker processes: no GIL ceiling, no queueing; the cores (or memory) bound
    assert sm.main([str(path), "--workers", "1,16", "--processes"]) == 0
    procs = capsys.readouterr().out
    assert "GIL 0.0 us/step" in procs and "| 32,000 | 32,000 | inf |" in procs
    with pytest.raises(SystemExit):
        sm.main([str(path), "--processes", "--gil-us", "5"])


def test_standin_scaling_prints_a_rate_per_worker_count(capsys):
    """bench/standin_scaling.py: every requested count gets a row per mode with
    a positive rate (the threads or processes really stepped) and bad counts
    or modes are refused."""
    import sys

    ss = _load_bench("standin_scaling")
    saved = list(sys.path)
    try:
        assert ss.main(["--workers", "1,2", "--seconds", "0.4", "--warmup", "0.2"]) == 0
        out = capsys.readouterr().out
        assert ss.main(["--workers", "1,2", "--seconds", "0.4", "--warmup", "0.3",
                        "--mode", "processes,threads"]) == 0
        out2 = capsys.readouterr().out
    finally:
        sys.path[:] = saved
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("threads", "1"), ("threads", "2")]
    assert all(float(r[2]) > 0 for r in rows)
    assert rows[0][3] == "1.00x"
    rows = [line.split() for line in out2.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("processes", "1"), ("threads", "1"),
                                            ("processes", "2"), ("threads", "2")]
    assert all(float(r[2]) > 0 for r in rows)
    assert rows[0][3] == rows[1][3] == "1.00x"
    for bad in (["--workers", "0"], ["--workers", "x"], ["--workers", ""],
                ["--mode", "fibers"], ["--mode", ""]):
        with pytest.raises(SystemExit):
            ss.main(bad)


def test_standin_processes_share_params_and_moments():
    """standin_scaling._share: the params and Adam's moments keep their values
    and become one mapping that a forked process writes and this one reads."""
    import multiprocessing as mp
    import sys

    import numpy as np

    from a3c_core.nn.network import build_network

    ss = _load_bench("standin_scaling")
    net = build_network("mlp", (4,), 2)
    shared = ss._shared_state(net)
    shared.optimizer.exp_avg[:] = 0.25
    before = shared.params.copy()
    mm = ss._share(shared)
    np.testing.assert_array_equal(shared.params, before)
    assert (shared.optimizer.exp_avg == 0.25).all()

    def child():
        shared.params[0] += 1.0
        shared.optimizer.exp_avg[-1] = 5.0
        shared.optimizer.exp_avg_sq[1] = 7.0
        sys.exit(0)

    p = mp.get_context("fork").Process(target=child)
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert shared.params[0] == before[0] + 1.0
    assert shared.optimizer.exp_avg[-1] == 5.0 and shared.optimizer.exp_avg_sq[1] == 7.0
    np.testing.assert_array_equal(shared.params[1:], before[1:])
    del mm


def test_gil_budget_records_kernels_and_restores_modules(capsys):
    """bench/gil_budget.py: the kernel-compute pass sees the worker's kernels
    (the fused step and the compiled backward's), gives every one a finite
    positive share, puts the module attributes back, and main prints a row
    per path (the figures themselves are benchmarks, not checked here)."""
    import importlib.util
    import math
    import os

    from numba.core.dispatcher import Dispatcher

    import a3c_core.nn.kernels as K
    import a3c_core.train.worker as W

    spec = importlib.util.spec_from_file_location(
        "gil_budget", os.path.join(os.path.dirname(__file__), "..", "bench", "gil_budget.py"))
    gb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gb)
    before = {(m.__name__, k): v for m in (K, W) for k, v in vars(m).items()
              if isinstance(v, Dispatcher)}
    w = gb.make_worker(episode=7)
    total, parts = gb.kernel_compute_us(w, rollouts=3, target_s=0.001)
    assert {(m.__name__, k): v for m in (K, W) for k, v in vars(m).items()
            if isinstance(v, Dispatcher)} == before
    # the worker's fused act (preprocessing, recorded step and sampling in one call)
    assert "doom_act_packed" in parts and "sample_categorical" not in parts
    if w.net.compiled_backward:
        assert {"conv_backward", "dense_backward", "lstm_backward", "heads_loss"} <= set(parts)
        w.rollout()   # the network's kept backward calls hold the kernels again, not wrappers
        assert w.net._bw_calls and all(isinstance(k, Dispatcher)
                                       for _, _, calls in w.net._bw_calls.values()
                                       for k, _ in calls)
    assert all(math.isfinite(v) and v >= 0 for v in parts.values())
    assert total == pytest.approx(sum(parts.values()))
    assert gb.main(["--seconds", "0.05", "--repeats", "1", "--episode", "5"]) == 0
    out = capsys.readouterr().out
    for path in ("numpy, paper", "numpy, merged", "less the Numba kernels"):
        assert path in out


def _load_bench(name):
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        name, os.path.join(os.path.dirname(__file__), "..", "bench", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gil_holds_stretches_count_short_calls_as_held():
    """bench/gil_holds.py: a stretch runs from a long call's end to the next
    long call's start; short calls inside it are part of it."""
    gh = _load_bench("gil_holds")
    us = 1000
    events = [("a", 0, 100 * us), ("short", 103 * us, 110 * us), ("b", 112 * us, 300 * us),
              ("a", 305 * us, 400 * us)]
    assert gh.stretches(events, 40 * us) == [("a", "b", 12 * us, 1), ("b", "a", 5 * us, 0)]
    assert gh.stretches(events, 5 * us) == [("a", "short", 3 * us, 0), ("short", "b", 2 * us, 0),
                                            ("b", "a", 5 * us, 0)]


def test_gil_holds_runs_and_restores_the_modules(capsys):
    from numba.core.dispatcher import Dispatcher

    import a3c_core.core.optim as OP
    import a3c_core.core.shared as SH
    import a3c_core.nn.kernels as K
    import a3c_core.train.worker as W

    gh = _load_bench("gil_holds")
    before = {(m.__name__, k): v for m in (K, W) for k, v in vars(m).items()
              if isinstance(v, Dispatcher)}
    hog = (SH._hogwild, OP._hogwild)
    assert gh.main(["--rollouts", "4", "--repeats", "1", "--episode", "7"]) == 0
    out = capsys.readouterr().out
    assert "GIL held per agent step" in out
    assert "doom_act_packed" in out and "env step (nogil spin)" in out
    assert {(m.__name__, k): v for m in (K, W) for k, v in vars(m).items()
            if isinstance(v, Dispatcher)} == before
    assert (SH._hogwild, OP._hogwild) == hog
    # a worker with 2 envs: both envs' steps are timed, one update per 2 parts
    assert gh.main(["--rollouts", "3", "--repeats", "1", "--episode", "7", "--envs", "2"]) == 0
    assert "env step (nogil spin)" in capsys.readouterr().out
    for bad in (["--short-us", "0"], ["--envs", "0"], ["--engine-core", "0"]):
        with pytest.raises(SystemExit):
            gh.main(bad)


def test_gil_holds_doom_times_the_engine_calls(capsys):
    """bench/gil_holds.py --doom: ViZDoom's make_action is a long call, the
    state reads are recorded, each env's game is put back and the envs are
    closed; --engine-core leaves this thread's cores as they were."""
    pytest.importorskip("vizdoom")
    import os

    gh = _load_bench("gil_holds")
    envs = gh._doom_envs(1, engine_core=sorted(os.sched_getaffinity(0))[0])
    try:
        game = envs[0]._game
        mask = os.sched_getaffinity(0)
        rec = gh._Recorder()
        gh.instrument(gh._gil_parts()._stand_in_worker(
            _image_pipe(envs[0]), envs[0]), rec)
        assert type(envs[0]._game).__name__ == "_Game"
        rec.restore()
        assert envs[0]._game is game
        assert os.sched_getaffinity(0) == mask
    finally:
        envs[0].close()
    assert gh.main(["--doom", "--rollouts", "3", "--repeats", "1", "--calls"]) == 0
    out = capsys.readouterr().out
    assert "doom make_action -> doom_act_packed" in out
    assert "doom get_state" in out and "doom is_episode_finished" in out


def _image_pipe(env):
    from a3c_core.obs import ObsPipeline
    return ObsPipeline({"kind": "image", "out_shape": [84, 84]}, env.obs_shape)


def test_batched_forward_reports_each_k(capsys):
    """bench/batched_forward.py: one row per K, per-agent-step time = batched / K."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "batched_forward", os.path.join(os.path.dirname(__file__), "..", "bench",
                                        "batched_forward.py"))
    bf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bf)
    assert bf.main(["--ks", "1,3", "--reps", "1", "--min-time", "0.001"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [int(r[0]) for r in rows] == [1, 3]
    for k, batched, per_step, _ in rows:
        assert float(per_step) == pytest.approx(float(batched) / int(k), abs=0.06)
    with pytest.raises(SystemExit):
        bf.main(["--ks", "0"])
    with pytest.raises(SystemExit):
        bf.main(["--ks", "a"])
    with pytest.raises(SystemExit):
        bf.main(["--min-time", "0"])


def test_converged_throughput_measures_threads_and_processes(tmp_path):
    """bench/converged_throughput.py resumes a copy of a run (left as it was)
    with worker threads or, with ``+p``, worker processes, and counts their
    steps; bad modes are refused."""
    pytest.importorskip("gymnasium")
    from a3c_core.train.config import Config
    from a3c_core.train.trainer import make_trainer

    run = str(tmp_path / "run")
    make_trainer(Config(env="CartPole-v1", spec="mlp", workers=2, total_steps=1500, run_dir=run,
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


def test_device_rows_table_pairs_threads_with_processes(tmp_path, capsys):
    """bench/device_rows.py table over hand-made e2e files (the list that its
    e2e mode writes, and `a3c bench --json`'s document): each worker count's
    pairs with the processes / threads ratio of each; a file whose name says
    neither mode is rejected."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "device_rows", os.path.join(os.path.dirname(__file__), "..", "bench", "device_rows.py"))
    dr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dr)

    def row(w, mean):
        return {"name": f"train steps/s w{w}", "median": mean, "min": mean, "max": mean,
                "unit": "steps/s", "notes": "", "samples": 1, "workers": w, "mean": mean}

    means = {("T", 1): 8000.0, ("P", 1): 13600.0, ("P", 2): 12000.0, ("T", 2): 7500.0}
    paths = []
    for (mode, pair), mean in means.items():
        p = tmp_path / f"e2e_w16_{mode}{pair}.json"
        rows = [row(16, mean), {"name": "train frames/s w16", "median": 4 * mean, "min": 0,
                                "max": 0, "unit": "frames/s", "notes": "", "samples": 1,
                                "workers": 16, "mean": 4 * mean}]
        doc = {"rows": rows} if pair == 2 else rows
        p.write_text(json.dumps(doc))
        paths.append(str(p))
    (tmp_path / "e2e_w8_T1.json").write_text(json.dumps([row(8, 6000.0)]))
    paths.append(str(tmp_path / "e2e_w8_T1.json"))
    assert dr.main(["table", *paths]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "  8 workers: pair 1 incomplete"
    assert "T1     8000  P1    13600  P/T 1.70" in lines[1]
    assert "T2     7500  P2    12000  P/T 1.60" in lines[1]
    bad = tmp_path / "e2e_w16.json"
    bad.write_text("[]")
    assert dr.main(["table", str(bad)]) == 2
    assert "_T<pair>.json" in capsys.readouterr().err
    missing, broken = tmp_path / "e2e_w16_T3.json", tmp_path / "e2e_w16_P3.json"
    broken.write_text('{"rows": [{"name": "train steps/s w16"}]}')
    for path, why in ((missing, "FileNotFoundError"), (broken, "KeyError")):
        assert dr.main(["table", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"{path}: not an e2e rows file ({why}" in err
    assert dr.main(["e2e", "16", "1", "1", "1", str(bad), "fast"]) == 2
    assert "unknown mode 'fast'" in capsys.readouterr().err


def test_dispatch_cost_prints_each_call_and_restores_the_kernel(capsys):
    """bench/dispatch_cost.py: a row per call with positive times, and the
    step's kernel put back after the no-op stand-in."""
    import importlib.util

    import a3c_core.nn.kernels as K

    spec = importlib.util.spec_from_file_location(
        "dispatch_cost", os.path.join(os.path.dirname(__file__), "..", "bench", "dispatch_cost.py"))
    dc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dc)
    kernel = K.doom_act_packed
    assert dc.main(["--calls", "40", "--repeats", "1"]) == 0
    assert K.doom_act_packed is kernel
    lines = capsys.readouterr().out.splitlines()[1:]
    names = ["no-op, 2 arrays", "no-op, 20 arrays", "no-op, 20 arrays, entry_point",
             "20 steps via Actor.step_row, per step", "20 prepared kernel calls, per step"]
    assert [ln[:45].strip() for ln in lines] == names
    assert all(float(ln.split()[-3]) > 0 for ln in lines)
    with pytest.raises(SystemExit):
        dc.main(["--calls", "0"])
