"""Per-update trace of a training run, to see what starts a post-convergence dip.

    python bench/trace_updates.py OUT.npz -- <a3c train arguments>

Runs ``a3c train`` with the given arguments and ``--min-rollout 0`` (the
default: every rollout ends with its episode, so that a row holds at most
one episode end; ``--cross-episode`` and ``--min-rollout`` K > 0 are refused) in this
process, with
:class:`~a3c_core.train.worker.Worker` and
:class:`~a3c_core.train.worker.ThreadStore` wrapped so that every update
(applied or skipped) appends one row to an in-memory table, written to
``OUT.npz`` when training ends (and every 60 s, so a stopped run keeps what
it had).  Nothing in the package changes: this is a diagnostic, and the
extra work (per-layer gradient norms: one pass over the gradient) slows a
worker by a few percent.

Columns (one per update, in the order the applies finished):

``t`` wall seconds since the trace started; ``wid``; ``seq`` the global
apply count after this one; ``stale`` applies by other workers between this
worker's last parameter refresh and this apply (Hogwild staleness); ``n``
rollout steps; ``ended`` 1 if the rollout ended its episode; ``raw`` summed
raw reward; ``v0`` the value of the rollout's first state; ``ret0`` its
return target; ``adv_rms`` RMS of the raw advantages; ``adv_mult`` the
advantage normalizer's multiplier after this update; ``pmin`` the smallest
probability of an action taken in the rollout; ``pmax_mean`` the mean of
the most likely action's probability (determinism); ``ent``/``vloss``/
``ploss`` per-step entropy, value and policy loss; ``gnorm`` the global
gradient norm (before the clip) and ``g_conv``/``g_fc``/``g_lstm``/
``g_pol``/``g_val`` the norms of those layers' gradients (``g_fc``: every
dense layer of the encoder); ``adam_exp`` the
norm Adam's second moments expect (``sqrt(sum v_hat)``, refreshed every
1,000 applies by the optimizer); ``applied``.

Analyse with ``python bench/trace_updates.py --show OUT.npz --at SECONDS``
(the updates around a moment) or ``--dips`` (each post-convergence dip of
the per-update raw-return average, with the updates that led into it) or
``--bursts OUT.npz [--since S] [--clip 40]`` (how often the norm exceeds the
clip, which layers carry it, by the least likely sampled action).
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

import numpy as np

COLS = ("t", "wid", "seq", "stale", "n", "ended", "raw", "v0", "ret0", "adv_rms", "adv_mult",
        "pmin", "pmax_mean", "ent", "vloss", "ploss", "gnorm", "g_conv", "g_fc", "g_lstm",
        "g_pol", "g_val", "adam_exp", "applied")


class Trace:
    def __init__(self, path, cap=4_000_000):
        self.path = path
        self.rows = np.zeros((cap, len(COLS)), np.float64)
        self.k = 0
        self.seq = 0
        self.lock = threading.Lock()
        self.t0 = time.perf_counter()
        self.last_save = self.t0

    def add(self, row):
        with self.lock:
            if self.k < len(self.rows):
                self.rows[self.k] = row
                self.k += 1
            due = time.perf_counter() - self.last_save > 60
        if due:
            self.save()

    def save(self):
        with self.lock:
            rows = self.rows[:self.k].copy()
            self.last_save = time.perf_counter()
        np.savez_compressed(self.path, rows=rows, cols=np.array(COLS))


def install(trace):
    """Wrap Worker/ThreadStore/Network methods so that each update adds a row;
    returns a function that puts the originals back."""
    from a3c_core.nn.network import Network
    from a3c_core.train import worker as W

    def group(name):
        for key, pre in (("g_conv", "conv"), ("g_lstm", "lstm."), ("g_pol", "policy."),
                         ("g_val", "value.")):
            if name.startswith(pre):
                return key
        return "g_fc"          # the dense layers of the encoder (fc, mlp)
    tls = threading.local()
    versions = {}          # id(local params) -> global apply count at its last refresh

    orig_pull = W.ThreadStore.pull
    orig_apply = W.ThreadStore.apply
    orig_rgrad = Network.rollout_grad
    orig_update = W.Worker._apply_update

    def pull(self, local_params):
        v = trace.seq
        orig_pull(self, local_params)
        versions[id(local_params)] = v

    def apply(self, grads, max_grad_norm, offset=0, local=None):
        norm, applied = orig_apply(self, grads, max_grad_norm, offset=offset, local=local)
        with trace.lock:
            trace.seq += 1
            tls.seq = trace.seq
        tls.norm = float(norm)
        return norm, applied

    def rollout_grad(self, actions, returns, advantages, **kw):
        stats = orig_rgrad(self, actions, returns, advantages, **kw)
        tls.loss = stats
        n = len(actions)
        probs = self.last_probs
        tls.pmin = float(probs[np.arange(n), actions].min())
        tls.pmax_mean = float(probs.max(axis=1).mean())
        tls.v0 = float(self.last_values[0])
        tls.ret0 = float(returns[0])
        tls.adv_rms = float(np.sqrt(np.mean(np.square(advantages, dtype=np.float64))))
        sq = dict.fromkeys(("g_conv", "g_fc", "g_lstm", "g_pol", "g_val"), 0.0)
        for name, v in self.grad_dict().items():
            v = v.ravel()
            sq[group(name)] += float(np.dot(v, v))
        tls.gn = {k: float(np.sqrt(x)) for k, x in sq.items()}
        return stats

    def apply_update(self, n, ret, adv):
        pid = id(self.net.params)
        before = versions.get(pid, 0)
        raw_adv_rms = float(np.sqrt(np.mean(np.square(adv, dtype=np.float64))))
        applied = orig_update(self, n, ret, adv)
        seq = tls.seq
        stale = seq - 1 - before
        if applied and getattr(self.store, "syncs_on_apply", False):
            versions[pid] = seq
        st = self.store
        mult = st.adv_normalizer.scale if getattr(st, "adv_normalizer", None) else 1.0
        opt = st.shared.optimizer
        adam = opt.expected_grad_norm() if hasattr(opt, "expected_grad_norm") else 0.0
        loss = tls.loss
        gn = tls.gn
        trace.add((time.perf_counter() - trace.t0, self.wid, seq, stale, n, 0.0,
                   float(self.raw_rewards[:n].sum()), tls.v0, tls.ret0, raw_adv_rms, mult,
                   tls.pmin, tls.pmax_mean, loss["entropy"] / n, loss["value_loss"] / n,
                   loss["policy_loss"] / n, tls.norm, gn["g_conv"], gn["g_fc"], gn["g_lstm"],
                   gn["g_pol"], gn["g_val"], adam, float(applied)))
        return applied

    orig_rollout = W.Worker.rollout

    def rollout(self):
        out = orig_rollout(self)
        if out[1] or out[2]:        # the episode ended: mark this worker's last row
            with trace.lock:
                for i in range(trace.k - 1, max(-1, trace.k - 64), -1):
                    if trace.rows[i, 1] == self.wid:
                        trace.rows[i, 5] = 1.0
                        break
        return out

    W.ThreadStore.pull = pull
    W.ThreadStore.apply = apply
    Network.rollout_grad = rollout_grad
    W.Worker._apply_update = apply_update
    W.Worker.rollout = rollout

    def restore():
        W.ThreadStore.pull = orig_pull
        W.ThreadStore.apply = orig_apply
        Network.rollout_grad = orig_rgrad
        W.Worker._apply_update = orig_update
        W.Worker.rollout = orig_rollout
    return restore


def load(path):
    z = np.load(path)
    return {c: z["rows"][:, i] for i, c in enumerate(z["cols"])}


def show(d, at, before=3.0, after=2.0, every=1):
    m = (d["t"] >= at - before) & (d["t"] <= at + after)
    idx = np.where(m)[0][::every]
    print(" ".join(f"{c:>8}" for c in COLS))
    for i in idx:
        print(" ".join(f"{d[c][i]:8.3g}" for c in COLS))


def dips(d, lo=60.0, hi=75.0, lead=1.5):
    """Per-worker episodes are not in the trace; use the ended rollouts'
    running raw returns per worker to rebuild episode returns."""
    n = len(d["t"])
    acc = {}
    ep_t, ep_r = [], []
    for i in range(n):
        w = int(d["wid"][i])
        acc[w] = acc.get(w, 0.0) + d["raw"][i]
        if d["ended"][i]:
            ep_t.append(d["t"][i])
            ep_r.append(acc[w])
            acc[w] = 0.0
    ep_t, ep_r = np.array(ep_t), np.array(ep_r)
    c = np.cumsum(np.r_[0, ep_r])
    k = np.arange(len(ep_r))
    a100 = (c[k + 1] - c[np.maximum(0, k - 99)]) / np.minimum(k + 1, 100)
    i = 99
    conv = np.where((k >= 99) & (a100 >= hi))[0]
    if not len(conv):
        print("never converged")
        return []
    out = []
    i = conv[0]
    while i < len(ep_r):
        below = np.where(a100[i:] < lo)[0]
        if not len(below):
            break
        j = i + below[0]
        on = j
        while on > i and a100[on] < hi:
            on -= 1
        out.append((ep_t[on], ep_t[j], a100[j:j + 2000].min()))
        rec = np.where(a100[j:] >= hi)[0]
        if not len(rec):
            break
        i = j + rec[0]
    return out


def bursts(d, after=0.0, clip=40.0, small=2.0):
    """Statistics of the updates after ``after`` seconds: how often the
    gradient norm exceeds ``clip``, which layers carry it (median share of
    the global norm, for ordinary updates with norm < ``small`` and for the
    bursts), the norm by the probability of the least likely action the
    rollout sampled, and the median norm Adam's second moments expect.
    Returns a dict (the figures of bench/RESULTS.md's trace section)."""
    m = d["t"] > after
    g = d["gnorm"][m]
    span = float(d["t"][m].max() - d["t"][m].min()) if m.sum() > 1 else 0.0
    out = {"updates": int(m.sum()), "seconds": span,
           "bursts": int((g > clip).sum()),
           "bursts_per_s": float((g > clip).sum() / span) if span > 0 else float("nan"),
           "burst_share": float((g > clip).mean()) if len(g) else float("nan"),
           "adam_exp_median": float(np.median(d["adam_exp"][m])) if len(g) else float("nan")}
    for name, sel in (("ordinary", g < small), ("burst", g > clip)):
        for layer in ("g_conv", "g_fc", "g_lstm", "g_pol", "g_val"):
            share = d[layer][m][sel] / g[sel] if sel.any() else np.array([np.nan])
            out[f"{name}_{layer}_share"] = float(np.median(share))
    pmin = d["pmin"][m]
    rows = []
    for lo, hi in ((0.0, 1e-3), (1e-3, 1e-2), (1e-2, 0.1), (0.1, 1.01)):
        sel = (pmin >= lo) & (pmin < hi)
        rows.append((lo, hi, int(sel.sum()),
                     float(np.median(g[sel])) if sel.any() else float("nan"),
                     float((g[sel] > clip).mean()) if sel.any() else float("nan")))
    out["by_pmin"] = rows
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--show", "--dips", "--bursts"):
        p = argparse.ArgumentParser()
        p.add_argument("--show", default=None)
        p.add_argument("--dips", default=None)
        p.add_argument("--bursts", default=None)
        p.add_argument("--since", type=float, default=0.0,
                       help="--bursts: only updates after this many seconds (e.g. the crossing)")
        p.add_argument("--clip", type=float, default=40.0, help="--bursts: the burst threshold")
        p.add_argument("--at", type=float, default=None)
        p.add_argument("--before", type=float, default=3.0)
        p.add_argument("--after", type=float, default=2.0)
        p.add_argument("--every", type=int, default=1)
        a = p.parse_args(argv)
        d = load(a.show or a.dips or a.bursts)
        if a.bursts:
            b = bursts(d, after=a.since, clip=a.clip)
            print(f"{b['updates']} updates over {b['seconds']:.0f} s; norm > {a.clip:g}: "
                  f"{b['bursts']} ({b['burst_share'] * 100:.1f} %, {b['bursts_per_s']:.2f}/s); "
                  f"median sqrt(sum v_hat) {b['adam_exp_median']:.2f}")
            for kind in ("ordinary", "burst"):
                print(f"  {kind:8s} median share of the norm: " + ", ".join(
                    f"{lay[2:]} {b[f'{kind}_{lay}_share']:.2f}"
                    for lay in ("g_conv", "g_fc", "g_lstm", "g_pol", "g_val")))
            for lo, hi, n, med, over in b["by_pmin"]:
                print(f"  sampled p_min in [{lo:g}, {hi:g}): {n} updates, median norm {med:.2f}, "
                      f"{over * 100:.1f} % over {a.clip:g}")
        if a.dips:
            for on, t, m in dips(d):
                print(f"dip: last avg100 >= 75 at {on:.2f} s, < 60 at {t:.2f} s, min {m:.1f}")
        if a.at is not None:
            show(d, a.at, a.before, a.after, a.every)
        return 0
    if "--" not in argv or argv.index("--") != 1:
        print(__doc__)
        return 2
    out, train_args = argv[0], argv[2:]
    min_rollout = [v for i, a in enumerate(train_args)
                   for v in ([a.split("=", 1)[1]] if a.startswith("--min-rollout=") else
                             train_args[i + 1:i + 2] if a == "--min-rollout" else [])]
    if "--cross-episode" in train_args or any(v != "0" for v in min_rollout):
        print("trace_updates.py: a row per update holds one episode end at most, so the trace "
              "needs rollouts that end with their episode; it runs training with --min-rollout 0 "
              "(drop --cross-episode / --min-rollout K from the arguments)", file=sys.stderr)
        return 2
    train_args = train_args + ["--min-rollout", "0"]
    trace = Trace(out)
    restore = install(trace)
    from a3c_core.cli import main as a3c_main
    try:
        return a3c_main(["train"] + train_args)
    finally:
        restore()
        trace.save()
        print(f"trace: {trace.k} updates -> {out}")


if __name__ == "__main__":
    sys.exit(main())
