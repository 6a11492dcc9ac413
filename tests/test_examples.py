"""The examples/ scripts run as documented (docs/embedding.md)."""
import os
import re
import subprocess
import sys

import numpy as np

from a3c_core import Policy, build_network

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_serve_many_serves_64_agents(tmp_path):
    net = build_network("doom-lstm", (1, 84, 84), 3, seed=3)
    net.state_dict()["policy.weight"][...] *= 100      # not uniform: the counts differ
    ckpt = str(tmp_path / "policy.npz")
    Policy.from_network(net, (60, 80), action_names=["LEFT", "RIGHT", "FIRE"]).save(ckpt)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "serve_many.py"), ckpt,
                        "--agents", "64", "--ticks", "5"],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    m = re.search(r"64 agents x 5 ticks: ([\d.]+) us per agent per tick .*batch-1 act ([\d.]+) us",
                  r.stdout)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, r.stdout
    counts = dict(re.findall(r"(LEFT|RIGHT|FIRE) (\d+)", r.stdout))
    assert sum(int(v) for v in counts.values()) == 64 * 5, r.stdout
    assert len(set(counts.values())) > 1


def test_serve_many_rejects_a_bad_checkpoint(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(np.arange(10).tobytes())
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "serve_many.py"), str(bad)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "bad.npz" in r.stderr
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
