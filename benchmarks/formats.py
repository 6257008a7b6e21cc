"""Prompts and moves as a real model uses them: does tidal render a game's prompts as the model's own chat template
does, and what do stop strings save?

    python benchmarks/formats.py [--quick] [--minutes 3] [hydra overrides for both runs...]

- ``template_match``: a 3-turn game (GuessNumber, three guesses by a scripted policy) played through
  ``play_episode``, the env actor's path, in each history mode (last, transcript, chat), with a ChatML-style and a
  Llama-3-style template written into random-init tokenizers: the prompt ids the policy was asked with, turn by
  turn, against ``apply_chat_template(messages, add_generation_prompt=True)``'s ids for the same messages, built
  here from the observations and completions. 1 when every prompt of every case matches.
- ``tokens_per_move_ratio``: mean sampled tokens per move of the default job with ``sampling.stop=["]"]``, over the
  same job without stop strings (each a real ``tidal launch``, the same minutes, one after the other).
- ``episodes_per_s_ratio``: the same two runs' mean episodes/s.

Ends with one line: ``template_match=<0|1> tokens_per_move_ratio=<r> episodes_per_s_ratio=<r>``. ``--quick`` (for
CI: about two minutes) runs the two jobs in the in-process mode for a few seconds each: its ratios check the
harness, they mean little.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import trio

from actors.env.episode import EpisodeSettings, play_episode
from actors.env.policy_client import TokenCodec
from actors.models.chat import PromptFormat, give_chat_template
from actors.models.random_model import builtin_corpus
from actors.models.tokenizer import make_tokenizer
from envs.registry import make
from streams.messages import Completion

GUESSES = ("[50]", "[25]", "I think [12]")  # three moves of GuessNumber (1..100): none is likely to end it
SYSTEM = "You are a careful player."


def reference_messages(history: str, observations: list[str], completions: list[str], system: str | None) -> list:
    """The messages of the last turn, as docs/models.md says each history mode shows a game: written here, apart
    from ``actors.models.chat``."""
    head = [{"role": "system", "content": system}] if system else []
    if history == "last":
        return head + [{"role": "user", "content": observations[-1]}]
    if history == "transcript":
        text = "\n\n".join([f"{o}\nYou: {c}" for o, c in zip(observations, completions)] + [observations[-1]])
        return head + [{"role": "user", "content": text}]
    turns = []
    for o, c in zip(observations, completions):
        turns += [{"role": "user", "content": o}, {"role": "assistant", "content": c}]
    return head + turns + [{"role": "user", "content": observations[-1]}]


def play_three_turns(tokenizer, history: str, system: str | None) -> tuple[list[list[int]], list[str], list[str]]:
    """GuessNumber played for three guesses through ``play_episode``: the prompt ids of each turn, the observations
    the game showed and the completions' texts."""
    codec = TokenCodec(tokenizer)
    game = make("guess_number", max_turns=10)
    observations, prompts, completions = [], [], []
    observe = game.observation

    def observation(seat):
        text = observe(seat)
        observations.append(text)
        return text

    game.observation = observation

    async def policy(prompt_ids, max_tokens, policy_id):
        prompts.append(list(prompt_ids))
        text = GUESSES[len(prompts) - 1] if len(prompts) <= len(GUESSES) else "[]"
        completions.append(text)
        ids = codec.encode(text)
        return Completion(len(prompts), ids, [0.0] * len(ids), [0] * len(ids), True)

    settings = EpisodeSettings("guess_number", max_new_tokens=8,
                               prompt=PromptFormat(frame="chat", history=history, system=system, name="chat"))
    trio.run(lambda: play_episode(game, ["main"], policy, codec, settings, episode_id="e", seed=3, learner="main"))
    return prompts[:3], observations[:3], completions[:3]


def template_match() -> tuple[int, list[dict]]:
    cases = []
    for style in ("chatml", "llama3"):
        tokenizer = give_chat_template(make_tokenizer(builtin_corpus(), 400), style)
        for history in ("last", "transcript", "chat"):
            for system in (None, SYSTEM):
                prompts, observations, completions = play_three_turns(tokenizer, history, system)
                matched = 0
                for turn, ids in enumerate(prompts):
                    messages = reference_messages(history, observations[:turn + 1], completions[:turn], system)
                    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                             return_dict=True)["input_ids"]
                    matched += ids == list(expected)
                cases.append({"style": style, "history": history, "system": bool(system), "turns": len(prompts),
                              "matched": matched})
    ok = all(c["turns"] == 3 and c["matched"] == 3 for c in cases)
    return int(ok), cases


def run_job(stop: bool, minutes: float, out: Path, quick: bool, extra: list[str]) -> dict:
    from actors.cli import launch, load_config

    overrides = [f"run.minutes={minutes}", "run.progress=false", "eval.every_s=0", f"run.dir={out}",
                 f"run.name={'stop' if stop else 'nostop'}", "sampling.stop=" + ('["]"]' if stop else "[]")]
    if quick:
        overrides += ["run.mode=local", "eval.endpoint_games_per_seat=10", "model.tiny.warmup_steps=30",
                      "model.tiny.warmup_games=200"]
    summary = launch(load_config(overrides + extra))
    return {"stop": stop, "turns": summary["turns"], "tokens": summary["tokens"],
            "tokens_per_move": summary["tokens"] / max(summary["turns"], 1),
            "episodes_per_s": summary["episodes_per_s"], "truncated_actions": summary["truncated_actions"],
            "final_nonloss": summary["final_nonloss"], "versions": summary["final_version"]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--minutes", type=float, default=3.0, help="training minutes of each of the two jobs")
    parser.add_argument("--out", default="runs/formats")
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING)
    match, cases = template_match()
    for case in cases:
        print(f"template {case['style']:<7} history={case['history']:<10} system={case['system']!s:<5} "
              f"prompts matching apply_chat_template: {case['matched']}/{case['turns']}")
    out = Path(args.out)
    minutes = 0.15 if args.quick else args.minutes
    runs = [run_job(stop, minutes, out, args.quick, extra) for stop in (True, False)]
    for run in runs:
        print(f"stop={run['stop']!s:<5} tokens/move={run['tokens_per_move']:.2f} episodes/s={run['episodes_per_s']} "
              f"truncated_actions={run['truncated_actions']} versions={run['versions']} "
              f"final_nonloss={run['final_nonloss']}")
    with_stop, without = runs
    out.mkdir(parents=True, exist_ok=True)
    (out / "formats.json").write_text(json.dumps({"template_cases": cases, "runs": runs, "time": time.time()},
                                                 indent=2))
    eps = (with_stop["episodes_per_s"] or 0) / without["episodes_per_s"] if without["episodes_per_s"] else float("nan")
    print(f"template_match={match} tokens_per_move_ratio="
          f"{with_stop['tokens_per_move'] / without['tokens_per_move']:.3f} episodes_per_s_ratio={eps:.3f}")
    return 0 if match else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
