"""Sequence lengths of pool records under a model's own processor and chat template.

Text tokens come from rendering the chat template and tokenizing it. Media tokens come from the
processor's own size rules (``get_number_of_image_patches``, ``get_num_of_video_patches``, the
feature extractor's frame count), fed with header sizes, so no pixel is decoded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from quantkit.chat import chat_messages
from quantkit.errors import InputError
from quantkit.media import probe_audio, probe_image, probe_video
from quantkit.taxonomy import ImageRule


def load_processor(model_dir: Path):
    from transformers import AutoProcessor

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise InputError("not a model folder (no config.json)", path=model_dir)
    try:
        return AutoProcessor.from_pretrained(str(model_dir))
    except (OSError, ValueError) as err:
        raise InputError(f"cannot load the model's processor: {err}", path=model_dir) from None


def image_rule_of(processor) -> ImageRule | None:
    """The dynamic-resolution rule of the model's image processor, for size buckets."""
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None:
        return None
    size = dict(getattr(image_processor, "size", None) or {})
    return ImageRule(
        patch_size=int(image_processor.patch_size),
        merge_size=int(image_processor.merge_size),
        min_pixels=int(size.get("shortest_edge") or getattr(image_processor, "min_pixels", 56 * 56)),
        max_pixels=int(size.get("longest_edge") or getattr(image_processor, "max_pixels", 28 * 28 * 1280)),
    )


# No tokenizer quantkit serves averages more characters than this per token over a long text, so a
# prefix this many times the token limit long tells whether a text is over the limit.
CHARS_PER_TOKEN_BOUND = 32


@dataclass
class TokenCounter:
    processor: object

    def __post_init__(self) -> None:
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.images = getattr(self.processor, "image_processor", None)
        self.videos = getattr(self.processor, "video_processor", None)
        self.audio = getattr(self.processor, "feature_extractor", None)

    def __call__(self, payload: dict, limit: int | None = None) -> int:
        """The sample's sequence length. With ``limit``, a text far longer than ``limit`` tokens
        is tokenised only up to CHARS_PER_TOKEN_BOUND x limit characters: if that prefix already
        holds more than ``limit`` tokens, its count (a lower bound, over the limit) is returned."""
        owner = self.processor if hasattr(self.processor, "apply_chat_template") else self.tokenizer
        text = owner.apply_chat_template(chat_messages(payload["messages"]), tokenize=False)
        if limit is not None and len(text) > CHARS_PER_TOKEN_BOUND * limit:
            head = len(self.tokenizer(text[: CHARS_PER_TOKEN_BOUND * limit], add_special_tokens=False)["input_ids"])
            if head > limit:
                return head
        count = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        for path in payload["images"]:
            count += self._image(Path(path)) - 1  # the placeholder token is replaced
        for path in payload["videos"]:
            count += self._video(Path(path)) - 1
        for path in payload["audios"]:
            count += self._audio(probe_audio(Path(path)).duration_s) - 1
        return count

    def _image(self, path: Path) -> int:
        if self.images is None:
            return 1
        info = probe_image(path)
        patches = self.images.get_number_of_image_patches(info.height, info.width, {})
        return patches // (self.images.merge_size**2)

    def _video(self, path: Path) -> int:
        if self.videos is None:
            return 1
        info = probe_video(path)
        fps = float(getattr(self.videos, "fps", None) or 2.0)
        max_frames = int(getattr(self.videos, "max_frames", None) or 64)
        min_frames = int(getattr(self.videos, "min_frames", None) or 2)
        frames = min(max(round(info.duration_s * fps), min_frames), max_frames, max(info.frames, 1))
        frames += frames % 2  # frames come in temporal pairs (see quantkit.media.load_video)
        patches = self.videos.get_num_of_video_patches(frames, info.height, info.width, {})
        tokens = patches // (self.videos.merge_size**2)
        if info.has_audio and self.audio is not None:
            tokens += self._audio(info.duration_s)
        return tokens

    def _audio(self, seconds: float) -> int:
        if self.audio is None:
            return 1
        # Whisper-style features: one frame per hop, clipped to the extractor's window; the
        # Qwen audio towers halve the length twice (conv stride, then pooling).
        window = float(getattr(self.audio, "chunk_length", 30))
        hop = int(getattr(self.audio, "hop_length", 160))
        rate = int(getattr(self.audio, "sampling_rate", 16000))
        frames = math.ceil(min(seconds, window) * rate / hop)
        return max(1, ((frames - 1) // 2 + 1 - 2) // 2 + 1)


def count_tokens(payloads: list[str], processor) -> list[int]:
    counter = TokenCounter(processor)
    return [counter(json.loads(payload)) for payload in payloads]
