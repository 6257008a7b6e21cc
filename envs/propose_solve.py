"""Propose and solve (Absolute Zero, Zhao et al. 2025, on Countdown): one policy sets tasks and solves them.

Seat 0 is the proposer, seats 1..k the solvers (``solvers``, default 4); ``roles`` names them (train with
``advantage: role_grpo``: GRPO over the k attempts, a running baseline for the proposer). The proposer writes a
task ``[a b c -> t]``: 2 to 4 numbers in 1..``max_number`` and a target in 1..``max_target`` that they reach with
+ - * / (each at most once), checked exactly (``envs.countdown.reachable``). Each solver then answers alone, an
expression such as ``[(3 * 4) + 5]``, seeing nothing of the others' answers.

Rewards, at the end: a solver 1 if its expression equals the target, else 0; the proposer the task's
learnability, 1 - r when 0 < r < 1, else 0 (r: the share of solvers right). A task whose target is one of its
numbers needs no arithmetic and earns the proposer 0 (``copy_target="invalid"``: it is invalid); one the buffer
holds already earns ``repeat_reward`` (default 0) of its learnability (benchmarks/RESULTS.md, "Role self-play").

``deal_numbers``: the env deals the numbers (from the episode's seed, redealt until some target in range is
reachable) and the proposer writes a target, ``[17]``; repeats are then the deal's doing and pay in full.
``witness`` (``envs.witness``, dealt numbers only): the proposer writes an expression of the dealt numbers,
``[4 * 5]``, whose value is the target (Absolute Zero's executor): ``free``, any with an operation; ``typed``, of
the form drawn evenly from ``forms``, which the prompt names and which is the episode's ``task_type``. Solvers
see the numbers ascending. ``deal_tasks``: the env sets every task (numbers and a target drawn evenly from those
they reach) and the proposer has no move: the recipe's control (``research/role_selfplay.py``).
``balance_kinds``: a kind of task (``task_kind``) past a fair share of the buffer's recent proposals pays its
learnability times that share over its own (``kind_balance``). ``reserved``: tasks the game never sets (a
benchmark's held-out set): a dealt task is drawn again, and a proposal of one ends the episode, everyone at 0.

Invalid moves follow ``envs.invalid``: an unreadable or out-of-range proposal, or one claiming an unreachable
target, is invalid, as is an unreadable answer. With no retries left the proposer's forfeit ends the episode
(``invalid_penalty`` to it, nobody else moves); a solver's costs that solver the penalty and counts as unsolved,
and the next answers (``forfeit_turn``).

With a ``buffer`` (``envs.task_buffer``) each finished episode records its task's solve rate; the proposer's
prompt shows ``references`` stored tasks; with probability ``buffer_share`` an episode replays a stored task (the
solvers answer, the proposer has no turn and 0). ``build``, the registry's factory, gives every game of a process
the shared buffer ``buffer`` names (None: none).
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

from envs.actions import bracket, first_move, read_int
from envs.base import StepResult
from envs.countdown import evaluate, numbers_used, parse_expression, reachable
from envs.task_buffer import TaskBuffer, reserved_tasks, shared_buffer, task_key
from envs.witness import DRAWN, FORMS, OPERATIONS, SHOWN, form_of, witnesses

MIN_NUMBERS, MAX_NUMBERS = 2, 4
MAX_SOLVERS = 8
MAX_DEALS = 1000  # redeals of numbers that reach no target in range before the settings are called impossible
WITNESSES = ("none", "free", "typed")  # the proposer claims a target, or writes an expression of any or a drawn form
COPY_TARGETS = ("unpaid", "invalid")  # a target that is one of the numbers: valid but earning 0, or invalid
KINDS = FORMS  # ``task_kind``'s names: the forms of ``envs.witness``


def learnability(solve_rate: float) -> float:
    """Absolute Zero's proposer reward: 1 - r for a task solved sometimes (0 < r < 1), else 0."""
    return 1.0 - solve_rate if 0.0 < solve_rate < 1.0 else 0.0


def task_kind(numbers, target: int) -> str:
    """What a task asks (``KINDS``): ``copy`` (the target is one of the numbers), ``a+b``, ``a*b``, ``a-b`` of two
    of them, or ``other`` (several operations, or a division)."""
    if target in numbers:
        return "copy"
    pairs = [(a, b) for i, a in enumerate(numbers) for j, b in enumerate(numbers) if i != j]
    for kind, value in (("a+b", lambda a, b: a + b), ("a*b", lambda a, b: a * b), ("a-b", lambda a, b: a - b)):
        if any(value(a, b) == target for a, b in pairs):
            return kind
    return "other"


def kind_balance(count: int, total: int) -> float:
    """``balance_kinds``' factor on the proposer's reward for a task of a kind that took ``count`` of the ``total``
    recent proposals: 1 up to a fair share of the kinds that pay (every kind but ``copy``), less in proportion
    above. One proposal of each kind is counted besides, so that a run's first few do not decide."""
    share, fair = (count + 1) / (total + len(KINDS)), 1.0 / (len(KINDS) - 1)
    return 1.0 if share <= fair else fair / share


def read_target(inside: str) -> int | None:
    """``17`` as 17: the proposer's move when the numbers are dealt; None for anything but a whole number."""
    return read_int(inside.strip())


def read_proposal(inside: str) -> tuple[tuple[int, ...], int] | None:
    """``3 4 5 -> 17`` as ((3, 4, 5), 17): 2 to 4 whole numbers, an arrow, a whole target; None otherwise."""
    left, arrow, right = inside.partition("->")
    words = left.split()
    if not arrow or not MIN_NUMBERS <= len(words) <= MAX_NUMBERS:
        return None
    numbers = tuple(read_int(word) for word in words)
    target = read_int(right.strip())
    if None in numbers or target is None:
        return None
    return numbers, target


class ProposeSolve:
    name = "propose_solve"

    def __init__(self, solvers: int = 4, max_number: int = 10, max_target: int = 50,
                 buffer: TaskBuffer | None = None, buffer_share: float = 0.25, references: int = 2,
                 max_new_tokens: int | None = None, repeat_reward: float = 0.0,
                 deal_numbers: bool = False, copy_target: str = "unpaid", balance_kinds: bool = False,
                 deal_tasks: bool = False, witness: str = "none", forms: tuple[str, ...] | list[str] = DRAWN,
                 reserved=frozenset()):
        if not 1 <= solvers <= MAX_SOLVERS:
            raise ValueError(f"solvers must be 1 to {MAX_SOLVERS}, not {solvers}")
        if not 1 <= max_number <= 1000 or not 1 <= max_target <= 10**6:
            raise ValueError(f"max_number must be 1 to 1000 and max_target 1 to 10**6, not {max_number}, {max_target}")
        if not 0.0 <= buffer_share <= 1.0:
            raise ValueError(f"buffer_share must lie in [0, 1], not {buffer_share}")
        if not 0.0 <= repeat_reward <= 1.0:
            raise ValueError(f"repeat_reward must lie in [0, 1], not {repeat_reward}")
        if references < 0:
            raise ValueError(f"references must be >= 0, not {references}")
        if not isinstance(deal_numbers, bool):
            raise ValueError(f"deal_numbers must be true or false, not {deal_numbers!r}")
        if not isinstance(deal_tasks, bool) or (deal_tasks and deal_numbers):
            raise ValueError(f"deal_tasks must be true or false, and true leaves the proposer nothing to write, so "
                             f"deal_numbers must then be false: not deal_tasks={deal_tasks!r}, deal_numbers={deal_numbers!r}")
        if witness not in WITNESSES or (witness != "none" and not deal_numbers):
            raise ValueError(f"witness must be one of {', '.join(WITNESSES)}, and an expression is of dealt numbers, "
                             f"so deal_numbers must then be true: not witness={witness!r}, "
                             f"deal_numbers={deal_numbers!r}")
        forms = tuple(forms)
        if not forms or len(set(forms)) != len(forms) or not set(forms) <= set(FORMS):
            raise ValueError(f"forms must be distinct forms of {', '.join(FORMS)}, at least one, not {list(forms)}")
        if copy_target not in COPY_TARGETS:
            raise ValueError(f"copy_target must be one of {', '.join(COPY_TARGETS)}, not {copy_target!r}")
        if buffer is not None and not isinstance(buffer, TaskBuffer):
            raise ValueError(f"buffer must be a TaskBuffer or None, not {type(buffer).__name__}")
        if not isinstance(balance_kinds, bool) or (balance_kinds and buffer is None):
            raise ValueError(f"balance_kinds must be true or false, and true needs a buffer (the recent kinds are "
                             f"counted there), not {balance_kinds!r} with buffer {buffer!r}")
        self.solvers, self.max_number, self.max_target = solvers, max_number, max_target
        self.buffer, self.buffer_share, self.references = buffer, buffer_share, references
        self.repeat_reward, self.deal_numbers, self.copy_target = repeat_reward, deal_numbers, copy_target
        self.balance_kinds, self.deal_tasks, self.witness, self.forms = balance_kinds, deal_tasks, witness, forms
        self.reserved = frozenset(task_key(numbers, target) for numbers, target in reserved)
        self.num_players = solvers + 1
        self.roles = ["proposer"] + ["solver"] * solvers
        self.max_tokens = max_new_tokens  # each turn's generation budget (None: the env actor's)
        self.reset(0)

    def reset(self, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.numbers: tuple[int, ...] | None = None
        self.target: int | None = None
        self.solved: list[bool] = []
        self.done = False
        self.novel = True  # the proposal is not in the buffer yet
        self.kind: str | None = None  # what the proposal asks (``task_kind``), once it is set
        self.dealt: tuple[int, ...] | None = None
        self.form: str | None = None  # the form asked of a typed witness
        self._example_seed = rng.randrange(2**31)  # the legal proposal's, drawn only when asked for
        self.replayed = bool(self.buffer) and rng.random() < self.buffer_share
        shown = self.buffer.sample(self.references, rng) if self.buffer and self.references else []
        self.examples = [(task.text(), task.mean_solve_rate) for task in shown]  # as they stand now
        if self.replayed:
            task = self.buffer.sample(1, rng)[0]
            self.numbers, self.target = tuple(rng.sample(task.numbers, len(task.numbers))), task.target
        elif self.deal_tasks:  # the env's task, from the seed alone: numbers and a target drawn evenly from theirs
            self.numbers, self.target = self._deal_task(random.Random(self._example_seed))
            self.kind = task_kind(self.numbers, self.target)
        self.turn = 0 if self.numbers is None else 1
        # the numbers dealt to the proposer, and the form asked of its expression: a function of the seed alone
        if self.deal_numbers and not self.replayed:
            if self.witness == "typed":  # a form first, then numbers that allow it
                self.form = random.Random(self._example_seed + 2).choice(self.forms)
            self.dealt = self._deal(random.Random(self._example_seed))

    def _deal(self, rng: random.Random) -> tuple[int, ...]:
        for _ in range(MAX_DEALS):
            numbers = tuple(rng.randint(1, self.max_number) for _ in range(rng.randint(MIN_NUMBERS, MAX_NUMBERS)))
            if self._targets(numbers) and self._witnessed(numbers):
                return numbers
        raise ValueError(f"deal_numbers: {MAX_DEALS} deals of numbers from 1 to {self.max_number} reached no target "
                         f"from 1 to {self.max_target}; widen max_target")

    def _deal_task(self, rng: random.Random) -> tuple[tuple[int, ...], int]:
        for _ in range(MAX_DEALS):  # numbers, and a target of theirs that is no reserved task
            numbers = self._deal(rng)
            if targets := [t for t in self._targets(numbers) if task_key(numbers, t) not in self.reserved]:
                return numbers, rng.choice(targets)
        raise ValueError(f"deal_tasks: {MAX_DEALS} deals of numbers reached only reserved targets")

    def _witnessed(self, numbers) -> bool:
        """Can a witness be written for ``numbers``: one of the form asked (typed), of some operation (free)?"""
        if self.witness == "none":
            return True
        return any(witnesses(numbers, form, self.max_target) for form in ([self.form] if self.form else OPERATIONS))

    def _targets(self, numbers) -> list[int]:
        """The whole targets in range that ``numbers`` reach (and, with ``copy_target=invalid``, that are none of
        them), ascending."""
        copies = set(numbers) if self.copy_target == "invalid" else set()
        return sorted(int(v) for v in reachable(tuple(sorted(numbers)))
                      if v.denominator == 1 and 1 <= v <= self.max_target and int(v) not in copies)

    @property
    def task_type(self) -> str:
        """The episode's type of task, where the env draws one (a typed witness's form), else "": the learner
        keeps the proposer's baseline per task type (Absolute Zero's per task type and role), so that a form
        that is easy to write valid does not look better than one that is hard, and crowd the others out."""
        return self.form or ""

    @property
    def current_player(self) -> int:
        return self.turn

    def simultaneous_players(self) -> list[int]:
        """Once the task is set, the solvers still to answer: none sees another's answer, so their moves are
        asked together (``actors.env.episode``), played in seat order."""
        return [] if self.done or self.turn == 0 else list(range(self.turn, self.num_players))

    def task_text(self) -> str:
        return f"[{' '.join(map(str, self.numbers))} -> {self.target}]"

    def observation(self, player: int) -> str:
        if player == 0:
            if self.turn == 0:
                return self._proposer_prompt()
            if self.replayed:
                return f"This round replays the stored task {self.task_text()}: you have no move."
            if self.deal_tasks:
                return f"This round's task {self.task_text()} was dealt: you have no move."
            return f"You proposed {self.task_text()}; the solvers are answering."
        if self.numbers is None:
            return "Countdown. Waiting for the proposer's task."
        return (f"Countdown. Numbers: {' '.join(map(str, self.numbers))}. Target: {self.target}.\n"
                f"Reach the target with + - * / and parentheses, each number at most once. Answer like "
                f"[(1 + 2) * 3]:")

    def _proposer_prompt(self) -> str:
        earlier = "".join(f"\n{text}" + ("" if rate is None else f" solved {round(100 * rate)}%")
                          for text, rate in self.examples)
        earlier = f"\nEarlier tasks:{earlier}" if earlier else ""
        if self.witness != "none":
            return (f"Set a Countdown task. Numbers: {' '.join(map(str, self.dealt))}. Write an expression of some of "
                    f"them (each at most once) that {SHOWN[self.form]}: its value, a whole number from 1 to "
                    f"{self.max_target}, is the target. {self.solvers} solvers will try to reach it: you score when "
                    f"some but not all do.{earlier}\nExpression:")
        if self.dealt is not None:
            return (f"Propose a Countdown target. Numbers: {' '.join(map(str, self.dealt))}. Write a target from 1 to "
                    f"{self.max_target} that some of them reach with + - * / (each at most once). Example: for 3 4 5, "
                    f"[17] (3 * 4 + 5). {self.solvers} solvers will try it: you score when some but not all solve "
                    f"it.{earlier}\nTarget:")
        return (f"Propose a Countdown task: {MIN_NUMBERS} to {MAX_NUMBERS} numbers from 1 to {self.max_number}, "
                f"'->', and a target from 1 to {self.max_target} that the numbers reach with + - * / (each number "
                f"at most once). Example: [3 4 5 -> 17] (3 * 4 + 5). {self.solvers} solvers will try it: you score "
                f"when some but not all solve it.{earlier}\nTask:")

    def legal_actions(self) -> list[str]:
        """A valid task for the proposer (with dealt numbers: a target they reach, drawn evenly from those in
        range, so the warm-up's proposer asks for targets of every difficulty); for a solver, well-formed answers
        of the task's numbers (right or wrong: a warm-up on them learns the form; ``expert_action`` is the right
        one)."""
        if self.done:
            return []
        if self.turn == 0:
            return [bracket(self._some_proposal())]
        rng = random.Random(self._example_seed + self.turn)
        answers = {bracket(self._some_answer(rng)) for _ in range(4)}
        return sorted(answers)

    def expert_action(self) -> str | None:
        """A solver's right answer (found by exact search); no opinion on the proposer's move."""
        if self.done or self.turn == 0:
            return None
        return bracket(reachable(tuple(sorted(self.numbers)))[Fraction(self.target)])

    def _some_answer(self, rng: random.Random) -> str:
        """A well-formed expression of some of the task's numbers, each at most once."""
        numbers = rng.sample(self.numbers, rng.randint(min(2, len(self.numbers)), len(self.numbers)))
        text = str(numbers[0])
        for n in numbers[1:]:
            text = f"({text} {rng.choice('+-*')} {n})"
        return text[1:-1] if text.startswith("(") else text

    def _some_proposal(self) -> str:
        """A valid task, the same for a seed."""
        if self.witness != "none":
            rng = random.Random(self._example_seed + 1)
            found = witnesses(self.dealt, self.form or rng.choice(OPERATIONS), self.max_target)  # free: not a copy
            for fallback in ("other", *OPERATIONS):  # free: the form drawn may have none (``_witnessed``: some has)
                found = found or witnesses(self.dealt, fallback, self.max_target)
            return rng.choice(found)
        if self.dealt is not None:
            return str(random.Random(self._example_seed + 1).choice(self._targets(self.dealt)))
        rng = random.Random(self._example_seed)
        while True:
            numbers = [rng.randint(1, self.max_number) for _ in range(rng.randint(MIN_NUMBERS, MAX_NUMBERS))]
            targets = self._targets(numbers)
            if targets:
                return f"{' '.join(map(str, numbers))} -> {rng.choice(targets)}"

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise RuntimeError("step() on a finished game; call reset() first")
        return self._propose(action_text) if self.turn == 0 else self._solve(action_text)

    def _invalid(self, reason: str) -> StepResult:
        return StepResult([0.0] * self.num_players, terminated=False, invalid=True, info={"reason": reason})

    def _propose(self, action_text: str) -> StepResult:
        if self.witness != "none":
            return self._propose_expression(action_text)
        if self.dealt is not None:
            return self._propose_target(action_text)
        proposal = first_move(action_text, read_proposal)
        if proposal is None:
            return self._invalid(f"a task like [3 4 5 -> 17]: {MIN_NUMBERS} to {MAX_NUMBERS} numbers, '->', a target")
        numbers, target = proposal
        if not all(1 <= n <= self.max_number for n in numbers) or not 1 <= target <= self.max_target:
            return self._invalid(f"numbers from 1 to {self.max_number} and a target from 1 to {self.max_target}")
        return self._set_task(numbers, target)

    def _propose_target(self, action_text: str) -> StepResult:
        target = first_move(action_text, read_target)
        if target is None:
            return self._invalid("a target like [17]: one whole number in brackets")
        if not 1 <= target <= self.max_target:
            return self._invalid(f"a target from 1 to {self.max_target}")
        return self._set_task(self.dealt, target)

    def _propose_expression(self, action_text: str) -> StepResult:
        expression = first_move(action_text, parse_expression)
        if expression is None:
            return self._invalid("an expression of the numbers in brackets, like [3 * 4 + 5]")
        if numbers_used(expression) - Counter(self.dealt):
            return self._invalid(f"only numbers of {' '.join(map(str, self.dealt))}, each at most once")
        if form_of(expression) != self.form if self.form else form_of(expression) == "copy":
            return self._invalid(f"an expression that {SHOWN[self.form].split(',')[0]}")
        value = evaluate(expression)
        if value is None or value.denominator != 1 or not 1 <= value <= self.max_target:
            return self._invalid(f"an expression whose value is a whole number from 1 to {self.max_target}")
        return self._set_task(tuple(sorted(self.dealt)), int(value))  # in order: the witness's stays unseen

    def _set_task(self, numbers: tuple[int, ...], target: int) -> StepResult:
        if Fraction(target) not in reachable(tuple(sorted(numbers))):
            return self._invalid(f"{target} cannot be reached from {' '.join(map(str, numbers))}")
        if self.copy_target == "invalid" and target in numbers:
            return self._invalid(f"{target} is one of the numbers: a task must need arithmetic")
        if task_key(numbers, target) in self.reserved:  # valid, but never set: the episode ends, all get 0
            self.done = True
            return StepResult([0.0] * self.num_players, terminated=True, info={"reserved": True})
        self.numbers, self.target, self.turn = numbers, target, 1
        self.novel = self.buffer is None or self.buffer.get(numbers, target) is None
        self.kind = task_kind(numbers, target)
        if self.buffer is not None:
            self.buffer.note_kind(self.kind)
        return StepResult([0.0] * self.num_players, terminated=False, info={"task": self.task_text()})

    def _solve(self, action_text: str) -> StepResult:
        expression = first_move(action_text, parse_expression)
        if expression is None:
            return self._invalid("one expression of the numbers with + - * / and parentheses, in brackets")
        allowed = not (numbers_used(expression) - Counter(self.numbers))
        return self._answered(allowed and evaluate(expression) == self.target)  # at most 4 numbers: cheap

    def forfeit_turn(self) -> StepResult | None:
        """``envs.invalid``'s hook for a forfeit: a solver's counts as unsolved and the next solver answers; the
        proposer's (None) ends the episode."""
        return None if self.turn == 0 else self._answered(False)

    def _answered(self, correct: bool) -> StepResult:
        self.solved.append(correct)
        if len(self.solved) < self.solvers:
            self.turn += 1
            return StepResult([0.0] * self.num_players, terminated=False, info={"correct": correct})
        self.done = True
        rate = sum(self.solved) / self.solvers
        if self.buffer is not None:
            self.buffer.record(self.numbers, self.target, rate)
        # with dealt numbers a repeat is the deal's doing, not the proposer's: it pays in full
        repeat = 1.0 if self.novel or self.deal_numbers else self.repeat_reward
        trivial = self.target in self.numbers  # no arithmetic: copying a number solves it
        proposer = 0.0 if self.replayed or self.deal_tasks or trivial else learnability(rate) * repeat
        if self.balance_kinds and proposer:
            kinds = self.buffer.recent_kinds()
            proposer *= kind_balance(kinds[self.kind], kinds.total())
        return StepResult([proposer, *(float(s) for s in self.solved)], terminated=True,
                          info={"correct": correct, "task": self.task_text(), "solve_rate": rate,
                                "solved": list(self.solved), "replayed": self.replayed,
                                "novel": self.novel, "trivial": trivial})


def build(buffer: str | TaskBuffer | None = "propose_solve", buffer_capacity: int = 1024, reserved: str | None = None,
          **kwargs) -> ProposeSolve:
    """The registry's factory: ``buffer`` names the process's shared buffer (``envs.task_buffer.shared_buffer``,
    so every game an env actor makes shares one), or is a TaskBuffer, or None for no buffer; ``reserved`` is the
    path of a task buffer file whose tasks the game never sets (``envs.task_buffer.reserved_tasks``)."""
    if isinstance(buffer, str):
        buffer = shared_buffer(buffer, buffer_capacity)
    return ProposeSolve(buffer=buffer, reserved=reserved_tasks(reserved) if reserved else (), **kwargs)
