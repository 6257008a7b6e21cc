"""One episode's trained rows, kept as columns from its first move: one list per column, no dict per row.

An ``EpisodeColumns`` holds what every row of the episode shares once (its id, env, seed, policy, matchup, when it
was created) and one list per column that varies by row. ``table_columns`` gives every column of the trajectory
schema as a list (``streams.schema.encode_episode_columns`` builds the Arrow table from them), so a finished
episode becomes its table without passing through rows.

It is also the episode's reward credit: each reward goes to the row of the seat's last action (a reward a seat
gets before it has acted goes to its first row), and ``finish`` writes every row's ``episode_return`` and marks
each seat's last row with how the episode ended.
"""

from __future__ import annotations

from streams.schema import NAMES, Columns

# the columns that vary by row, in the order ``add_row`` appends them
ROW_COLUMNS = (Columns.TURN, Columns.AGENT, Columns.ROLE, Columns.PROMPT_IDS, Columns.ACTION_IDS, Columns.ACTION_TEXT,
               Columns.BEHAVIOUR_LOGPROBS, Columns.POLICY_VERSIONS, Columns.GENERATED_AT, Columns.ACTION_TRUNCATED)
# the columns written after the row: its reward, its end, its return and whether it was invalid
CREDIT_COLUMNS = (Columns.REWARD, Columns.TERMINATED, Columns.TRUNCATED, Columns.EPISODE_RETURN,
                  Columns.INVALID_ACTION)


class EpisodeColumns:
    """The trained rows of one episode, column by column, and each seat's return (see the module)."""

    __slots__ = ("shared", "turn", "agent", "role", "prompt_ids", "action_ids", "action_text", "logprobs",
                 "versions", "generated_at", "action_truncated", "reward", "terminated", "truncated", "invalid",
                 "returns", "_last", "_pending")

    def __init__(self, shared: dict, num_players: int):
        self.shared = shared  # column -> the one value every row has (episode id, env, seed, policy, ...)
        self.turn, self.agent, self.role = [], [], []
        self.prompt_ids, self.action_ids, self.action_text, self.logprobs, self.versions = [], [], [], [], []
        self.generated_at, self.action_truncated = [], []
        self.reward, self.terminated, self.truncated, self.invalid = [], [], [], []
        self.returns = [0.0] * num_players
        self._last: dict[int, int] = {}  # seat -> the index of its last row
        self._pending = [0.0] * num_players  # rewards of seats that have no row yet

    def __len__(self) -> int:
        return len(self.turn)

    def add_row(self, turn: int, seat: int, role: str, prompt_ids, completion, text: str, generated_at: float) -> int:
        """A trained move's row (``completion``: its ids, logprobs, versions and whether it finished); its index."""
        index = len(self.turn)
        self.turn.append(turn)
        self.agent.append(seat)
        self.role.append(role)
        self.prompt_ids.append(prompt_ids)
        self.action_ids.append(completion.token_ids)
        self.action_text.append(text)
        self.logprobs.append(completion.logprobs)
        self.versions.append(completion.versions)
        self.generated_at.append(generated_at)
        self.action_truncated.append(not completion.finished)
        self.reward.append(self._pending[seat])
        self._pending[seat] = 0.0
        self.terminated.append(False)
        self.truncated.append(False)
        self.invalid.append(False)
        self._last[seat] = index
        return index

    def add_rewards(self, rewards: list[float]) -> None:
        for seat, reward in enumerate(rewards):
            if reward:
                self.returns[seat] += reward
                last = self._last.get(seat)
                if last is None:
                    self._pending[seat] += reward
                else:
                    self.reward[last] += reward

    def add_reward(self, seat: int, reward: float) -> None:
        """``reward`` to ``seat`` alone (a penalty of the mover's)."""
        self.add_rewards([reward if s == seat else 0.0 for s in range(len(self.returns))])

    def finish(self, terminated: bool, truncated: bool) -> None:
        for index in self._last.values():
            self.terminated[index], self.truncated[index] = terminated, truncated

    def table_columns(self) -> dict[str, list]:
        """Every column of the trajectory schema as a list of this episode's rows' values."""
        n, returns = len(self.turn), self.returns
        columns = {name: [value] * n for name, value in self.shared.items()}
        columns.update({
            Columns.TURN: self.turn, Columns.AGENT: self.agent, Columns.ROLE: self.role,
            Columns.PROMPT_IDS: self.prompt_ids, Columns.ACTION_IDS: self.action_ids,
            Columns.ACTION_TEXT: self.action_text, Columns.BEHAVIOUR_LOGPROBS: self.logprobs,
            Columns.POLICY_VERSIONS: self.versions, Columns.GENERATED_AT: self.generated_at,
            Columns.ACTION_TRUNCATED: self.action_truncated, Columns.REWARD: self.reward,
            Columns.TERMINATED: self.terminated, Columns.TRUNCATED: self.truncated,
            Columns.EPISODE_RETURN: [returns[seat] for seat in self.agent], Columns.INVALID_ACTION: self.invalid,
            Columns.SCORED_AT: [0.0] * n, Columns.SCORED_BY: [""] * n})
        return columns

    def rows(self) -> list[dict]:
        """The rows one by one (a test's or a tool's view; the actor never builds them)."""
        columns = self.table_columns()
        return [{name: columns[name][i] for name in NAMES} for i in range(len(self))]
