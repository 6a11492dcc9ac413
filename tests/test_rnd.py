"""The RND exploration bonus (a3c_core.nn.rnd, exploration = "rnd"): kernels
against their numpy twins, float64 finite differences and PyTorch (skipped
without torch); novelty falls on a frame seen often; the worker's mapping of
novelties to rewards; checkpoints; a3c train with threads and processes."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from a3c_core.core import SharedState, make_optimizer
from a3c_core.core.normalize import ReturnNormalizer
from a3c_core.envs.base import Env
from a3c_core.nn import rnd
from a3c_core.nn.network import build_network
from a3c_core.train.config import Config, ConfigError
from a3c_core.train.worker import RolloutSettings, ThreadStore, Worker

SMALL = (1, 42, 42)      # pooled 10x10 -> 4x4 -> 1x1: the networks' smallest usual input


def _rows(shape, n, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal((n,) + shape).astype(dtype)


# -- kernels and their twins ----------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,k", [((2, 9, 11), 2), ((1, 84, 84), 4), ((3, 7, 7), 3)])
def test_avg_pool_matches_its_twin(shape, k, dtype):
    x = _rows(shape, 3, dtype=dtype)
    oh, ow = shape[1] // k, shape[2] // k
    y = np.empty((3, shape[0], oh, ow), dtype)
    rnd.avg_pool_rows(x, k, y)
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(y, rnd.ref_avg_pool(x, k), rtol=tol, atol=tol)
    dy = _rows(y.shape[1:], 3, seed=1, dtype=dtype)
    dx = np.full(x.shape, 7.0, dtype)             # written in full: no 7 survives
    rnd.avg_pool_backward(dy, k, dx)
    np.testing.assert_allclose(dx, rnd.ref_avg_pool_backward(dy, k, x.shape), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mse_matches_its_twin(dtype):
    p, t = _rows((5,), 4, 0, dtype), _rows((5,), 4, 1, dtype)
    err, dp = np.empty(4), np.empty_like(p)
    loss = rnd.mse_rows(p, t, err, dp)
    want_loss, want_err, want_dp = rnd.ref_mse(p.astype(np.float64), t.astype(np.float64))
    tol = 1e-6 if dtype == np.float32 else 1e-14
    assert loss == pytest.approx(want_loss, rel=tol)
    np.testing.assert_allclose(err, want_err, rtol=tol)
    np.testing.assert_allclose(dp, want_dp, rtol=tol, atol=tol)


def _fd(f, x, eps=1e-6, n=12, seed=0):
    """Centred differences of scalar ``f`` at ``n`` random entries of ``x``."""
    rng = np.random.default_rng(seed)
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, min(n, flat.size), replace=False)
    out = []
    for i in idx:
        keep = flat[i]
        flat[i] = keep + eps
        lp = f()
        flat[i] = keep - eps
        lm = f()
        flat[i] = keep
        out.append((lp - lm) / (2 * eps))
    return idx, np.array(out)


def test_pool_and_mse_gradients_match_finite_differences():
    x = _rows((2, 9, 10), 3)
    w = _rows((2, 4, 5), 3, seed=1)                 # loss = sum(w * pool(x))
    y = np.empty_like(w)

    def pool_loss():
        rnd.avg_pool_rows(x, 2, y)
        return float((w * y).sum())

    dx = np.empty_like(x)
    rnd.avg_pool_backward(w, 2, dx)
    idx, num = _fd(pool_loss, x, n=40)
    np.testing.assert_allclose(dx.reshape(-1)[idx], num, rtol=1e-7, atol=1e-9)
    assert not dx[:, :, 8:, :].any()                # the dropped row gets no gradient

    p, t = _rows((6,), 5, 2), _rows((6,), 5, 3)
    err, dp = np.empty(5), np.empty_like(p)
    rnd.mse_rows(p, t, err, dp)
    idx, num = _fd(lambda: rnd.mse_rows(p, t, np.empty(5), np.empty_like(p)), p, n=30)
    np.testing.assert_allclose(dp.reshape(-1)[idx], num, rtol=1e-7, atol=1e-10)


def test_net_matches_the_ref_twin_and_finite_differences_float64():
    """The whole bonus (pool, target, predictor, MSE, the predictor's compiled
    backward) against the layers' numpy twins, and its gradient against
    centred differences along random directions (as a3c gradcheck does)."""
    net = rnd.RNDNet(SMALL, np.float64, seed=3)
    x = _rows(SMALL, 5, seed=4)
    net.pool_into(x)
    loss = net.loss_and_grad(5)
    t, p = net.state_dicts()
    want_loss, want_err, want_g = rnd.ref_loss_and_grad(net.layers, t, p, x, net.pool)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(net.errors[:5], want_err, rtol=1e-12)
    g = net.layout.views(net.grads)
    for name, arr in want_g.items():
        np.testing.assert_allclose(g[name], arr, rtol=1e-9, atol=1e-14, err_msg=name)
    analytic = net.grads.copy()
    rng = np.random.default_rng(5)
    for name in net.layout:
        view = net.layout.views(net.params)[name].reshape(-1)
        ga = net.layout.views(analytic)[name].reshape(-1)
        for _ in range(3):
            idx = rng.choice(view.size, min(20, view.size), replace=False)
            v = rng.standard_normal(idx.size)
            v /= np.linalg.norm(v)
            base = view[idx].copy()
            eps = 1e-5
            view[idx] = base + eps * v
            lp = net.loss_and_grad(5, backward=False)
            view[idx] = base - eps * v
            lm = net.loss_and_grad(5, backward=False)
            view[idx] = base
            a, n = float(ga[idx] @ v), (lp - lm) / (2 * eps)
            assert abs(a - n) <= 1e-6 * max(abs(a) + abs(n), 1e-12), (name, a, n)


def test_compiled_and_numpy_backward_agree():
    a = rnd.RNDNet(SMALL, np.float32, seed=1)
    b = rnd.RNDNet(SMALL, np.float32, seed=1)
    b._bl = None                                   # the per-layer numpy backward
    x = _rows(SMALL, 7, seed=2, dtype=np.float32)
    for net in (a, b):
        net.pool_into(x)
        net.loss_and_grad(7)
    np.testing.assert_array_equal(a.errors[:7], b.errors[:7])
    np.testing.assert_allclose(a.grads, b.grads, rtol=1e-5, atol=1e-7)


# -- PyTorch parity ---------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


def test_kernels_match_torch():
    torch = _torch()
    F = torch.nn.functional
    x = _rows((2, 9, 11), 3)
    tx = torch.tensor(x, requires_grad=True)
    ty = F.avg_pool2d(tx, 2)
    y = np.empty(tuple(ty.shape))
    rnd.avg_pool_rows(x, 2, y)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-13)
    dy = _rows(y.shape[1:], 3, seed=1)
    ty.backward(torch.tensor(dy))
    dx = np.empty_like(x)
    rnd.avg_pool_backward(dy, 2, dx)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-13)
    p, t = _rows((6,), 5, 2), _rows((6,), 5, 3)
    tp = torch.tensor(p, requires_grad=True)
    tl = F.mse_loss(tp, torch.tensor(t))
    tl.backward()
    dp = np.empty_like(p)
    loss = rnd.mse_rows(p, t, np.empty(5), dp)
    assert loss == pytest.approx(tl.item(), rel=1e-13)
    np.testing.assert_allclose(dp, tp.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-9), (np.float32, 1e-4)])
def test_net_matches_torch(dtype, tol):
    torch = _torch()
    F = torch.nn.functional
    net = rnd.RNDNet((1, 84, 84), dtype, seed=7)
    tdt = torch.float64 if dtype == np.float64 else torch.float32

    def model(params):
        mods = []
        for layer in net.layers:
            if layer.kind == "conv":
                m = torch.nn.Conv2d(layer.in_shape[0], layer.out_ch, layer.k, layer.stride)
            else:
                m = torch.nn.Linear(layer.n_in, layer.n_out)
            m = m.to(tdt)
            m.weight.data = torch.tensor(np.array(params[layer.name + ".weight"]))
            m.bias.data = torch.tensor(np.array(params[layer.name + ".bias"]))
            mods.append((layer, m))
        return mods

    def features(mods, x):
        h = F.avg_pool2d(x, net.pool)
        for layer, m in mods:
            h = m(h)
            if layer.act == "elu":
                h = F.elu(h)
            if getattr(layer, "flatten_out", False):
                h = h.flatten(1)
        return h

    t_params, p_params = net.state_dicts()
    target, pred = model(t_params), model(p_params)
    x = _rows((1, 84, 84), 6, seed=8, dtype=dtype)
    tx = torch.tensor(x)
    with torch.no_grad():
        tf = features(target, tx)
    pf = features(pred, tx)
    tloss = F.mse_loss(pf, tf)
    tloss.backward()
    err = ((pf - tf) ** 2).mean(1).detach().numpy()
    net.pool_into(x)
    loss = net.loss_and_grad(6)
    assert loss == pytest.approx(tloss.item(), rel=tol)
    np.testing.assert_allclose(net.errors[:6], err, rtol=tol * 10)
    g = net.layout.views(net.grads)
    for layer, m in pred:
        for key, tp in (("weight", m.weight), ("bias", m.bias)):
            want = tp.grad.numpy()
            got = g[f"{layer.name}.{key}"]
            assert np.max(np.abs(got - want)) <= tol * max(np.max(np.abs(want)), 1e-30), key


# -- novelty ---------------------------------------------------------------------------

def test_a_frame_seen_often_gets_a_smaller_bonus_than_a_new_one():
    """200 predictor updates on one frame: its novelty falls far below a new frame's."""
    rs = rnd.RNDShared((1, 84, 84), seed=0, optimizer="adam", opt_kwargs={"lr": 1e-3})
    net = rs.new_net()
    rng = np.random.default_rng(0)
    seen = rng.random((1, 1, 84, 84)).astype(np.float32)
    new = rng.random((1, 1, 84, 84)).astype(np.float32)
    before = net.novelty(seen)[0]
    losses = []
    for _ in range(200):
        net.pool_into(seen)
        losses.append(net.loss_and_grad(1))
        rs.shared.apply(net.grads, 40.0, sync_to=net.params)
    assert losses[-1] < 0.05 * losses[0]
    after_seen, after_new = net.novelty(seen)[0], net.novelty(new)[0]
    assert after_seen < 0.05 * before
    assert after_seen < 0.1 * after_new


# -- the worker --------------------------------------------------------------------------

class FramesEnv(Env):
    """Image env: frame t of episode e is a fixed random image; episodes last
    ``length`` steps (terminal)."""

    def __init__(self, length=5, seed=0):
        self.env_id = "test:frames"
        self.n_actions = 2
        self.action_names = ["a", "b"]
        self.obs_shape = SMALL
        self.obs_dtype = np.dtype(np.float32)
        self.obs_kind = "image"
        self.frame_skip = 1
        self.preprocess_spec = {"kind": "vector"}
        self.length = length
        self.rng = np.random.default_rng(seed)
        self.frames = self.rng.random((50,) + SMALL).astype(np.float32)
        self.episode = -1
        self.t = 0

    def frame(self):
        return self.frames[(7 * self.episode + self.t) % len(self.frames)]

    def reset(self):
        self.episode += 1
        self.t = 0
        return self.frame()

    def step(self, action):
        self.t += 1
        done = self.t == self.length
        return self.frame(), 0.0, done, False


class Pipe:
    """The worker's pipeline for already-preprocessed frames."""

    net_obs_shape = SMALL

    def __call__(self, obs, out):
        out[...] = obs


class SpyStore(ThreadStore):
    def __init__(self, shared, explore):
        super().__init__(shared, ReturnNormalizer(0.9), None, explore=explore)
        self.episodes = []
        self.merged = []

    def record_episode(self, wid, ret, length, intrinsic=None, end=None):
        self.episodes.append((ret, length, intrinsic))

    def intrinsic_scale(self, returns):
        self.merged.append(np.array(returns))
        return 1.0


def _rnd_worker(length, t_max, **kw):
    env = FramesEnv(length)
    net = build_network("atari-lstm", SMALL, 2, lstm_size=8, seed=0)
    shared = SharedState(net.params.copy(), make_optimizer("adam", net.n_params))
    rs = rnd.RNDShared(SMALL, seed=1)
    store = SpyStore(shared, rs)
    s = RolloutSettings(t_max=t_max, gamma=0.9, exploration="rnd", exploration_scale=0.5,
                        norm_clip=1e9, **kw)
    return Worker(0, env, net, Pipe(), store, s, np.random.default_rng(0)), env, rs, store


def test_worker_pays_each_step_the_novelty_of_its_next_observation():
    """Episodes of 5 steps, t_max 3: a cut rollout's last step gets the novelty
    of the frame it bootstraps from; an episode's last step gets none."""
    w, env, rs, store = _rnd_worker(length=5, t_max=3)
    frames = env.frames
    raws = []
    for r in range(4):
        before = rs.shared.params.copy()
        ref = rnd.RNDNet(SMALL, np.float32, target=rs.target, predictor=before)
        n, term, _, _ = w.rollout()
        # rollout r covers frames of episode e from step t0 on
        e, t0 = [(0, 0), (0, 3), (1, 0), (1, 3)][r]
        seen = frames[[(7 * e + t0 + i) % 50 for i in range(n + 1)]]
        nov = ref.novelty(seen)
        want = 0.5 * nov[1:n + 1]
        if term:
            want[-1] = 0.0
        np.testing.assert_allclose(w._bonus[:n], want, rtol=1e-5)
        assert not np.array_equal(rs.shared.params, before)      # the predictor learned
        raws.append(w._bonus[:n] / 0.5)
    # the intrinsic return (merged with scale 1 here) runs on across rollouts
    # and across the episode end: non-episodic
    acc, want = 0.0, []
    for x in np.concatenate(raws):
        acc = 0.9 * acc + x
        want.append(acc)
    np.testing.assert_allclose(np.concatenate(store.merged), want, rtol=1e-12)
    assert [ep[:2] for ep in store.episodes] == [(0.0, 5), (0.0, 5)]
    # each episode reported with its mean bonus per step
    np.testing.assert_allclose([ep[2] for ep in store.episodes],
                               [0.5 * np.concatenate(raws[:2]).sum() / 5,
                                0.5 * np.concatenate(raws[2:]).sum() / 5], rtol=1e-12)


def test_worker_bonus_with_several_envs_and_rollouts_across_episodes():
    for kw in ({"min_steps": 4}, {}):
        env_count = 1 if kw else 2
        w, _, _, store = _rnd_worker(length=3, t_max=4, **kw)
        if env_count == 2:
            w2 = _rnd_worker(length=3, t_max=4)[0]
            envs = [FramesEnv(3, seed=1), FramesEnv(2, seed=2)]
            w = Worker(0, envs, w2.net, Pipe(), store, w2.s, np.random.default_rng(0))
        for _ in range(6):
            n = w.rollout()[0]
            assert np.all(np.isfinite(w._bonus[:n])) and np.all(w._bonus[:n] >= 0)
        assert w.explore_stats.updates == 6
        assert store.episodes and all(np.isfinite(ep[2]) for ep in store.episodes)


def test_bonus_off_leaves_the_worker_as_it_was():
    env = FramesEnv(5)
    net = build_network("atari-lstm", SMALL, 2, lstm_size=8, seed=0)
    shared = SharedState(net.params.copy(), make_optimizer("adam", net.n_params))
    w = Worker(0, env, net, Pipe(), ThreadStore(shared, ReturnNormalizer(0.9)),
               RolloutSettings(t_max=3), np.random.default_rng(0))
    assert w.rnd is None and w.explore_stats is None
    with pytest.raises(ValueError, match="store.explore"):
        Worker(0, env, net, Pipe(), ThreadStore(shared, ReturnNormalizer(0.9)),
               RolloutSettings(t_max=3, exploration="rnd"), np.random.default_rng(0))


# -- config and checkpoints ---------------------------------------------------------------

def test_config_names_the_field_and_the_choices():
    with pytest.raises(ConfigError, match=r"'exploration' = 'icm'.*none, rnd"):
        Config(exploration="icm").validate()
    with pytest.raises(ConfigError, match="exploration_scale"):
        Config(exploration_scale=0.0).validate()
    assert Config().exploration == "none"
    from a3c_core.train.config import resolve
    with pytest.raises(ConfigError, match="'exploration' = 'rnd': needs image"):
        resolve(Config(env="CartPole-v1", exploration="rnd"), "vector")


def test_shared_state_round_trips_through_its_checkpoint_entries():
    a = rnd.RNDShared((1, 84, 84), seed=0)
    a.shared.params[:] += 0.25
    a.shared.optimizer.exp_avg[:] = 0.5
    a.shared.optimizer.step = 17
    a.normalizer.update(np.arange(5.0))
    meta = json.loads(json.dumps(a.meta()))
    arrays = a.arrays()
    rest, mine = rnd.RNDShared.split_arrays(dict(arrays, exp_avg=np.zeros(3)))
    assert set(rest) == {"exp_avg"} and set(mine) == set(arrays)
    b = rnd.RNDShared((1, 84, 84), seed=1)
    assert not np.array_equal(a.target, b.target)
    b.load(meta, mine)
    np.testing.assert_array_equal(b.shared.params, a.shared.params)
    np.testing.assert_array_equal(b.target, a.target)
    np.testing.assert_array_equal(b.shared.optimizer.exp_avg, a.shared.optimizer.exp_avg)
    assert b.shared.optimizer.step == 17
    assert b.normalizer.state_dict() == a.normalizer.state_dict()
    assert rnd.RNDShared.unusable(None, (1, 84, 84), "adam") is not None
    assert "optimizer" in rnd.RNDShared.unusable(meta, (1, 84, 84), "rmsprop")
    assert "networks" in rnd.RNDShared.unusable(meta, (1, 42, 42), "adam")


def test_measure_cost_reports_both_updates():
    r = rnd.measure_cost(repeat=3, warmup=1)
    assert r["plain_us"] > 0 and r["bonus_us"] > 0
    assert r["ratio"] == pytest.approx(r["bonus_us"] / r["plain_us"])
    assert r["rnd_params"] == rnd.RNDNet((1, 84, 84)).n_params


# -- a3c train -------------------------------------------------------------------------

def _train(run, *extra):
    cmd = [sys.executable, "-m", "a3c_core", "train", "--workers", "2", "--no-tensorboard",
           "--log-interval", "0.5", *extra]
    if "--resume" not in extra:
        cmd += ["--env", "doom:my_way_home", "--exploration", "rnd", "--total-steps", "1500",
                "--obs-norm-frames", "100", "--run-dir", run]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(run))


# processes in the slow tier: the default tier's time is near its 3-minute budget
@pytest.mark.parametrize("backend", ["--no-worker-processes",
                                     pytest.param("--worker-processes", marks=pytest.mark.slow)])
def test_train_my_way_home_with_the_bonus_and_resume(tmp_path, backend):
    pytest.importorskip("vizdoom")
    from a3c_core.checkpoint import load_checkpoint
    from a3c_core.train.trainer import Trainer

    run = str(tmp_path / "run")
    p = _train(run, backend)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(os.path.join(run, "metrics.csv")) as fh:
        rows = [ln.split(",") for ln in fh.read().splitlines()]
    bonus = [float(r[3]) for r in rows if r[2] in ("charts/intrinsic_reward",
                                                   "charts/episodic_intrinsic")]
    loss = [float(r[3]) for r in rows if r[2] == "losses/rnd_loss"]
    assert bonus and loss and all(np.isfinite(bonus + loss)) and max(bonus) > 0
    ck = load_checkpoint(run)
    assert ck.meta["exploration"]["kind"] == "rnd"
    pred = ck.opt_arrays["rnd/predictor"]
    assert np.all(np.isfinite(pred))
    cfg = Config.from_toml(os.path.join(run, "config.toml"), saved_run=True)
    with Trainer(cfg.replace(run_dir=run, quiet=True), resume=run) as t:
        np.testing.assert_array_equal(t.explore.shared.params, pred)
        np.testing.assert_array_equal(t.explore.target, ck.opt_arrays["rnd/target"])
        np.testing.assert_array_equal(t.explore.shared.optimizer.exp_avg,
                                      ck.opt_arrays["rnd/opt.exp_avg"])
        assert t.explore.shared.optimizer.step == \
            ck.meta["exploration"]["optimizer_scalars"]["step"]
        assert t.shared.optimizer.step == ck.meta["optimizer_scalars"]["step"]
    p = _train(run, backend, "--resume", run, "--total-steps", "2500")
    assert p.returncode == 0, p.stdout + p.stderr
    assert load_checkpoint(run).steps >= 2500


def test_a_checkpoint_without_rnd_resumes_with_a_new_predictor(tmp_path):
    pytest.importorskip("vizdoom")
    from a3c_core.train.trainer import Trainer

    run = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "a3c_core", "train", "--env", "doom:my_way_home", "--workers",
           "1", "--total-steps", "200", "--obs-norm-frames", "100", "--run-dir", run,
           "--no-tensorboard", "--quiet", "--no-worker-processes"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60, cwd=str(tmp_path))
    cfg = Config.from_toml(os.path.join(run, "config.toml"), saved_run=True)
    with Trainer(cfg.replace(run_dir=run, exploration="rnd", quiet=True), resume=run) as t:
        assert "RND predictor and target initialized anew" in t.resume_note
        assert t.explore is not None


def test_not_with_a_backend_that_cannot_run_it():
    from a3c_core.train.backends import Backend
    from a3c_core.train.trainer import Trainer

    class NoBonus(Backend):
        name = "elsewhere"

    with pytest.raises(ConfigError, match=r"'exploration' = 'rnd': not with NoBonus \(elsewhere\)"):
        Trainer(Config(exploration="rnd"), backend=NoBonus())
