"""The fused agent step (``Network.actor``, ``kernels.doom_act_packed``): one
compiled call that preprocesses the frame, records the step and samples the
action must give bit for bit what the three separate calls give, in a
network's rollout rows and in a whole worker's training."""
import numpy as np
import pytest

from a3c_core.core import SharedState, make_optimizer
from a3c_core.core.normalize import AdvantageNormalizer, ReturnNormalizer
from a3c_core.envs.base import Env
from a3c_core.nn.network import build_network
from a3c_core.obs import ObservationError, ObsPipeline
from a3c_core.sampling import sample_categorical
from a3c_core.train.worker import RolloutSettings, ThreadStore, Worker

RAW = (30, 40)
OBS = (1, 84, 84)


def _pipe():
    return ObsPipeline({"kind": "image", "out_shape": [84, 84]}, RAW)


def _net(seed=3, dtype=np.float32):
    net = build_network("doom-lstm", OBS, 3, seed=seed, dtype=dtype)
    net.single_step_kernel = True
    return net


def _frames(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n,) + RAW, dtype=np.uint8)


def _reference(net, pipe, frames, u, state0, reset_at=()):
    """step(record=True) + the Python sampler + the pipeline, as the worker ran them."""
    T = len(frames)
    obs = np.zeros((T,) + OBS, np.float32)
    net.begin_rollout(T)
    st = state0
    acts, vals = [], []
    for t in range(T):
        pipe(frames[t], obs[t])
        if t in reset_at:
            st = net.initial_state()
        p, v, st = net.step(obs[t], st, record=True)
        acts.append(sample_categorical(p, u[t]))
        vals.append(v)
    return np.array(acts), np.array(vals, np.float32), st, obs


@pytest.mark.parametrize("reset_at", [(), (4,)])
def test_actor_records_samples_and_preprocesses_as_the_separate_calls(reset_at):
    T = 9
    pipe = _pipe()
    ref, net = _net(), _net()
    frames = _frames(T)
    rng = np.random.default_rng(1)
    u = rng.random(T)
    s0 = tuple(rng.standard_normal(256).astype(np.float32) * 0.3 for _ in range(2))
    a_ref, v_ref, st_ref, obs_ref = _reference(ref, pipe, frames, u, s0, reset_at)

    acts, vals = np.zeros(T, np.int64), np.zeros(T, np.float32)
    act = net.actor(pipe, acts, vals)
    obs = np.zeros((T,) + OBS, np.float32)
    net.begin_rollout(T)
    for t in range(T):
        state = s0 if t == 0 else (net.initial_state() if t in reset_at else None)
        a = act(t, obs[t], u[t], frames[t], state)
        assert a == acts[t]
    np.testing.assert_array_equal(acts, a_ref)
    np.testing.assert_array_equal(vals, v_ref)
    np.testing.assert_array_equal(obs, obs_ref)
    h, c = net.recorded_state()
    np.testing.assert_array_equal(h, st_ref[0])
    np.testing.assert_array_equal(c, st_ref[1])
    # the recorded rows: the same update, bit for bit
    ret = rng.standard_normal(T).astype(np.float32)
    adv = rng.standard_normal(T).astype(np.float32)
    assert net.rollout_grad(acts, ret, adv) == ref.rollout_grad(a_ref, ret, adv)
    np.testing.assert_array_equal(net.grads, ref.grads)


def test_actor_without_a_frame_steps_the_given_observation():
    pipe = _pipe()
    net = _net()
    obs = np.random.default_rng(2).random((2,) + OBS).astype(np.float32)
    acts, vals = np.zeros(2, np.int64), np.zeros(2, np.float32)
    act = net.actor(pipe, acts, vals)
    ref = _net()
    net.begin_rollout(2)
    ref.begin_rollout(2)
    st = ref.initial_state()
    for t in range(2):
        act(t, obs[t], 0.5, None, net.initial_state() if t == 0 else None)
        p, v, st = ref.step(obs[t], st, record=True)
        assert vals[t] == np.float32(v)
        np.testing.assert_array_equal(act.probs, p)


def test_actor_refuses_bad_frames_rows_and_states():
    pipe = _pipe()
    net = _net()
    acts, vals = np.zeros(3, np.int64), np.zeros(3, np.float32)
    act = net.actor(pipe, acts, vals)
    obs = np.zeros((3,) + OBS, np.float32)
    with pytest.raises(RuntimeError, match="begin_rollout"):
        act(0, obs[0], 0.5, None, net.initial_state())
    net.begin_rollout(3)
    with pytest.raises(ObservationError, match="uint8"):
        act(0, obs[0], 0.5, np.zeros(RAW, np.float32), net.initial_state())
    with pytest.raises(ObservationError, match="shape"):
        act(0, obs[0], 0.5, np.zeros((3, 4), np.uint8), net.initial_state())
    bad = obs[0].copy()
    bad[0, 5, 5] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        act(0, bad, 0.5, None, net.initial_state())
    with pytest.raises(ValueError, match="input state"):
        act(0, obs[0], 0.5, None, None)
    assert net.recorded_steps == 0          # nothing recorded by the failures
    act(0, obs[0], 0.5, None, net.initial_state())
    with pytest.raises(RuntimeError, match="next rollout row"):
        act(2, obs[2], 0.5, None, None)
    act(1, obs[1], 0.5, None, None)
    act(2, obs[2], 0.5, None, None)
    assert net.recorded_steps == 3
    with pytest.raises(RuntimeError, match="3 at most"):
        act(3, obs[0], 0.5, None, None)


@pytest.mark.parametrize("layout", ["fortran", "strided"])
@pytest.mark.parametrize("method", ["__call__", "step_row"])
def test_actor_refuses_a_frame_that_is_not_c_contiguous(layout, method):
    """The kernel hands the frame's address to the C preprocessor, which
    reads it as contiguous: a frame in another layout (even one whose flat
    reshape is a strided view) goes to the pipeline, which refuses it,
    before anything is recorded."""
    pipe = _pipe()
    f = _frames(1, seed=4)[0]
    odd = np.asfortranarray(f) if layout == "fortran" else np.repeat(f, 2, axis=1)[:, ::2]
    assert not odd.flags.c_contiguous and np.array_equal(odd, f)
    net = _net()
    act = net.actor(pipe, np.zeros(2, np.int64), np.zeros(2, np.float32))
    obs = np.zeros((2,) + OBS, np.float32)
    net.begin_rollout(2)
    with pytest.raises(ValueError, match="C-contiguous"):
        getattr(act, method)(0, obs[0], 0.5, odd, net.initial_state())
    assert net.recorded_steps == 0
    getattr(act, method)(0, obs[0], 0.5, f, net.initial_state())     # its contiguous copy steps
    assert net.recorded_steps == 1


def test_actor_exists_only_for_the_fused_float32_step_and_an_image_pipeline():
    acts, vals = np.zeros(3, np.int64), np.zeros(3, np.float32)
    assert _net(dtype=np.float64).actor(_pipe(), acts, vals) is None
    vec = ObsPipeline({"kind": "vector"}, (4,))
    assert build_network("mlp-lstm", (4,), 2).actor(vec, acts, vals) is None
    assert _net().actor(ObsPipeline({"kind": "image", "out_shape": [42, 42]}, RAW),
                        acts, vals) is None
    with pytest.raises(TypeError, match="int64"):
        _net().actor(_pipe(), acts.astype(np.int32), vals)


class FrameEnv(Env):
    """uint8 frames from a seeded RNG, reward +1 on action 1 and -0.5 else;
    episode lengths cycle through ``lengths``, the last step a termination
    (or a truncation every ``trunc_every``-th episode)."""

    def __init__(self, lengths=(7, 25, 3, 12), trunc_every=0):
        self.env_id = "test:frames"
        self.n_actions = 3
        self.action_names = ["a", "b", "c"]
        self.obs_shape = RAW
        self.obs_dtype = np.dtype(np.uint8)
        self.obs_kind = "image"
        self.frame_skip = 1
        self.preprocess_spec = {"kind": "image", "out_shape": [84, 84]}
        self.default_network = "doom-lstm"
        self.lengths = lengths
        self.trunc_every = trunc_every
        self.rng = np.random.default_rng(5)
        self.episode = -1
        self.episode_over = True

    def _frame(self):
        return self.rng.integers(0, 256, RAW, dtype=np.uint8)

    def reset(self):
        self.episode += 1
        self.t = 0
        self.episode_over = False
        return self._frame()

    def step(self, action):
        self.t += 1
        r = 1.0 if action == 1 else -0.5
        if self.t >= self.lengths[self.episode % len(self.lengths)]:
            self.episode_over = True
            trunc = bool(self.trunc_every) and self.episode % self.trunc_every == 0
            return self._frame(), r, not trunc, trunc
        return self._frame(), r, False, False


def _train(fused, settings, rollouts=40):
    env = FrameEnv(trunc_every=3)
    pipe = ObsPipeline(env.preprocess_spec, env.obs_shape)
    net = _net(seed=7)
    shared = SharedState(net.params.copy(), make_optimizer("adam", net.n_params, lr=1e-3))
    episodes = []
    store = ThreadStore(shared, ReturnNormalizer(0.99),
                        lambda w, r, n, i, **_: episodes.append((r, n)), AdvantageNormalizer())
    w = Worker(0, env, net, pipe, store, settings, np.random.default_rng(11), fused_act=fused)
    assert (w.actor is not None) == fused
    lengths = [w.rollout()[0] for _ in range(rollouts)]
    return shared.params.copy(), lengths, episodes, w.state


@pytest.mark.parametrize("settings", [
    RolloutSettings(t_max=10, normalize_advantages=True),
    RolloutSettings(t_max=10, truncation_bootstrap=False, reward_clip=0.7),
    # rollouts across episodes: merge_below's switch on from the first episode
    RolloutSettings(t_max=10, merge_below=1e9, merge_window=1),
], ids=["paper", "no-boot", "merge"])
def test_worker_with_the_fused_step_trains_bit_for_bit_as_before(settings):
    p_new, n_new, ep_new, st_new = _train(True, settings)
    p_old, n_old, ep_old, st_old = _train(False, settings)
    assert n_new == n_old
    assert ep_new == ep_old and len(ep_new) > 3
    np.testing.assert_array_equal(p_new, p_old)
    np.testing.assert_array_equal(st_new[0], st_old[0])
    np.testing.assert_array_equal(st_new[1], st_old[1])


def test_actor_value_is_the_unrecorded_steps_value_and_preprocesses_its_frame():
    pipe = _pipe()
    net = _net()
    acts, vals = np.zeros(2, np.int64), np.zeros(2, np.float32)
    act = net.actor(pipe, acts, vals)
    frame = _frames(1, seed=4)[0]
    rng = np.random.default_rng(4)
    state = tuple(rng.standard_normal(256).astype(np.float32) for _ in range(2))
    ref_obs = pipe(frame, np.zeros(OBS, np.float32))
    _, v_ref, _ = _net().step(ref_obs, state)
    obs = np.zeros(OBS, np.float32)
    assert act.value(obs, state, frame) == v_ref
    np.testing.assert_array_equal(obs, ref_obs)
    assert act.value(obs, state) == v_ref            # no frame: obs as it is
    assert net.recorded_steps == 0
    with pytest.raises(ObservationError):
        act.value(obs, state, frame.astype(np.int16))


def test_worker_uniforms_are_one_rng_stream_in_blocks():
    """The sampler's uniforms: rollout k gets values k*t_max ... of one
    stream, across the block refills, as one rng.random(t_max) per rollout."""
    env = FrameEnv()
    pipe = ObsPipeline(env.preprocess_spec, env.obs_shape)
    net = _net()
    shared = SharedState(net.params.copy(), make_optimizer("adam", net.n_params))
    w = Worker(0, env, net, pipe, ThreadStore(shared), RolloutSettings(t_max=7),
               np.random.default_rng(9))
    ref = np.random.default_rng(9)
    for _ in range(Worker.UNIFORM_BLOCK * 2 + 3):
        np.testing.assert_array_equal(w.uniforms.take(w.rng), ref.random(7))
    w.rng = np.random.default_rng(10)              # a new rng: its own stream from the start
    np.testing.assert_array_equal(w.uniforms.take(w.rng), np.random.default_rng(10).random(7))
