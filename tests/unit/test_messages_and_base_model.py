import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.base_model import TinyModelConfig, make_model, make_tokenizer
from streams.messages import Completion, GenerationRequest, VersionAnnounced, Weights
from streams.wire import FrameError, pack


def test_messages_round_trip():
    request = GenerationRequest(7, "tcp://127.0.0.1:5555", "main", [5, 6, 7], 0.7, 12)
    assert GenerationRequest.from_body(request.to_body()) == request
    completion = Completion(7, [1, 2], [-0.5, -0.25], [3, 4], True)
    assert Completion.from_body(completion.to_body()) == completion
    assert Weights.from_body(Weights("main", 3, b"\x00\x01").to_body()) == Weights("main", 3, b"\x00\x01")
    assert VersionAnnounced.from_body(VersionAnnounced("main", 9).to_body()) == VersionAnnounced("main", 9)


def test_malformed_messages_raise_frame_errors():
    with pytest.raises(FrameError, match="lacks"):
        Completion.from_body(pack({"id": 1}))
    with pytest.raises(FrameError, match="2 tokens, 1 log-probs"):
        Completion.from_body(pack({"id": 1, "tokens": b"\x00" * 8, "logprobs": b"\x00" * 4,
                                   "versions": b"\x00" * 8, "finished": True}))
    with pytest.raises(FrameError, match="empty prompt"):
        GenerationRequest.from_body(GenerationRequest(1, "a", "main", [], 1.0, 4).to_body())
    with pytest.raises(FrameError):
        Weights.from_body(b"\xc1 not msgpack")


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
