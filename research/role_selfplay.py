"""Role self-play on the arithmetic recipe: does the solver get better at tasks it never proposed, and does the
proposer's curriculum stay learnable?

    python research/role_selfplay.py [--quick] [--minutes 12] [--heldout 200] [overrides...]

One policy proposes Countdown tasks and solves them (`env=propose_solve`, `docs/roles.md`): each episode a
proposal and k = 4 solver attempts at it, GRPO over the attempts for the solver and a running baseline for the
proposer (`advantage=role_grpo`), Absolute Zero's learnability as the proposer's reward. The tiny base model is
warmed up on the recipe (valid proposals, answers right and wrong). A real `tidal launch` for ``--minutes``.

Before and after, the solver answers a held-out task set (made here with its own seed and reserved: the run and
its warm-up never set these tasks; any task the run set all the same is left out, `seen_tasks`) greedily, through
the same prompt and checker as in the game: the solve rate of the base model and of the trained policy. The
proposals' solve rate over the last third of the run is read from the task buffer kept with the run (its tasks in
the order first proposed), and the share of valid proposals over the last third from the proposer's turns in the
metrics. Last line:

    solver_heldout_start=<x> solver_heldout_final=<x> solver_gain=<final - start>
    proposal_solve_rate_last_third=<x> valid_proposals=<x>

`--quick` (a few minutes): a short in-process run and 40 held-out tasks; it checks the harness.

`--answers MODEL_DIR` (no run): what that model writes on the held-out tasks, greedily: right, wrong, unreadable or
with numbers not given, its commonest operator sequences, and what it gets right by kind of task.

`--proposals MODEL_DIR` (no run): that model's proposals of the recipe's typed witness, sampled, valid by form
drawn, with and without stored tasks shown in the prompt.

`--ceiling N` (no run): the base model after N supervised steps on right answers (the env's expert) to random
dealt tasks outside the held-out set, scored on the held-out set: what direct supervision makes of the tiny
model, a reference for the solver's gain. Last line: `expert_sft_steps=N heldout_start=<x> heldout_expert=<x>`.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path

# configs/recipe/propose_solve.yaml, and a base model warmed up on the recipe's form with a task buffer of its own:
# the run's proposer prompts show stored tasks, and one warmed up on prompts without them wrote valid expressions of
# the drawn form 4% of the time when they were there (85% without; research/RESULTS.md, "Role self-play")
FORMS = ("copy", "a+b", "a-b", "a*b")  # configs/env/propose_solve.yaml's forms: what the recipe's typed witness draws
SOLVER_TASK = re.compile(r"Numbers: ([\d ]+)\. Target: (\d+)\.")  # a solver's prompt (ProposeSolve.observation)


def recipe(reserved: Path) -> list[str]:
    """The run's overrides; ``reserved``, the held-out tasks' file, kept out of the run and of its warm-up."""
    warmup = ("{solvers:4,buffer:warmup,deal_numbers:true,witness:typed,forms:[" + ",".join(f"'{f}'" for f in FORMS)
              + f"],reserved:'{reserved}'}}")
    return ["+recipe=propose_solve", "model.tiny.warmup_env=propose_solve", f"++model.tiny.warmup_env_args={warmup}",
            "model.tiny.warmup_expert_share=0.3", "run.progress=false", f"++env.args.env_args.reserved='{reserved}'"]


def reserve(tasks: list, out: Path) -> Path:
    """``tasks`` as a task buffer file under ``out`` (an absolute path: the env actors and the warm-up read it)."""
    from envs.task_buffer import TaskBuffer

    buffer = TaskBuffer(capacity=len(tasks))
    for numbers, target in tasks:
        buffer.record(numbers, target)
    path = out.resolve() / f"heldout-{len(tasks)}.arrows"
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer.save(path)
    return path


def heldout_tasks(count: int, seed: int = 20261126) -> list[tuple[tuple[int, ...], int]]:
    """Three numbers from 1 to 10 and a whole target from 1 to 50 they reach: the benchmark's own tasks."""
    from envs.countdown import reachable

    rng, tasks = random.Random(seed), set()
    while len(tasks) < count:
        numbers = tuple(sorted(rng.randint(1, 10) for _ in range(3)))
        targets = [int(v) for v in reachable(numbers) if v.denominator == 1 and 1 <= v <= 50]
        tasks.add((numbers, rng.choice(sorted(targets))))
    return sorted(tasks)


def answers(model_dir: Path, tasks: list):
    """Each task with the answer the model at ``model_dir`` writes, greedily, as a solver of the game, and the
    game's verdict: (numbers, target, answer, right)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envs.propose_solve import ProposeSolve

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for numbers, target in tasks:
        game = ProposeSolve(solvers=1)
        game.reset(0)
        game.numbers, game.target, game.turn = numbers, target, 1
        ids = tokenizer(game.observation(1), return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        result = game.step(answer)
        yield numbers, target, answer, bool(not result.invalid and result.info.get("correct"))


def proposal_validity(model_dir: Path, episodes: int = 120, forms=FORMS) -> str:
    """The proposer of the model at ``model_dir`` (the recipe's typed witness), sampled at temperature 1 on
    ``episodes`` dealt deals: its valid share by form drawn, with no stored tasks in its prompt and with two (a
    run's proposer prompts show them once its buffer holds tasks)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envs.propose_solve import ProposeSolve
    from envs.task_buffer import TaskBuffer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    stored, rng = TaskBuffer(capacity=64), random.Random(1)
    for seed in range(40):
        dealt = ProposeSolve(deal_tasks=True, buffer=None)
        dealt.reset(seed)
        stored.record(dealt.numbers, dealt.target, rng.choice([0.0, 0.25, 0.5, 1.0]))
    torch.manual_seed(0)
    parts = []
    for buffer in (None, stored):
        valid, drawn = Counter(), Counter()
        for seed in range(episodes):
            game = ProposeSolve(buffer=buffer, buffer_share=0.0, deal_numbers=True, witness="typed", forms=forms)
            game.reset(seed)
            ids = tokenizer(game.observation(0), return_tensors="pt")["input_ids"]
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=24, do_sample=True, temperature=1.0,
                                     pad_token_id=tokenizer.pad_token_id)
            drawn[game.form] += 1
            valid[game.form] += not game.step(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)).invalid
        parts.append(f"{'with' if buffer else 'without'} stored tasks: "
                     + ", ".join(f"{form} {valid[form]}/{n}" for form, n in sorted(drawn.items())))
    return "valid proposals by form, " + "; ".join(parts)


def solve_rate(model_dir: Path, tasks: list) -> float:
    """The share of ``tasks`` the model at ``model_dir`` answers right, greedily, as a solver of the game."""
    return sum(right for *_, right in answers(model_dir, tasks)) / len(tasks)


def answer_forms(model_dir: Path, tasks: list) -> str:
    """What the solver writes: right, wrong, unreadable, or with numbers it was not given; the commonest operator
    sequences of its readable answers; and the tasks of each ``task_kind`` it gets right."""
    from envs.actions import first_move
    from envs.countdown import numbers_used, parse_expression
    from envs.propose_solve import task_kind

    verdicts, forms, kinds, right_kinds = Counter(), Counter(), Counter(), Counter()
    for numbers, target, answer, right in answers(model_dir, tasks):
        kind = task_kind(numbers, target)
        kinds[kind] += 1
        expression = first_move(answer, parse_expression)
        if expression is None:
            verdicts["unreadable"] += 1
            continue
        forms[" ".join(item for item in expression if isinstance(item, str)) or "a number"] += 1
        if numbers_used(expression) - Counter(numbers):
            verdicts["other numbers"] += 1
        else:
            verdicts["right" if right else "wrong"] += 1
        right_kinds[kind] += right
    return (f"answers: {dict(verdicts)}; operators: {forms.most_common(5)}; right by kind: "
            + ", ".join(f"{kind} {right_kinds[kind]}/{n}" for kind, n in sorted(kinds.items())))


def expert_ceiling(base: Path, steps: int, exclude: set, out: Path, pairs: int = 20_000) -> Path:
    """``base`` after ``steps`` supervised steps (the warm-up's) on right answers to random dealt tasks of the game
    (2 to 4 numbers, an evenly drawn reachable target) outside ``exclude``, saved to ``out``."""
    import dataclasses

    from actors.models.base_model import TinyModelConfig, load_policy, warm_up
    from envs.propose_solve import ProposeSolve
    from envs.task_buffer import task_key

    model, tokenizer = load_policy(base)
    game, rng, shown = ProposeSolve(solvers=1, deal_numbers=True), random.Random(1), []
    while len(shown) < pairs:
        game.reset(rng.randrange(2**31))
        game.step(game.legal_actions()[0])
        if task_key(game.numbers, game.target) not in exclude:
            shown.append((game.observation(1), game.expert_action()))
    warm_up(model, tokenizer, shown, dataclasses.replace(TinyModelConfig(), warmup_steps=steps))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def breakdown(run_dir: Path) -> str:
    """The kept proposals' count and mean solve rate per count of numbers and per ``task_kind``, and the share
    whose target is 1."""
    from envs.propose_solve import task_kind

    groups: dict[str, list[float]] = {}
    tasks = [task for kept in kept_tasks(run_dir) for task in kept if task["solve_rates"]]
    for task in tasks:
        rate = sum(task["solve_rates"]) / len(task["solve_rates"])
        for key in (f"{len(task['numbers'])} numbers", task_kind(task["numbers"], task["target"])):
            groups.setdefault(key, []).append(rate)
    ones = sum(task["target"] == 1 for task in tasks) / max(1, len(tasks))
    kinds = " ".join(f"{k} {len(r)} ({sum(r) / len(r):.2f});" for k, r in sorted(groups.items()))
    return f"{kinds} target 1: {ones:.2f}"


def seen_tasks(run_dir: Path) -> set[tuple[tuple[int, ...], int]]:
    """Every task the run's solvers were set: those of the episodes its learner took in (the run's episode dataset,
    ``run.dataset``: a solver's prompt names its task) and those its task buffer kept. The held-out score leaves
    these out: the buffer alone keeps only its last ``buffer_capacity`` tasks, and a task it pushed out early may
    still have been learned by heart."""
    from envs.task_buffer import task_key

    if not (run_dir / "episodes").is_dir():
        raise FileNotFoundError(f"{run_dir / 'episodes'} is missing: the held-out filter reads every task the run set "
                                "from its episode dataset (run.dataset=true)")
    prompts = solver_rows(run_dir, ["prompt_text"]).column("prompt_text").to_pylist()
    seen = {task for task in map(solver_task, prompts) if task is not None}
    return seen | {task_key(t["numbers"], t["target"]) for tasks in kept_tasks(run_dir) for t in tasks}


def solver_rows(run_dir: Path, columns: list[str]):
    """``columns`` of the solvers' rows in the run's episode dataset (``run.dataset``), as an Arrow table."""
    import pyarrow.dataset as ds

    return ds.dataset(run_dir / "episodes", format="parquet").to_table(columns=columns,
                                                                       filter=ds.field("role") == "solver")


def own_tasks(run_dir: Path, count: int = 200) -> list[tuple[tuple[int, ...], int]]:
    """``count`` tasks the run set its solvers in its last third (by batch) that are shaped like the held-out ones:
    three numbers, a target that is none of them (seeded draw). The solver's rate on these against the held-out
    rate tells learning the tasks it was set from learning Countdown."""
    from envs.propose_solve import task_kind

    table = solver_rows(run_dir, ["prompt_text", "batch_seq"])
    batches = table.column("batch_seq").to_pylist()
    last = max(batches, default=0)
    tasks = {task for task, seq in zip(map(solver_task, table.column("prompt_text").to_pylist()), batches)
             if task is not None and seq * 3 >= last * 2 and len(task[0]) == 3 and task_kind(*task) != "copy"}
    return random.Random(1).sample(sorted(tasks), min(count, len(tasks)))


def solver_groups(run_dir: Path) -> str:
    """The solvers' groups (one proposal's k attempts) the learner took in: how many, the share with both right and
    wrong attempts (the only ones GRPO learns from), the share whose attempts wrote one text alike, how many
    different tasks they were set, and the share of the last third's (by batch) set in an earlier group."""
    table = solver_rows(run_dir, ["episode_id", "reward", "action_text", "prompt_text", "batch_seq"])
    groups: dict[str, list] = {}
    tasks: dict[str, tuple] = {}
    for episode, reward, text, prompt, seq in zip(*(table.column(name).to_pylist() for name in table.column_names)):
        groups.setdefault(episode, []).append((reward > 0, text))
        if episode not in tasks:  # one parse per group: its k attempts share the prompt
            tasks[episode] = (seq, episode, solver_task(prompt))
    mixed = sum(len({right for right, _ in group}) == 2 for group in groups.values())
    alike = sum(len({text for _, text in group}) == 1 for group in groups.values())
    order, seen, again = sorted(tasks.values()), set(), []
    for seq, _, task in order:
        if seq * 3 >= order[-1][0] * 2:
            again.append(task in seen)
        seen.add(task)
    return (f"solver groups {len(groups)}: with right and wrong attempts {mixed} ({mixed / max(1, len(groups)):.2f}), "
            f"one answer written by all {alike / max(1, len(groups)):.2f}; different tasks {len(seen)}, of the last "
            f"third's set before {sum(again) / max(1, len(again)):.2f}")


def solver_task(prompt: str | None) -> tuple[tuple[int, ...], int] | None:
    """The task a solver's prompt sets (``ProposeSolve.observation``), numbers sorted; None for another prompt."""
    from envs.task_buffer import task_key

    found = SOLVER_TASK.search(prompt or "")
    return task_key(map(int, found[1].split()), int(found[2])) if found else None


def kept_tasks(run_dir: Path) -> list[list[dict]]:
    """The tasks each env actor kept with the run (``tasks/<actor>.arrows``), each file's in the order first
    proposed."""
    from envs.task_buffer import TaskBuffer

    files = []
    for path in sorted((run_dir / "tasks").glob("*.arrows")):
        buffer = TaskBuffer(capacity=100_000)
        buffer.load(path)
        files.append(buffer.to_table().to_pylist())
    return files


def last_third(run_dir: Path) -> tuple[float | None, float | None]:
    """The mean solve rate of the tasks first proposed in the last third, and the valid share of proposals then."""
    rates = [sum(task["solve_rates"]) / len(task["solve_rates"]) for tasks in kept_tasks(run_dir)
             for task in tasks[len(tasks) * 2 // 3:] if task["solve_rates"]]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    counted = [r for r in rows if "turns_role_proposer" in r]
    valid = None
    if counted:
        start = next(r for r in counted if r["elapsed_s"] >= counted[-1]["elapsed_s"] * 2 / 3)
        turns = counted[-1]["turns_role_proposer"] - start["turns_role_proposer"]
        invalid = counted[-1]["invalid_role_proposer"] - start["invalid_role_proposer"]
        valid = 1 - invalid / turns if turns else None
    return (sum(rates) / len(rates) if rates else None), valid


def main(argv: list[str]) -> int:
    from actors.cli import launch, load_config
    from actors.models.base_model import ensure_base_model, tiny_model_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short in-process run, 40 held-out tasks")
    parser.add_argument("--minutes", type=float, default=12.0, help="the run's training budget")
    parser.add_argument("--heldout", type=int, default=200, help="held-out tasks")
    parser.add_argument("--out", default="runs/bench-roles")
    parser.add_argument("--ceiling", type=int, default=0, help="no run: N supervised steps on the expert's answers")
    parser.add_argument("--answers", metavar="MODEL_DIR", help="no run: what this model writes on the held-out tasks")
    parser.add_argument("--proposals", metavar="MODEL_DIR", help="no run: how often this model's proposals are valid")
    args, overrides = parser.parse_known_args(argv)
    if args.answers:
        print(answer_forms(Path(args.answers), heldout_tasks(args.heldout)))
        return 0
    if args.proposals:
        print(proposal_validity(Path(args.proposals)))
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    minutes, count = args.minutes, args.heldout
    if args.quick:
        minutes, count = 0.5, 40
        overrides = ["run.mode=local", "replay.args.batch_episodes=8", "env.args.concurrency=16",
                     "model.tiny.warmup_steps=30", "model.tiny.warmup_games=200", *overrides]
    heldout = heldout_tasks(count)
    reserved = reserve(heldout, Path(args.out))  # the run never sets a held-out task
    cfg = load_config([*recipe(reserved), f"run.minutes={minutes}", f"run.dir={args.out}", "run.name=propose-solve",
                       *overrides])
    base = ensure_base_model(cfg.model.cache_dir, tiny_model_config(cfg))
    if args.ceiling:
        tasks = heldout
        expert = expert_ceiling(base, args.ceiling, set(tasks), Path(args.out) / f"expert-sft-{args.ceiling}")
        print(f"expert_sft_steps={args.ceiling} heldout_start={solve_rate(base, tasks):.3f} "
              f"heldout_expert={solve_rate(expert, tasks):.3f}")
        return 0
    summary = launch(cfg)
    run_dir = Path(summary["run_dir"])
    seen = seen_tasks(run_dir)
    tasks = [task for task in heldout if task not in seen]
    start, final = solve_rate(base, tasks), solve_rate(run_dir / "policy", tasks)
    rate, valid = last_third(run_dir)
    print(f"held-out tasks {len(tasks)} (of {count}; the rest were set in the run); versions "
          f"{summary['final_version']}; run {summary['minutes']:.1f} min; {run_dir}")
    if set_in_run := [task for task in heldout if task in seen]:  # what was trained on, for contrast
        print(f"the {len(set_in_run)} held-out tasks the run set its solvers (left out above): "
              f"{solve_rate(base, set_in_run):.3f} -> {solve_rate(run_dir / 'policy', set_in_run):.3f}")
    print(f"kept proposals (solve rate): {breakdown(run_dir)}")
    print(solver_groups(run_dir))
    if own := own_tasks(run_dir):
        print(f"{len(own)} of the run's own tasks of the last third (three numbers, not copies): "
              f"{solve_rate(base, own):.3f} -> {solve_rate(run_dir / 'policy', own):.3f}")
    show = lambda x: "nan" if x is None else f"{x:.3f}"  # noqa: E731
    print(f"solver_heldout_start={start:.3f} solver_heldout_final={final:.3f} solver_gain={final - start:.3f} "
          f"proposal_solve_rate_last_third={show(rate)} valid_proposals={show(valid)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
