"""Rules of the multi-agent games: wins, draws, illegal moves, payoffs, private information, seeds."""

import pytest

import envs
from envs.liars_dice import LiarsDice
from envs.negotiation import SimpleNegotiation
from tests.factories import kuhn

MULTI = [("tictactoe", {}), ("kuhn_poker", {}), ("negotiation", {}), ("liars_dice", {}),
         ("liars_dice", {"players": 5, "dice": 1})]


def random_transcript(name, kwargs, seed):
    game, opponent = envs.make(name, **kwargs), envs.make_opponent("random", seed=seed)
    game.reset(seed)
    transcript, result = [], None
    while result is None or not result.terminated:
        observation = game.observation(game.current_player)
        action = opponent.act(game)
        result = game.step(action)
        transcript.append((game.current_player, observation, action, result.rewards))
    return transcript, result


@pytest.mark.parametrize("name,kwargs", MULTI)
def test_random_legal_play_ends_validly_zero_sum_and_reproducibly(name, kwargs):
    for seed in range(20):
        transcript, result = random_transcript(name, kwargs, seed)
        assert not result.invalid and sum(sum(r) for *_, r in transcript) == pytest.approx(0.0)
        assert random_transcript(name, kwargs, seed) == (transcript, result)


@pytest.mark.parametrize("name,kwargs", MULTI)
def test_an_illegal_move_changes_nothing_then_forfeits(name, kwargs):
    game = envs.make(name, max_retries=1, retry_penalty=-0.5, **kwargs)
    game.reset(7)
    mover, before = game.current_player, game.observation(game.current_player)
    retried = game.step("[nonsense]")
    assert retried.invalid and not retried.terminated and retried.rewards[mover] == -0.5
    assert game.current_player == mover and game.observation(mover).endswith(before)
    forfeited = game.step("no move at all")
    assert forfeited.terminated and forfeited.info["forfeit"] == mover and forfeited.rewards[mover] == -1.0
    assert sum(forfeited.rewards) == -1.0  # the others get 0
    with pytest.raises(RuntimeError, match="finished game"):
        game.step(game.legal_actions()[0] if game.legal_actions() else "[1]")



@pytest.mark.parametrize("cards,moves,rewards", [
    ((2, 0), ["check", "check"], [1.0, -1.0]),  # showdown for the antes
    ((0, 1), ["check", "check"], [-1.0, 1.0]),
    ((1, 2), ["bet", "call"], [-2.0, 2.0]),  # a called bet doubles the stake
    ((2, 1), ["check", "bet", "call"], [2.0, -2.0]),
    ((0, 2), ["bet", "fold"], [1.0, -1.0]),  # a fold gives the antes away whatever the cards
    ((2, 0), ["check", "bet", "fold"], [-1.0, 1.0]),
])
def test_kuhn_poker_payoffs(cards, moves, rewards):
    game, result = kuhn(cards, moves)
    assert result.terminated and result.rewards == rewards


def test_kuhn_poker_moves_and_private_cards():
    game, result = kuhn((0, 2), ["check"])
    assert not result.terminated and game.legal_actions() == ["[check]", "[bet]"]
    assert "Your card: K" in game.observation(1) and "Your card: J" not in game.observation(1)
    assert "Your card: J" in game.observation(0) and "player 0 checked" in game.observation(1)
    assert game.step("I [call]").invalid  # nothing to call
    game.step("[bet]")
    assert game.legal_actions() == ["[call]", "[fold]"]
    deals = set()
    for seed in range(30):
        game.reset(seed)
        assert len(set(game.cards)) == 2
        deals.add(tuple(game.cards))
    assert len(deals) == 6  # every deal happens


@pytest.mark.parametrize("cards,moves,expert", [
    ((2, 0), [], "[bet]"), ((0, 2), [], "[check]"), ((1, 2), [], "[check]"), ((2, 1), ["check"], "[check]"),
    ((0, 2), ["check"], "[bet]"), ((0, 2), ["bet"], "[call]"), ((2, 0), ["bet"], "[fold]"),
    ((2, 0), ["check", "bet"], "[call]"), ((0, 2), ["check", "bet"], "[fold]"),
    ((1, 0), ["check", "bet"], None), ((2, 1), ["bet"], None),  # the Q facing a bet: no opinion
])
def test_kuhn_expert_plays_the_dominant_moves_and_leaves_the_q_facing_a_bet_alone(cards, moves, expert):
    game, _ = kuhn(cards, moves)
    assert game.expert_action() == expert
    assert expert is None or expert in game.legal_actions()


def dice_game(hands, players=2, dice=2):
    game = LiarsDice(players=players, dice=dice)
    game.reset(0)
    game.hands = [sorted(h) for h in hands]
    return game


def test_liars_dice_a_true_bid_costs_the_challenger_a_die():
    game = dice_game([[3, 5], [5, 6]])
    assert game.step("[bid 2 5]").rewards == [0.0, 0.0]
    result = game.step("[liar]")  # two fives are there
    assert game.counts == [2, 1] and result.info["round_loser"] == 1 and game.current_player == 1


def test_liars_dice_a_false_bid_costs_the_bidder_a_die_and_bids_must_rise():
    game = dice_game([[3, 5], [5, 6]])
    game.step("[bid 2 5]")
    assert game.step("[bid 2 4]").invalid and game.step("[bid 1 6]").invalid and game.step("[bid 5 6]").invalid
    game.step("[bid 2 6]")
    game.step("[liar]")  # one six only
    assert game.counts == [2, 1] and game.current_player == 1


def test_liars_dice_the_last_player_with_dice_wins_among_four():
    game = dice_game([[2], [2], [2], [2]], players=4, dice=1)
    assert game.legal_actions()[-1] != "[liar]"  # nothing to challenge yet
    for _ in range(3):
        game.hands = [[2] * n for n in game.counts]  # no six anywhere
        bidder = game.current_player
        game.step(f"[bid {sum(game.counts)} 6]")  # false
        result = game.step("[liar]")
        assert game.counts[bidder] == 0
    assert result.terminated and result.info["winner"] == 3 and result.info["rounds"] == 3
    assert result.rewards == pytest.approx([-1 / 3, -1 / 3, -1 / 3, 1.0])


def test_liars_dice_dice_are_private_and_players_checked():
    game = LiarsDice(players=3)
    game.reset(4)
    own = " ".join(map(str, game.hands[1]))
    assert f"Your dice: {own}." in game.observation(1)
    assert all(f"Your dice: {' '.join(map(str, h))}." not in game.observation(1)
               for p, h in enumerate(game.hands) if p != 1 and h != game.hands[1])
    with pytest.raises(ValueError, match="2 to 6 players"):
        LiarsDice(players=7)


def test_negotiation_a_trade_moves_resources_and_the_larger_gain_wins():
    game = SimpleNegotiation(max_turns=2)
    game.reset(0)
    game.inventory = [{"wood": 3, "stone": 0, "gold": 1}, {"wood": 0, "stone": 2, "gold": 1}]
    game.values = [{"wood": 1, "stone": 9, "gold": 5}, {"wood": 8, "stone": 2, "gold": 5}]
    game.start_value = [game.value(0), game.value(1)]
    game.step("I propose [offer 2 wood for 1 stone]")
    assert "give 2 wood for 1 stone" in game.observation(1)
    result = game.step("[accept]")
    assert game.inventory == [{"wood": 1, "stone": 1, "gold": 1}, {"wood": 2, "stone": 1, "gold": 1}]
    assert result.terminated and result.info["gains"] == [9 - 2, 16 - 2] and result.rewards == [-1.0, 1.0]


def test_negotiation_no_trade_is_a_draw_and_bad_offers_are_invalid():
    game = SimpleNegotiation(max_turns=2)
    game.reset(3)
    assert game.step("[accept]").invalid  # nothing to accept
    too_much = game.inventory[0]["gold"] + 1
    assert game.step(f"[offer {too_much} gold for 1 wood]").invalid  # cannot give what it lacks
    assert game.step("[offer 1 wood for nothing]").invalid
    game.step("[offer 1 wood for 1 gold]")
    result = game.step("[deny]")
    assert result.terminated and result.rewards == [0.0, 0.0] and result.info["winner"] is None


def test_negotiation_values_are_private():
    game = SimpleNegotiation()
    game.reset(5)
    text = game.observation(0)
    assert all(f"worth {game.values[0][r]} each" in text for r in game.values[0])
    assert "worth" not in text.split("You have:")[0]
