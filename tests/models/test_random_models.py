"""model.init=random: a random-init model of an architecture's shape, saved as a Hugging Face directory with tidal's
tokenizer and cached by its shape; the presets compose; bad shapes fail naming the key; and benchmarks/gpu_check.py
(no GPU here) says so and exits 0, and runs its measurements on the CPU without Ray, vLLM, ZeroMQ or trio."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.cli import load_config
from actors.models import random_model
from actors.models.chat import CHAT_STYLES
from actors.models.random_model import ModelShape, ensure_random_model, parameter_count, random_model_config

ROOT = Path(__file__).resolve().parents[2]
GPU_CHECK = ROOT / "benchmarks" / "gpu_check.py"
SMALL = dict(hidden_size=64, layers=2, heads=4, kv_heads=2, intermediate_size=96, vocab_size=1000,
             max_positions=256, rope_theta=1e6, tokenizer_vocab=512)
SMALL_OVERRIDES = [f"model.shape.{key}={value}" for key, value in SMALL.items()]


def gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    module = sys.modules["gpu_check"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("architecture, model_class, tied", [("qwen2", "Qwen2ForCausalLM", True),
                                                            ("llama", "LlamaForCausalLM", False)])
def test_a_random_model_loads_as_a_hugging_face_directory_of_its_shape(tmp_path, architecture, model_class, tied):
    shape = ModelShape(architecture=architecture, tie_embeddings=tied, **SMALL)
    path = ensure_random_model(tmp_path, shape)
    assert (path / "model.safetensors").exists()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    config = model.config
    assert type(model).__name__ == model_class and model.dtype == torch.float32
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.vocab_size) == (64, 2, 4, 2, 96, 1000)
    assert model.get_input_embeddings().weight.shape == (1000, 64)
    assert (model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()) == tied
    # the tokenizer is tidal's small BPE; the embedding's rows past it are ids no text encodes to
    assert 258 <= len(tokenizer) <= 512 + len(CHAT_STYLES["chatml"].specials) < config.vocab_size
    # with a ChatML chat template whose end of turn is the model's EOS, as an instruct model's tokenizer has them
    assert tokenizer.eos_token == "<|im_end|>" and config.eos_token_id == tokenizer.eos_token_id
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "[5]"}], add_generation_prompt=True,
                                         tokenize=False)
    assert chat == "<|im_start|>user\n[5]<|im_end|>\n<|im_start|>assistant\n"
    # it encodes as trained, whichever class transformers loads it as (a Qwen2 directory's: Qwen2Tokenizer)
    trained = Tokenizer.from_file(str(path / "tokenizer.json"))
    for text in ("You are player 1. Board: X|O|3 [5]", "It's 10:30, bid 37 [bid 3 5]\n\nX|O  café"):
        ids = tokenizer(text)["input_ids"]
        assert ids == trained.encode(text).ids and tokenizer.decode(ids) == text
    assert tokenizer.decode([999]) == ""
    assert json.loads((path / "tidal_base_model.json").read_text())["parameters"] == parameter_count(model)


def test_the_cache_is_reused_and_a_different_shape_gets_its_own_directory(tmp_path, monkeypatch):
    shape = ModelShape(**SMALL)
    first = ensure_random_model(tmp_path, shape)
    made = (first / "model.safetensors").stat().st_mtime_ns

    def refuse(*args):
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(random_model, "make_random_model", refuse)
    assert ensure_random_model(tmp_path, ModelShape(**SMALL)) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == made
    with pytest.raises(AssertionError, match="rebuilt"):  # another seed is another model
        ensure_random_model(tmp_path, ModelShape(**{**SMALL, "seed": 1}))


@pytest.mark.parametrize("damage", ["changed", "no_checksums", "added"])
def test_a_cached_model_whose_files_do_not_match_their_checksums_is_made_again(tmp_path, damage, caplog):
    """Review old 20: the cache was trusted as soon as config.json existed."""
    first = ensure_random_model(tmp_path, ModelShape(**SMALL))
    weights = (first / "model.safetensors").read_bytes()
    if damage == "changed":  # another user's, or a disk's, change to the weights
        (first / "model.safetensors").write_bytes(weights[:-8] + b"\x7f" * 8)
    elif damage == "no_checksums":  # cut short before its checksums, or made by a tidal before them
        (first / "CHECKSUMS.json").unlink()
    else:
        (first / "extra.py").write_text("print('not the model')")
    again = ensure_random_model(tmp_path, ModelShape(**SMALL))
    assert again == first and (again / "model.safetensors").read_bytes() == weights  # the same seed: remade
    assert not (again / "extra.py").exists() and (again / "CHECKSUMS.json").exists()
    assert "is not used" in caplog.text and "made again" in caplog.text


def test_random_25m_has_at_least_20m_parameters(tmp_path):
    cfg = load_config(["model=random_25m", f"model.cache_dir={tmp_path}"])
    shape = random_model_config(cfg)
    assert cfg.model.init == "random" and shape.tokenizer_env == "tictactoe"  # null: the run's environment
    model = AutoModelForCausalLM.from_pretrained(ensure_random_model(cfg.model.cache_dir, shape))
    params = parameter_count(model)
    print(f"random_25m: {params / 1e6:.1f} M parameters")
    assert params >= 20e6


def test_the_presets_compose_and_the_driver_resolves_the_base_model(tmp_path):
    from actors.runs.driver import Driver

    qwen = load_config(["model=qwen2_0_5b"])
    assert qwen.model.init == "random" and qwen.model.path is None
    assert (qwen.model.shape.architecture, qwen.model.shape.hidden_size, qwen.model.shape.layers,
            qwen.model.shape.heads, qwen.model.shape.kv_heads, qwen.model.shape.intermediate_size,
            qwen.model.shape.vocab_size, qwen.model.shape.tie_embeddings, qwen.model.shape.rope_theta) == (
        "qwen2", 896, 24, 14, 2, 4864, 151936, True, 1e6)
    assert load_config([]).model.init == "tiny"
    run = ["model=random_25m", f"model.cache_dir={tmp_path / 'models'}", f"run.dir={tmp_path}", *SMALL_OVERRIDES]
    made = Driver(load_config(run + ["run.name=a"])).model_path()
    assert made.parent == tmp_path / "models" and made.name.startswith("random-llama-h64-l2-")
    # model.path wins over init
    assert Driver(load_config(run + ["run.name=b", f"model.path={made}"])).model_path() == made


@pytest.mark.parametrize("override, message", [
    ("model.shape.heads=5", "model.shape.heads=5 does not divide model.shape.hidden_size=512"),
    ("model.shape.kv_heads=3", "model.shape.kv_heads=3 does not divide model.shape.heads=8"),
    ("model.shape.vocab_size=300", "model.shape.vocab_size=300 is smaller than model.shape.tokenizer_vocab=512"),
    ("model.shape.tokenizer_vocab=100", "model.shape.tokenizer_vocab=100 is below 258"),
    ("model.shape.architecture=gpt2", "model.shape.architecture='gpt2': choose one of llama, qwen2"),
    ("model.shape.layers=0", "model.shape.layers=0 must be a positive integer"),
    ("model.init=pretrained", "model.init='pretrained': choose one of tiny, random"),
])
def test_a_bad_shape_fails_when_composed_naming_the_key(override, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(["model=random_25m", override])


def test_a_bad_shape_is_refused_when_built_directly_too():
    with pytest.raises(ValueError, match=re.escape("model.shape.heads=14 does not divide model.shape.hidden_size=64")):
        ModelShape(**{**SMALL, "heads": 14, "kv_heads": 2})


def test_gpu_check_says_there_is_no_gpu_and_exits_0(monkeypatch, capsys):
    gpu_check = gpu_check_module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    assert "gpu_check: no CUDA GPU on this machine" in capsys.readouterr().out


def test_gpu_check_publishes_the_bytes_the_learner_publishes(tmp_path):
    from streams.weights import weights_to_bytes

    gpu_check = gpu_check_module()
    model = AutoModelForCausalLM.from_pretrained(ensure_random_model(tmp_path, ModelShape(**SMALL)))
    assert gpu_check.serialise(model) == weights_to_bytes(model)



@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                                        ("NVIDIA H100 NVL", 835.0), ("NVIDIA H200", 989.0), ("NVIDIA H200 NVL", 835.0),
                                        ("NVIDIA L40S", 362.0), ("NVIDIA L40", 181.0), ("NVIDIA L4", 121.0),
                                        ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA GeForce RTX 4090", None)])
def test_gpu_check_finds_each_gpus_own_bf16_peak(name, peak):
    """The dense bf16 peaks of NVIDIA's data sheets (half their sparse figures), each name its own: an H200 NVL is
    not an H200, nor an L40 an L4."""
    assert gpu_check_module().bf16_peak_tflops(name) == peak


def test_gpu_check_loop_figures_are_the_runs_totals_over_its_training_time():
    gpu_check = gpu_check_module()
    rows = [{"version": 1, "elapsed_s": 2.0, "episodes": 64, "tokens": 512},
            {"version": 4, "elapsed_s": 8.0, "episodes": 200, "tokens": 1600}]
    summary = {"interrupted": False, "learner_busy": 0.75, "run_dir": "runs/loop"}
    figures = gpu_check.loop_figures(summary, rows, versions=3)
    assert figures["loop_versions_per_s"] == 0.5 and figures["loop_episodes_per_s"] == 25.0
    assert figures["loop_gen_tokens_per_s"] == 200.0 and figures["loop_learner_busy"] == 0.75
    with pytest.raises(SystemExit, match="the loop reached version 4 of 5"):
        gpu_check.loop_figures(summary, rows, versions=5)
    with pytest.raises(SystemExit, match="reached version 4 of 3 \\(interrupted\\)"):
        gpu_check.loop_figures({**summary, "interrupted": True}, rows, versions=3)


ABSENT = """
import runpy, sys


class Absent:  # as if these were not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"ray", "vllm", "zmq", "trio", "hydra"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, Absent())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_gpu_check_runs_on_the_cpu_without_ray_vllm_zmq_or_trio(tmp_path):
    shape = tmp_path / "small.yaml"
    shape.write_text(json.dumps({"init": "random", "shape": {"architecture": "llama", **SMALL}}))  # JSON is YAML
    args = ["--device", "cpu", "--shape", str(shape), "--steps", "1", "--batch", "2", "--seq-len", "16",
            "--gen-batch", "2", "--gen-tokens", "4", "--cache-dir", str(tmp_path)]
    done = subprocess.run([sys.executable, "-c", ABSENT, str(GPU_CHECK), *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"gpu=(\S+) learner_tokens_per_s=(\S+) mfu=(\S+) peak_mem_gib=(\S+) "
                         r"gen_tokens_per_s=(\S+) publish_s=(\S+)", last)
    assert match, last
    name, learner, mfu, memory, generation, publish = match.groups()
    assert name == "cpu" and float(learner) > 0 and float(generation) > 0 and float(publish) >= 0
    assert mfu == "nan" and memory == "nan"  # no bf16 peak and no CUDA memory counter on the CPU
