"""A bounded buffer of proposed tasks and how often they were solved: Absolute Zero's task buffer.

``envs.propose_solve`` keeps every valid proposal here with the solve rate of each episode it was played in: a
task is its numbers (as a multiset: ``[3 4 5 -> 17]`` and ``[5 3 4 -> 17]`` are one task) and its target. The
buffer holds at most ``capacity`` tasks (the oldest added goes first) and each task's last ``RATES_KEPT`` solve
rates. It serves reference examples for the proposer's prompt (``sample``), replays of stored tasks, and
``statistics()``: its size and a histogram of the tasks' mean solve rates.

``save(path)`` writes it as an Arrow IPC stream (columns ``numbers`` list<int64>, ``target`` int64,
``solve_rates`` list<float64>, oldest first); ``load(path)`` adds a file's tasks to a buffer: a file that is no
such stream, or has other columns or types, is a ``ValueError`` that says so; a row whose values are no task
(too few numbers, an unreachable target, a rate outside [0, 1], ...) is skipped and counted.

``shared_buffer(name, capacity)`` is one buffer per name in a process: ``envs.make`` builds a game per
episode slot, and the games of one env actor share their buffer through it.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
from collections import Counter, deque
from dataclasses import dataclass, field
from fractions import Fraction

import pyarrow as pa

from envs.countdown import MAX_SEARCHED, reachable

log = logging.getLogger(__name__)
RATES_KEPT = 32  # solve rates kept per task (its most recent)
KINDS_KEPT = 256  # the kinds of the most recent proposals (``note_kind``), repeats included
MAX_VALUE = 10**9 - 1  # the largest number or target a stored task may hold (9 digits, as a move may)
SCHEMA = pa.schema([("numbers", pa.list_(pa.int64())), ("target", pa.int64()), ("solve_rates", pa.list_(pa.float64()))])

Key = tuple[tuple[int, ...], int]  # (sorted numbers, target)


@dataclass
class Task:
    numbers: tuple[int, ...]  # sorted
    target: int
    solve_rates: list[float] = field(default_factory=list)  # the most recent RATES_KEPT, oldest first

    @property
    def mean_solve_rate(self) -> float | None:
        return sum(self.solve_rates) / len(self.solve_rates) if self.solve_rates else None

    def text(self) -> str:
        return f"[{' '.join(map(str, self.numbers))} -> {self.target}]"


def task_problem(numbers, target) -> str | None:
    """Why ``numbers`` and ``target`` make no task (None when they make one): 2 to ``MAX_SEARCHED`` whole numbers
    in 1..``MAX_VALUE``, and a whole target in 1..``MAX_VALUE`` that some of them reach."""
    if not isinstance(numbers, (list, tuple)) or not 2 <= len(numbers) <= MAX_SEARCHED:
        return f"a task has 2 to {MAX_SEARCHED} numbers, not {numbers!r}"
    if not all(type(n) is int and 1 <= n <= MAX_VALUE for n in numbers):
        return f"numbers must be whole numbers in 1..{MAX_VALUE}: {numbers!r}"
    if type(target) is not int or not 1 <= target <= MAX_VALUE:
        return f"the target must be a whole number in 1..{MAX_VALUE}, not {target!r}"
    if Fraction(target) not in reachable(tuple(sorted(numbers))):
        return f"{target} cannot be reached from {list(numbers)}"
    return None


class TaskBuffer:
    def __init__(self, capacity: int = 1024, seed: int = 0):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, not {capacity}")
        self.capacity = capacity
        self._rng = random.Random(seed)  # ``sample``'s draws when no rng is given
        self._tasks: dict[Key, Task] = {}  # insertion order: oldest first
        self._kinds: deque[str] = deque(maxlen=KINDS_KEPT)

    def __len__(self) -> int:
        return len(self._tasks)

    def tasks(self) -> list[Task]:
        return list(self._tasks.values())

    def get(self, numbers, target: int) -> Task | None:
        return self._tasks.get(task_key(numbers, target))

    def record(self, numbers, target: int, solve_rate: float | None = None) -> Task:
        """Keep the task (once: the same numbers in any order and the same target are one task), and a solve rate
        of it when given. A new task past ``capacity`` pushes the oldest out."""
        if solve_rate is not None and not (isinstance(solve_rate, (int, float)) and 0.0 <= solve_rate <= 1.0):
            raise ValueError(f"a solve rate lies in [0, 1], not {solve_rate!r}")
        key = task_key(numbers, target)
        task = self._tasks.get(key)
        if task is None:
            task = self._tasks[key] = Task(*key)
            while len(self._tasks) > self.capacity:
                del self._tasks[next(iter(self._tasks))]
        if solve_rate is not None:
            task.solve_rates = [*task.solve_rates[-(RATES_KEPT - 1):], float(solve_rate)]
        return task

    def note_kind(self, kind: str) -> None:
        """A proposal of ``kind`` (what its task asks; not kept with the buffer)."""
        self._kinds.append(kind)

    def recent_kinds(self) -> Counter[str]:
        """The last ``KINDS_KEPT`` proposals counted by kind."""
        return Counter(self._kinds)

    def sample(self, n: int, rng: random.Random | None = None) -> list[Task]:
        """``n`` different tasks (all of them when it holds fewer), drawn uniformly with ``rng``."""
        tasks = self.tasks()
        return (rng or self._rng).sample(tasks, min(n, len(tasks)))

    def statistics(self, bins: int = 5) -> dict:
        """``size``; ``solve_rate_histogram``: tasks counted by mean solve rate in ``bins`` equal bins over [0, 1]
        (a rate of 1 in the last); ``unrated``: tasks with no solve rate yet; ``mean_solve_rate`` over the rated."""
        histogram = [0] * bins
        rates = [t.mean_solve_rate for t in self._tasks.values() if t.mean_solve_rate is not None]
        for rate in rates:
            histogram[min(int(rate * bins), bins - 1)] += 1
        return {"size": len(self._tasks), "solve_rate_histogram": histogram,
                "unrated": len(self._tasks) - len(rates),
                "mean_solve_rate": sum(rates) / len(rates) if rates else None,
                "recent_kinds": dict(sorted(self.recent_kinds().items()))}

    def to_table(self) -> pa.Table:
        tasks = self.tasks()
        return pa.table({"numbers": [list(t.numbers) for t in tasks], "target": [t.target for t in tasks],
                         "solve_rates": [t.solve_rates for t in tasks]}, schema=SCHEMA)

    def save(self, path) -> None:
        """Write the buffer to ``path`` (an Arrow IPC stream), atomically: a reader sees the old file or the new."""
        path = os.fspath(path)
        table, temporary = self.to_table(), f"{path}.tmp{os.getpid()}"
        with pa.OSFile(temporary, "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
            writer.write_table(table)
        os.replace(temporary, path)

    def load(self, path) -> dict:
        """Add the tasks of a file ``save`` wrote (after those held; a task held already gains the file's rates).
        Returns ``{"loaded": n, "skipped": m}``; rows that hold no task are skipped (logged with the first reason)."""
        table = read_table(os.fspath(path))
        loaded, problems = 0, []
        for numbers, target, rates in zip(*(table.column(name).to_pylist() for name in SCHEMA.names)):
            problem = task_problem(numbers, target) or _rates_problem(rates)
            if problem:
                problems.append(problem)
                continue
            task = self.record(numbers, target)
            task.solve_rates = [*task.solve_rates, *rates][-RATES_KEPT:]
            loaded += 1
        if problems:
            log.warning("%s: skipped %d rows that hold no task (first: %s)", path, len(problems), problems[0])
        return {"loaded": loaded, "skipped": len(problems)}


def task_key(numbers, target: int) -> tuple[tuple[int, ...], int]:
    """A task as one key: its numbers as a multiset (sorted) and its target."""
    return tuple(sorted(numbers)), target


@functools.lru_cache(maxsize=8)
def reserved_tasks(path: str) -> frozenset[tuple[tuple[int, ...], int]]:
    """The tasks of a task buffer file as (numbers sorted, target): tasks a game must never set (a benchmark's
    held-out set). Every row must hold a task: one skipped would be a held-out task let into the run."""
    table, tasks = read_table(os.fspath(path)), set()
    for numbers, target in zip(table.column("numbers").to_pylist(), table.column("target").to_pylist()):
        if problem := task_problem(numbers, target):
            raise ValueError(f"{path}: a reserved task must be a task: {problem}")
        tasks.add(task_key(numbers, target))
    return frozenset(tasks)


def read_table(path: str) -> pa.Table:
    """The table of a task buffer file; a ``ValueError`` naming the problem when it is not one."""
    try:
        with pa.OSFile(path, "rb") as source:
            table = pa.ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as error:
        raise ValueError(f"{path} is not a task buffer file (an Arrow IPC stream): {error}") from None
    if table.schema.remove_metadata() != SCHEMA:
        raise ValueError(f"{path} is not a task buffer file: its columns are {table.schema.to_string()!r}, "
                         f"not {SCHEMA.to_string()!r}")
    return table


def _rates_problem(rates) -> str | None:
    if rates is None or not all(r is not None and math.isfinite(r) and 0.0 <= r <= 1.0 for r in rates):
        return f"solve rates lie in [0, 1]: {rates!r}"
    return None


_SHARED: dict[str, TaskBuffer] = {}


def shared_buffer(name: str = "propose_solve", capacity: int = 1024) -> TaskBuffer:
    """The process's buffer called ``name`` (made on first use): every game that names it shares it. Asking for
    it again with another capacity is a ``ValueError``."""
    buffer = _SHARED.get(name)
    if buffer is None:
        buffer = _SHARED[name] = TaskBuffer(capacity)
    elif buffer.capacity != capacity:
        raise ValueError(f"the shared task buffer {name!r} holds {buffer.capacity} tasks; asked for {capacity}")
    return buffer
