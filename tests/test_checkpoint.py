import os
import threading

import numpy as np
import pytest

from a3c_core.checkpoint import (
    CheckpointError,
    check_layout,
    find_resume_checkpoint,
    load_checkpoint,
    save_checkpoint,
)


class _Net:
    """Minimal stand-in: two tensors viewing one flat buffer."""

    def __init__(self, shapes):
        self.params = np.arange(sum(int(np.prod(s)) for s in shapes), dtype=np.float32)
        self._shapes = shapes
        self.spec = {"name": "toy"}

    def state_dict(self):
        out, off = {}, 0
        for i, s in enumerate(self._shapes):
            n = int(np.prod(s))
            out[f"t{i}"] = self.params[off:off + n].reshape(s)
            off += n
        return out


def _meta(net):
    return {"network": net.spec, "layout": [[k, list(v.shape)] for k, v in net.state_dict().items()]}


def test_round_trip(tmp_path):
    net = _Net([(3, 4), (5,)])
    p = tmp_path / "ckpt.npz"
    save_checkpoint(p, net.params, _meta(net), {"square_avg": np.ones(17, np.float32)})
    ck = load_checkpoint(str(p))
    np.testing.assert_array_equal(ck.params, net.params)
    np.testing.assert_array_equal(ck.opt_arrays["square_avg"], np.ones(17, np.float32))
    assert ck.meta["network"] == {"name": "toy"}
    assert ck.meta["n_params"] == 17
    assert "numpy" in ck.meta["versions"]
    check_layout(ck, net)
    assert [f for f in os.listdir(tmp_path) if f.startswith(".tmp")] == []


def test_missing_and_corrupt(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(str(tmp_path / "nope.npz"))
    net = _Net([(3, 4)])
    p = tmp_path / "c.npz"
    save_checkpoint(p, net.params, _meta(net))
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(str(p))
    p.write_bytes(b"not a zip at all")
    with pytest.raises(CheckpointError, match=r"not an \.npz checkpoint"):
        load_checkpoint(str(p))
    np.savez(p, x=np.zeros(3))
    with pytest.raises(CheckpointError, match="not an a3c_core checkpoint"):
        load_checkpoint(str(p))


def test_layout_mismatch_names_the_tensor(tmp_path):
    net = _Net([(3, 4), (5,)])
    p = tmp_path / "c.npz"
    save_checkpoint(p, net.params, _meta(net))
    other = _Net([(4, 3), (5,)])
    with pytest.raises(CheckpointError, match="tensor t0 shape \\(3, 4\\)"):
        check_layout(load_checkpoint(str(p)), other)
    with pytest.raises(CheckpointError, match="17 parameters"):
        check_layout(load_checkpoint(str(p)), _Net([(3, 4)]))


def test_interrupted_write_keeps_previous(tmp_path, monkeypatch):
    """A crash in the middle of a write leaves the previous checkpoint loadable."""
    net = _Net([(3, 4)])
    p = tmp_path / "latest.npz"
    save_checkpoint(p, net.params, _meta(net))

    def boom(*a, **k):
        raise KeyboardInterrupt("simulated Ctrl-C mid-write")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(p, net.params + 1, _meta(net))
    monkeypatch.undo()
    ck = load_checkpoint(str(p))
    np.testing.assert_array_equal(ck.params, net.params)
    assert [f for f in os.listdir(tmp_path) if f.startswith(".tmp")] == []


def test_concurrent_writers_never_expose_partial_file(tmp_path):
    net = _Net([(256, 256)])
    p = tmp_path / "latest.npz"
    save_checkpoint(p, net.params, _meta(net))
    errors = []

    def writer(k):
        for i in range(5):
            save_checkpoint(p, net.params + k, _meta(net))

    def reader():
        for _ in range(20):
            try:
                load_checkpoint(str(p))
            except CheckpointError as e:  # pragma: no cover - would be the bug
                errors.append(e)

    ts = [threading.Thread(target=writer, args=(k,)) for k in range(2)] + [threading.Thread(target=reader)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []


@pytest.mark.parametrize("content", [os.urandom(4096), b'env = "doom:basic"\nseed = 0\n', b""])
def test_non_npz_file_is_named_as_such(tmp_path, content):
    """Random bytes or a config.toml: 'not an .npz checkpoint', never 'pickled (object) data'."""
    p = tmp_path / "config.toml"
    p.write_bytes(content if not content.startswith(b"PK") else b"X" + content)
    with pytest.raises(CheckpointError, match=r"config\.toml is not an \.npz checkpoint") as e:
        load_checkpoint(str(p))
    assert "pickled" not in str(e.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_params_are_refused_both_ways(tmp_path, bad):
    net = _Net([(3, 4), (5,)])
    params = net.params.copy()
    params[7] = bad
    p = tmp_path / "c.npz"
    with pytest.raises(CheckpointError, match="1 of 17 parameters are not finite.*index 7"):
        save_checkpoint(p, params, _meta(net))
    assert not p.exists() and os.listdir(tmp_path) == []
    # a file written by something else (an older trainer) is refused at load
    meta = dict(_meta(net), format="a3c_core.checkpoint", format_version=1, n_params=17)
    np.savez(p, params=params, meta=np.frombuffer(__import__("json").dumps(meta).encode(), np.uint8))
    with pytest.raises(CheckpointError, match="not finite"):
        load_checkpoint(str(p))


@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="POSIX file modes")
@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_checkpoint_mode_follows_umask(tmp_path, mask):
    net = _Net([(3,)])
    old = os.umask(mask)
    try:
        ref = tmp_path / "plain"
        ref.write_bytes(b"")  # what any new file gets
        p = save_checkpoint(tmp_path / "c.npz", net.params, _meta(net))
    finally:
        os.umask(old)
    assert os.stat(p).st_mode & 0o777 == os.stat(ref).st_mode & 0o777 == 0o666 & ~mask


def _save_at(run, which, steps, net):
    meta = dict(_meta(net), counters={"steps": steps})
    return save_checkpoint(os.path.join(run, "checkpoints", f"{which}.npz"), net.params + steps, meta)


def test_find_resume_checkpoint_newest_valid(tmp_path):
    net = _Net([(3, 4)])
    run = str(tmp_path / "run")
    with pytest.raises(CheckpointError, match="run directory not found"):
        find_resume_checkpoint(run)
    os.makedirs(run)
    with pytest.raises(CheckpointError, match="(?s)no usable checkpoint.*latest.npz: missing.*best.npz: missing"):
        find_resume_checkpoint(run)
    # killed before the first latest.npz: best.npz alone is used
    best = _save_at(run, "best", 400, net)
    ck = find_resume_checkpoint(run)
    assert ck.path == best and ck.steps == 400 and ck.skipped == []   # a missing one is no news
    # the newer of the two by counters.steps
    latest = _save_at(run, "latest", 1000, net)
    assert find_resume_checkpoint(run).path == latest
    _save_at(run, "best", 2000, net)
    assert find_resume_checkpoint(run).path == best
    _save_at(run, "best", 1000, net)  # tie: latest
    assert find_resume_checkpoint(run).path == latest
    # a corrupt latest is skipped
    with open(latest, "r+b") as fh:
        fh.truncate(100)
    ck = find_resume_checkpoint(run)
    assert ck.path == best
    # ... and the checkpoint chosen says why (the resume line prints it)
    assert len(ck.skipped) == 1 and ck.skipped[0].startswith(latest) and "truncated" in ck.skipped[0]
    with open(best, "wb") as fh:
        fh.write(b"garbage")
    with pytest.raises(CheckpointError, match="(?s)latest.npz: .*truncated.*best.npz: .*not an .npz"):
        find_resume_checkpoint(run)


def test_describe_names_file_step_and_average(tmp_path):
    net = _Net([(3,)])
    meta = dict(_meta(net), counters={"steps": 40000}, moving_avg=12.5, best_moving_avg=80.25,
                avg_window=100)
    p = save_checkpoint(tmp_path / "best.npz", net.params, meta)
    d = load_checkpoint(p).describe()
    assert p in d and "step 40,000" in d and "12.50 over the last 100 episodes" in d and "best 80.25" in d


def test_a_run_saved_with_the_removed_rnd_bonus_still_resumes(tmp_path, capsys):
    """A run saved while the RND exploration bonus existed holds its state as
    ``opt/rnd/*`` arrays and an "exploration" meta entry, and its config.toml
    sets ``exploration``, ``exploration_scale`` and ``min_rollout``: loading
    ignores the arrays, and ``--resume`` trains on, naming the ignored fields."""
    pytest.importorskip("gymnasium")
    from a3c_core.cli import main

    run = str(tmp_path / "run")
    assert main(["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "200",
                 "--run-dir", run, "--quiet", "--no-tensorboard"]) == 0
    path = os.path.join(run, "checkpoints", "latest.npz")
    ck = load_checkpoint(path)
    rnd = {"rnd/predictor": np.ones(8, np.float32), "rnd/target": np.zeros(8, np.float32),
           "rnd/opt.exp_avg": np.zeros(8, np.float32)}
    save_checkpoint(path, ck.params, dict(ck.meta, exploration={"kind": "rnd"}),
                    dict(ck.opt_arrays, **rnd))
    assert set(load_checkpoint(path).opt_arrays) == set(ck.opt_arrays)
    with open(os.path.join(run, "config.toml"), "a") as fh:
        fh.write('exploration = "rnd"\nexploration_scale = 0.5\nmin_rollout = 0\n')
    capsys.readouterr()
    assert main(["train", "--resume", run, "--total-steps", "400", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "ignored: exploration, exploration_scale, min_rollout" in out, out
    assert load_checkpoint(path).meta["counters"]["steps"] >= 400
