import os
import threading

import numpy as np
import pytest

from a3c_core.checkpoint import (
    CheckpointError,
    check_layout,
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
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
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
