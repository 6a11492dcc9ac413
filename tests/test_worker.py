"""The Worker's rollout logic against a scripted env whose returns are known by hand."""
import threading

import numpy as np
import pytest

from a3c_core.core import SharedState, make_optimizer
from a3c_core.core.normalize import ReturnNormalizer
from a3c_core.envs.base import Env
from a3c_core.nn.network import build_network
from a3c_core.obs import ObsPipeline
from a3c_core.train.worker import RolloutSettings, Store, ThreadStore, Worker


class ScriptedEnv(Env):
    """Vector env: obs = [episode, t]; reward r_t = script[t]; ends after len(script)
    steps, as a termination or a truncation; optionally a 'life loss' every episode."""

    def __init__(self, script, *, truncate=False, lives=1):
        self.env_id = "test:scripted"
        self.n_actions = 2
        self.action_names = ["a", "b"]
        self.obs_shape = (2,)
        self.obs_dtype = np.dtype(np.float32)
        self.obs_kind = "vector"
        self.frame_skip = 1
        self.preprocess_spec = {"kind": "vector"}
        self.default_network = "mlp-lstm"
        self.script = list(script)
        self.truncate = truncate
        self.lives = lives
        self.lives_left = lives
        self.episode = -1
        self.t = 0
        self.episode_over = True

    def reset(self):
        if self.lives_left <= 0 or self.episode < 0:
            self.lives_left = self.lives
        self.episode += 1
        self.t = 0
        return np.array([self.episode, 0], np.float32)

    def step(self, action):
        r = self.script[self.t]
        self.t += 1
        done = self.t == len(self.script)
        if done:
            self.lives_left -= 1
            self.episode_over = self.lives_left == 0
        obs = np.array([self.episode, self.t], np.float32)
        return obs, r, done and not self.truncate, done and self.truncate


class SpyNet:
    """Wraps a real network; records what loss_and_grad receives and step's values."""

    def __init__(self, net):
        self._net = net
        self.calls = []
        self.step_values = []

    def __getattr__(self, name):
        return getattr(self._net, name)

    def step(self, obs, state, record=False):
        probs, v, state = self._net.step(obs, state, record=record)
        self.step_values.append((obs.copy(), float(v)))
        return probs, v, state

    def step_batch(self, obs, state=None, done=None):      # the batched worker's bootstraps
        probs, v, state = self._net.step_batch(obs, state, done)
        for o, x in zip(obs, v):
            self.step_values.append((o.copy(), float(x)))
        return probs, v, state

    def rollout_grad(self, actions, returns, adv, **kw):   # the worker's backward-only update
        call = {"obs": self._net.recorded_obs.copy(),
                "returns": np.array(returns, np.float64), "kw": dict(kw)}
        self.calls.append(call)
        loss = self._net.rollout_grad(actions, returns, adv, **kw)
        call["entropy"] = loss["entropy"]
        return loss

    def loss_and_grad(self, obs, actions, returns, adv, state0, **kw):
        self.calls.append({"obs": obs.copy(), "returns": np.array(returns, np.float64)})
        return self._net.loss_and_grad(obs, actions, returns, adv, state0, **kw)


class RecordingStore(Store):
    def __init__(self, n_params):
        self.steps = 0
        self.episodes = []
        self.applied = 0
        self.params = np.zeros(n_params, np.float32)

    def pull(self, local):
        pass  # keep the worker's own initial params: values stay predictable

    def apply(self, grads, max_grad_norm, offset=0):
        self.applied += 1
        return 1.0, True

    def add_steps(self, n):
        self.steps += n
        return self.steps

    def record_episode(self, wid, ret, length, intrinsic=None, end=None):
        self.episodes.append((ret, length))

    def reward_scale(self, returns):
        return 1.0


def _worker(env, t_max, *, gamma=0.5, boot_trunc=True, reward_scale=1.0, reward_clip=0.0):
    net = SpyNet(build_network("mlp", (2,), 2, hidden=(8,), seed=0))
    pipe = ObsPipeline({"kind": "vector"}, env.obs_shape)
    store = RecordingStore(net.n_params)
    s = RolloutSettings(t_max=t_max, gamma=gamma, gae_lambda=1.0, reward_scale=reward_scale,
                        truncation_bootstrap=boot_trunc, reward_clip=reward_clip)
    return Worker(0, env, net, pipe, store, s, np.random.default_rng(0)), net, store


def _value_of(net, obs):
    for o, v in net.step_values:
        if np.array_equal(o, obs):
            return v
    raise AssertionError(f"no step on {obs}")


def test_terminal_episode_returns_have_no_bootstrap():
    env = ScriptedEnv([1.0, 2.0, 3.0])
    w, net, store = _worker(env, t_max=5)
    n, term, trunc, applied = w.rollout()
    assert (n, term, trunc, applied) == (3, True, False, True)
    # gamma 0.5: R2 = 3, R1 = 2 + 1.5, R0 = 1 + 0.5 * 3.5
    np.testing.assert_allclose(net.calls[0]["returns"], [2.75, 3.5, 3.0], rtol=1e-6)
    assert store.episodes == [(6.0, 3)] and store.steps == 3


def test_cut_by_t_max_bootstraps_and_shifts_the_last_obs():
    env = ScriptedEnv([1.0, 0.0, 0.0, 4.0, 0.0])
    w, net, store = _worker(env, t_max=2)
    w.rollout()
    v_s2 = _value_of(net, np.array([0, 2], np.float32))
    np.testing.assert_allclose(net.calls[0]["returns"], [1 + 0.25 * v_s2, 0.5 * v_s2], rtol=1e-5)
    w.rollout()
    # the second rollout starts where the first stopped: obs [0, 2]
    np.testing.assert_array_equal(net.calls[1]["obs"][0], [0, 2])
    v_s4 = _value_of(net, np.array([0, 4], np.float32))
    np.testing.assert_allclose(net.calls[1]["returns"], [0.5 * (4 + 0.5 * v_s4), 4 + 0.5 * v_s4],
                               rtol=1e-5)
    assert store.episodes == []
    w.rollout()  # the last step ends the episode: no bootstrap, episode recorded
    np.testing.assert_allclose(net.calls[2]["returns"], [0.0], atol=0)
    assert store.episodes == [(5.0, 5)]
    # the next rollout starts the next episode from its first observation
    w.rollout()
    np.testing.assert_array_equal(net.calls[3]["obs"][0], [1, 0])


@pytest.mark.parametrize("boot", [True, False])
def test_truncation_bootstraps_only_when_asked(boot):
    env = ScriptedEnv([1.0, 1.0], truncate=True)
    w, net, store = _worker(env, t_max=5, boot_trunc=boot)
    n, term, trunc, _ = w.rollout()
    assert (n, term, trunc) == (2, False, True)
    v_last = _value_of(net, np.array([0, 2], np.float32)) if boot else 0.0
    np.testing.assert_allclose(net.calls[0]["returns"], [1 + 0.5 * (1 + 0.5 * v_last), 1 + 0.5 * v_last],
                               rtol=1e-5)
    assert store.episodes == [(2.0, 2)]


def test_life_loss_is_terminal_for_learning_but_scores_whole_games():
    env = ScriptedEnv([1.0, 2.0], lives=3)
    w, net, store = _worker(env, t_max=5)
    for _ in range(2):
        w.rollout()
        np.testing.assert_allclose(net.calls[-1]["returns"], [2.0, 2.0], rtol=1e-6)  # 1 + 0.5*2
        assert store.episodes == []
    w.rollout()
    assert store.episodes == [(9.0, 6)]


def test_reward_clip_and_fixed_scale():
    env = ScriptedEnv([5.0, -3.0, 0.5])
    w, net, store = _worker(env, t_max=5, gamma=1.0, reward_scale=2.0, reward_clip=1.0)
    w.rollout()
    np.testing.assert_allclose(net.calls[0]["returns"], [2 * (1 - 1 + 0.5), 2 * (-1 + 0.5), 1.0])
    assert store.episodes == [(2.5, 3)]  # raw rewards are reported


class ShapedEnv(ScriptedEnv):
    """ScriptedEnv whose step adds a shaping term (like a Doom env's
    health_reward) and keeps the episode's sum in ``episode_shaping``."""

    def __init__(self, script, shaping, **kw):
        super().__init__(script, **kw)
        self.shaping = list(shaping)
        self.episode_shaping = 0.0

    def reset(self):
        self.episode_shaping = 0.0
        return super().reset()

    def step(self, action):
        sh = self.shaping[self.t]
        obs, r, term, trunc = super().step(action)
        self.episode_shaping += sh
        return obs, r + sh, term, trunc


@pytest.mark.parametrize("t_max", [5, 2])
def test_shaping_is_learned_from_but_scores_are_the_tasks_own(t_max):
    env = ShapedEnv([1.0, 2.0, 3.0], shaping=[0.0, 10.0, -4.0])
    w, net, store = _worker(env, t_max=t_max, gamma=1.0)
    while not store.episodes:
        w.rollout()
    # learning sees r + shaping = [1, 12, -1]; the logged score is 1 + 2 + 3
    if t_max == 5:
        np.testing.assert_allclose(net.calls[0]["returns"], [12.0, 11.0, -1.0], rtol=1e-6)
    assert store.episodes == [(6.0, 3)]


def test_thread_store_is_hogwild_on_shared_state_and_counts_skips():
    net = build_network("mlp", (2,), 2, hidden=(8,), seed=0)
    shared = SharedState(net.params, make_optimizer("adam", net.n_params, lr=0.1))
    got = []
    store = ThreadStore(shared, ReturnNormalizer(0.99), lambda *a, **k: got.append((a, k)))
    g = np.ones(net.n_params, np.float32)
    store.apply(g, 0.0)
    # Adam's first step: lr x g / |g| per parameter (bias-corrected moments)
    np.testing.assert_allclose(shared.params, net.params - 0.1, rtol=1e-5, atol=1e-6)
    bad = g.copy()
    bad[3] = np.nan
    store.apply(bad, 0.0)
    store.apply(bad, 0.0)
    assert store.consecutive_skips == 2 and shared.skipped_updates == 2
    store.apply(g, 0.0)
    assert store.consecutive_skips == 0
    local = np.zeros_like(shared.params)
    store.pull(local)
    np.testing.assert_array_equal(local, shared.params)
    store.record_episode(1, 5.0, 7)
    store.record_episode(0, -1.0, 3, end="died")
    assert got == [((1, 5.0, 7, 1), {"end": None}),
                   ((0, -1.0, 3, 2), {"end": "died"})]


def test_worker_run_stops_at_total_steps_and_on_event():
    env = ScriptedEnv([0.0] * 7)
    w, net, store = _worker(env, t_max=3)
    w.run(threading.Event(), total_steps=10)
    assert store.steps >= 10 and store.steps < 13
    stop = threading.Event()
    stop.set()
    before = store.steps
    w.run(stop, total_steps=0)
    assert store.steps == before


class _PullingThreadStore(ThreadStore):
    """ThreadStore without the fused apply + sync (the worker pulls every rollout)."""

    syncs_on_apply = False


def _thread_worker(store_cls, seed=0):
    env = ScriptedEnv([0.5, -1.0, 2.0, 0.0, 1.0, 3.0, -2.0])
    net = build_network("mlp-lstm", (2,), 2, hidden=(16,), lstm_size=8, seed=seed)
    pipe = ObsPipeline({"kind": "vector"}, env.obs_shape)
    shared = SharedState(net.params.copy(), make_optimizer("adam", net.n_params, lr=1e-2))
    store = store_cls(shared, ReturnNormalizer(0.9))
    s = RolloutSettings(t_max=3, gamma=0.9, max_grad_norm=0.5)
    return Worker(0, env, net, pipe, store, s, np.random.default_rng(seed)), net, shared, store


def test_fused_apply_sync_matches_pull_every_rollout():
    """The worker skips its pull after an update that refreshed its params in
    the apply sweep; with one worker that is bit for bit the old pull path."""
    wa, neta, sa, storea = _thread_worker(ThreadStore)
    wb, netb, sb, storeb = _thread_worker(_PullingThreadStore)
    pulls = []
    orig = storea.pull
    storea.pull = lambda local: (pulls.append(1), orig(local))
    for _ in range(12):
        ra, rb = wa.rollout(), wb.rollout()
        assert ra == rb
        np.testing.assert_array_equal(sa.params, sb.params)
        np.testing.assert_array_equal(neta.params, sa.params)
    assert sa.updates == 12
    assert len(pulls) == 1          # only the first rollout pulled


def test_skipped_update_makes_the_next_rollout_pull():
    w, net, shared, store = _thread_worker(ThreadStore)
    w.rollout()
    pulls = []
    orig = store.pull
    store.pull = lambda local: (pulls.append(1), orig(local))
    real_apply = shared.apply
    shared.apply = lambda *a, **k: (float("nan"), False)    # a non-finite update
    w.rollout()
    shared.apply = real_apply
    shared.params[:] += 1.0
    w.rollout()                       # must pull: the skip did not refresh net.params
    assert len(pulls) == 1
    assert not w._fresh or np.array_equal(net.params, shared.params)


# -- lockstep rollouts of K envs: t_max ticks, across episode boundaries ---------

class _ScaleSpyStore(RecordingStore):
    def __init__(self, n_params):
        super().__init__(n_params)
        self.scale_calls = []

    def reward_scale(self, returns):
        self.scale_calls.append(np.array(returns, np.float64))
        return 1.0


def _settings(t_max, gamma=0.5, reward_scale=1.0, boot_trunc=True, **kw):
    return RolloutSettings(t_max=t_max, gamma=gamma, gae_lambda=1.0, reward_scale=reward_scale,
                           truncation_bootstrap=boot_trunc, **kw)


def _net_of(spec):
    kw = {"hidden": (8,)} if spec == "mlp" else {"hidden": (8,), "lstm_size": 4}
    return SpyNet(build_network(spec, (2,), 2, seed=0, **kw))


def _cross_worker(script, t_max, *, spec="mlp", truncate=False, K=2, **kw):
    """K envs playing ``script`` in lockstep (identical envs: every env's
    rows are the same; row t*K + k is tick t of env k)."""
    net = _net_of(spec)
    envs = [ScriptedEnv(script, truncate=truncate) for _ in range(K)]
    pipe = ObsPipeline({"kind": "vector"}, envs[0].obs_shape)
    store = _ScaleSpyStore(net.n_params)
    w = Worker(0, envs, net, pipe, store, _settings(t_max, **kw), np.random.default_rng(0))
    return w, net, store


def _merged_worker(env, t_max, *, spec="mlp", **kw):
    """One env, merge_below's switch on: rollouts run on into the next
    episode until they hold t_max // 2 steps."""
    net = _net_of(spec)
    pipe = ObsPipeline({"kind": "vector"}, env.obs_shape)
    store = _ScaleSpyStore(net.n_params)
    w = Worker(0, env, net, pipe, store, _settings(t_max, **kw), np.random.default_rng(0))
    w.merging = True
    return w, net, store


def test_lockstep_rollout_runs_on_into_the_next_episode():
    w, net, store = _cross_worker([1.0, 2.0, 3.0], t_max=5)
    n, term, trunc, applied = w.rollout()
    assert (n, term, trunc, applied) == (10, False, False, True)
    v = _value_of(net, np.array([1, 2], np.float32))        # bootstrap of the cut segment
    # episode 0 (terminal, no bootstrap) then episode 1's first two steps
    want = [2.75, 3.5, 3.0, 1 + 0.5 * (2 + 0.5 * v), 2 + 0.5 * v]
    for k in range(2):                                      # each env's rows
        np.testing.assert_allclose(net.calls[0]["returns"][k::2], want, rtol=1e-5)
        np.testing.assert_array_equal(net.calls[0]["obs"][k::2, 0], [0, 0, 0, 1, 1])
        np.testing.assert_array_equal(net.calls[0]["obs"][k::2, 1], [0, 1, 2, 0, 1])
    assert store.episodes == [(6.0, 3)] * 2 and store.steps == 10
    w.rollout()           # episode 1 ends at tick 0, episode 2 fills ticks 1-3, episode 3 starts
    np.testing.assert_array_equal(net.calls[1]["obs"][0::2, 1], [2, 0, 1, 2, 0])
    np.testing.assert_array_equal(net.calls[1]["obs"][1::2, 0], [1, 2, 2, 2, 3])
    assert store.episodes == [(6.0, 3)] * 6 and store.steps == 20


@pytest.mark.parametrize("boot", [True, False])
def test_lockstep_truncation_bootstraps_each_segment(boot):
    w, net, store = _cross_worker([1.0, 1.0], t_max=3, truncate=True, boot_trunc=boot)
    w.rollout()
    v_end0 = _value_of(net, np.array([0, 2], np.float32)) if boot else 0.0
    v_cut = _value_of(net, np.array([1, 1], np.float32))     # t_max cut: always bootstrapped
    for k in range(2):
        np.testing.assert_allclose(net.calls[0]["returns"][k::2],
                                   [1 + 0.5 * (1 + 0.5 * v_end0), 1 + 0.5 * v_end0,
                                    1 + 0.5 * v_cut], rtol=1e-5)
    assert store.episodes == [(2.0, 2)] * 2


def test_lockstep_resets_each_rows_lstm_state_and_records_the_reset():
    w, net, store = _cross_worker([1.0, 2.0], t_max=5, spec="mlp-lstm")
    w.rollout()
    assert net._rec_resets == 4                   # both envs' episodes start at ticks 2 and 4
    cws = net._ws[len(net.encoder)]
    assert list(cws["reset"][:10]) == [False] * 4 + [True] * 2 + [False] * 2 + [True] * 2
    np.testing.assert_array_equal(cws["hin"][4:6], 0.0)
    assert store.episodes == [(3.0, 2)] * 4


def test_lockstep_resets_only_the_row_whose_episode_ended():
    """Envs with different episode lengths: each row's state restarts at its
    own episode's start, and the other rows carry on."""
    net = _net_of("mlp-lstm")
    envs = [ScriptedEnv([1.0, 1.0]), ScriptedEnv([1.0, 1.0, 1.0])]
    pipe = ObsPipeline({"kind": "vector"}, envs[0].obs_shape)
    w = Worker(0, envs, net, pipe, _ScaleSpyStore(net.n_params), _settings(6),
               np.random.default_rng(0))
    w.rollout()
    cws = net._ws[len(net.encoder)]
    reset = cws["reset"][:12].reshape(6, 2)
    np.testing.assert_array_equal(reset[:, 0], [False, False, True, False, True, False])
    np.testing.assert_array_equal(reset[:, 1], [False, False, False, True, False, False])


def test_lockstep_running_returns_restart_at_each_episode():
    w, net, store = _cross_worker([1.0, 2.0, 3.0], t_max=5, reward_scale=None)
    w.rollout()
    # gamma 0.5: episode 0 -> 1, 2.5, 4.25; episode 1 restarts -> 1, 2.5 (one merge, env-major)
    assert len(store.scale_calls) == 1
    np.testing.assert_allclose(store.scale_calls[0], [1, 2.5, 4.25, 1, 2.5] * 2)
    w.rollout()
    # episode 1 goes on from its carried 2.5: 0.5 * 2.5 + 3; then episode 2: 1, 2.5, 4.25, 1
    np.testing.assert_allclose(store.scale_calls[1], [4.25, 1, 2.5, 4.25, 1] * 2)


def test_merged_rollout_runs_on_into_the_next_episode_until_it_holds_half_t_max():
    env = ScriptedEnv([1.0, 2.0, 3.0])
    w, net, store = _merged_worker(env, t_max=10)
    n, term, trunc, applied = w.rollout()
    # episode 0 ends after 3 steps (< 5: run on), episode 1 after 6 (>= 5: stop there)
    assert (n, term, trunc, applied) == (6, True, False, True)
    np.testing.assert_allclose(net.calls[0]["returns"], [2.75, 3.5, 3.0] * 2, rtol=1e-6)
    np.testing.assert_array_equal(net.calls[0]["obs"][:, 0], [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(net.calls[0]["obs"][:, 1], [0, 1, 2, 0, 1, 2])
    assert store.episodes == [(6.0, 3)] * 2 and store.steps == 6
    w.rollout()           # the next rollout starts with episode 2's first observation
    np.testing.assert_array_equal(net.calls[1]["obs"][:, 0], [2, 2, 2, 3, 3, 3])
    np.testing.assert_array_equal(net.calls[1]["obs"][:, 1], [0, 1, 2, 0, 1, 2])
    assert store.steps == 12


def test_merged_rollouts_of_longer_episodes_end_as_the_papers():
    """Episodes longer than t_max // 2: cut at t_max (bootstrapped) and ended
    at their end, exactly like the paper's rollouts."""
    script = [1.0, 2.0, 3.0, 4.0, 5.0]
    w, net, store = _merged_worker(ScriptedEnv(script), t_max=3)
    w0, net0, store0 = _merged_worker(ScriptedEnv(script), t_max=3)
    w0.merging = False
    for _ in range(4):
        assert w.rollout() == w0.rollout()
    for a, b in zip(net.calls, net0.calls):
        np.testing.assert_array_equal(a["obs"], b["obs"])
        np.testing.assert_allclose(a["returns"], b["returns"], rtol=1e-6)
    assert store.episodes == store0.episodes and store.steps == store0.steps == 10


# -- merge_below: the switch to rollouts across episodes once episodes are short ---

def _merge_worker(env, t_max, merge_below, window, spec="mlp"):
    w, net, store = _merged_worker(env, t_max, spec=spec, reward_scale=None,
                                   merge_below=merge_below, merge_window=window)
    w.merging = False
    return w, net, store


def test_merge_below_switches_on_once_the_window_of_episodes_is_short():
    """Episodes of 3 steps, window 4, merge_below 4: the first four episodes are
    the paper's rollouts (one per episode); from then on a rollout runs on into
    the next episode until it holds t_max // 2 = 5 steps, exactly as a worker
    whose switch is on from the start (same obs, returns and normalizer merges)."""
    w, net, store = _merge_worker(ScriptedEnv([1.0, 2.0, 3.0]), t_max=10, merge_below=4, window=4)
    for k in range(4):
        assert not w.merging
        assert w.rollout()[0] == 3
    assert w.merging and w.mean_episode_length() == 3.0
    twin, tnet, tstore = _merged_worker(ScriptedEnv([1.0, 2.0, 3.0]), t_max=10,
                                        reward_scale=None)
    twin.env.episode = w.env.episode - 1    # the twin starts where the switch happened
    twin.rng = np.random.default_rng(1)
    w.rng = np.random.default_rng(1)
    for _ in range(3):
        assert w.rollout() == twin.rollout() == (6, True, False, True)
        np.testing.assert_array_equal(net.grads, tnet.grads)    # same actions, same update
    for a, b in zip(net.calls[4:], tnet.calls):
        np.testing.assert_array_equal(a["obs"], b["obs"])
        np.testing.assert_array_equal(a["returns"], b["returns"])
    for a, b in zip(store.scale_calls[4:], tstore.scale_calls):
        np.testing.assert_array_equal(a, b)
    assert store.steps == 4 * 3 + 3 * 6


def test_merge_below_switches_off_when_episodes_grow_past_t_max():
    """Long episodes (7 steps > t_max 4) after short ones: the window's mean
    rises past t_max and rollouts end with their episode again."""
    env = ScriptedEnv([1.0])
    w, net, store = _merge_worker(env, t_max=4, merge_below=2, window=2)
    w.rollout(), w.rollout()
    assert w.merging                          # two 1-step episodes: mean 1 < 2
    env.script = [1.0] * 7
    seen = []
    for _ in range(12):
        n, term, _, _ = w.rollout()
        seen.append((n, term, w.merging))
    assert not w.merging and w.mean_episode_length() == 7.0
    # paper rollouts once off: 4 (cut by t_max), then 3 (episode end), repeating
    tail = [n for n, _, _ in seen[-4:]]
    assert tail in ([4, 3, 4, 3], [3, 4, 3, 4])


def test_merge_below_in_between_keeps_the_current_mode():
    """Hysteresis: a mean between merge_below and t_max changes nothing."""
    w, _, _ = _merge_worker(ScriptedEnv([1.0] * 5), t_max=10, merge_below=4, window=2)
    for _ in range(4):
        w.rollout()
    assert not w.merging and w.mean_episode_length() == 5.0     # never below 4: still off
    w.merging = True
    for _ in range(4):
        w.rollout()
    assert w.merging                               # 5 is not above t_max 10: still on


def test_merge_below_off_never_tracks_or_switches():
    w, net, _ = _merge_worker(ScriptedEnv([1.0]), t_max=10, merge_below=0.0, window=2)
    for _ in range(6):
        assert w.rollout()[0] == 1
    assert not w.merging and w.mean_episode_length() is None
