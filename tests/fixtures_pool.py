"""Real-format pool fixtures: records written in each framework's documented shape (LLaMA-Factory's
data/README and dataset_info.json, ms-swift's custom-dataset page, Qwen-VL's fine-tuning demos,
OpenAI / Qwen content lists, Hugging Face datasets), with media generated here."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
from PIL import Image

from quantkit.media import write_mp4
from quantkit.synthetic.media import write_wav


class Media:
    """Writes small real media files under ``root`` and returns their paths relative to it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = 0

    def _name(self, folder: str, ext: str) -> tuple[str, Path]:
        self.count += 1
        rel = f"{folder}/{self.count}.{ext}"
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        return rel, path

    def image(self, folder: str = "images", ext: str = "jpg", size=(64, 48)) -> str:
        rel, path = self._name(folder, ext)
        color = ((self.count * 53) % 255, (self.count * 97) % 255, 120)
        Image.new("RGB", size, color).save(path)
        return rel

    def audio(self, folder: str = "audios", seconds: float = 1.0) -> str:
        rel, path = self._name(folder, "wav")
        t = np.arange(int(16000 * seconds)) / 16000
        write_wav(path, 0.2 * np.sin(2 * np.pi * (220 + 10 * self.count) * t))
        return rel

    def video(self, folder: str = "videos", seconds: int = 2, sound: bool = False) -> str:
        rel, path = self._name(folder, "mp4")
        frames = (np.full((48, 64, 3), (i * 37 + self.count) % 255, np.uint8) for i in range(seconds * 2))
        track = (0.2 * np.sin(np.arange(16000 * seconds) / 16000 * 2 * np.pi * 300)).astype(np.float32)
        write_mp4(path, frames, (64, 48), 2, audio=track if sound else None)
        return rel

    def png_bytes(self, size=(40, 30)) -> bytes:
        import io

        self.count += 1
        buffer = io.BytesIO()
        Image.new("RGB", size, ((self.count * 31) % 255, 10, 200)).save(buffer, format="PNG")
        return buffer.getvalue()

    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png_bytes()).decode()


def write_json(path: Path, records: list[dict]) -> Path:
    """A JSON array, indented as the frameworks' demo files are."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def llamafactory_data(root: Path) -> Path:
    """A LLaMA-Factory ``data/`` folder: dataset_info.json and the demo files' shapes (alpaca,
    identity, glaive tool calls, mllm image / video / audio / video+audio, a hub-only entry)."""
    data = root / "data"
    media = Media(data)
    write_json(
        data / "alpaca_en_demo.json",
        [
            {"instruction": f"Give three tips for staying healthy ({i}).", "input": "", "output": f"1. Eat well {i}."}
            for i in range(4)
        ]
        + [{"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour", "system": "Be terse.",
            "history": [["Hi", "Hello!"]]}],
    )  # fmt: skip
    write_json(
        data / "identity.json",
        [{"instruction": "hi", "input": "", "output": "Hello! I am {{name}}, an AI assistant."}],
    )
    tools = json.dumps([{"name": "get_price", "description": "price of a product", "parameters": {"type": "object"}}])
    write_json(
        data / "glaive_toolcall_en_demo.json",
        [
            {
                "conversations": [
                    {"from": "human", "value": f"What does the kettle {i} cost?"},
                    {"from": "function_call", "value": json.dumps({"name": "get_price", "arguments": {"item": "kettle"}})},
                    {"from": "observation", "value": json.dumps({"price": 20 + i})},
                    {"from": "gpt", "value": f"It costs {20 + i} dollars."},
                ],
                "tools": tools,
            }
            for i in range(3)
        ],
    )
    write_json(
        data / "mllm_demo.json",
        [
            {
                "messages": [
                    {"content": "<image>Who are they?", "role": "user"},
                    {"content": f"They are players {i}.", "role": "assistant"},
                    {"content": "What are they doing?<image>", "role": "user"},
                    {"content": "Celebrating.", "role": "assistant"},
                ],
                "images": [media.image("mllm_demo_data"), media.image("mllm_demo_data")],
            }
            for i in range(3)
        ],
    )
    write_json(
        data / "mllm_video_demo.json",
        [
            {
                "messages": [
                    {"content": "<video>Why is this video funny?", "role": "user"},
                    {"content": f"Because of the cat {i}.", "role": "assistant"},
                ],
                "videos": [media.video("mllm_demo_data")],
            }
            for i in range(2)
        ],
    )
    write_json(
        data / "mllm_audio_demo.json",
        [
            {
                "messages": [
                    {"content": "<audio>What's that sound?", "role": "user"},
                    {"content": f"A tone {i}.", "role": "assistant"},
                ],
                "audios": [media.audio("mllm_demo_data")],
            }
            for i in range(2)
        ],
    )
    write_jsonl(
        data / "v1_multimodal_demo.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "value": media.image("mllm_demo_data")},
                                                 {"type": "text", "value": "Describe the image."}]},  # fmt: skip
                    {"role": "assistant", "content": [{"type": "text", "value": "A plain colour."}]},
                ]
            }
        ],
    )
    sharegpt_openai = {
        "formatting": "sharegpt",
        "columns": {"messages": "messages"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    }
    info = {
        "identity": {"file_name": "identity.json"},
        "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"},
        "glaive_toolcall_en_demo": {
            "file_name": "glaive_toolcall_en_demo.json",
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "tools": "tools"},
        },
        "mllm_demo": {**sharegpt_openai, "file_name": "mllm_demo.json", "columns": {"messages": "messages", "images": "images"}},
        "mllm_video_demo": {**sharegpt_openai, "file_name": "mllm_video_demo.json",
                            "columns": {"messages": "messages", "videos": "videos"}},  # fmt: skip
        "mllm_audio_demo": {**sharegpt_openai, "file_name": "mllm_audio_demo.json",
                            "columns": {"messages": "messages", "audios": "audios"}},  # fmt: skip
        "alpaca_gpt4_en": {"hf_hub_url": "llamafactory/alpaca_gpt4_en", "ms_hub_url": "llamafactory/alpaca_gpt4_en"},
    }
    write_json(data / "dataset_info.json", [])
    (data / "dataset_info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return data


# The tiers and buckets of the small test taxonomies (tasks follow it).
TWO_TIER_HEADER = """\
version: 1
tiers: {high: 3.0, low: 1.0}
buckets:
  image_tokens: [256, 1024]
  video_seconds: [10, 60]
  audio_seconds: [10, 30]
  image_rule: {patch_size: 14, merge_size: 2, min_pixels: 3136, max_pixels: 12845056}
tasks:
"""
# Two text tasks, one per tier: the smallest taxonomy that still stratifies (calibrate, faults).
TWO_TIER_TAXONOMY = TWO_TIER_HEADER + """\
  - {name: precise, family: text, modalities: [text], tier: high}
  - {name: casual, family: text, modalities: [text], tier: low}
"""
