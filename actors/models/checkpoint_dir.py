"""The checkpoint directory as one contract: what a learner's checkpoint directory holds, how a new one replaces the
last, and how one is found. Plain paths, no torch: replay stats the learner's checkpoint after every batch, and
loads torch only once there is one to read (reading it: `actors.models.checkpoints`).

A checkpoint directory holds the policy (a Hugging Face model directory, safetensors), ``trainer_state.pt`` (the
learner's own state) and ``optimizer/``. A new one is written beside the last (``<dir>.new``) and swapped in; a
swap cut short leaves the last one complete as ``<dir>.old``, where `find_checkpoint` looks too. A write cut
short (a kill, a full disk) leaves a half ``<dir>.new``: a starting learner removes it (`remove_stale`), so that
it does not hold the space its next checkpoint needs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

TRAINER_STATE = "trainer_state.pt"  # the learner's own state: version, data cursor, rng, totals, objective state
OPTIMIZER_DIR = "optimizer"  # the optimizer's state (torch.distributed.checkpoint)


def fresh_beside(final: Path) -> Path:
    """Where a new checkpoint is written before `swap_in` makes it ``final``."""
    return final.with_name(final.name + ".new")


def swap_in(final: Path) -> None:
    """Make the checkpoint written to ``fresh_beside(final)`` the one in ``final``: the last one is renamed
    ``.old`` first, so that at every moment one complete checkpoint is found by `find_checkpoint`."""
    fresh, old = fresh_beside(final), final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    fresh.rename(final)
    shutil.rmtree(old, ignore_errors=True)
def remove_stale(final: str | Path) -> list[Path]:
    """Remove what a cut-short write or swap left beside the checkpoint ``final``: ``<final>.new`` always (never
    swapped in, so never found), ``<final>.old`` only where ``final`` is complete (else it is the checkpoint).
    The removed paths."""
    final = Path(final)
    stale = [fresh_beside(final)]
    if (final / TRAINER_STATE).exists():
        stale.append(final.with_name(final.name + ".old"))
    removed = [path for path in stale if path.exists()]
    for path in removed:
        shutil.rmtree(path)
    return removed


def find_checkpoint(save_dir: str | Path | None) -> Path | None:
    """The complete checkpoint in ``save_dir`` (or the one a swap cut short left beside it), else None."""
    if not save_dir:
        return None
    final = Path(save_dir)
    for candidate in (final, final.with_name(final.name + ".old")):
        if (candidate / TRAINER_STATE).exists():
            return candidate
    return None
