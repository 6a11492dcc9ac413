"""Checkpoint files: one ``.npz`` archive, written atomically.

A checkpoint holds

* ``params`` - the flat float32 parameter array;
* ``opt/<name>`` - the optimizer's state arrays (same layout as params);
* ``meta`` - one JSON document (stored as a uint8 array) with the network
  spec and its tensor layout, the env spec (id, frame skip, action names),
  the preprocessing spec, the optimizer's scalar state, the counters, the
  training config and the library versions.

Writes go to a temporary file in the destination directory, are flushed and
fsync'ed, then renamed over the target (``os.replace`` is atomic on POSIX and
Windows), so a crash or Ctrl-C mid-write leaves the previous checkpoint intact.
A write the file system refuses (a full disk, a file-size limit, an I/O error,
a read-only file system) raises :class:`CheckpointWriteError` naming the file
and the error; the temporary file is removed and the previous checkpoint is
left as it was.
The file gets the mode the user's umask gives any new file (not the 0600 of
the temporary file). Parameters must be finite: :func:`save_checkpoint`
refuses NaN/inf parameters and :func:`load_checkpoint` refuses files holding
them. Only numpy is needed to read one (``allow_pickle=False`` throughout).
"""
from __future__ import annotations

import json
import os
import platform
import tempfile
import zipfile
from importlib import metadata

import numpy as np

from a3c_core import __version__

FORMAT = "a3c_core.checkpoint"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, corrupt or does not match."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written: the file system refused (ENOSPC, EFBIG,
    EIO, EROFS, ...).  Nothing was replaced: the previous file at ``path`` is
    intact and no temporary file is left.  ``errno`` is the OSError's."""

    def __init__(self, path, error: OSError):
        self.path = path
        self.errno = error.errno
        #: ``[Errno 28] No space left on device``
        self.why = f"[Errno {error.errno}] {error.strerror}" if error.errno else str(error)
        super().__init__(f"cannot write checkpoint {path}: {self.why}")


def versions() -> dict:
    """Python, numpy, numba and a3c_core versions (numba's read from its
    package metadata: reading a checkpoint needs numpy only)."""
    out = {"python": platform.python_version(), "numpy": np.__version__,
           "a3c_core": __version__}
    try:
        out["numba"] = metadata.version("numba")
    except metadata.PackageNotFoundError:  # pragma: no cover - a dependency
        pass
    return out


def process_umask() -> int:
    """The process umask, read without changing it where the OS allows."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # brief window; only where /proc is unavailable
    os.umask(mask)
    return mask


def _check_finite(params, what):
    bad = ~np.isfinite(params)
    if bad.any():
        n = int(bad.sum())
        raise CheckpointError(
            f"{what}: {n} of {params.size} parameters are not finite (NaN or inf); "
            f"the first at flat index {int(np.argmax(bad))}"
        )


def save_checkpoint(path, params, meta, opt_arrays=None):
    """Atomically write ``params`` (+ optimizer arrays) and ``meta`` to ``path``.

    ``params``: flat float32 ``(P,)``; raises :class:`CheckpointError` (and
    writes nothing) if any parameter is NaN or inf, and
    :class:`CheckpointWriteError` if the file system refuses the write (a
    full disk, a file-size limit, an I/O error, a read-only file system):
    the file at ``path`` is then left as it was.
    """
    path = os.fspath(path)
    params = np.ascontiguousarray(params, dtype=np.float32)
    _check_finite(params, f"refusing to write checkpoint {path}")
    try:
        return _write(path, params, meta, opt_arrays)
    except OSError as e:
        raise CheckpointWriteError(path, e) from None


def _write(path, params, meta, opt_arrays):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    meta = dict(meta)
    meta.setdefault("format", FORMAT)
    meta.setdefault("format_version", FORMAT_VERSION)
    meta.setdefault("versions", versions())
    meta["n_params"] = int(params.size)
    arrays = {"params": params}
    for k, v in (opt_arrays or {}).items():
        arrays["opt/" + k] = np.ascontiguousarray(v)
    arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path) + "-", dir=directory)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o666 & ~process_umask())
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:  # pragma: no cover - not supported everywhere
        pass
    return path


class Checkpoint:
    """A loaded checkpoint: ``params``, ``opt_arrays`` and ``meta``."""

    def __init__(self, path, params, opt_arrays, meta):
        self.path = path
        self.params = params
        self.opt_arrays = opt_arrays
        self.meta = meta
        #: ``"path: why"`` of the checkpoints find_resume_checkpoint refused before this one
        self.skipped = []

    @property
    def network_spec(self) -> dict:
        return self.meta["network"]

    @property
    def env_spec(self) -> dict:
        return self.meta.get("env", {})

    @property
    def preprocess_spec(self) -> dict:
        return self.meta.get("preprocess", {"kind": "vector"})

    @property
    def steps(self):
        """Agent steps the run had taken when this checkpoint was saved (None if unknown)."""
        steps = self.meta.get("counters", {}).get("steps")
        return None if steps is None else int(steps)

    def describe(self) -> str:
        """One line: which file, at which step, and the training averages saved with it."""
        parts = [self.path]
        if self.steps is not None:
            parts.append(f"step {self.steps:,}")
        window = self.meta.get("avg_window")
        over = f" over the last {window} episodes" if window else ""
        avg = self.meta.get("moving_avg")
        parts.append("training moving average " + ("n/a (no episode finished)" if avg is None
                                                    else f"{avg:.2f}{over}"))
        best = self.meta.get("best_moving_avg")
        if best is not None:
            parts.append(f"best {best:.2f}")
        for key, value in sorted(self.meta.items()):
            # per-window averages, e.g. "moving_avg_10": 71.3 (written by newer trainers)
            if key.startswith("moving_avg_") and isinstance(value, (int, float)):
                parts.append(f"{key.replace('moving_avg_', 'last ')} episodes {value:.2f}")
        if self.meta.get("saved_at"):
            parts.append(f"saved {self.meta['saved_at']}")
        return ", ".join(parts)


def resolve_checkpoint_path(path, which="latest"):
    """Accept a checkpoint file or a run directory (-> its ``<which>.npz``)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        cand = os.path.join(path, "checkpoints", f"{which}.npz")
        if not os.path.exists(cand):
            raise CheckpointError(
                f"run directory {path!r} has no checkpoint checkpoints/{which}.npz"
            )
        return cand
    return path


def load_checkpoint(path, which="latest") -> Checkpoint:
    """Read and validate a checkpoint file (or a run directory's ``which`` one)."""
    path = resolve_checkpoint_path(path, which)
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint not found: {path}")
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path} is a directory, not a run directory or .npz file")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from None
    if magic[:2] != b"PK":
        raise CheckpointError(
            f"{path} is not an .npz checkpoint (not a zip archive); a3c_core checkpoints "
            f"are RUN_DIR/checkpoints/latest.npz and best.npz"
        )
    try:
        with np.load(path, allow_pickle=False) as z:
            names = set(z.files)
            if "meta" not in names or "params" not in names:
                raise CheckpointError(
                    f"{path} is not an a3c_core checkpoint (missing 'meta' or 'params')"
                )
            meta = json.loads(bytes(z["meta"]).decode())
            params = np.ascontiguousarray(z["params"], dtype=np.float32)
            # (``opt/rnd/*``: the RND exploration bonus's state, which runs saved
            # before the bonus was removed hold; not read)
            opt = {k[4:]: np.array(z[k]) for k in names
                   if k.startswith("opt/") and not k.startswith("opt/rnd/")}
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt: {e}") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an a3c_core checkpoint (format {meta.get('format')!r})")
    if int(meta.get("format_version", 0)) > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format version {meta.get('format_version')}, newer than this "
            f"a3c_core understands ({FORMAT_VERSION}); upgrade a3c_core"
        )
    if params.size != int(meta.get("n_params", -1)):
        raise CheckpointError(
            f"checkpoint {path} is inconsistent: {params.size} parameters stored, "
            f"metadata says {meta.get('n_params')}"
        )
    if "network" not in meta:
        raise CheckpointError(f"checkpoint {path} has no network spec")
    _check_finite(params, f"checkpoint {path} is unusable")
    return Checkpoint(path, params, opt, meta)


def no_run_dir(path) -> CheckpointError:
    """The error for a ``--resume`` path that is not a directory.  A checkpoint
    file (``RUN/checkpoints/latest.npz``) names its run directory."""
    p = os.fspath(path)
    if not os.path.isfile(p):
        return CheckpointError(f"--resume: run directory not found: {p}")
    folder = os.path.dirname(os.path.abspath(p))
    run = os.path.dirname(folder)
    hint = (f"; its run directory is {run} (a3c train --resume {run})"
            if os.path.basename(folder) == "checkpoints" else "")
    return CheckpointError(f"--resume takes a run directory, not a file: {p}{hint}")


def find_resume_checkpoint(run_dir) -> Checkpoint:
    """The newest valid checkpoint of ``run_dir`` (``latest.npz`` or ``best.npz``).

    "Newest" is by ``counters.steps`` (ties: ``latest``). Missing, corrupt or
    non-finite files are skipped; if none is usable, :class:`CheckpointError`
    lists every file tried and why it was refused.
    """
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise CheckpointError(f"run directory not found: {run_dir}")
    found, tried = [], []
    for which in ("latest", "best"):
        path = os.path.join(run_dir, "checkpoints", f"{which}.npz")
        if not os.path.exists(path):
            tried.append(f"{path}: missing")
            continue
        try:
            found.append(load_checkpoint(path))
        except CheckpointError as e:
            tried.append(f"{path}: {e}")
    if not found:
        raise CheckpointError(f"run directory {run_dir} has no usable checkpoint; tried:\n  "
                              + "\n  ".join(tried))
    # max() keeps the first of equal keys: latest wins a tie
    chosen = max(found, key=lambda c: -1 if c.steps is None else c.steps)
    chosen.skipped = [t for t in tried if not t.endswith(": missing")]
    return chosen


def check_layout(ckpt: Checkpoint, net) -> None:
    """Raise :class:`CheckpointError` if ``net``'s layout differs from the checkpoint's."""
    stored = ckpt.meta.get("layout")
    if ckpt.params.size != net.params.size:
        raise CheckpointError(
            f"checkpoint {ckpt.path} has {ckpt.params.size} parameters but the network "
            f"'{net.spec.get('name')}' has {net.params.size}"
        )
    if stored is None:
        return
    mine = layout_of(net)
    if stored != mine:
        for a, b in zip(stored, mine):
            if a != b:
                raise CheckpointError(
                    f"checkpoint {ckpt.path} does not match the network: tensor {a[0]} "
                    f"shape {tuple(a[1])} in the checkpoint vs {b[0]} {tuple(b[1])} in the network"
                )
        raise CheckpointError(
            f"checkpoint {ckpt.path} has {len(stored)} tensors, the network {len(mine)}"
        )


def layout_of(net) -> list:
    """JSON-able [(name, shape), ...] of a network's parameter layout."""
    return [[name, list(view.shape)] for name, view in net.state_dict().items()]
