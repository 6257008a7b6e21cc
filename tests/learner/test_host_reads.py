"""The update reads no number back from the device per micro-batch: on a GPU each read (``float(t)``, ``int(t)``,
``bool(t)``, ``t[mask]``) waits for every kernel queued before it. The statistics of a minibatch's micro-batches
add up on the device and come back in one copy; a budget that cuts a minibatch finer adds no read."""

import copy
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from actors.learner.batch import single_turn_batch
from actors.learner.update import Objective, ObjectiveState, policy_gradient_step
from actors.models import padding
from algos.losses import (decoupled_ppo_loss, entropy_bonus, kl_cost_to_go, kl_penalty, ppo_clip_loss, reinforce_loss,
                          sft_loss, token_logprobs, truncated_is_loss)

ROOT = Path(__file__).resolve().parents[2]
# the update's own code: the host batch's reads (actors/learner/batch.py, before the copy to the device) are not its
OWN = {ROOT / "actors" / "learner" / "update.py", ROOT / "algos" / "losses.py"}
READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
         torch.ops.aten.masked_select.default}


class CountReads(TorchDispatchMode):
    """Counts the ops that copy a value to the host, by the innermost frame of tidal's code outside torch."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        boolean_index = func is torch.ops.aten.index.Tensor and any(
            i is not None and i.dtype == torch.bool for i in args[1])
        if func in READS or boolean_index:
            frame = sys._getframe(1)
            while frame is not None and "/torch/" in frame.f_code.co_filename:
                frame = frame.f_back
            if frame is not None and Path(frame.f_code.co_filename).resolve() in OWN:
                self.reads.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {func}")
        return func(*args, **(kwargs or {}))


class BigramPolicy(torch.nn.Module):
    """The smallest policy the update trains: each position's logits from its token alone."""

    def __init__(self, vocab: int = 32):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, vocab)

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(logits=self.head(self.embed(input_ids)))


def random_batch(rows: int = 24, vocab: int = 32):
    rng = random.Random(0)
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(2, 20))] for _ in range(rows)]
    completions = [SimpleNamespace(token_ids=[rng.randrange(1, vocab) for _ in range(n)], versions=[0] * n,
                                   logprobs=[-rng.uniform(2.0, 4.0) for _ in range(n)])
                   for n in (rng.randint(1, 12) for _ in range(rows))]
    return single_turn_batch(prompts, completions, [rng.choice([-1.0, 0.0, 1.0]) for _ in range(rows)])


def test_cutting_a_minibatch_into_more_micro_batches_reads_nothing_more_back(monkeypatch):
    base = BigramPolicy()
    objective = Objective(advantage="grpo", minibatches=2, kl_coef=0.1, entropy_coef=0.01)  # every term
    counted = {}
    for budget in (None, 40):
        monkeypatch.setattr(padding, "MAX_SPREAD", float("inf") if budget is None else 2.0)  # None: one pass
        model = copy.deepcopy(base)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with CountReads() as mode:
            stats = policy_gradient_step(model, optimizer, random_batch(), objective, ObjectiveState(),
                                         temperature=1.0, reference=copy.deepcopy(base), version=0,
                                         generator=torch.Generator().manual_seed(0), max_tokens_per_microbatch=budget)
        counted[budget] = (stats["microbatches"], mode.reads)
    (whole, whole_reads), (cut, cut_reads) = counted[None], counted[40]
    assert whole == 2 and cut >= 12
    assert len(cut_reads) == len(whole_reads), (whole_reads, cut_reads)


def test_no_loss_reads_its_statistics_back():
    """Each loss returns its statistics as tensors on the device: the update reads a minibatch's at once."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 7, generator=generator, requires_grad=True)
    targets = torch.randint(7, (2, 4), generator=generator)
    mask = torch.tensor([[False, True, True, True], [False, False, True, False]])
    behaviour, advantages = torch.full((2, 4), -2.0), torch.tensor([[1.0] * 4, [-0.5] * 4])
    with CountReads() as mode:
        logprobs = token_logprobs(logits, targets)
        proximal = logprobs.detach() + 0.1
        results = [decoupled_ppo_loss(logprobs, proximal, behaviour, advantages, mask),
                   decoupled_ppo_loss(logprobs, proximal, behaviour, advantages, mask, out_of_range="clamp"),
                   ppo_clip_loss(logprobs, behaviour, advantages, mask),
                   truncated_is_loss(logprobs, behaviour, advantages, mask),
                   reinforce_loss(logprobs, advantages, mask), kl_penalty(logprobs, behaviour, mask),
                   kl_cost_to_go(proximal, behaviour, mask), entropy_bonus(logits, mask),
                   sft_loss(logits, targets, mask)]
        sum(loss.sum() for loss, _ in results).backward()
    assert mode.reads == []
    for _, stats in results:
        assert all(isinstance(value, torch.Tensor) and value.dim() == 0 for value in stats.values()), stats
