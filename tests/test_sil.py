"""Self-imitation learning in the worker (``RolloutSettings.self_imitation``):
the episodes it keeps against what the env played, the targets it replays them
with, and its update against finite differences of the SIL loss."""
import re

import numpy as np
import pytest

from a3c_core.core import SharedState, make_optimizer
from a3c_core.core.normalize import ST_SCALE, AdvantageNormalizer, ReturnNormalizer
from a3c_core.envs.base import Env
from a3c_core.nn.network import build_network
from a3c_core.obs import ObsPipeline
from a3c_core.train.config import Config, resolve
from a3c_core.train.sil import SelfImitation
from a3c_core.train.worker import RolloutSettings, Store, ThreadStore, Worker


class TaggedEnv(Env):
    """Vector env: obs ``[tag, episode, t]``; episode e lasts ``lengths[e % n]``
    steps, each paying ``e + 1`` (so every episode's return is its own); it
    logs what the agent saw, did and got, per episode."""

    def __init__(self, tag, lengths, *, truncate=False):
        self.env_id = "test:tagged"
        self.n_actions = 3
        self.action_names = ["a", "b", "c"]
        self.obs_shape = (3,)
        self.obs_dtype = np.dtype(np.float32)
        self.obs_kind = "vector"
        self.frame_skip = 1
        self.preprocess_spec = {"kind": "vector"}
        self.default_network = "mlp-lstm"
        self.tag, self.lengths, self.truncate = tag, list(lengths), truncate
        self.episode, self.t = -1, 0
        self.log = []           # per episode: [(obs, action, reward)]

    def _obs(self):
        return np.array([self.tag, self.episode, self.t], np.float32)

    def reset(self):
        self.episode += 1
        self.t = 0
        self.log.append([])
        return self._obs()

    def step(self, action):
        seen = self._obs()
        r = float(self.episode + 1)
        self.log[-1].append((seen, int(action), r))
        self.t += 1
        done = self.t == self.lengths[self.episode % len(self.lengths)]
        return self._obs(), r, done and not self.truncate, done and self.truncate


class SpyStore(ThreadStore):
    """Hogwild on a real (float32) SharedState; keeps a copy of every
    gradient applied (a float64 network's are only kept)."""

    def __init__(self, shared, normalizer=None, adv_normalizer=None):
        super().__init__(shared, normalizer, adv_normalizer=adv_normalizer)
        self.grads = []

    def apply(self, grads, max_grad_norm, offset=0, local=None):
        self.grads.append(np.array(grads, np.float64))
        if grads.dtype != np.float32:
            return 0.0, True
        return super().apply(grads, max_grad_norm, offset, local=local)


def _sil_worker(envs, *, t_max=4, dtype=np.float32, normalizer=None,
                adv_normalizer=None, reward_scale=1.0, **kw):
    net = build_network("mlp-lstm", (3,), 3, hidden=(8,), lstm_size=4, seed=0, dtype=dtype)
    shared = SharedState(net.params.astype(np.float32),
                         make_optimizer("adam", net.n_params, lr=1e-3))
    store = SpyStore(shared, normalizer, adv_normalizer)
    s = RolloutSettings(t_max=t_max, gamma=0.9, reward_scale=reward_scale,
                        normalize_advantages=adv_normalizer is not None, self_imitation=True,
                        **kw)
    pipe = ObsPipeline({"kind": "vector"}, (3,))
    w = Worker(0, envs if len(envs) > 1 else envs[0], net, pipe, store, s,
               np.random.default_rng(0))
    return w, net, store


@pytest.mark.parametrize("n_envs", [1, 2])
@pytest.mark.parametrize("across", [False, True])
def test_kept_episodes_are_the_ones_the_envs_played(n_envs, across):
    """Episodes of 3, 6 and 9 steps with t_max 4 span rollouts (and, with
    rollouts across episodes, share them): every finished episode is kept
    (fewer than SIL_EPISODES), row for row what the agent saw, did and got;
    the running ones are not."""
    envs = [TaggedEnv(tag, [3, 6, 9][tag:] + [3, 6, 9][:tag]) for tag in range(n_envs)]
    # across: merge_below's switch on from the first episode (a window of one)
    w, _, _ = _sil_worker(envs, merge_below=1e9 if across else 0.0, merge_window=1)
    for _ in range(10):
        w.rollout()
    kept = {(int(e[1][0, 0]), int(e[1][0, 1])): e for e in w.sil.buf}
    finished = [(env.tag, i, ep) for env in envs for i, ep in enumerate(env.log)
                if len(ep) == env.lengths[i % 3]]
    assert 2 <= len(finished) < SelfImitation.EPISODES
    assert sorted(kept) == sorted((tag, i) for tag, i, _ in finished)
    for tag, i, ep in finished:
        ret, obs, acts, raw = kept[(tag, i)]
        np.testing.assert_array_equal(obs, np.array([o for o, _, _ in ep]))
        np.testing.assert_array_equal(acts, [a for _, a, _ in ep])
        np.testing.assert_array_equal(raw, [r for _, _, r in ep])
        assert ret == sum(r for _, _, r in ep)
    # best first
    assert [e[0] for e in w.sil.buf] == sorted((e[0] for e in w.sil.buf), reverse=True)


def test_the_buffer_keeps_the_best_episodes_within_its_row_cap(monkeypatch):
    monkeypatch.setattr(SelfImitation, "EPISODES", 3)
    monkeypatch.setattr(SelfImitation, "ROWS", 10)
    w, _, _ = _sil_worker([TaggedEnv(0, [3])])

    def close(ret, rows):
        got = w.sil_keep(np.zeros((rows, 3), np.float32), np.zeros(rows, np.int64),
                         np.full(rows, ret / rows))
        buf = [(round(e[0], 6), len(e[2])) for e in w.sil.buf]
        assert got == ((round(ret, 6), rows) in buf)
        return buf

    assert close(1.0, 2) == [(1.0, 2)]
    assert close(3.0, 2) == [(3.0, 2), (1.0, 2)]
    assert close(2.0, 2) == [(3.0, 2), (2.0, 2), (1.0, 2)]
    assert close(0.5, 2) == [(3.0, 2), (2.0, 2), (1.0, 2)]      # not among the best 3
    assert close(5.0, 2) == [(5.0, 2), (3.0, 2), (2.0, 2)]      # the worst one goes
    assert close(4.0, 6) == [(5.0, 2), (4.0, 6), (3.0, 2)]      # 10 rows at most
    assert close(6.0, 9) == [(6.0, 9)]
    assert close(7.0, 11) == [(6.0, 9)]     # an episode over the cap is never kept whole
    with pytest.raises(ValueError, match="2 observation rows, 3 actions and 3 rewards"):
        w.sil_keep(np.zeros((2, 3), np.float32), np.zeros(3, np.int64), np.ones(3))
    assert close(6.5, 9) == [(6.5, 9)]


def test_sil_keep_refuses_rows_the_replay_could_not_use():
    w, _, _ = _sil_worker([TaggedEnv(0, [3])])
    ok = (np.zeros((2, 3), np.float32), np.zeros(2, np.int64), np.ones(2))
    assert w.sil_keep(*ok)
    bad = {"observation rows must be a (3,) float32": (np.zeros((2, 4), np.float32),) + ok[1:],
           "got (3,) float64": (np.zeros((2, 3)),) + ok[1:],
           "got list": ([[0.0] * 3] * 2,) + ok[1:],
           "actions must be integers in [0, 3); got int64 in [0, 3]":
               (ok[0], np.array([0, 3]), ok[2]),
           "got float64 in [0.0, 0.0]": (ok[0], np.zeros(2), ok[2]),
           "actions must be integers in [0, 3); got object": (ok[0], np.array([None, 1]), ok[2]),
           "NaN or an infinity": ok[:2] + (np.array([1.0, np.nan]),)}
    for msg, args in bad.items():
        with pytest.raises(ValueError, match=re.escape(msg)):
            w.sil_keep(*args)
    assert len(w.sil.buf) == 1          # nothing refused was kept


def test_sil_keep_refuses_a_worker_without_self_imitation():
    net = build_network("mlp-lstm", (3,), 3, hidden=(8,), lstm_size=4, seed=0)
    shared = SharedState(net.params.copy(), make_optimizer("adam", net.n_params))
    w = Worker(0, TaggedEnv(0, [3]), net, ObsPipeline({"kind": "vector"}, (3,)),
               ThreadStore(shared), RolloutSettings(t_max=4), np.random.default_rng(0))
    with pytest.raises(RuntimeError, match="self_imitation is off"):
        w.sil_keep(np.zeros((2, 3), np.float32), np.zeros(2, np.int64), np.ones(2))


def test_an_episode_longer_than_the_row_cap_is_dropped_as_it_plays(monkeypatch):
    monkeypatch.setattr(SelfImitation, "ROWS", 7)
    w, _, _ = _sil_worker([TaggedEnv(0, [9, 3])], t_max=4)
    for _ in range(8):
        w.rollout()
    assert [len(e[2]) for e in w.sil.buf] == [3, 3]      # the 9-step episodes are not kept


def test_targets_are_discounted_returns_in_the_learning_scale():
    raw = np.array([3.0, -2.0, 0.5, 4.0])
    w, _, _ = _sil_worker([TaggedEnv(0, [3])], reward_scale=0.5, reward_clip=1.0)
    r = np.clip(raw, -1, 1) * 0.5
    want = [r[0] + .9 * r[1] + .81 * r[2] + .729 * r[3], r[1] + .9 * r[2] + .81 * r[3],
            r[2] + .9 * r[3], r[3]]
    np.testing.assert_allclose(w.sil.targets(raw), want, rtol=1e-6)   # float32 targets
    # normalized rewards: the normalizer's current scale (read, not merged), then norm_clip
    norm = ReturnNormalizer(0.9)
    norm.update([1.0, 3.0, 5.0])
    w, _, _ = _sil_worker([TaggedEnv(0, [3])], normalizer=norm, reward_scale=None, norm_clip=0.3)
    before = norm.stats.copy()
    r = np.clip(raw * norm.scale, -0.3, 0.3)
    want = [r[0] + .9 * r[1] + .81 * r[2] + .729 * r[3], r[1] + .9 * r[2] + .81 * r[3],
            r[2] + .9 * r[3], r[3]]
    np.testing.assert_allclose(w.sil.targets(raw), want, rtol=1e-6)   # float32 targets
    np.testing.assert_array_equal(norm.stats, before)


def _sil_loss(net, obs, acts, R, c, beta):
    """The SIL loss of Oh et al. (2018) at the network's current parameters:
    -sum log pi(a_t) c_t + beta / 2 sum max(R_t - V_t, 0)^2, c_t held fixed."""
    z = np.zeros(len(acts))
    net.loss(obs, acts, z, z, None, value_coef=0.0, entropy_beta=0.0)
    p = net.last_probs[np.arange(len(acts)), acts]
    v = net.last_values
    return float(-(np.log(p) * c).sum() + beta / 2 * (np.maximum(R - v, 0.0) ** 2).sum())


@pytest.mark.parametrize("adv_norm", [False, True])
def test_update_is_the_gradient_of_the_sil_loss(adv_norm):
    """float64: the gradient a replay applies equals centred differences of
    the SIL loss, with the clipped advantage (times the advantage scale)
    held fixed."""
    an = None
    if adv_norm:
        an = AdvantageNormalizer()
        an.update([0.5, -1.5, 2.0])
    w, net, store = _sil_worker([TaggedEnv(0, [3])], dtype=np.float64, adv_normalizer=an)
    rng = np.random.default_rng(3)
    obs = rng.normal(size=(7, 3))
    acts = rng.integers(0, 3, 7)
    raw = np.array([0.0, 1.0, -3.0, 0.0, 2.0, -1.0, 0.5])
    w.sil.buf = [(float(raw.sum()), obs, acts, raw)]
    R = w.sil.targets(raw)
    z = np.zeros(7)
    net.loss(obs, acts, z, z, None)
    c = np.maximum(R - net.last_values, 0.0)
    assert 0 < (c > 0).sum() < 7           # some steps beat the value, some do not
    scale = float(an.stats[ST_SCALE]) if adv_norm else 1.0
    c = c * scale
    params0 = net.params.copy()
    w.sil_replay(7)
    assert (w.stats.sil_replays, w.stats.sil_updates, len(store.grads)) == (1, 1, 1)
    g = store.grads[0]
    twin = build_network("mlp-lstm", (3,), 3, hidden=(8,), lstm_size=4, dtype=np.float64)
    for i in rng.choice(net.n_params, 25, replace=False):
        fd = []
        for eps in (1e-6, -1e-6):
            twin.params[:] = params0
            twin.params[i] += eps
            fd.append(_sil_loss(twin, obs, acts, R, c, SelfImitation.VALUE_COEF))
        np.testing.assert_allclose(g[i], (fd[0] - fd[1]) / 2e-6, rtol=1e-5, atol=1e-8)


def test_no_update_where_no_return_beats_the_value():
    w, net, store = _sil_worker([TaggedEnv(0, [3])], dtype=np.float64)
    obs = np.zeros((4, 3))
    w.sil.buf = [(-400.0, obs, np.zeros(4, np.int64), np.full(4, -100.0))]
    w.sil_replay(4)
    assert (w.stats.sil_replays, w.stats.sil_updates, store.grads) == (1, 0, [])


def test_replays_follow_the_steps_played():
    """A replay costs its episode's rows: 10 played steps buy replays of a
    4-step episode until the credit is spent (3 replays, 2 rows owed)."""
    w, _, store = _sil_worker([TaggedEnv(0, [3])])
    w.sil.buf = [(8.0, np.zeros((4, 3), np.float32), np.zeros(4, np.int64), np.full(4, 2.0))]
    w.sil_replay(10)
    assert w.stats.sil_replays == 3 and w.sil.credit == -2
    w.sil_replay(1)
    assert w.stats.sil_replays == 3 and w.sil.credit == -1


def test_off_keeps_nothing():
    env = TaggedEnv(0, [3])
    net = build_network("mlp-lstm", (3,), 3, hidden=(8,), lstm_size=4, seed=0)
    shared = SharedState(net.params.copy(), make_optimizer("adam", net.n_params))
    w = Worker(0, env, net, ObsPipeline({"kind": "vector"}, (3,)), SpyStore(shared),
               RolloutSettings(t_max=4, reward_scale=1.0), np.random.default_rng(0))
    for _ in range(4):
        w.rollout()
    assert w.sil is None and len(w.store.grads) == 4


def test_a_store_without_its_normalizers_arrays_is_refused():
    class Bare(Store):
        pass

    net = build_network("mlp-lstm", (3,), 3, hidden=(8,), lstm_size=4, seed=0)
    with pytest.raises(ValueError, match="self_imitation"):
        Worker(0, TaggedEnv(0, [3]), net, ObsPipeline({"kind": "vector"}, (3,)), Bare(),
               RolloutSettings(self_imitation=True), np.random.default_rng(0))


def test_config_defaults_and_override():
    assert resolve(Config(env="doom:basic")).self_imitation is False
    assert resolve(Config(env="doom:deadly_corridor")).self_imitation is True
    assert resolve(Config(env="doom:deadly_corridor", self_imitation=False)).self_imitation is False
    assert resolve(Config(env="CartPole-v1", self_imitation=True), "vector").self_imitation
    with pytest.raises(ValueError, match="self_imitation"):
        Config(self_imitation="yes").validate()
    # a run saved before the field existed resumes without replays; one
    # saved since keeps what it trained with (config.toml pins it)
    old = Config.from_dict({"env": "doom:deadly_corridor"}, saved_run=True)
    assert resolve(old).self_imitation is False
    cfg = Config(env="doom:deadly_corridor")
    assert cfg.pinned(resolve(cfg)).self_imitation is True


# processes in the slow tier: the default tier's time is near its 3-minute budget
@pytest.mark.parametrize("backend", ["--no-worker-processes",
                                     pytest.param("--worker-processes", marks=pytest.mark.slow)])
def test_train_logs_its_replays_and_a_resume_keeps_them(tmp_path, backend):
    pytest.importorskip("vizdoom")
    import os
    import subprocess
    import sys

    run = str(tmp_path / "run")

    def train(*extra):
        cmd = [sys.executable, "-m", "a3c_core", "train", "--workers", "2", "--no-tensorboard",
               "--quiet", "--log-interval", "0.25", backend, *extra]
        p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120,
                           cwd=str(tmp_path))
        assert p.returncode == 0, p.stdout + p.stderr
        with open(os.path.join(run, "metrics.csv")) as fh:
            rows = [ln.split(",") for ln in fh.read().splitlines()[1:]]
        assert "self-imitation: each worker replays its 16 best episodes" in p.stdout
        return ([(int(r[1]), float(r[3])) for r in rows if r[2] == "charts/sil_replays"],
                [float(r[3]) for r in rows if r[2] == "charts/sil_update_share"])

    replays, share = train("--env", "doom:basic", "--self-imitation", "--total-steps", "4000",
                           "--run-dir", run)
    assert replays and all(n > 0 for _, n in replays)
    assert share and all(0.0 <= x <= 1.0 for x in share)
    cfg = Config.from_toml(os.path.join(run, "config.toml"), saved_run=True)
    assert cfg.self_imitation is True
    replays, _ = train("--resume", run, "--total-steps", "7000")
    assert any(step > 4000 for step, _ in replays)         # the resumed run replays too


def test_bench_measures_a_row_replayed_per_row_played():
    """``a3c bench``'s self-imitation row times the worker's real replay: over
    the timed rounds it replays as many rows as the rollouts played, and with
    episodes that pay +1 a step every replay updates (the row's upper bound)."""
    from a3c_core.bench.network import measure_sil_cost

    r = measure_sil_cost(t_max=20, episode_rows=30, repeat=3, warmup=1)
    assert r["rounds_per_sample"] == 3                  # lcm(20, 30) / 20
    assert r["rows_played"] == 3 * 3 * 20
    assert r["rows_replayed"] == r["rows_played"] == r["replays"] * 30
    assert r["updates"] == r["replays"] > 0
    assert r["ratio"] == pytest.approx(r["sil_us_per_step"] / r["plain_us_per_step"])
