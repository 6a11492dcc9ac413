"""Run-directory metrics: CSV always, TensorBoard scalars when tensorboardX is there.

Scalar names follow one scheme (as CleanRL): ``charts/episodic_return``,
``charts/episodic_length``, ``charts/sps``, ``charts/learning_rate``,
``losses/policy_loss``, ``losses/value_loss``, ``losses/entropy``,
``losses/grad_norm``.

* ``metrics.csv``: ``wall_time,step,name,value`` (one row per scalar);
* ``episodes.csv``: ``episode,wall_time,step,worker,return,length`` with raw
  (unscaled) episode returns.
"""
from __future__ import annotations

import csv
import os
import sys
import threading


class MetricsLogger:
    def __init__(self, run_dir: str, tensorboard: bool = True, notice=sys.stderr):
        self.run_dir = run_dir
        self._lock = threading.Lock()
        new_m = not os.path.exists(os.path.join(run_dir, "metrics.csv"))
        new_e = not os.path.exists(os.path.join(run_dir, "episodes.csv"))
        self._mf = open(os.path.join(run_dir, "metrics.csv"), "a", newline="")
        self._ef = open(os.path.join(run_dir, "episodes.csv"), "a", newline="")
        self._m = csv.writer(self._mf)
        self._e = csv.writer(self._ef)
        if new_m:
            self._m.writerow(["wall_time", "step", "name", "value"])
        if new_e:
            self._e.writerow(["episode", "wall_time", "step", "worker", "return", "length"])
        self._tb = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(os.path.join(run_dir, "tb"))
            except ImportError:
                if notice is not None:
                    print(
                        "note: tensorboardX is not installed; writing CSV metrics only "
                        "(pip install 'a3c_core[log]' for TensorBoard scalars)",
                        file=notice,
                    )

    def scalar(self, name: str, value: float, step: int, wall_time: float) -> None:
        with self._lock:
            self._m.writerow([f"{wall_time:.3f}", step, name, f"{float(value):.6g}"])
            if self._tb is not None:
                self._tb.add_scalar(name, float(value), step, walltime=None)

    def episode(self, index, wall_time, step, worker, ret, length) -> None:
        with self._lock:
            self._e.writerow([index, f"{wall_time:.3f}", step, worker, f"{ret:.6g}", length])
            self._m.writerow([f"{wall_time:.3f}", step, "charts/episodic_return", f"{ret:.6g}"])
            self._m.writerow([f"{wall_time:.3f}", step, "charts/episodic_length", length])
            if self._tb is not None:
                self._tb.add_scalar("charts/episodic_return", float(ret), step)
                self._tb.add_scalar("charts/episodic_length", float(length), step)

    def flush(self) -> None:
        with self._lock:
            self._mf.flush()
            self._ef.flush()
            if self._tb is not None:
                self._tb.flush()

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._mf.close()
            self._ef.close()
            if self._tb is not None:
                self._tb.close()
