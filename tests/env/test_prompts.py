"""Prompts rendered as a model is used to them (``actors.models.chat``): the chat template, the history modes, the
context guard, and that only the policy's own tokens are trained, its behaviour log-probs lining up token for token
with the learner's."""

import re

import pytest
import torch
import trio
from transformers import AutoTokenizer

from actors.env.episode import EpisodeCounts, EpisodeSettings, play_episode
from actors.env.policy_client import TokenCodec
from actors.learner.batch import collate
from actors.learner.update import behaviour_gap
from actors.models.base_model import load_policy
from actors.models.chat import PromptFormat, PromptRenderer, give_chat_template, prompt_format
from actors.models.random_model import builtin_corpus
from actors.models.tokenizer import make_tokenizer
from actors.rollout.sampling import sample
from envs.registry import make
from streams.messages import Completion
from streams.schema import Columns, trajectory_table

HISTORIES = ("last", "transcript", "chat")


@pytest.fixture(scope="module")
def chat_tokenizer():
    return give_chat_template(make_tokenizer(builtin_corpus(), 400), "chatml")


def scripted(codec, moves, asked):
    """A policy that writes ``moves`` in turn (then ``[1]``), keeping the prompt ids it was asked with."""

    async def policy(prompt_ids, max_tokens, policy_id):
        asked.append(list(prompt_ids))
        ids = codec.encode(moves[len(asked) - 1] if len(asked) <= len(moves) else "[1]")
        return Completion(len(asked), ids, [-0.5] * len(ids), [2] * len(ids), True)

    return policy


def play_guesses(tokenizer, history, moves=("[40]", "[20]", "maybe [10]"), **settings):
    codec = TokenCodec(tokenizer)
    asked = []
    counts = EpisodeCounts(1)
    fmt = PromptFormat(frame="chat", history=history, name="chat")
    played = trio.run(lambda: play_episode(
        make("guess_number", max_turns=4), ["main"], scripted(codec, moves, asked), codec,
        EpisodeSettings("guess_number", max_new_tokens=8, prompt=fmt, **settings), episode_id="e", seed=11,
        learner="main", counts=counts))
    return played, asked, counts


@pytest.mark.parametrize("history", HISTORIES)
def test_only_the_sampled_tokens_of_each_turn_are_trained_in_every_history_mode(chat_tokenizer, history):
    (rows, _), asked, _ = play_guesses(chat_tokenizer, history)
    assert len(rows) >= 3
    batch = collate(trajectory_table(rows), chat_tokenizer.pad_token_id)
    for i, row in enumerate(rows):
        prompt, action = row[Columns.PROMPT_IDS], row[Columns.ACTION_IDS]
        assert list(prompt) == asked[i]  # the ids the policy was asked with travel as they are
        trained = batch.input_ids[i][batch.action_mask[i]].tolist()
        assert trained == list(action)  # the mask covers exactly the sampled tokens, nothing of the prompt
        assert batch.action_mask[i].nonzero().squeeze(-1).tolist() == list(range(len(prompt), len(prompt) + len(action)))
        assert batch.behaviour_logprobs[i][batch.action_mask[i]].tolist() == [-0.5] * len(action)
        text = chat_tokenizer.decode(prompt)
        assert text.endswith("<|im_start|>assistant\n")  # the template's own frame is context
    later = chat_tokenizer.decode(rows[2][Columns.PROMPT_IDS])
    if history == "last":
        assert "[40]" not in later
    else:  # the policy's earlier moves are context of the later turns, never trained there
        assert "[40]" in later and "[20]" in later
    if history == "chat":
        assert later.count("<|im_start|>assistant\n") == 3  # two earlier completions and the generation prompt


def test_the_rendered_prompt_is_what_the_chat_template_gives_and_a_llama3_bos_is_not_doubled():
    tokenizer = give_chat_template(make_tokenizer(builtin_corpus(), 400), "llama3")
    codec = TokenCodec(tokenizer)
    renderer = PromptRenderer(PromptFormat(frame="chat", system="Be brief.", name="chat"), codec, tokenizer)
    ids = renderer.ids("Board: X|O|3")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Board: X|O|3"}]
    assert ids == tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids.count(tokenizer.bos_token_id) == 1  # raw encoding would put a second one first
    assert codec.encode("x")[0] == tokenizer.bos_token_id


def test_raw_prompts_are_the_observation_as_before_and_a_named_template_wraps_it(chat_tokenizer):
    codec = TokenCodec(chat_tokenizer)
    assert PromptRenderer(prompt_format("raw"), codec).ids("1|2|3\nMove:") == codec.encode("1|2|3\nMove:")
    spiral = prompt_format("spiral")
    assert spiral.frame == "chat" and spiral.answer == "boxed"
    text = PromptRenderer(spiral, codec, chat_tokenizer).text("1|2|3")
    assert "Observation: 1|2|3" in text and "\\boxed{}" in text and text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("kwargs, named", [
    (dict(template="nonexistent"), "prompt.template='nonexistent'"),
    (dict(template="../launch"), "prompt.template='../launch'"),
    (dict(template="raw", history="chat"), "prompt.history=chat"),
    (dict(template="chat", history="sideways"), "prompt.history='sideways'"),
])
def test_a_prompt_that_cannot_render_is_refused_naming_the_key(kwargs, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.").replace("(", r"\(")):
        prompt_format(**kwargs)


def test_a_template_without_its_variable_or_with_an_unknown_one_does_not_render():
    with pytest.raises(ValueError, match=r"no \{observation\}"):
        PromptFormat(frame="chat", user="Play well.", name="mine")
    with pytest.raises(ValueError, match=r"unknown variable\(s\) \{board\}"):
        PromptFormat(frame="chat", user="{observation} {board}", name="mine")
    assert PromptFormat(frame="chat", user="As {role}: {observation} \\boxed{}", name="mine").user


def test_a_tokenizer_without_a_chat_template_asked_for_chat_is_refused():
    tokenizer = make_tokenizer(builtin_corpus(200), 300)
    with pytest.raises(ValueError, match="has no chat template.*prompt.template=raw"):
        PromptRenderer(prompt_format("chat"), TokenCodec(tokenizer), tokenizer)


def test_a_turn_that_would_not_fit_the_context_ends_its_episode_truncated_and_counted(chat_tokenizer):
    _, first, _ = play_guesses(chat_tokenizer, "chat", moves=("[40]",))
    room = len(first[0]) + 8 + 6  # the first prompt and its budget fit; the chat history soon outgrows it
    (rows, returns), asked, counts = play_guesses(chat_tokenizer, "chat", max_context_tokens=room)
    assert 1 <= len(rows) < 4 and len(asked) == len(rows)
    assert rows[-1][Columns.TRUNCATED] and not rows[-1][Columns.TERMINATED]
    assert counts.counts["context_full_episodes"] == 1 and counts.counts["errored"] == 0
    assert all(len(r[Columns.PROMPT_IDS]) + 8 <= room for r in rows)


def test_behaviour_logprobs_of_a_chat_prompt_line_up_with_the_learners_token_for_token(tiny_model_dir):
    """The tiny model samples moves for chat-rendered prompts with history; the learner's recomputed log-probs of
    those rows agree with the recorded ones, token for token."""
    model, tokenizer = load_policy(tiny_model_dir)
    assert tokenizer.chat_template  # tidal's tiny model has a template of its own
    codec = TokenCodec(tokenizer)
    generator = torch.Generator().manual_seed(0)

    async def policy(prompt_ids, max_tokens, policy_id):
        s = sample(model, [list(prompt_ids)], eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                   max_new_tokens=max_tokens, generator=generator, version=1)[0]
        return Completion(0, s.tokens, s.logprobs, s.versions, s.finished)

    rows = []
    for seed in range(3):
        played = trio.run(lambda: play_episode(
            make("tictactoe"), ["main", "main"], policy, codec,
            EpisodeSettings("tictactoe", max_new_tokens=6, prompt=prompt_format("chat", "chat")),
            episode_id=f"e{seed}", seed=seed, learner="main"))
        rows += played[0]
    batch = collate(trajectory_table(rows), tokenizer.pad_token_id)
    assert behaviour_gap(model, batch, 1.0) < 1e-4


def test_an_env_actor_prompts_a_qwen2_shape_with_the_spiral_template_and_reads_the_last_box(tmp_path):
    """A random-init Qwen2-shaped model directory (its tokenizer with a ChatML template): the env actor renders
    every prompt through the SPIRAL-style template, and a completion that boxes a move while reasoning and then
    boxes its answer plays the last box."""
    from actors.models.random_model import ModelShape, ensure_random_model
    from tests.factories import run_episodes

    model_dir = ensure_random_model(tmp_path, ModelShape(
        architecture="qwen2", hidden_size=64, layers=1, heads=2, kv_heads=1, intermediate_size=64, vocab_size=600,
        max_positions=4096, tokenizer_vocab=512))

    def reason_then_box(prompt: str) -> str:
        board = prompt.split("Observation: ", 1)[1].split("\nMove:")[0]
        free = re.findall(r"[1-9]", board.split("\n", 1)[1])
        return f"<think>Cell {free[-1]}? No: \\boxed{{{free[-1]}}} loses.</think> So \\boxed{{{free[0]}}}"

    requests = []
    *episodes, stats = run_episodes(model_dir, reason_then_box, episodes=4, record_requests=requests,
                                    prompt={"template": "spiral"}, answer="boxed", opponent_share=0.0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    first = tokenizer.decode(requests[0].prompt_ids)
    assert first.startswith("<|im_start|>user\nYou are playing a game.") and "\\boxed{}" in first
    assert first.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert stats["invalid_actions"] == 0 and stats["unreadable_actions"] == 0
    for table in episodes:
        rows = table.to_pylist()
        moves = [re.findall(r"\\boxed\{(\d)\}", r[Columns.ACTION_TEXT])[-1] for r in rows]
        assert len(set(moves)) == len(moves)  # each the first free cell, as the last box said: no cell twice
        assert rows[-1][Columns.TERMINATED]  # both seats take the first free cell: X wins on 3 5 7
