"""Prompts as a model is used to them: an env's observations rendered through the model's chat template (or as
raw text), with the history of a multi-turn game shown one of three ways, then tokenized once.

A ``PromptFormat`` is the run's ``prompt`` section resolved: its ``frame`` (``chat``: the tokenizer's own chat
template, ``raw``: the text as it is), an optional ``system`` message, the ``user`` text each observation is put in
(``{observation}`` and ``{role}`` are its variables) and the ``history`` shown:

- ``last``: the current observation only (a game whose observation says everything, such as a board);
- ``transcript``: every earlier observation and the policy's own moves, then the current observation, as one user
  message;
- ``chat``: the game as alternating turns, each observation a user message and each earlier completion the
  assistant's message (needs the ``chat`` frame).

``prompt.template`` is ``chat``, ``raw``, or the name of a template file in ``configs/templates/`` (a frame, a
system message, the user text, and the answer form it asks for: ``spiral`` asks for reasoning and a ``\\boxed{}``
answer, as SPIRAL and GEM prompt their games).

Rendered chat text is tokenized as ``apply_chat_template`` tokenizes it (no special tokens added: the template
writes its own); raw text as the tokenizer encodes it. tidal's tiny model gets a ChatML template of its own
(`give_chat_template`), so the default job takes the path a real instruct model takes.

Nothing here imports torch, trio or transformers: the env actor renders with its tokenizer, and the tiny model's
warm-up renders its demonstrations the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "configs" / "templates"
FRAMES = ("chat", "raw")
HISTORIES = ("last", "transcript", "chat")
VARIABLES = ("observation", "role")
_VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

# tidal's own writing of two common chat formats (a ChatML one, as Qwen's, and a Llama-3 one): the templates of
# the models tidal makes, and the test bench of the renderer (benchmarks/formats.py).
CHATML = ("{%- for message in messages %}"
          "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
          "{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
LLAMA3 = ("{{- bos_token }}"
          "{%- for message in messages %}"
          "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
          " + '<|eot_id|>' }}"
          "{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")


@dataclass(frozen=True)
class ChatStyle:
    template: str
    specials: tuple[str, ...]  # tokens the template writes, added to the tokenizer as special tokens
    end_of_turn: str  # the token that ends the assistant's message: the model's EOS
    bos: str | None = None


CHAT_STYLES = {
    "chatml": ChatStyle(CHATML, ("<|im_start|>", "<|im_end|>"), "<|im_end|>"),
    "llama3": ChatStyle(LLAMA3, ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                        "<|eot_id|>", bos="<|begin_of_text|>"),
}


def give_chat_template(tokenizer, style: str = "chatml"):
    """``tokenizer`` with the chat ``style``'s template, its tokens as special tokens and its end of turn as EOS
    (as an instruct model's tokenizer has them). Returns the tokenizer."""
    if style not in CHAT_STYLES:
        raise ValueError(f"unknown chat style {style!r}; choose one of {', '.join(CHAT_STYLES)}")
    chat = CHAT_STYLES[style]
    tokenizer.add_special_tokens({"additional_special_tokens": list(chat.specials)})
    tokenizer.eos_token = chat.end_of_turn
    if chat.bos:  # as Llama-3's tokenizer: encoding text puts BOS first; a rendered template writes its own
        from tokenizers.processors import TemplateProcessing

        tokenizer.bos_token = chat.bos
        tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
            single=f"{chat.bos} $A", pair=f"{chat.bos} $A {chat.bos} $B",
            special_tokens=[(chat.bos, tokenizer.convert_tokens_to_ids(chat.bos))])
    tokenizer.chat_template = chat.template
    return tokenizer


@dataclass(frozen=True)
class PromptFormat:
    """How a turn's prompt is rendered (see the module)."""

    frame: str = "raw"  # chat | raw
    history: str = "last"  # last | transcript | chat
    system: str | None = None
    user: str = "{observation}"
    answer: str | None = None  # the answer form a named template asks for (env.args.answer must read it)
    name: str = "raw"  # the template's name, for messages

    def __post_init__(self):
        problems = format_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def plain(self) -> bool:
        """Today's raw prompt: the observation's own text, nothing around it."""
        return self.frame == "raw" and self.history == "last" and not self.system and self.user == "{observation}"


def format_problems(f: PromptFormat) -> list[str]:
    problems = []
    if f.frame not in FRAMES:
        problems.append(f"prompt.template {f.name!r}: frame must be one of {', '.join(FRAMES)}, not {f.frame!r}")
    if f.history not in HISTORIES:
        problems.append(f"prompt.history={f.history!r}: choose one of {', '.join(HISTORIES)}")
    elif f.history == "chat" and f.frame != "chat":
        problems.append(f"prompt.history=chat shows the game as chat turns: it needs a chat frame, and the template "
                        f"{f.name!r} is raw text (choose history last or transcript)")
    if not isinstance(f.user, str) or "{observation}" not in f.user:
        problems.append(f"prompt.template {f.name!r}: its user text does not render: it has no {{observation}}")
    else:
        unknown = sorted(set(_VARIABLE.findall(f.user)) - set(VARIABLES))
        if unknown:
            problems.append(f"prompt.template {f.name!r}: its user text does not render: unknown variable(s) "
                            f"{', '.join('{' + u + '}' for u in unknown)} (known: {', '.join(VARIABLES)})")
    if f.system is not None and not isinstance(f.system, str):
        problems.append(f"prompt.system must be text or null, not {type(f.system).__name__}")
    return problems


def template_names() -> list[str]:
    return ["chat", "raw", *sorted(p.stem for p in TEMPLATES_DIR.glob("*.yaml"))]


def prompt_format(template: str = "raw", history: str = "last", system: str | None = None) -> PromptFormat:
    """The ``prompt`` section resolved: ``template`` is chat, raw, or a file of ``configs/templates/``; a ``system``
    given here wins over the template's."""
    if template in FRAMES:
        return PromptFormat(frame=template, history=history, system=system, name=template)
    path = TEMPLATES_DIR / f"{template}.yaml"
    if not re.fullmatch(r"[A-Za-z0-9_-]+", template or "") or not path.is_file():
        raise ValueError(f"prompt.template={template!r}: choose one of {', '.join(template_names())}")
    import yaml

    spec = yaml.safe_load(path.read_text()) or {}
    known = {"frame", "system", "user", "answer"}
    if not isinstance(spec, dict) or set(spec) - known:
        raise ValueError(f"prompt.template {template!r} ({path}): a mapping of {', '.join(sorted(known))}, "
                         f"not {sorted(spec) if isinstance(spec, dict) else type(spec).__name__}")
    return PromptFormat(frame=spec.get("frame", "chat"), history=history,
                        system=system if system is not None else spec.get("system"),
                        user=spec.get("user", "{observation}"), answer=spec.get("answer"), name=template)


class PromptRenderer:
    """A turn's prompt ids from the observation and the seat's earlier turns, as ``format`` says.

    ``codec`` encodes text (``encode(text)``, and ``encode_chat(text)`` without added special tokens); ``tokenizer``
    renders chat messages (its ``apply_chat_template``). Rendered chat texts are kept for repeats (a board seen
    again renders the same prompt)."""

    def __init__(self, format: PromptFormat, codec, tokenizer=None):
        self.format, self.codec, self.tokenizer = format, codec, tokenizer
        self._plain = format.plain  # the format is frozen: asked once, not every turn
        if format.frame == "chat":
            if tokenizer is None or not getattr(tokenizer, "chat_template", None):
                raise ValueError(f"prompt.template={format.name}: the model's tokenizer has no chat template "
                                 "(choose prompt.template=raw, or a model with one)")

    def user_text(self, observation: str, role: str = "") -> str:
        return self.format.user.replace("{role}", role).replace("{observation}", observation)

    def messages(self, observation: str, earlier: list[tuple[str, str]] = (), role: str = "") -> list[dict]:
        """The chat messages of a turn: ``earlier`` holds the seat's (observation, completion text) turns."""
        f = self.format
        messages = [{"role": "system", "content": f.system}] if f.system else []
        if f.history == "chat":
            for seen, said in earlier:
                messages += [{"role": "user", "content": self.user_text(seen, role)},
                             {"role": "assistant", "content": said}]
            return messages + [{"role": "user", "content": self.user_text(observation, role)}]
        if f.history == "transcript" and earlier:
            observation = transcript(observation, earlier)
        return messages + [{"role": "user", "content": self.user_text(observation, role)}]

    def text(self, observation: str, earlier: list[tuple[str, str]] = (), role: str = "") -> str:
        messages = self.messages(observation, earlier, role)
        if self.format.frame == "chat":
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n\n".join(m["content"] for m in messages)  # raw: a system text, then the user text

    def ids(self, observation: str, earlier: list[tuple[str, str]] = (), role: str = "") -> list[int]:
        if self._plain:
            return self.codec.encode(observation)
        text = self.text(observation, earlier, role)
        return self.codec.encode_chat(text) if self.format.frame == "chat" else self.codec.encode(text)


def chat_problems(tokenizers: dict, template: str) -> list[str]:
    """A model (``tokenizers``: model path -> its tokenizer) whose tokenizer has no chat template, when the
    ``template`` renders through one."""
    if prompt_format(template).frame != "chat":
        return []
    return [f"prompt.template={template} renders through the model's chat template, and {path}'s tokenizer has none "
            f"(choose prompt.template=raw, or a model with one)" for path, tokenizer in tokenizers.items()
            if not getattr(tokenizer, "chat_template", None)]


def transcript(observation: str, earlier: list[tuple[str, str]]) -> str:
    """The game so far as one text: each earlier observation and the policy's move after it, then the current
    observation."""
    parts = [f"{seen}\nYou: {said}" for seen, said in earlier]
    return "\n\n".join(parts + [observation])
