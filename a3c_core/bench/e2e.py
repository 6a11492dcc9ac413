"""The end-to-end rows of ``a3c bench``: a real trainer's throughput.

* ``train steps/s wN`` / ``train frames/s wN``: a real
  :class:`~a3c_core.train.trainer.Trainer` with N worker threads (or, with
  ``--worker-processes``, processes); once every worker has made its first
  update plus a warm-up period, the global step counter is sampled every
  0.5 s for ``--seconds``; median/min/max are over those windows, the note
  gives the whole-window mean.  frames/s = steps/s x frame skip.  With
  ``--envs-per-worker K`` (K > 1) the names end in ``kK``.
* ``step env/forward/backward/apply/glue wN``: where an agent step went in
  the measured window, from the workers' own timers (:func:`_step_breakdown`).
* ``env-only ceiling wN``: the agent steps/s of min(N, cores) envs stepped
  alone, each at the ``env step`` row's time (one env and its engine
  pinned to one core, as a training worker's are; resets not counted), and
  the share of it training reached: how close training runs to its env.
* ``scaling wN`` = steps/s(N) / (N x steps/s(1)).

The trainer is imported when a run starts (:class:`_TrainerRun`), not with
this module.
"""
from __future__ import annotations

import io
import os
import tempfile
import threading
import time

from a3c_core.bench.machine import Row
from a3c_core.train.affinity import allowed_cores
from a3c_core.train.config import Config


class _TrainerRun:
    """A real Trainer in a background thread, stopped by :meth:`stop`."""

    def __init__(self, env, spec, workers, seed=0, limit_s=600.0, envs_per_worker=1,
                 processes=False):
        from a3c_core.train.trainer import Trainer

        self.tmp = tempfile.TemporaryDirectory(prefix="a3c-bench-")
        cfg = Config(env=env, spec=spec, workers=workers, total_steps=0, total_seconds=float(limit_s),
                     seed=seed, envs_per_worker=int(envs_per_worker), run_dir=os.path.join(self.tmp.name, "run"), quiet=True,
                     tensorboard=False, checkpoint_interval=0.0, log_interval=1.0,
                     worker_processes=bool(processes))
        self.trainer = Trainer(cfg, out=io.StringIO())
        self.n_envs = int(workers) * int(envs_per_worker)
        self.ramp_s = 0.0
        es = self.trainer.env_spec if isinstance(self.trainer.env_spec, dict) else {}
        self.frame_skip = int(es.get("frame_skip") or cfg.frame_skip or 1)
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._run, name="a3c-bench-trainer", daemon=True)

    def _run(self):
        try:
            self.result = self.trainer.run()
        except BaseException as e:  # noqa: BLE001 - re-raised by stop()
            self.error = e

    @property
    def steps(self):
        return self.trainer.live_steps()

    def _all_updated(self):
        """Every worker is built (its envs started) and has applied an update."""
        counts = self.trainer.worker_updates()
        return bool(counts) and min(counts) > 0

    def start(self, warmup, timeout=None):
        """Start; return once every worker has made its first update and
        ``warmup`` s passed.

        The envs start one ViZDoom init at a time (a module lock), beside
        the warm-up and then in the workers that still lack theirs, so with
        many workers (times ``envs_per_worker``) the last one starts
        seconds after the first: a window that opened at the first update
        would time a ramp.  ``self.ramp_s`` is the time
        from the first update to the last worker's first update."""
        if timeout is None:     # the envs start one at a time: ~0.1-0.3 s each
            timeout = 120.0 + 0.5 * self.n_envs
        self.thread.start()
        t_end = time.perf_counter() + timeout
        t_first = None
        while not self._all_updated():
            if t_first is None and self.steps > 0:
                t_first = time.perf_counter()
            if not self.thread.is_alive() or time.perf_counter() > t_end:
                self.stop()
                raise RuntimeError("training produced no steps" if t_first is None else
                                   f"not every worker updated within {timeout:g} s")
            time.sleep(0.02)
        self.ramp_s = time.perf_counter() - t_first if t_first is not None else 0.0
        time.sleep(warmup)

    def sample_rates(self, seconds, tick=0.5):
        """Steps/s over ``tick`` windows for ``seconds``; also the overall mean."""
        rates = []
        t0 = t_prev = time.perf_counter()
        s0 = s_prev = self.steps
        while True:
            time.sleep(tick)
            t, s = time.perf_counter(), self.steps
            rates.append((s - s_prev) / (t - t_prev))
            t_prev, s_prev = t, s
            if t - t0 >= seconds:
                break
            if not self.thread.is_alive():
                break
        return rates, (s_prev - s0) / (t_prev - t0)

    def stop(self):
        self.trainer.stop_event.set()
        self.thread.join(120)
        try:
            if self.error is not None:
                raise self.error
        finally:
            self.tmp.cleanup()


def _step_breakdown(n, spent) -> list[Row]:
    """Where an agent step went in the measured window, from the workers'
    timers (``LossStats``' ``t_*`` fields, summed over the workers): env,
    forward (with the preprocessing), backward, apply, and the rest (Python
    glue, the targets, the pull, self-imitation), in us per agent step of
    one worker and as shares of the rollouts' wall time."""
    from a3c_core.train.store import LossStats
    f = {name: float(v) for name, v in zip(LossStats.FIELDS, spent)}
    steps = f["agent_steps"]
    if steps <= 0 or f["t_rollout"] <= 0:
        return []
    parts = [("env", f["t_env"]), ("forward", f["t_forward"]),
             ("backward", f["t_backward"]), ("apply", f["t_apply"])]
    parts.append(("glue", f["t_rollout"] - sum(v for _, v in parts)))
    rows = []
    for name, sec in parts:
        us = 1e6 * sec / steps
        rows.append(Row(f"step {name} w{n}", [us], "us",
                        f"{100 * sec / f['t_rollout']:.0f}% of a worker's rollout time "
                        f"(per agent step, {n} worker(s))",
                        {"workers": n, "share": sec / f["t_rollout"]}))
    return rows


def bench_e2e(env, spec, worker_counts, seconds, warmup, envs_per_worker=1,
              processes=False, env_step_us=None) -> list[Row]:
    """The training rows for each worker count in turn (see the module
    docstring); with ``env_step_us`` (the ``env step`` row) also each
    count's env-only ceiling."""
    cores = len(allowed_cores()) or os.cpu_count() or 1
    rows, base = [], None
    per = f", {envs_per_worker} envs each" if envs_per_worker > 1 else ""
    kk = f" k{envs_per_worker}" if envs_per_worker > 1 else ""
    kind = "process(es)" if processes else "thread(s)"
    for n in worker_counts:
        run = _TrainerRun(env, spec, n, envs_per_worker=envs_per_worker, processes=processes)
        run.start(warmup)
        before = run.trainer.backend.loss_totals()
        rates, mean = run.sample_rates(seconds)
        spent = run.trainer.backend.loss_totals() - before
        run.stop()
        fs = run.frame_skip
        rows.append(Row(f"train steps/s w{n}{kk}", rates, "steps/s",
                        f"{n} worker {kind}{per}; mean {mean:.0f} over {seconds:g}s after warm-up "
                        f"(all workers updating {run.ramp_s:.1f}s after the first)",
                        {"workers": n, "mean": mean, "ramp_s": run.ramp_s,
                         "processes": bool(processes)}))
        rows.append(Row(f"train frames/s w{n}{kk}", [r * fs for r in rates], "frames/s",
                        f"steps/s x frame skip {fs}; mean {mean * fs:.0f}", {"workers": n, "mean": mean * fs}))
        rows.extend(_step_breakdown(f"{n}{kk}", spent))
        if env_step_us:
            ceiling = min(n, cores) * 1e6 / env_step_us
            rows.append(Row(f"env-only ceiling w{n}{kk}", [ceiling], "steps/s",
                            f"{min(n, cores)} core(s) x 1 / env step ({env_step_us:.0f} us "
                            f"alone); training ran at {100 * mean / ceiling:.0f}% of it",
                            {"workers": n, "train_share": mean / ceiling}))
        if n == 1:
            base = mean
        if base and n > 1:
            eff = mean / (n * base)
            rows.append(Row(f"scaling w{n}{kk}", [eff], "ratio",
                            f"steps/s(w{n}) / ({n} x steps/s(w1)); speed-up {mean / base:.2f}x",
                            {"workers": n}))
    return rows
