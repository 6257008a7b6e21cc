"""The league table: ratings and the payoff matrix as text, and the ratings over time as a plot."""

from __future__ import annotations

from pathlib import Path


def format_table(state: dict, max_snapshot_columns: int = 4) -> str:
    """Ratings (OpenSkill ordinal = mu - 3 sigma, best first) and every pair's win rate, row against column."""
    ratings = state["ratings"]  # player -> [mu, sigma]
    players = sorted(ratings, key=lambda p: -(ratings[p][0] - 3 * ratings[p][1]))
    roles = {m["id"]: m["role"] for m in state["members"]}
    lines = [f"{'player':<22} {'kind':<17} {'ordinal':>8} {'mu':>7} {'sigma':>6}"]
    for p in players:
        mu, sigma = ratings[p]
        kind = roles.get(p) or ("snapshot" if p in state["snapshots"] else "fixed opponent")
        lines.append(f"{p:<22} {kind:<17} {mu - 3 * sigma:>8.2f} {mu:>7.2f} {sigma:>6.2f}")
    counts = {(a, b): (w, d, g) for a, b, w, d, g in state["payoff"]["counts"]}
    snapshots = sorted(state["snapshots"], key=lambda s: state["snapshots"][s]["version"])
    columns = [p for p in players if p not in state["snapshots"]] + snapshots[-max_snapshot_columns:]
    lines += ["", f"payoff: win rate of the row against the column (decayed; '-' never met; the columns: "
                  f"members, fixed opponents and the {max_snapshot_columns} newest snapshots)"]
    lines.append(f"{'':<22} " + " ".join(f"{c[:11]:>11}" for c in columns))
    for a in players:
        cells = []
        for b in columns:
            w, d, g = counts.get((a, b), (0, 0, 0))
            cells.append(f"{(w + 0.5 * d) / g:>11.2f}" if g else f"{'-':>11}")
        lines.append(f"{a:<22} " + " ".join(cells))
    stats = state["stats"]
    lines += ["", f"matches={stats['matches']} snapshots={len(state['snapshots'])} "
                  f"errored={stats['errored_matches']} unrated={stats['unrated_matches']}"]
    return "\n".join(lines)


def plot_ratings(state: dict, path: Path) -> None:
    """Each player's ordinal against the number of matches played (a snapshot's line starts when it joins)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    history = state["history"]
    players = sorted({p for h in history for p in h["ordinal"]})
    for p in players:
        points = [(h["matches"], h["ordinal"][p]) for h in history if p in h["ordinal"]]
        style = "-" if p in {m["id"] for m in state["members"]} else ":"
        ax.plot([x for x, _ in points], [y for _, y in points], style, label=p)
    ax.set(xlabel="matches", ylabel="rating (OpenSkill ordinal)", title="league ratings")
    ax.grid(alpha=0.3)
    if players:
        ax.legend(fontsize=7, loc="best", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
