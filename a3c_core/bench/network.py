"""The network and learner rows of ``a3c bench``.

* ``step (batch 1)``: batch-1 ``net.step(obs, state)`` (LSTM state carried),
  us; the note says whether the fused ``doom_step`` kernel or the per-layer
  kernels ran, and its GFLOP/s as a share of ``sgemm peak``.
* ``loss_and_grad T=..``: forward + BPTT backward over a ``t_max``-step
  rollout, us and achieved GFLOP/s (FLOPs from
  :func:`a3c_core.bench.kernels.flops`).
* ``update T=..``: what a worker does per rollout after the forward steps:
  loss_and_grad + clip_grad_norm + Adam apply (the default) + sync_params, us.
* ``learner us/agent step``: what one worker's learner costs per agent step,
  ``(T x step + update) / T`` with ``update`` = the backward-only
  ``rollout_grad`` over the rows the T ``step(record=True)`` calls recorded +
  the trainer's update tail (norm pass, then Adam with the clip folded in and
  the worker's params written in the same sweep) (:func:`bench_learner`;
  sampling, the env and the bootstrap step, ~1 step / T more, are not in
  it).  Timed interleaved with ``learner us/agent step (recompute)`` (plain
  steps + ``loss_and_grad``, the path before backward-only updates) and,
  when torch is installed, ``learner us/agent step (torch)``: the same
  rollout done PyTorch-A3C style (T ``inference_mode`` steps,
  forward+backward recompute, ``clip_grad_norm_``, ``torch.optim.Adam`` on a
  shared model, copy back), one thread each.
* ``learner + self-imitation us/agent step`` (:func:`bench_self_imitation`,
  doom-lstm only): the plain update (``rollout_grad`` + clipped apply) with
  a real worker's self-imitation replays (a row replayed per row played,
  every replay updating), alternated with the plain update in one run; the
  note gives the ratio.
"""
from __future__ import annotations

import copy
import math
import statistics

import numpy as np

from a3c_core import core
from a3c_core._blas import limit_blas_threads
from a3c_core._fpenv import flush_denormals
from a3c_core.bench.machine import Row, us
from a3c_core.nn.network import build_network
from a3c_core.timing import time_alternating, time_call


def _rollout(net, T, rng):
    obs = rng.random((T,) + tuple(net.obs_shape), dtype=np.float32).astype(net.params.dtype)
    actions = rng.integers(0, net.n_actions, T).astype(np.int64)
    returns = rng.standard_normal(T).astype(net.params.dtype)
    adv = rng.standard_normal(T).astype(net.params.dtype)
    return obs, actions, returns, adv


def bench_network(net, T, repeat, min_time, peak, fl) -> list[Row]:
    """The step, loss_and_grad, update, learner and (doom-lstm) self-imitation
    rows; ``peak`` is the sgemm rate (GFLOP/s), ``fl`` :func:`flops` of ``T`` steps."""
    rows = []
    rng = np.random.default_rng(0)
    obs1 = rng.random(tuple(net.obs_shape), dtype=np.float32)
    holder = [net.initial_state()]

    def step():
        _, _, holder[0] = net.step(obs1, holder[0])

    s = time_call(step, repeat=repeat, min_time=min_time)
    gf = fl["per_step"]["forward"] / statistics.median(s) / 1e9
    path = "fused doom_step" if net.fused_step else "per-layer kernels"
    rows.append(Row("step (batch 1)", us(s), "us",
                    f"{net.spec['name']} ({path}); {gf:.1f} GFLOP/s = {gf / peak:.0%} of sgemm peak "
                    f"({fl['per_step']['forward'] / 1e6:.2f} MFLOP)"))

    obs, actions, returns, adv = _rollout(net, T, rng)
    state0 = net.initial_state()

    def lag():
        net.loss_and_grad(obs, actions, returns, adv, state0, value_coef=0.5, entropy_beta=0.01)

    s = time_call(lag, repeat=repeat, min_time=min_time)
    rows.append(Row(f"loss_and_grad T={T}", us(s), "us", "forward + BPTT backward, grads into flat buffer"))
    total = fl["forward"] + fl["backward"]
    gfs = [total / x / 1e9 for x in s]
    rows.append(Row(f"loss_and_grad T={T} GFLOP/s", gfs, "GFLOP/s",
                    f"{total / 1e6:.1f} MFLOP/update; {statistics.median(gfs) / peak:.0%} of sgemm peak",
                    {"fraction_of_peak": statistics.median(gfs) / peak, "flops": total}))

    shared = net.params.copy()
    opt = core.Adam(net.n_params, lr=1e-4)  # the trainer's default optimizer

    def update():
        net.loss_and_grad(obs, actions, returns, adv, state0, value_coef=0.5, entropy_beta=0.01)
        core.clip_grad_norm(net.grads, 40.0)
        opt.apply(shared, net.grads, 0)
        core.sync_params(shared, net.params)

    s = time_call(update, repeat=repeat, min_time=min_time)
    rows.append(Row(f"update T={T}", us(s), "us", "loss_and_grad + clip + Adam apply + sync_params"))

    rows.extend(bench_learner(net, T, repeat, min_time))
    if len(net.obs_shape) == 3 and net.spec["name"] == "doom-lstm":
        rows.append(bench_self_imitation(net, T, repeat))
    return rows


def _torch_learner(net, obs, actions, returns, adv, state0):
    """A PyTorch-A3C-style learner rollout for ``net``'s twin, or None without torch."""
    from a3c_core.nn import torch_twin

    try:
        torch = torch_twin.import_torch()
    except ImportError:
        return None
    torch.set_num_threads(1)
    model = torch_twin.torch_model(net)
    shared = copy.deepcopy(model)
    opt = torch.optim.Adam(shared.parameters(), lr=1e-4)
    x = torch.from_numpy(np.ascontiguousarray(obs, np.float32))
    ts0 = torch_twin.torch_state(state0, model)
    pairs = list(zip(model.parameters(), shared.parameters()))

    def rollout():
        st = ts0
        with torch.inference_mode():
            for t in range(x.shape[0]):
                logits, _, st = model(x[t:t + 1], st)
                torch.softmax(logits, 1)
        torch_twin.torch_loss_and_grad(model, obs, actions, returns, adv, state0)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 40.0)
        for p, sp in pairs:
            sp.grad = p.grad
        opt.step()
        with torch.no_grad():
            for p, sp in pairs:
                p.copy_(sp)

    return rollout


def bench_learner(net, T, repeat, min_time) -> list[Row]:
    """``learner us/agent step`` rows: backward-only (ours), recompute (ours,
    the old path) and PyTorch-style recompute (when torch is installed), the
    paths timed interleaved (one sample of each in turn) so machine load
    hits them alike.  Each = one rollout's ``T`` steps + update, / ``T``."""
    rng = np.random.default_rng(1)
    obs, actions, returns, adv = _rollout(net, T, rng)
    state0 = net.initial_state()
    shared = net.params.copy()
    opt = core.Adam(net.n_params, lr=1e-4)
    fused = core.SharedState(net.params, core.Adam(net.n_params, lr=1e-4))

    def apply():      # the path before: clip pass(es), apply pass, sync pass
        core.clip_grad_norm(net.grads, 40.0)
        opt.apply(shared, net.grads, 0)
        core.sync_params(shared, net.params)

    def backward_only():
        net.begin_rollout(T)
        s = state0
        for t in range(T):
            _, _, s = net.step(obs[t], s, record=True)
        net.rollout_grad(actions, returns, adv, value_coef=0.5, entropy_beta=0.01)
        # the trainer's update: norm pass, then apply with the clip folded in
        # and the worker's params refreshed in the same sweep
        fused.apply(net.grads, 40.0, sync_to=net.params)

    def recompute():
        s = state0
        for t in range(T):
            _, _, s = net.step(obs[t], s)
        net.loss_and_grad(obs, actions, returns, adv, state0, value_coef=0.5, entropy_beta=0.01)
        apply()

    paths = {"backward-only": backward_only, "recompute": recompute}
    torch_fn = _torch_learner(net, obs, actions, returns, adv, state0)
    if torch_fn is not None:
        paths["torch"] = torch_fn
    samples = {k: [] for k in paths}
    for fn in paths.values():
        time_call(fn, repeat=1, min_time=min_time / 4, warmup=2)
    for _ in range(repeat):
        for k, fn in paths.items():
            samples[k] += time_call(fn, repeat=1, min_time=min_time, warmup=0)
    per = {k: [s * 1e6 / T for s in v] for k, v in samples.items()}
    med = {k: statistics.median(v) for k, v in per.items()}
    # the per-sample ratio of interleaved neighbours is steadier than the ratio of medians
    ratio = statistics.median(b / a for a, b in zip(per["backward-only"], per["recompute"]))
    note = (f"T={T}: T x step(record) + rollout_grad + norm + Adam with clip and sync fused, / T; "
            f"recompute path {med['recompute']:.0f} us ({ratio:.2f}x)")
    if "torch" in med:
        tr = statistics.median(b / a for a, b in zip(per["backward-only"], per["torch"]))
        note += f"; torch recompute-style {med['torch']:.0f} us ({tr:.2f}x)"
    rows = [Row("learner us/agent step", per["backward-only"], "us", note,
                {"recompute_over_backward_only": ratio}),
            Row("learner us/agent step (recompute)", per["recompute"], "us",
                "T x step + loss_and_grad + clip + Adam + sync, / T (the path before "
                "backward-only updates)")]
    if "torch" in per:
        rows.append(Row("learner us/agent step (torch)", per["torch"], "us",
                        "PyTorch-A3C style: T inference_mode steps + forward/backward recompute "
                        "+ clip_grad_norm_ + Adam on a shared model + copy back, / T, 1 thread"))
    return rows


#: rows of each episode ``bench_self_imitation`` keeps: deadly_corridor's episodes (the
#: scenario it is on by default) run 32-41 steps once past the trap (docs/scenarios.md)
SIL_EPISODE_ROWS = 40


def measure_sil_cost(*, t_max=20, episode_rows=SIL_EPISODE_ROWS, repeat=31, warmup=3,
                     seed=0, obs_shape=(1, 84, 84), n_actions=3) -> dict:
    """Learner microseconds per agent step of the plain update and of the
    update with self-imitation (``--self-imitation``), on the doom-lstm
    workload, in one run: ``warmup`` rounds, then ``repeat`` rounds
    alternating the two; medians.

    plain: ``rollout_grad`` over one ``t_max``-row recorded rollout + the
    shared optimizer's clip and apply (with the local refresh), as a worker
    runs them.  With self-imitation: the
    same plus a real :class:`~a3c_core.train.worker.Worker`'s
    ``sil_replay`` for the rows played: it replays whole kept episodes (a
    row replayed per row played), each a batched forward over the episode,
    its backward and one more clipped Hogwild apply, with subnormal floats
    flushed to zero as in a worker thread.  The worker keeps
    ``SelfImitation.EPISODES`` episodes of ``episode_rows`` rows that each pay
    +1 per step, so every replay's return beats the value and every replay
    updates: the most a replay costs (one whose return beats no value skips
    the backward and the apply; a run logs the share that updated as
    ``charts/sil_update_share``).  A round is ``lcm(t_max, episode_rows) /
    t_max`` updates, so each replays the same rows.

    Returns ``{"plain_us_per_step", "sil_us_per_step", "ratio", "replays",
    "updates", "rows_played", "rows_replayed", "rounds_per_sample", "t_max",
    "episode_rows", "repeat"}``; the counts are over the timed rounds."""
    from a3c_core.core.normalize import AdvantageNormalizer, ReturnNormalizer
    from a3c_core.train.sil import SelfImitation
    from a3c_core.train.worker import RolloutSettings, ThreadStore, Worker

    # as in a worker: one BLAS thread, subnormal floats flushed (Worker.run)
    with limit_blas_threads(1), flush_denormals():
        net = build_network("doom-lstm", obs_shape, n_actions, seed=seed)
        shared = core.SharedState(net.params.copy(), core.make_optimizer("adam", net.n_params))
        store = ThreadStore(shared, ReturnNormalizer(0.99), adv_normalizer=AdvantageNormalizer())
        settings = RolloutSettings(t_max=t_max, gamma=0.99, reward_scale=None,
                                   normalize_advantages=True, self_imitation=True)
        w = Worker(0, _NoEnv(), net, _FramePipe(obs_shape), store, settings,
                   np.random.default_rng(seed), fused_act=False)
        rng = np.random.default_rng(seed)
        for _ in range(SelfImitation.EPISODES):
            w.sil_keep(rng.random((episode_rows,) + tuple(obs_shape)).astype(net.dtype),
                       rng.integers(0, n_actions, episode_rows), np.ones(episode_rows))
        obs = rng.random((t_max,) + tuple(obs_shape)).astype(net.dtype)
        actions = rng.integers(0, n_actions, t_max)
        returns = rng.standard_normal(t_max).astype(np.float32)
        adv = rng.standard_normal(t_max).astype(np.float32)
        net.record_rollout(obs)
        rounds = math.lcm(t_max, episode_rows) // t_max

        def plain():
            for _ in range(rounds):
                net.rollout_grad(actions, returns, adv)
                shared.apply(net.grads, 40.0, sync_to=net.params)

        def with_sil():
            for _ in range(rounds):
                net.rollout_grad(actions, returns, adv)
                shared.apply(net.grads, 40.0, sync_to=net.params)
                w.sil_replay(t_max)

        time_alternating(plain, with_sil, repeat=0, warmup=warmup)
        replays0, updates0 = w.stats.sil_replays, w.stats.sil_updates
        a, b = time_alternating(plain, with_sil, repeat=repeat, warmup=0)
    steps = rounds * t_max
    pa, pb = float(np.median(a)) * 1e6 / steps, float(np.median(b)) * 1e6 / steps
    replays = int(w.stats.sil_replays - replays0)
    return {"plain_us_per_step": pa, "sil_us_per_step": pb, "ratio": pb / pa,
            "replays": replays, "updates": int(w.stats.sil_updates - updates0),
            "rows_played": repeat * steps, "rows_replayed": replays * episode_rows,
            "rounds_per_sample": rounds, "t_max": t_max, "episode_rows": episode_rows,
            "repeat": repeat}


class _NoEnv:
    """The env of :func:`measure_sil_cost`'s worker, which only replays (never stepped)."""


class _FramePipe:
    """The pipeline of :func:`measure_sil_cost`'s worker (never called)."""

    def __init__(self, shape):
        self.net_obs_shape = tuple(shape)


def bench_self_imitation(net, T, repeat) -> Row:
    """Self-imitation's cost (``--self-imitation``): learner µs per agent
    step with its replays against the plain update, alternated in one run
    (:func:`measure_sil_cost`)."""
    r = measure_sil_cost(t_max=T, repeat=max(4 * repeat + 1, 11), warmup=3,
                         obs_shape=tuple(net.obs_shape), n_actions=net.n_actions)
    return Row("learner + self-imitation us/agent step", [r["sil_us_per_step"]], "us",
               f"{r['ratio']:.2f}x of the plain update's {r['plain_us_per_step']:.0f} us "
               f"(T={T}; a row replayed per row played, episodes of {r['episode_rows']} rows, "
               f"every replay updating; medians of {r['repeat']} alternating rounds)",
               {"ratio": r["ratio"], "plain_us_per_step": r["plain_us_per_step"]})
