"""config.json files with the real shapes of four flagship models, for `quantize --dry-run`.

The values are the architectures' published hyper-parameters as known to the author (no file was
downloaded). Unsure, and each moving the plan by a few percent at most: the vision towers'
intermediate sizes (3420 / 3456 / 4304), Qwen3-Omni's audio encoder (taken as Qwen2.5-Omni's:
32 layers, d_model 1280, downsample 480), Qwen3-Omni's dense intermediate_size (unused: every
layer is MoE), rope settings (library defaults; they do not change any size). Thinker-only
configs for the Omni models (the adapters take the whole upstream model as well). Written with transformers' own config
classes so that the files are what transformers 5 reads. Run: python bench/real_configs.py OUT
(bench/configs/ holds the output).
"""

from __future__ import annotations

import sys
from pathlib import Path

QWEN25_VISION = dict(
    depth=32,
    hidden_size=1280,
    intermediate_size=3420,
    num_heads=16,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31],
    in_channels=3,
)
QWEN3_VISION = dict(
    depth=27,
    hidden_size=1152,
    intermediate_size=4304,
    num_heads=16,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    num_position_embeddings=2304,
    deepstack_visual_indexes=[8, 16, 24],
)
AUDIO = dict(
    d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120, num_mel_bins=128
)


def configs() -> dict:
    from transformers import Qwen2_5_VLConfig, Qwen2_5OmniThinkerConfig, Qwen3VLConfig
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeThinkerConfig

    return {
        "Qwen2.5-Omni-7B": Qwen2_5OmniThinkerConfig(
            text_config=dict(
                hidden_size=3584,
                intermediate_size=18944,
                num_hidden_layers=28,
                num_attention_heads=28,
                num_key_value_heads=4,
                vocab_size=152064,
                tie_word_embeddings=False,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 1000000.0,
                    "mrope_section": [16, 24, 24],
                },
            ),
            vision_config={**QWEN25_VISION, "out_hidden_size": 3584, "intermediate_size": 3420},
            audio_config={**AUDIO, "output_dim": 3584},
            architectures=["Qwen2_5OmniThinkerForConditionalGeneration"],
            dtype="bfloat16",
        ),
        "Qwen3-Omni-30B-A3B": Qwen3OmniMoeThinkerConfig(
            text_config=dict(
                hidden_size=2048,
                intermediate_size=768,
                moe_intermediate_size=768,
                num_hidden_layers=48,
                num_attention_heads=32,
                num_key_value_heads=4,
                head_dim=128,
                num_experts=128,
                num_experts_per_tok=8,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                vocab_size=152064,
                tie_word_embeddings=False,
            ),
            vision_config={**QWEN3_VISION, "out_hidden_size": 2048},
            audio_config={**AUDIO, "output_dim": 2048, "downsample_hidden_size": 480},
            architectures=["Qwen3OmniMoeThinkerForConditionalGeneration"],
            dtype="bfloat16",
        ),
        "Qwen3-VL-8B": Qwen3VLConfig(
            text_config=dict(
                hidden_size=4096,
                intermediate_size=12288,
                num_hidden_layers=36,
                num_attention_heads=32,
                num_key_value_heads=8,
                head_dim=128,
                vocab_size=151936,
                tie_word_embeddings=False,
            ),
            vision_config={**QWEN3_VISION, "out_hidden_size": 4096},
            architectures=["Qwen3VLForConditionalGeneration"],
            tie_word_embeddings=False,
            dtype="bfloat16",
        ),
        "Qwen2.5-VL-72B": Qwen2_5_VLConfig(
            text_config=dict(
                hidden_size=8192,
                intermediate_size=29568,
                num_hidden_layers=80,
                num_attention_heads=64,
                num_key_value_heads=8,
                vocab_size=152064,
                tie_word_embeddings=False,
            ),
            vision_config={**QWEN25_VISION, "out_hidden_size": 8192, "intermediate_size": 3456},
            architectures=["Qwen2_5_VLForConditionalGeneration"],
            tie_word_embeddings=False,
            dtype="bfloat16",
        ),
    }


def write(out: Path) -> list[Path]:
    written = []
    for name, config in configs().items():
        folder = Path(out) / name
        config.save_pretrained(folder)
        written.append(folder)
    return written


if __name__ == "__main__":
    for folder in write(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/configs")):
        print(folder)
