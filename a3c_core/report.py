"""What a finished run prints: one line with its result.

A base helper (imports nothing of a3c_core), so that ``a3c train`` and
``a3c train --ray`` (:mod:`a3c_core.cli`, :mod:`a3c_core.distributed.cli`)
print the same line without one importing the other.
"""
from __future__ import annotations

__all__ = ["final_line"]


def final_line(res) -> str:
    """The one-line result of a run (a :class:`~a3c_core.train.trainer.TrainResult`):
    final and best averages and which file holds which."""
    line = f"{res.status}: {res.steps:,} steps, {res.episodes:,} episodes in {res.seconds:.1f}s; "
    where = (f"parameters in {res.checkpoint}" if res.checkpoint
             else "no checkpoint written (stopped before training started)")
    if res.moving_avg is None:
        line += f"no episode finished; {where}"
    else:
        line += f"final raw reward avg{res.avg_window} {res.moving_avg:.2f}"
        if getattr(res, "episode_ends", None):
            # how those episodes ended, where the env tells (Doom: the scenario's goal
            # is "ended alive"; CartPole's 500 steps: "truncated")
            line += f" ({', '.join(f'{n} {end}' for end, n in res.episode_ends.items())})"
        if res.long_avg is not None and res.long_window != res.avg_window:
            # fewer episodes than the short window (a short run, or a resume: the
            # windows start again at a resume) put the same episodes in both
            line += f", avg{res.long_window} {res.long_avg:.2f}"
        line += f" ({where})"
    if res.best_checkpoint and res.best_avg is not None:
        line += (f"; best long-window avg {res.best_avg:.2f} at step {res.best_step:,} "
                 f"({res.best_checkpoint})")
    if res.skipped_updates:
        line += f"; {res.skipped_updates} updates skipped (non-finite gradients)"
    restarts = getattr(res, "env_restarts", 0)
    if restarts:
        line += (f"; {restarts} env restart{'s' * (restarts > 1)} after a crash or a hang "
                 f"(errors.log)")
    restarts = getattr(res, "worker_restarts", 0)
    if restarts:
        line += (f"; {restarts} worker process restart{'s' * (restarts > 1)} after a death "
                 f"(errors.log)")
    return line
