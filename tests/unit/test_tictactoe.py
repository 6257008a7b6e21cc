import pytest

import envs
from envs.opponents import RandomOpponent
from envs.tictactoe import parse_move


def play(moves):
    game = envs.make("tictactoe")
    game.reset(0)
    result = None
    for move in moves:
        result = game.step(move)
    return game, result


def test_first_row_wins_for_x():
    game, result = play(["[1]", "[4]", "[2]", "[5]", "[3]"])
    assert result.terminated and result.rewards == [1.0, -1.0] and result.info["winner"] == 0


def test_diagonal_wins_for_o():
    _, result = play(["[1]", "[3]", "[2]", "[5]", "[9]", "[7]"])
    assert result.rewards == [-1.0, 1.0]


def test_full_board_is_a_draw():
    _, result = play(["[1]", "[2]", "[3]", "[5]", "[4]", "[6]", "[8]", "[7]", "[9]"])
    assert result.terminated and result.rewards == [0.0, 0.0] and not result.invalid


@pytest.mark.parametrize("text", ["[5]", "I take [5].", "[ 5 ]", "thinking... [5] [6]"])
def test_move_format_tolerates_text_around_the_brackets(text):
    assert parse_move(text) == 4


@pytest.mark.parametrize("text", ["5", "[0]", "[a]", "", "[10]"])
def test_unparseable_moves_are_invalid_and_end_the_game(text):
    game, result = play([text])
    assert result.invalid and result.terminated and result.rewards == [-1.0, 0.0]
    with pytest.raises(RuntimeError, match="finished game"):
        game.step("[1]")


def test_taken_cell_is_invalid_for_the_mover_only():
    _, result = play(["[5]", "[5]"])
    assert result.invalid and result.rewards == [0.0, -1.0]


def test_observation_shows_free_cells_and_the_role():
    game, _ = play(["[5]"])
    text = game.observation(1)
    assert "You are O" in text and "4|X|6" in text
    assert game.legal_actions() == ["[1]", "[2]", "[3]", "[4]", "[6]", "[7]", "[8]", "[9]"]


def test_random_opponent_only_plays_legal_moves():
    opponent = RandomOpponent(seed=1)
    for seed in range(50):
        game = envs.make("tictactoe")
        game.reset(seed)
        result = None
        while result is None or not result.terminated:
            result = game.step(opponent.act(game))
        assert not result.invalid


def test_unknown_names_get_a_clear_error():
    with pytest.raises(ValueError, match="unknown environment 'chess'"):
        envs.make("chess")
    with pytest.raises(ValueError, match="unknown opponent"):
        envs.make_opponent("grandmaster")
