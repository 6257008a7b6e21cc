import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.models.base_model import TinyModelConfig, make_model, make_tokenizer
from streams.messages import Completion, GenerationRequest, VersionAnnounced, WeightsChunk, WeightsFetch, WeightsManifest
from streams.wire import FrameError, pack, unpack


def test_messages_round_trip():
    request = GenerationRequest(7, "tcp://127.0.0.1:5555", "main", [5, 6, 7], 0.7, 12, min_version=4)
    assert GenerationRequest.from_body(request.to_body()) == request
    completion = Completion(7, [1, 2], [-0.5, -0.25], [3, 4], True)
    assert Completion.from_body(completion.to_body()) == completion
    refused = Completion.refused(8, "temperature must be in [0, 2]")
    assert Completion.from_body(refused.to_body()) == refused and refused.error and not refused.token_ids
    manifest = WeightsManifest("main", 3, 10, 4, [1, 2, 3], "host/boot", "/dev/shm/w", "tcp://127.0.0.1:5", life=2)
    assert WeightsManifest.from_body(manifest.to_body()) == manifest
    assert WeightsFetch.from_body(WeightsFetch("main", 3, 2, "mem://x").to_body()) == WeightsFetch("main", 3, 2, "mem://x")
    assert WeightsChunk.from_body(WeightsChunk("main", 3, 2, b"ab").to_body()) == WeightsChunk("main", 3, 2, b"ab")
    assert VersionAnnounced.from_body(VersionAnnounced("main", 9).to_body()) == VersionAnnounced("main", 9)


def test_malformed_messages_raise_frame_errors():
    with pytest.raises(FrameError, match="lacks"):
        Completion.from_body(pack({"id": 1}))
    with pytest.raises(FrameError, match="2 tokens, 1 log-probs"):
        Completion.from_body(pack({"ids": b"\x01" + b"\x00" * 7, "lengths": b"\x02\x00\x00\x00", "tokens": b"\x00" * 8,
                                   "logprobs": b"\x00" * 4, "versions": b"\x00" * 8, "finished": b"\x01", "errors": [""]}))
    with pytest.raises(FrameError, match="empty prompt"):
        GenerationRequest.from_body(GenerationRequest(1, "a", "main", [], 1.0, 4).to_body())
    with pytest.raises(FrameError):
        WeightsManifest.from_body(b"\xc1 not msgpack")
    with pytest.raises(FrameError, match="does not match its 2 checksums"):
        WeightsManifest.from_body(WeightsManifest("main", 3, 10, 4, [1, 2], "h", "p", "tcp://a:1").to_body())
    with pytest.raises(FrameError, match="negative life"):
        WeightsManifest.from_body(WeightsManifest("main", 3, 10, 4, [1, 2, 3], "h", "p", "tcp://a:1", -1).to_body())
    with pytest.raises(FrameError, match="not a stream address"):
        GenerationRequest.from_body(GenerationRequest(1, "/etc/passwd", "main", [1], 1.0, 4).to_body())
    fields = unpack(GenerationRequest(1, "mem://a", "main", [1], 1.0, 4).to_body())
    with pytest.raises(FrameError, match="field temperatures is a str"):
        GenerationRequest.from_body(pack({**fields, "temperatures": "hot"}))
    with pytest.raises(FrameError, match="out of range"):
        GenerationRequest.from_body(GenerationRequest(1, "mem://a", "main", [1], 1.0, 10**9).to_body())


def test_tiny_model_saves_and_loads_as_a_hugging_face_directory(tmp_path):
    tokenizer = make_tokenizer(["TicTacToe. You are X.\n1|2|3\nMove:", "[5]"] * 20, vocab_size=300)
    model = make_model(tokenizer, TinyModelConfig())
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    text = "TicTacToe. You are O.\n1|X|3\nMove:[7]"
    ids = loaded_tokenizer(text)["input_ids"]
    assert loaded_tokenizer.decode(ids) == text  # byte-level: any text round-trips
    assert loaded.config.hidden_size // loaded.config.num_attention_heads >= 32
    assert loaded_tokenizer.eos_token_id is not None and loaded_tokenizer.pad_token_id is not None


def test_head_dim_below_32_is_refused():
    tokenizer = make_tokenizer(["ab"] * 5, vocab_size=270)
    with pytest.raises(ValueError, match="head_dim 16"):
        make_model(tokenizer, TinyModelConfig(hidden_size=64, heads=4))


def test_demonstrations_play_slow_environments_on_a_mock_clock_and_mix_in_the_expert():
    from actors.models.base_model import demonstrations, tiny_model_config
    from actors.cli import load_config

    # the tool's latency is 1000 s a call: on the mock clock it costs no wall time
    args = {"lookups": 1, "latency_median_s": 1000.0, "latency_sigma": 0.0, "latency_max_s": 1000.0}
    expert = demonstrations("tool_latency", 20, seed=0, env_args=args, expert_share=1.0)
    # the expert looks the one value up, then answers: two moves an episode, the second an answer
    assert len(expert) == 40
    assert all(a.startswith("[lookup") for _, a in expert[0::2]) and all(a.startswith("[answer") for _, a in expert[1::2])
    mixed = demonstrations("tool_latency", 20, seed=0, env_args=args, expert_share=0.0)
    assert mixed != expert and demonstrations("tool_latency", 20, seed=0, env_args=args) == mixed
    # the run's environment is the warm-up's, unless the model config names one
    cfg = tiny_model_config(load_config(["env=tool_latency", "env.args.env_args.lookups=1"]))
    assert cfg.warmup_env == "tool_latency" and cfg.warmup_env_args["lookups"] == 1
    assert tiny_model_config(load_config([])).warmup_env == "tictactoe"
    assert tiny_model_config(load_config(["model.tiny.warmup_env=tictactoe", "env=tool_latency"])).warmup_env_args == {}


def test_a_new_expert_revision_names_a_new_base_model(monkeypatch):
    from envs.kuhn_poker import KuhnPoker

    expert = TinyModelConfig(warmup_env="kuhn_poker", warmup_expert_share=0.5)
    plain = TinyModelConfig(warmup_env="kuhn_poker")
    before = expert.fingerprint(), plain.fingerprint()
    monkeypatch.setattr(KuhnPoker, "expert_revision", KuhnPoker.expert_revision + 1)
    assert expert.fingerprint() != before[0]  # a cached model warmed up on the old expert is not reused
    assert plain.fingerprint() == before[1]  # no expert moves in its warm-up: the revision does not matter
