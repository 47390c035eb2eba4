"""Size rules: vision tokens of an image, size buckets, modality combination names."""

from __future__ import annotations

import math

from quantkit.taxonomy import ImageRule

BUCKET_NAMES = {"image": ("small", "medium", "large"), "video": ("short", "medium", "long")}
BUCKET_NAMES["audio"] = BUCKET_NAMES["video"]


def image_tokens(width: int, height: int, rule: ImageRule) -> int:
    """Vision tokens of an image under the dynamic-resolution rule (Qwen2-VL's smart resize):
    scale into [min_pixels, max_pixels] keeping the aspect ratio, round each side to
    patch_size * merge_size, then one token per merge_size x merge_size patches."""
    factor = rule.patch_size * rule.merge_size
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > rule.max_pixels:
        beta = math.sqrt((height * width) / rule.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < rule.min_pixels:
        beta = math.sqrt(rule.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return (h_bar // rule.patch_size) * (w_bar // rule.patch_size) // (rule.merge_size**2)


def bucket_label(kind: str, value: float, edges: list[float]) -> str:
    index = sum(1 for edge in edges if value >= edge)
    names = BUCKET_NAMES[kind]
    name = names[index] if len(edges) == len(names) - 1 else f"b{index}"
    return f"{kind}:{name}"


def modality_name(n_images: int, n_videos: int, n_audios: int, video_has_sound: bool) -> str:
    parts = []
    if n_images:
        parts.append("multi-image" if n_images > 1 else "image")
    if n_videos:
        parts.append("video")
    if n_audios or video_has_sound:
        parts.append("audio")
    return "+".join(parts) if parts else "text"
