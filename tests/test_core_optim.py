"""Optimizers, clipping, sync and SharedState: parity with numpy twins, formulas, threads."""
import json
import threading
import time

import numpy as np
import pytest

from a3c_core.core import (OPTIMIZERS, Adam, RMSProp, SharedState, clip_grad_norm,
                           make_optimizer, sync_params)
from a3c_core.core.ref import ref_adam, ref_amsgrad, ref_clip, ref_rmsprop

RTOL, ATOL = 2e-6, 1e-7


def _rand(rng, n, scale=1.0):
    return (rng.standard_normal(n) * scale).astype(np.float32)


@pytest.mark.parametrize("n", [1, 3, 7, 8, 9, 31, 1000, 4099])
def test_rmsprop_parity(n):
    rng = np.random.default_rng(n)
    p, ms = _rand(rng, n), np.abs(_rand(rng, n, 0.1))
    opt = RMSProp(n, lr=1e-2, alpha=0.95, eps=0.05)
    opt.square_avg[:] = ms
    for k in range(3):
        g = _rand(rng, n)
        want_p, want_s = ref_rmsprop(p, g, opt.square_avg, 1e-2, 0.95, 0.05)
        opt.apply(p, g)
        np.testing.assert_allclose(opt.square_avg, want_s, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(p, want_p, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("n", [1, 5, 8, 13, 1000, 4099])
def test_adam_parity(n):
    rng = np.random.default_rng(100 + n)
    p = _rand(rng, n)
    opt = Adam(n, lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-6)
    m, v = opt.exp_avg.copy(), opt.exp_avg_sq.copy()
    for t in range(1, 4):
        g = _rand(rng, n)
        want_p, m, v = ref_adam(p, g, m, v, 1e-2, 0.8, 0.99, 1e-6, t)
        opt.apply(p, g)
        assert opt.step == t
        np.testing.assert_allclose(opt.exp_avg, m, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(opt.exp_avg_sq, v, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(p, want_p, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("n", [1, 5, 8, 13, 1000, 4099])
@pytest.mark.parametrize("offset", [0, 3])
def test_amsgrad_parity(n, offset):
    """AMSGrad against its numpy twin, with the out= sweep and a wrapped offset;
    a large first gradient then small ones, so the running max matters."""
    rng = np.random.default_rng(200 + n)
    p = _rand(rng, n)
    opt = Adam(n, lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-6, amsgrad=True)
    m, v, w = (np.zeros(n, np.float32) for _ in range(3))
    out = np.empty(n, np.float32)
    for t in range(1, 6):
        g = _rand(rng, n, 3.0 if t == 1 else 0.1)
        want_p, m, v, w = ref_amsgrad(p, g, m, v, w, 1e-2, 0.8, 0.99, 1e-6, t, grad_scale=0.5)
        opt.apply(p, g, grad_scale=0.5, offset=offset, out=out)
        np.testing.assert_allclose(opt.exp_avg, m, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(opt.exp_avg_sq, v, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(opt.max_exp_avg_sq, w, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(p, want_p, rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(out, p)
    assert np.all(opt.max_exp_avg_sq >= opt.exp_avg_sq)
    assert np.any(opt.max_exp_avg_sq > opt.exp_avg_sq)     # the large first gradient is kept


def test_amsgrad_step_shrinks_with_the_gradient_where_adam_does_not():
    """The drift mechanism in one weight: after 2,000 applies of unit gradients,
    14,000 of gradients 100x smaller (v forgets in ~1,000).  Adam's steps return
    to ~lr (scale-free); AMSGrad's are ~lr/100, as SGD's would be."""
    steps = {}
    for ams in (False, True):
        p = np.zeros(1, np.float32)
        opt = Adam(1, lr=1e-3, amsgrad=ams)
        for k in range(16000):
            if k == 15999:
                before = p.copy()
            opt.apply(p, np.array([1.0 if k < 2000 else 0.01], np.float32))
        steps[ams] = float(before[0] - p[0])
    assert steps[False] == pytest.approx(1e-3, rel=0.05)
    assert steps[True] < 3e-5 and steps[True] > 0


def test_amsgrad_state_roundtrip_and_legacy_state():
    rng = np.random.default_rng(9)
    n = 64
    a = Adam(n, amsgrad=True)
    p = _rand(rng, n)
    for _ in range(3):
        a.apply(p, _rand(rng, n))
    d = a.state_dict()
    assert set(d) >= {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    b = Adam(n, amsgrad=True)
    b.load_state_dict(d)
    for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
    # a checkpoint written without AMSGrad: the running max starts at v
    plain = Adam(n)
    plain.apply(p, _rand(rng, n))
    c = Adam(n, amsgrad=True)
    c.load_state_dict(plain.state_dict())
    np.testing.assert_array_equal(c.max_exp_avg_sq, plain.exp_avg_sq)
    assert "max_exp_avg_sq" not in plain.state_dict()
    with pytest.raises(TypeError, match="amsgrad"):
        Adam(n, amsgrad="yes")
    bad = dict(d, max_exp_avg_sq=np.zeros(n + 1, np.float32))
    with pytest.raises(ValueError, match="max_exp_avg_sq"):
        Adam(n, amsgrad=True).load_state_dict(bad)


def test_amsgrad_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    n = 257
    p0 = _rand(rng, n)
    tp = torch.nn.Parameter(torch.tensor(p0.copy()))
    topt = torch.optim.Adam([tp], lr=1e-3, betas=(0.9, 0.99), eps=1e-8, amsgrad=True)
    opt = Adam(n, lr=1e-3, beta1=0.9, beta2=0.99, eps=1e-8, amsgrad=True)
    p = p0.copy()
    for t in range(20):
        g = _rand(rng, n, 2.0 if t < 3 else 0.05)
        tp.grad = torch.tensor(g)
        topt.step()
        opt.apply(p, g)
    np.testing.assert_allclose(p, tp.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_the_optimizers_are_adam_and_the_papers_rmsprop():
    assert sorted(OPTIMIZERS) == ["adam", "rmsprop"]
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        make_optimizer("sgd", 4)


def test_rmsprop_hand_computed():
    p = np.array([1.0, -2.0], np.float32)
    g = np.array([0.5, -1.0], np.float32)
    opt = RMSProp(2, lr=0.1, alpha=0.9, eps=0.1)
    opt.apply(p, g)
    # g2 = 0.1*0.25 = 0.025 ; 0.1*1 = 0.1 ; step = 0.1*d/sqrt(g2+0.1)
    np.testing.assert_allclose(opt.square_avg, [0.025, 0.1], rtol=1e-6)
    np.testing.assert_allclose(p, [1 - 0.05 / np.sqrt(0.125), -2 + 0.1 / np.sqrt(0.2)], rtol=1e-6)


def test_rmsprop_anneal():
    opt = RMSProp(1, lr=1.0, anneal_steps=100)
    assert opt.lr_at(0) == 1.0 and opt.lr_at(25) == 0.75 and opt.lr_at(500) == 0.0
    p = np.ones(1, np.float32)
    opt.apply(p, np.ones(1, np.float32), global_step=100)
    assert p[0] == 1.0                                  # lr_t = 0: no move
    opt.apply(p, np.ones(1, np.float32), global_step=50)
    s = 0.99 * 0.01 + 0.01                             # second stats update
    np.testing.assert_allclose(p, [1 - 0.5 / np.sqrt(s + 0.1)], rtol=1e-6)


def test_adam_anneal_against_a_numpy_twin():
    rng = np.random.default_rng(3)
    n, b1, b2, eps = 7, 0.9, 0.999, 1e-8
    opt = Adam(n, lr=0.01, anneal_steps=200)
    assert opt.lr_at(0) == 0.01 and opt.lr_at(50) == 0.0075 and opt.lr_at(999) == 0.0
    p = rng.standard_normal(n).astype(np.float32)
    ref, m, v = p.astype(np.float64), np.zeros(n), np.zeros(n)
    for t, step in enumerate((0, 50, 120, 200, 260), start=1):
        g = rng.standard_normal(n).astype(np.float32)
        opt.apply(p, g, global_step=step)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g.astype(np.float64) ** 2
        lr_t = 0.01 * max(0.0, 1 - step / 200)
        ref = ref - lr_t * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        np.testing.assert_allclose(p, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(opt.exp_avg_sq, v, rtol=1e-5)  # the moments still move at lr 0
    state = opt.state_dict()
    assert state["anneal_steps"] == 200
    fresh = Adam(n, lr=0.01)
    fresh.load_state_dict(state)
    assert fresh.anneal_steps == 200 and fresh.step == 5


@pytest.mark.parametrize("floor", [0.1, 0.25])
def test_adam_anneal_floor_against_a_numpy_twin(floor):
    """The anneal ends at lr * floor and stays there; the floor is saved with the
    state and restored."""
    rng = np.random.default_rng(4)
    n, b1, b2, eps = 5, 0.9, 0.999, 1e-8
    opt = Adam(n, lr=0.01, anneal_steps=100, anneal_floor=floor, amsgrad=True)
    assert opt.lr_at(0) == 0.01 and opt.lr_at(50) == pytest.approx(0.005)
    assert opt.lr_at(100 * (1 - floor)) == pytest.approx(0.01 * floor)
    assert opt.lr_at(10**9) == pytest.approx(0.01 * floor)
    p = rng.standard_normal(n).astype(np.float32)
    ref, m, v, w = p.astype(np.float64), np.zeros(n), np.zeros(n), np.zeros(n)
    for t, step in enumerate((0, 40, 95, 100, 5000), start=1):
        g = rng.standard_normal(n).astype(np.float32)
        opt.apply(p, g, global_step=step)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g.astype(np.float64) ** 2
        w = np.maximum(w, v)
        lr_t = 0.01 * max(floor, 1 - step / 100)
        ref = ref - lr_t * (m / (1 - b1 ** t)) / (np.sqrt(w / (1 - b2 ** t)) + eps)
        np.testing.assert_allclose(p, ref, rtol=1e-5, atol=1e-7)
    fresh = Adam(n, lr=0.01, amsgrad=True)
    fresh.load_state_dict(opt.state_dict())
    assert fresh.anneal_floor == floor and fresh.anneal_steps == 100
    r = RMSProp(1, lr=1.0, anneal_steps=10, anneal_floor=floor)
    assert r.lr_at(10**6) == pytest.approx(floor) and r.lr_at(5) == pytest.approx(max(floor, 0.5))
    with pytest.raises(ValueError, match="anneal_floor"):
        Adam(n, anneal_floor=1.5)


def test_adam_hand_computed():
    p = np.array([1.0], np.float32)
    opt = Adam(1, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8)
    opt.apply(p, np.array([2.0], np.float32))
    # t=1: m_hat = g, v_hat = g^2 -> step = lr*sign(g)
    np.testing.assert_allclose(p, [0.9], rtol=1e-6)
    opt.apply(p, np.array([-1.0], np.float32))
    m = 0.9 * 0.2 + 0.1 * -1.0
    v = 0.999 * 0.004 + 0.001 * 1.0
    step = 0.1 * (m / (1 - 0.9 ** 2)) / (np.sqrt(v / (1 - 0.999 ** 2)) + 1e-8)
    np.testing.assert_allclose(p, [0.9 - step], rtol=1e-5)


def test_adam_moment_stats_against_numpy():
    """The logged diagnostics: sqrt(mean v_hat) and rms(m_hat / (sqrt(v_hat) + eps))."""
    rng = np.random.default_rng(3)
    opt = Adam(500, lr=1e-3, eps=1e-6)
    p = np.zeros(500, np.float32)
    for k in range(7):
        opt.apply(p, (rng.standard_normal(500) * (k + 1)).astype(np.float32))
    t = opt.step
    m = opt.exp_avg.astype(np.float64) / (1 - 0.9 ** t)
    v = opt.exp_avg_sq.astype(np.float64) / (1 - 0.999 ** t)
    den, upd = opt.moment_stats()
    assert den == pytest.approx(np.sqrt(v.mean()), rel=1e-12)
    assert upd == pytest.approx(np.sqrt(np.mean((m / (np.sqrt(v) + 1e-6)) ** 2)), rel=1e-9)
    # one constant gradient: every step is lr in size (|m_hat / sqrt(v_hat)| = 1)
    opt = Adam(10)
    g = np.full(10, 0.25, np.float32)
    for _ in range(5):
        opt.apply(np.zeros(10, np.float32), g)
    assert opt.moment_stats() == (pytest.approx(0.25, rel=1e-6), pytest.approx(1.0, rel=1e-5))


def test_adam_state_saved_with_the_removed_relative_clip_loads():
    """An optimizer state saved before clip_relative was removed still has that
    hyper-parameter: it loads (the key ignored) and the moments carry over."""
    rng = np.random.default_rng(7)
    a = SharedState(np.zeros(50, np.float32), Adam(50))
    for _ in range(20):
        a.apply(rng.standard_normal(50).astype(np.float32), 40.0)
    d = a.state_dict()
    assert "clip_relative" not in d["optimizer"]
    d["optimizer"]["clip_relative"] = 3.0          # an old checkpoint's state
    b = SharedState.from_state_dict(d)
    assert not hasattr(b.optimizer, "clip_relative")
    np.testing.assert_array_equal(b.optimizer.exp_avg_sq, a.optimizer.exp_avg_sq)
    assert b.optimizer.step == a.optimizer.step
    with pytest.raises(TypeError, match="clip_relative"):
        Adam(3, clip_relative=1.0)


def test_adam_shared_step_count_threads():
    n, workers, per = 64, 4, 200
    opt = Adam(n, lr=1e-4)
    p = np.zeros(n, np.float32)
    g = np.full(n, 1e-3, np.float32)

    def work():
        for _ in range(per):
            opt.apply(p, g)

    ts = [threading.Thread(target=work) for _ in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert opt.step == workers * per
    assert np.all(np.isfinite(p))


def test_adam_failed_apply_does_not_count():
    opt = Adam(4)
    with pytest.raises(ValueError, match="grads"):
        opt.apply(np.zeros(4, np.float32), np.zeros(5, np.float32))
    assert opt.step == 0


@pytest.mark.parametrize("name", ["rmsprop", "adam"])
def test_state_dict_roundtrip(name):
    rng = np.random.default_rng(3)
    a = make_optimizer(name, 10)
    p = _rand(rng, 10)
    a.apply(p, _rand(rng, 10))
    d = a.state_dict()
    assert d["name"] == name == a.name
    json.dumps({k: v for k, v in d.items() if not isinstance(v, np.ndarray)})
    b = make_optimizer(name, 10)
    b.load_state_dict(d)
    p2 = p.copy()
    g = _rand(rng, 10)
    a.apply(p, g)
    b.apply(p2, g)
    np.testing.assert_array_equal(p, p2)


def test_state_dict_errors():
    opt = RMSProp(10)
    d = opt.state_dict()
    d["square_avg"] = np.zeros(9, np.float32)
    with pytest.raises(ValueError, match="square_avg.*shape"):
        opt.load_state_dict(d)
    with pytest.raises(ValueError, match="adam"):
        opt.load_state_dict(Adam(10).state_dict())
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer("adagrad", 10)
    with pytest.raises(ValueError, match="alpha"):
        RMSProp(10, alpha=1.5)


def test_bad_inputs_name_the_argument():
    opt = RMSProp(8)
    p = np.zeros(8, np.float32)
    with pytest.raises(TypeError, match="grads.*float32"):
        opt.apply(p, np.zeros(8, np.float64))
    with pytest.raises(ValueError, match="grads.*length"):
        opt.apply(p, np.zeros(7, np.float32))
    with pytest.raises(ValueError, match="params.*contiguous"):
        opt.apply(np.zeros(16, np.float32)[::2], np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="params.*1-D"):
        opt.apply(np.zeros((2, 4), np.float32), np.zeros(8, np.float32))
    with pytest.raises(TypeError, match="params"):
        opt.apply([0.0] * 8, np.zeros(8, np.float32))
    ro = np.zeros(8, np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="params.*writeable"):
        opt.apply(ro, np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="share memory"):
        opt.apply(p, p)
    with pytest.raises(ValueError, match="dst.*length"):
        sync_params(p, np.zeros(9, np.float32))
    with pytest.raises(TypeError, match="grads"):
        clip_grad_norm(np.zeros(3, np.float16), 1.0)


def test_sync_params():
    src = np.arange(1000, dtype=np.float32)
    dst = np.zeros(1000, np.float32)
    sync_params(src, dst)
    np.testing.assert_array_equal(src, dst)


# lengths around the norm pass's 32 partial-sum lanes and its remainder loop
@pytest.mark.parametrize("n", [1, 7, 8, 31, 32, 33, 65, 1001, 70001])
def test_clip_parity(n):
    rng = np.random.default_rng(n)
    g = _rand(rng, n, 3.0)
    for max_norm in [None, 0.0, 0.5, 1e6]:
        want, want_norm, _ = ref_clip(g, max_norm)
        got = g.copy()
        norm, finite = clip_grad_norm(got, max_norm)
        assert finite
        np.testing.assert_allclose(norm, want_norm, rtol=1e-12)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_clip_scaling_and_noop():
    g = np.array([3.0, 4.0], np.float32)
    norm, finite = clip_grad_norm(g, 1.0)
    assert finite and norm == pytest.approx(5.0)
    np.testing.assert_allclose(g, [0.6, 0.8], rtol=1e-6)
    g = np.array([3.0, 4.0], np.float32)
    assert clip_grad_norm(g, 10.0) == (pytest.approx(5.0), True)
    np.testing.assert_array_equal(g, [3.0, 4.0])
    assert clip_grad_norm(g, None)[0] == pytest.approx(5.0)
    np.testing.assert_array_equal(g, [3.0, 4.0])
    big = np.full(4, 3e38, np.float32)                  # finite; float64 sum does not overflow
    norm, finite = clip_grad_norm(big, 1.0)
    assert finite and norm == pytest.approx(6e38, rel=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("n,where", [(15, 1), (70, 40), (35, 34)])   # lanes; remainder
def test_clip_nonfinite_untouched(bad, n, where):
    g = np.linspace(-2, 2, n).astype(np.float32)
    g[where] = bad
    before = g.copy()
    norm, finite = clip_grad_norm(g, 1.0)
    assert not finite and not np.isfinite(norm)
    np.testing.assert_array_equal(g, before)


def test_shared_state_apply_and_skip():
    params = np.array([1.0, 2.0, 3.0], np.float64)
    s = SharedState(params, Adam(3, lr=0.1))
    assert s.params.dtype == np.float32 and s.params is not params
    g = np.array([3.0, 4.0, 0.0], np.float32)
    norm, applied = s.apply(g, max_grad_norm=1.0)
    assert applied and norm == pytest.approx(5.0)
    # Adam's first step: lr x sign of the (clipped) gradient
    np.testing.assert_allclose(s.params, [0.9, 1.9, 3.0], rtol=1e-6)
    np.testing.assert_array_equal(g, [3.0, 4.0, 0.0])     # grads not modified
    before = s.params.copy()
    norm, applied = s.apply(np.array([np.nan, 0, 0], np.float32), 1.0)
    assert not applied
    np.testing.assert_array_equal(s.params, before)
    assert s.counters() == {"steps": 0, "updates": 1, "episodes": 0, "skipped_updates": 1}


def test_shared_state_nonfinite_keeps_optimizer_stats():
    s = SharedState(np.zeros(4, np.float32), Adam(4))
    s.apply(np.array([np.inf, 0, 0, 0], np.float32), 40.0)
    assert s.optimizer.step == 0 and not s.optimizer.exp_avg.any()
    assert s.skipped_updates == 1


def test_shared_state_counters_threads_and_checkpoint():
    s = SharedState(np.zeros(5, np.float32), RMSProp(5, anneal_steps=10))

    def work():
        for _ in range(1000):
            s.add_steps(20)
            s.add_episodes(1)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert s.steps == 80000 and s.episodes == 4000
    s.apply(np.ones(5, np.float32), 40.0, global_step=0)
    d = s.state_dict()
    s2 = SharedState.from_state_dict(d)
    assert s2.counters() == s.counters()
    np.testing.assert_array_equal(s2.params, s.params)
    np.testing.assert_array_equal(s2.optimizer.square_avg, s.optimizer.square_avg)
    assert s2.optimizer.anneal_steps == 10
    d["params"] = np.zeros(6, np.float32)
    with pytest.raises(ValueError, match="params.*shape"):
        s2.load_state_dict(d)
    with pytest.raises(ValueError, match="optimizer is for"):
        SharedState(np.zeros(6, np.float32), RMSProp(5))


@pytest.mark.parametrize("name", ["rmsprop", "adam"])
def test_hogwild_stress_quadratic(name):
    """4 threads hammer the same shared params for ~1 s: finite, loss decreases."""
    n = 20000
    rng = np.random.default_rng(0)
    target = _rand(rng, n)
    kw = {"lr": 1e-2} if name == "rmsprop" else {"lr": 1e-2}
    s = SharedState(np.zeros(n, np.float32), make_optimizer(name, n, **kw))

    def loss(p):
        return 0.5 * float(np.sum((p.astype(np.float64) - target) ** 2))

    loss0 = loss(s.params)
    stop = time.perf_counter() + 1.0
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        local = np.empty(n, np.float32)
        grads = np.empty(n, np.float32)
        try:
            while time.perf_counter() < stop:
                s.sync_to(local)
                np.subtract(local, target, out=grads)
                grads += r.standard_normal(n).astype(np.float32) * 0.1
                s.apply(grads, 40.0)
                s.add_steps(1)
        except Exception as e:                           # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert s.updates > 20 and s.skipped_updates == 0
    assert np.all(np.isfinite(s.params))
    assert loss(s.params) < 0.5 * loss0


@pytest.mark.parametrize("name", ["rmsprop", "adam"])
@pytest.mark.parametrize("offset", [1, 17, 500, 999, 1000, -3])
def test_offset_sweep_gives_identical_result(name, offset):
    """A staggered start (wrap-around sweep) changes the order, not the result."""
    rng = np.random.default_rng(3)
    n = 1000
    p0 = rng.standard_normal(n).astype(np.float32)
    gs = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    a, b = make_optimizer(name, n), make_optimizer(name, n)
    pa, pb = p0.copy(), p0.copy()
    for g in gs:
        a.apply(pa, g, grad_scale=0.5)
        b.apply(pb, g, grad_scale=0.5, offset=offset)
    np.testing.assert_array_equal(pa, pb)
    for k, v in a.state_dict().items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, b.state_dict()[k])


def test_offset_apply_still_rejects_bad_input_before_writing():
    n = 100
    opt = make_optimizer("adam", n)
    p = np.ones(n, np.float32)
    with pytest.raises(ValueError, match="length"):
        opt.apply(p, np.ones(n + 5, np.float32), offset=50)
    with pytest.raises(TypeError, match="float32"):
        opt.apply(p, np.ones(n, np.float64), offset=50)
    np.testing.assert_array_equal(p, np.ones(n, np.float32))
    assert opt.step == 0


@pytest.mark.parametrize("name", ["rmsprop", "adam"])
@pytest.mark.parametrize("n,offset", [(1, 0), (7, 3), (1000, 0), (4099, 1500)])
def test_apply_with_out_equals_apply_then_sync(name, n, offset):
    """apply(..., out=local) is the fused apply + sync: bit for bit the same
    params and statistics as apply() alone, and ``local`` equals the params."""
    rng = np.random.default_rng(n + offset)
    p0 = rng.standard_normal(n).astype(np.float32)
    a, b = make_optimizer(name, n), make_optimizer(name, n)
    pa, pb = p0.copy(), p0.copy()
    local = np.full(n, np.nan, np.float32)
    for k in range(3):
        g = rng.standard_normal(n).astype(np.float32)
        a.apply(pa, g, grad_scale=0.7, offset=offset)
        b.apply(pb, g, grad_scale=0.7, offset=offset, out=local)
        np.testing.assert_array_equal(pb, pa)
        np.testing.assert_array_equal(local, pa)
    for k, v in a.state_dict().items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, b.state_dict()[k])


@pytest.mark.parametrize("name", ["rmsprop", "adam"])
def test_apply_out_is_validated_before_anything_is_written(name):
    n = 64
    opt = make_optimizer(name, n)
    p = np.ones(n, np.float32)
    g = np.ones(n, np.float32)
    before = {k: v.copy() for k, v in opt.state_dict().items() if isinstance(v, np.ndarray)}
    for bad, exc, msg in [(np.zeros(n + 1, np.float32), ValueError, "out has length"),
                          (np.zeros(n, np.float64), TypeError, "out must have dtype float32"),
                          (p, ValueError, "out and params must not share memory"),
                          (g, ValueError, "out and grads must not share memory")]:
        with pytest.raises(exc, match=msg):
            opt.apply(p, g, out=bad)
    np.testing.assert_array_equal(p, np.ones(n, np.float32))
    for k, v in opt.state_dict().items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, before[k])
    if name == "adam":
        assert opt.step == 0


def test_shared_state_apply_sync_to():
    """SharedState.apply(sync_to=local) refreshes local with the new shared
    params when applied, and leaves it alone when the update is skipped."""
    rng = np.random.default_rng(5)
    n = 513
    s = SharedState(rng.standard_normal(n).astype(np.float32), make_optimizer("adam", n))
    local = np.zeros(n, np.float32)
    g = rng.standard_normal(n).astype(np.float32) * 100
    norm, applied = s.apply(g, max_grad_norm=1.0, sync_to=local, offset=200)
    assert applied and norm > 1.0
    np.testing.assert_array_equal(local, s.params)
    bad = g.copy()
    bad[7] = np.nan
    keep = local.copy()
    s.params[:] += 1.0        # the shared params move on, local must not follow a skip
    _, applied = s.apply(bad, max_grad_norm=1.0, sync_to=local)
    assert not applied
    np.testing.assert_array_equal(local, keep)


@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("offset", [0, 1, 250, 999])
def test_adam_kernel_offset_sweep_is_the_plain_sweep(amsgrad, offset):
    """_hogwild.adam_apply(..., offset=k): one call that sweeps [k, n) then
    [0, k), bit for bit the sweep from 0 (out= too); an offset outside [0, n)
    is refused before anything is written."""
    from a3c_core import _hogwild

    rng = np.random.default_rng(offset)
    n = 1000
    arrs = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
    m0 = rng.standard_normal(n).astype(np.float32)
    v0 = rng.random(n).astype(np.float32)
    runs = []
    for k in (0, offset):
        p, g = arrs[0].copy(), arrs[1]
        m, v, w, out = m0.copy(), v0.copy(), v0.copy(), np.zeros(n, np.float32)
        _hogwild.adam_apply(p, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 3, 0.5, out,
                            w if amsgrad else None, k)
        runs.append((p, m, v, w, out))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(runs[1][0], runs[1][4])
    p = arrs[0].copy()
    for bad in (-1, n):
        with pytest.raises(ValueError, match="offset"):
            _hogwild.adam_apply(p, arrs[1], m0.copy(), v0.copy(), 1e-3, 0.9, 0.999, 1e-8, 3,
                                offset=bad)
    np.testing.assert_array_equal(p, arrs[0])
