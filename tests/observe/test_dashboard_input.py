"""``tidal top`` shows what a run directory holds as data: a string written there (an evaluation's tag, a player's
name) reaches the terminal as plain text, with no rich markup read from it and no control character (OSC 52 would
write the clipboard, ``ESC[2J`` clear the screen); a row or a field of the wrong shape is shown as missing."""

import io
import json

from rich.console import Console

from actors.runs.dashboard import render

HOSTILE = "[blink red]owned[/] \x1b]52;c;ZWNobyBoaQ==\x07\x1b[2J"


def shown(run_dir) -> str:
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="truecolor", width=200).print(render(run_dir))
    return out.getvalue()


def test_hostile_strings_and_odd_rows_are_shown_as_plain_text(tmp_path):
    rows = [
        ["not", "a", "row"],
        {"version": 3, "staleness_total": {"x": 1, "2": 5, "1": "many"}, "restarts_by_actor": ["replay"],
         "ratings": {HOSTILE: 1.5, "main": "high"}, "versions": {HOSTILE: 2},
         "evaluation": {"tag": HOSTILE, "player": "main", "opponent": HOSTILE, "nonloss_by_seat": {"0": "x"}},
         "elapsed_s": "soon"},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{cut")
    (tmp_path / "summary.json").write_text("[1, 2")
    text = shown(tmp_path)
    assert "\x1b]52" not in text and "\x1b[2J" not in text and "\x07" not in text
    assert "\x1b[5m" not in text  # no blink: the markup was not read
    assert "[blink red]owned[/]" in text  # shown as the characters it is
    assert "1 metrics rows" in text  # the list was not a row
