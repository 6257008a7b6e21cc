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


def test_the_expert_wins_before_it_blocks_and_has_no_opinion_on_a_quiet_board():
    from actors.models.base_model import demonstrations
    from envs.tictactoe import TicTacToe

    game = TicTacToe()
    assert game.expert_action() is None  # nothing to complete or block: the warm-up plays a random move
    for cell in ("[1]", "[4]", "[2]", "[5]"):  # X on 1 and 2, O on 4 and 5; X to move
        game.step(cell)
    assert game.expert_action() == "[3]"  # X completes its row rather than block O's
    game.step("[7]")  # X plays elsewhere: O to move, with its own row 4-5-6 to complete
    assert game.expert_action() == "[6]"
    game = TicTacToe()
    for cell in ("[1]", "[5]", "[2]"):  # X threatens 3; O has no line of its own
        game.step(cell)
    assert game.expert_action() == "[3]"  # so O blocks
    # a warm-up of expert moves only still plays every game to its end, with random moves where it has none
    pairs = demonstrations("tictactoe", 30, seed=0, expert_share=1.0)
    assert len(pairs) >= 30 * 5 and pairs != demonstrations("tictactoe", 30, seed=0, expert_share=0.0)
