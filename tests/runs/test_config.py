"""The typed run config: the schema refuses unknown keys and wrong types when composed, moved keys name their new
place, contradictions fail naming the keys, and one topology plan serves a single run and a league."""

import dataclasses
import json

import pytest

from actors.cli import load_config, main, migrated
from actors.runs.config import sampling_stops, Member, RunConfig, check
from actors.runs.driver import Driver
from actors.runs.topology import Topology, plan_groups, spawn_rollouts


def test_the_default_jobs_compose_as_typed_configs():
    single, league = load_config([]), load_config([], "league")
    assert isinstance(single, RunConfig) and single.league is None
    assert single.members() == [Member("main")]  # a single run: a population of one
    assert single.learner.args.objective.advantage == "rae_state"  # launch.yaml's own choice over the group's
    assert [m.id for m in league.members()] == ["main", "exploiter", "leaguex"]
    assert league.league.args.matchmaking.fixed_opponents == ["random", "kuhn_equilibrium"]


@pytest.mark.parametrize("override, message", [
    ("learner.args.lrr=1", "learner.args.lrr"),
    ("+learner.args.lrr=1", "unknown config keys: learner.args.lrr"),  # Hydra's + adds even to a typed node
    ("run.minutes=soon", "run.minutes"),
    ("env.args.concurrency=1.5", "env.args.concurrency"),
    ("learner.args.objective.loss=bogus", "unknown loss 'bogus'"),  # the actor's own dataclass checks it
    ("++learner.args.objective.row_share_by_role={proposer:2}", "a row share must be a number in (0, 1], not 2"),
])
def test_unknown_keys_and_wrong_types_fail_when_composed(override, message):
    with pytest.raises(Exception) as error:
        load_config([override])
    assert message in str(error.value) or message in str(error.value.__cause__)


def test_a_role_row_share_composes_into_the_learners_objective():
    objective = load_config(["++learner.args.objective.row_share_by_role={proposer:0.25}"]).learner.args.objective
    assert objective.row_share_by_role == {"proposer": 0.25}
    rows = [("propose_solve", "main", "proposer"), ("propose_solve", "main", "solver")]
    assert objective.row_shares(rows).tolist() == [0.25, 1.0]


@pytest.mark.parametrize("group", ["env", "rollout", "learner"])
def test_the_policy_id_is_declared_once_and_the_old_keys_say_where_it_went(group):
    with pytest.raises(ValueError, match=f"{group}.args.policy_id is declared once now, as run.policy_id"):
        load_config([f"{group}.args.policy_id=x"])
    assert load_config(["run.policy_id=x"]).members() == [Member("x")]


def test_contradictions_fail_before_anything_starts_naming_the_keys(capsys):
    with pytest.raises(ValueError, match=r"run.max_matches .* this run has no league"):
        check(load_config(["run.max_matches=3"]))
    with pytest.raises(ValueError, match=r"rollout: rollout latency_s is emulated by the hf backend only"):
        check(load_config(["rollout.backend=vllm", "rollout.args.latency_s=0.1"]))
    with pytest.raises(ValueError, match=r"league.members need distinct ids"):
        check(load_config(["league.members=[{id: a}, {id: a}]"], "league"))
    with pytest.raises(ValueError, match=r"env.args: policy_id 'random' is the name of a fixed opponent"):
        check(load_config(["run.policy_id=random"]))
    assert main(["launch", "run.mode=local", "rollout.autoscale.enabled=true"]) == 2
    assert "rollout.autoscale.enabled needs run.mode=ray" in capsys.readouterr().err


def test_a_saved_config_reads_back_and_an_old_one_is_migrated(tmp_path):
    cfg = load_config(["run.minutes=3"])
    saved = json.loads(json.dumps(dataclasses.asdict(cfg)))
    saved["learner"]["args"]["policy_id"] = "old"  # as configs saved before the policy id was declared once
    assert migrated(saved)["run"]["policy_id"] == "old" and "policy_id" not in saved["learner"]["args"]


def test_one_plan_names_a_single_run_plainly_and_a_leagues_members_apart(tmp_path):
    single = plan_groups(load_config([]), "base", tmp_path)
    assert [(g.learner, g.replay, g.reward, g.policy_dir) for g in single.values()] == [
        ("learner", "replay", "reward", tmp_path / "policy")]
    assert single["main"].rollout_name(0) == "rollout-0"
    league = plan_groups(load_config(["league.members=[{id: main}, {id: x, model: /m}]"], "league"), "base", tmp_path)
    assert [(g.learner, g.index, g.model_path) for g in league.values()] == [("learner-main", 0, "base"),
                                                                              ("learner-x", 1, "/m")]
    assert league["x"].policy_dir == tmp_path / "members" / "x" / "policy"
    assert league["x"].rollout_name(2) == "rollout-x-2"


def test_the_judge_group_composes_and_a_missing_model_is_named_before_any_actor_starts(tmp_path):
    with pytest.raises(ValueError, match=r"reward.args: scorer=judge needs judge.model_path"):
        load_config(["reward=judge"])
    cfg = load_config(["reward=judge", f"reward.args.judge.model_path={tmp_path}", "reward.args.judge.batch_size=2"])
    assert cfg.reward.args.scorer == "judge" and cfg.reward.args.judge.batch_size == 2
    with pytest.raises(Exception, match="tokenizer_path"):  # the topology fills it in: the run's tokenizer
        load_config(["reward.args.tokenizer_path=x"])


def test_an_answer_form_the_env_cannot_read_is_refused_naming_the_key():
    assert load_config([]).env.args.answer == "first_bracket" and load_config([]).env.args.format_penalty == 0.0
    assert load_config(["env.args.answer=think_boxed", "env.args.format_penalty=-0.2"]).env.args.answer == "think_boxed"
    assert load_config(["env=gem"]).env.args.answer == "boxed"  # GEM reads boxes: its config says so
    with pytest.raises(ValueError, match=r"env.args: answer 'boxd' is not an answer form: env.args.answer is one of "
                                         r"first_bracket, last_bracket, boxed"):
        load_config(["env.args.answer=boxd"])
    with pytest.raises(ValueError, match=r"answer 'last_bracket' cannot be read by gem:game:GuessTheNumber-v0-easy.*"
                                         r"env.args.answer must be one of boxed, think_boxed"):
        load_config(["env=gem", "env.args.answer=last_bracket"])
    with pytest.raises(ValueError, match=r"answer 'first_bracket' cannot be read by gem:game:Mastermind-v0-easy"):
        load_config(["env.args.env_name=gem:game:Mastermind-v0-easy"])  # the default form, on a GEM env
    with pytest.raises(ValueError, match=r"env.args: format_penalty must be a finite number, not nan"):
        load_config(["env.args.format_penalty=nan"])


def test_stop_strings_are_declared_once_under_sampling_and_reach_every_rollout_actor(tmp_path):
    cfg = load_config(["sampling.stop=[']', '</answer>']"])
    assert cfg.sampling.stop == ["]", "</answer>"] and load_config([]).sampling.stop is None
    # null: the answer form's own, the first "]" for first_bracket (the default job), none where the answer comes last
    assert sampling_stops(load_config([])) == ["]"] and sampling_stops(load_config(["sampling.stop=[]"])) == []
    assert sampling_stops(load_config(["env.args.answer=boxed"])) == []
    assert sampling_stops(load_config(["env.args.answer=last_bracket"])) == []
    with pytest.raises(ValueError, match=r"sampling\.stop: '' is not a non-empty string"):
        load_config(["sampling.stop=[']', '']"])
    with pytest.raises(Exception, match=r"rollout\.args\.stop"):  # the topology fills it in from sampling.stop
        load_config(["rollout.args.stop=[']']"])
    spawned = []

    class Cluster:
        def spawn_many(self, actors):
            spawned.extend(config for _, _, config, _ in actors)
            return [{"requests": f"inproc://{name}"} for name, *_ in actors]

    spawn_rollouts(Cluster(), cfg, Topology(plan_groups(cfg, "base", tmp_path)), {"main": 2})
    assert [rollout.stop for rollout in spawned] == [["]", "</answer>"]] * 2


def test_a_stop_string_longer_than_the_token_budget_is_refused_before_any_actor_starts(tmp_path):
    """The run's tokenizer is at hand once the driver has its model: a stop string it encodes to more tokens than
    sampling.max_new_tokens is refused there, naming both keys."""
    from actors.models.tokenizer import make_tokenizer, save_tokenizer

    model = tmp_path / "model"
    save_tokenizer(make_tokenizer(["[5] You are X", "Move: [3]"], 280), model)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))  # a tokenizer is all the check reads
    cfg = load_config([f"model.path={model}", "sampling.stop=[']', '[5][5]']", "sampling.max_new_tokens=3",
                       f"run.dir={tmp_path / 'runs'}", "observe.tensorboard=false", "prompt.template=raw"])
    with pytest.raises(ValueError, match=r"^sampling\.stop: '\[5\]\[5\]' is 6 tokens of .*model's tokenizer, more "
                                         r"than sampling\.max_new_tokens=3$"):
        Driver(cfg).execute()
    # and a tokenizer with no chat template, where the prompt renders through one (the default), at the same moment
    cfg = load_config([f"model.path={model}", f"run.dir={tmp_path / 'runs'}", "observe.tensorboard=false"])
    with pytest.raises(ValueError, match=r"^prompt\.template=chat renders through the model's chat template, and "
                                         r".*model's tokenizer has none \(choose prompt\.template=raw"):
        Driver(cfg).execute()


def test_a_named_template_needs_the_answer_form_it_asks_for_and_the_prompt_keys_are_checked_when_composed():
    assert load_config(["prompt.template=spiral", "env.args.answer=boxed"]).prompt.template == "spiral"
    assert load_config(["prompt.template=spiral", "env.args.answer=think_boxed"]).env.args.answer == "think_boxed"
    with pytest.raises(ValueError, match=r"prompt.template=spiral asks for the answer in the form boxed, but "
                                         r"env.args.answer=first_bracket reads another: set env.args.answer=boxed"):
        load_config(["prompt.template=spiral"])
    with pytest.raises(ValueError, match=r"prompt.template='nope': choose one of chat, raw, spiral"):
        load_config(["prompt.template=nope"])
    with pytest.raises(ValueError, match=r"prompt.max_context_tokens=8 leaves no room for a prompt and "
                                         r"sampling.max_new_tokens=8"):
        load_config(["prompt.max_context_tokens=8"])
