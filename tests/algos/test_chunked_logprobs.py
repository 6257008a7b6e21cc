"""Log-probs and entropies computed block by block over the tokens (``algos.losses.per_token``): the values and
gradients of the whole-tensor formula, without its fp32 copies of a micro-batch's logits."""

import pytest
import torch

from algos import losses
from algos.losses import entropy_bonus, token_logprobs
from tests.support.memory import forward_backward_memory

QWEN2_VOCAB = 151936


def whole_logprobs(logits, targets, temperature=1.0):
    """The formula the blocks must reproduce, over the whole tensor at once."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def whole_entropy(logits, temperature=1.0):
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def value_and_grad(fn, logits, upstream):
    """fn(logits) and the gradient of sum(upstream * fn(logits)) with respect to logits (a fresh leaf)."""
    leaf = logits.detach().clone().requires_grad_()
    value = fn(leaf[:, :-1])  # a slice, as the learner passes the positions that predict a token
    (value * upstream).sum().backward()
    return value.detach(), leaf.grad


# 3 rows of 6 predicting positions over 11 tokens: 66 logits a row. 40 a block: a row's tokens in runs of 3;
# 150: two whole rows a block, then the last row alone
@pytest.mark.parametrize("chunk", [40, 150])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_give_the_values_and_gradients_of_the_whole_tensor(chunk, dtype, monkeypatch):
    generator = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 7, 11, generator=generator)).to(dtype)
    targets = torch.randint(11, (3, 6), generator=generator)
    upstream = torch.randn(3, 6, generator=generator)
    expected = {"logprobs": value_and_grad(lambda x: whole_logprobs(x, targets, 0.7), logits, upstream),
                "entropy": value_and_grad(lambda x: whole_entropy(x, 0.7), logits, upstream)}
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", chunk)
    calls = []
    monkeypatch.setattr(losses, "_blocks", record(calls, losses._blocks))
    got = {"logprobs": value_and_grad(lambda x: token_logprobs(x, targets, 0.7), logits, upstream),
           "entropy": value_and_grad(lambda x: losses.per_token(lambda b: whole_entropy(b, 0.7), x), logits,
                                     upstream)}
    assert len(calls) == 4  # both computed in blocks, forward and backward
    for name in expected:
        (value, grad), (want_value, want_grad) = got[name], expected[name]
        assert value.dtype == torch.float32 and grad.dtype == dtype
        assert torch.equal(value, want_value), name  # each block is the formula itself: the same bits
        assert torch.equal(grad, want_grad), name


def record(calls, apply):
    def recorded(*args):
        calls.append(args)
        return apply(*args)

    return recorded


def test_the_entropy_bonus_and_rows_of_logits_without_a_batch_dimension_are_cut_alike(monkeypatch):
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 9, 5, generator=generator, requires_grad=True)
    mask = torch.tensor([[True] * 4 + [False] * 4, [False] * 2 + [True] * 6])
    whole, _ = entropy_bonus(logits[:, :-1], mask)
    whole_grad, = torch.autograd.grad(whole, logits)
    flat = torch.randn(7, 5, generator=generator)  # a sampler's [rows, V]
    flat_targets = torch.randint(5, (7,), generator=generator)
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 12)
    cut, stats = entropy_bonus(logits[:, :-1], mask)
    cut_grad, = torch.autograd.grad(cut, logits)
    assert torch.equal(cut, whole) and torch.equal(cut_grad, whole_grad) and float(stats["entropy"]) == float(whole)
    assert torch.equal(token_logprobs(flat, flat_targets), whole_logprobs(flat, flat_targets))


@pytest.mark.parametrize("what", ["logprobs", "entropy"])
def test_blocks_hold_no_fp32_copy_of_a_micro_batchs_logits(what, monkeypatch):
    """A micro-batch's bf16 logits (as autocast leaves them on a GPU) at Qwen2's vocabulary, through a forward and
    a backward pass. The whole-tensor formula keeps an fp32 log-softmax of every logit for the backward pass and
    peaks at several fp32 copies; in blocks, only the logits' gradient (and the slice's, the same for both) is
    whole."""
    block = 1 << 20  # logits a block: 6 tokens' here, so that the micro-batch is many blocks
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", block)
    logits = torch.randn(1, 65, QWEN2_VOCAB, dtype=torch.bfloat16).requires_grad_()
    targets = torch.randint(QWEN2_VOCAB, (1, 64))
    blocks, whole = {
        "logprobs": (lambda x: token_logprobs(x, targets), lambda x: whole_logprobs(x, targets)),
        "entropy": (lambda x: losses.per_token(whole_entropy, x), whole_entropy),
    }[what]
    measured = {}
    for name, compute in (("blocks", blocks), ("whole", whole)):
        logits.grad = None
        measured[name] = forward_backward_memory(compute, logits)
    (blocks_held, blocks_peak), (whole_held, whole_peak) = measured["blocks"], measured["whole"]
    fp32_copy = logits[:, :-1].numel() * 4
    assert whole_held >= fp32_copy and whole_peak >= 2.5 * fp32_copy, measured
    assert blocks_held <= 65536, measured  # the [1, 64] result, and nothing kept for the backward pass
    assert blocks_peak <= 2 * logits.numel() * logits.element_size() + 8 * 4 * block, measured
    assert blocks_peak < whole_peak / 2.5, measured
