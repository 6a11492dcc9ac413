"""Smoke tests of ``a3c bench`` and its FLOP counter (no throughput claims)."""
import json

import numpy as np
import pytest

from a3c_core import bench

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


def test_flops_from_shapes_without_network():
    shapes = {"conv1.weight": (16, 1, 8, 8), "conv1.bias": (16,),
              "conv2.weight": (32, 16, 4, 4), "conv2.bias": (32,),
              "fc.weight": (256, 2592), "fc.bias": (256,),
              "lstm.weight_ih": (1024, 256), "lstm.weight_hh": (1024, 256),
              "lstm.bias_ih": (1024,), "lstm.bias_hh": (1024,),
              "policy.weight": (3, 256), "policy.bias": (3,),
              "value.weight": (1, 256), "value.bias": (1,)}
    layers = bench.layers_from_shapes(shapes, (1, 84, 84))
    assert layers[1]["out_shape"] == (32, 9, 9)
    assert bench.flops_of_layers(layers)["per_step"]["forward"] == 2 * MACS


def test_bench_quick_table_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--quick", "--skip-e2e", "--skip-env", "--repeat", "2", "--sgemm-n", "128",
                     "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    rows = {r["name"]: r for r in doc["rows"]}
    expected = ["sgemm peak", "step (batch 1)", "loss_and_grad T=20", "loss_and_grad T=20 GFLOP/s",
                "update T=20", "rmsprop apply", "adam apply", "preprocess"]
    for name in expected:
        assert name in rows, name
        assert name in text
        r = rows[name]
        assert r["median"] > 0 and r["min"] > 0 and r["max"] >= r["median"] >= r["min"], r
    assert 0 < rows["loss_and_grad T=20 GFLOP/s"]["fraction_of_peak"]
    for key in ("cpu_model", "cpu_count", "python", "numpy", "numba"):
        assert doc["machine"][key]
    assert doc["flops"]["per_step"]["forward"] == 2 * MACS
    header = next(line for line in text.splitlines() if line.startswith("name"))
    assert header.split() == ["name", "median", "min", "max", "unit", "notes"]


def test_bench_rejects_bad_workers():
    with pytest.raises(SystemExit):
        bench.main(["--workers", "0,x"])


def test_gil_probe_sees_a_gil_holding_thread():
    import threading
    import time

    alone = bench.gil_probe(0.2)
    base = float(np.median(alone))
    stop = threading.Event()

    def hog():  # holds the GIL ~80 % of the time: 400 us of Python, 100 us of sleep
        while not stop.is_set():
            t = time.perf_counter()
            while time.perf_counter() - t < 400e-6:
                pass
            time.sleep(100e-6)

    th = threading.Thread(target=hog)
    th.start()
    try:
        busy = bench.gil_probe(0.3)
    finally:
        stop.set()
        th.join()
    # loose: the machine may be shared; the point is that the probe sees the hog
    assert bench.gil_blocked_fraction(busy, base) > bench.gil_blocked_fraction(alone, base) + 0.3
