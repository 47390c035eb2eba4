"""A byte-level BPE tokenizer trained on the spot, with a model family's real special tokens.

Real Qwen tokenizers cannot be downloaded here, so tiny models get a small tokenizer that keeps
what matters for quantization: the same special tokens (the processors look them up by text),
a Qwen-style chat template and a vocabulary that fits the tiny embedding table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from quantkit.zoo.vocabulary import corpus_lines

# Tokens every Qwen chat model has, in the order the real vocabularies list them.
QWEN_CHAT_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

QWEN_VL_TOKENS = [
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

QWEN_OMNI_TOKENS = [
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
]

# Named special tokens the processors read as tokenizer attributes (tokenizer.image_token, ...).
QWEN_VL_NAMED = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
}
QWEN_OMNI_NAMED = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}

# Qwen-style ChatML template. Media parts of a message become the family's placeholder runs; the
# processor expands each placeholder to as many tokens as the encoder produces.
_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{- '__IMAGE__' }}"
    "{%- elif part['type'] == 'video' %}{{- '__VIDEO__' }}"
    "{%- elif part['type'] == 'audio' %}{{- '__AUDIO__' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_PLACEHOLDERS = {
    "qwen-vl": {
        "__IMAGE__": "<|vision_start|><|image_pad|><|vision_end|>",
        "__VIDEO__": "<|vision_start|><|video_pad|><|vision_end|>",
        "__AUDIO__": "",
    },
    "qwen-omni": {
        "__IMAGE__": "<|vision_bos|><|IMAGE|><|vision_eos|>",
        "__VIDEO__": "<|vision_bos|><|VIDEO|><|vision_eos|>",
        "__AUDIO__": "<|audio_bos|><|AUDIO|><|audio_eos|>",
    },
    "qwen-text": {"__IMAGE__": "", "__VIDEO__": "", "__AUDIO__": ""},
}


def chat_template(family: str) -> str:
    template = _CHAT_TEMPLATE
    for marker, text in _PLACEHOLDERS[family].items():
        template = template.replace(marker, text)
    return template


@dataclass(frozen=True)
class TokenizerSpec:
    family: str  # "qwen-vl", "qwen-omni" or "qwen-text"
    vocab_size: int
    special_tokens: list[str] = field(default_factory=list)
    named_tokens: dict[str, str] = field(default_factory=dict)
    # Split numbers into single digits before BPE, as the real Qwen2/Qwen3 tokenizers do (their
    # pre-tokenizer matches \p{N} one digit at a time). The random-weight zoo keeps the plain byte-level
    # BPE its recorded token counts were made with; a model that must learn to read and add numbers
    # needs digits as units: with merged "63" / "105" tokens it cannot compose them.
    individual_digits: bool = False


def spec_for(family: str, vocab_size: int) -> TokenizerSpec:
    if family == "qwen-vl":
        return TokenizerSpec(family, vocab_size, QWEN_CHAT_TOKENS + QWEN_VL_TOKENS, QWEN_VL_NAMED)
    if family == "qwen-omni":
        return TokenizerSpec(family, vocab_size, QWEN_CHAT_TOKENS + QWEN_OMNI_TOKENS, QWEN_OMNI_NAMED)
    if family == "qwen-text":
        return TokenizerSpec(family, vocab_size, list(QWEN_CHAT_TOKENS), {})
    raise ValueError(f"unknown tokenizer family {family!r}")


def _training_corpus() -> list[str]:
    # Deterministic text covering what the demo prompts say; the BPE merges only need to be
    # plausible, not good, since the model weights are random.

    return corpus_lines()


def build_tokenizer(spec: TokenizerSpec) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer of at most ``spec.vocab_size`` entries.

    Training with one thread keeps the merges, and so the saved file, identical between runs.
    """
    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if spec.individual_digits:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=spec.special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_corpus(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=[
            t for t in spec.special_tokens if t not in ("<|endoftext|>", "<|im_end|>")
        ],
        model_max_length=32768,
        chat_template=chat_template(spec.family),
        padding_side="left",
        **spec.named_tokens,
    )
    return wrapped
