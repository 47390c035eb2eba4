"""Real media files made on the spot: images (PIL), MP4 video with or without AAC audio (PyAV), WAV.

Everything here is deterministic: randomness comes only from the ``numpy.random.Generator`` the caller
passes in, and the writers avoid timestamps and other per-run metadata, so the same inputs give the
same bytes.
"""

from __future__ import annotations

import wave
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

SAMPLE_RATE = 16_000

RGB = tuple[int, int, int]
Box = tuple[int, int, int, int]  # [x1, y1, x2, y2], inclusive pixel coordinates as PIL draws them

COLOR_RGB: dict[str, RGB] = {
    "red": (220, 30, 30),
    "blue": (30, 70, 220),
    "green": (30, 160, 60),
    "black": (15, 15, 15),
    "white": (250, 250, 250),
    "yellow": (240, 210, 20),
    "purple": (130, 40, 170),
    "orange": (245, 130, 20),
    "pink": (240, 120, 180),
    "gray": (128, 128, 128),
}
BACKGROUND_RGB: dict[str, RGB] = {
    "light gray": (215, 215, 215),
    "beige": (235, 222, 195),
    "light blue": (195, 218, 240),
    "dark green": (25, 70, 45),
    "dark gray": (55, 55, 60),
}


def contrasting_colors(background: RGB) -> list[str]:
    """Object colour names far enough from ``background`` to stand out (why: a white box on beige
    would make a grounding answer unverifiable by eye)."""
    return [
        name
        for name, rgb in COLOR_RGB.items()
        if sum(abs(a - b) for a, b in zip(rgb, background, strict=True)) > 160
    ]


# ---------------------------------------------------------------------------------------------- images


@lru_cache(maxsize=64)
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's bundled font at ``size`` px; the fixed bitmap font where FreeType is missing."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):
        return ImageFont.load_default()


def fitting_font(text: str, max_width: int, max_size: int, min_size: int = 8):
    """The largest font, at most ``max_size`` px, in which ``text`` fits ``max_width``."""
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    size = max(max_size, min_size)
    while size > min_size and draw.textlength(text, font=font(size)) > max_width:
        size -= 1
    return font(size)


def save_image(image: Image.Image, path: Path) -> None:
    """PNG or JPEG by suffix, with fixed settings and no metadata, so bytes repeat."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() in (".jpg", ".jpeg"):
        image.save(path, format="JPEG", quality=88)
    else:
        image.save(path, format="PNG", compress_level=6)


def text_image(lines: Sequence[str], size: tuple[int, int], background: RGB, ink: RGB) -> Image.Image:
    """Lines of text centred on a flat background, as on a price card or a shop sign."""
    width, height = size
    image = Image.new("RGB", size, background)
    draw = ImageDraw.Draw(image)
    line_height = height // (len(lines) + 1)
    longest = max(lines, key=len)
    face = fitting_font(longest, int(width * 0.88), int(line_height * 0.7))
    for row, line in enumerate(lines):
        y = line_height * (row + 1)
        draw.text((width // 2, y), line, fill=ink, font=face, anchor="mm")
    return image


def table_image(rows: Sequence[Sequence[str]], size: tuple[int, int]) -> Image.Image:
    """A ruled table with a shaded header row; ``rows[0]`` is the header."""
    width, height = size
    image = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(image)
    margin = max(4, width // 20)
    n_rows, n_cols = len(rows), len(rows[0])
    cell_w = (width - 2 * margin) // n_cols
    cell_h = min((height - 2 * margin) // n_rows, cell_w)
    top = (height - cell_h * n_rows) // 2
    widest = max((cell for row in rows for cell in row), key=len)
    face = fitting_font(widest, int(cell_w * 0.85), int(cell_h * 0.55))
    draw.rectangle((margin, top, margin + cell_w * n_cols, top + cell_h), fill=(210, 210, 210))
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            x, y = margin + c * cell_w, top + r * cell_h
            draw.rectangle((x, y, x + cell_w, y + cell_h), outline=(0, 0, 0), width=max(1, width // 300))
            draw.text((x + cell_w // 2, y + cell_h // 2), cell, fill=(0, 0, 0), font=face, anchor="mm")
    return image


@dataclass(frozen=True)
class Shape:
    kind: str  # "box", "circle" or "triangle"
    color: str
    box: Box
    label: str = ""


def scene_image(size: tuple[int, int], background: str, shapes: Sequence[Shape]) -> Image.Image:
    """Flat shapes (products) on a flat background; a label, when given, is written inside its shape."""
    image = Image.new("RGB", size, BACKGROUND_RGB[background])
    draw = ImageDraw.Draw(image)
    for shape in shapes:
        fill = COLOR_RGB[shape.color]
        x1, y1, x2, y2 = shape.box
        if shape.kind == "circle":
            draw.ellipse(shape.box, fill=fill)
        elif shape.kind == "triangle":
            draw.polygon([((x1 + x2) // 2, y1), (x2, y2), (x1, y2)], fill=fill)
        else:
            draw.rectangle(shape.box, fill=fill)
        if shape.label:
            ink = (255, 255, 255) if sum(fill) < 400 else (0, 0, 0)
            face = fitting_font(shape.label, int((x2 - x1) * 0.8), max(8, (y2 - y1) // 3))
            draw.text(((x1 + x2) // 2, (y1 + y2) // 2), shape.label, fill=ink, font=face, anchor="mm")
    return image


# ---------------------------------------------------------------------------------------------- audio


@dataclass(frozen=True)
class Turn:
    """A stretch of "speech" from one voice, ``start``..``end`` seconds, at fundamental ``pitch_hz``."""

    start: float
    end: float
    pitch_hz: float


def speech_like(
    turns: Sequence[Turn], duration: float, rng: np.random.Generator, sample_rate: int = SAMPLE_RATE
) -> np.ndarray:
    """Mono float32 in [-1, 1]: syllable-like bursts of a harmonic tone with a gliding pitch.

    Not words, but it has what matters to an audio encoder's activations: a voiced spectrum, syllable
    rhythm, pauses and per-speaker pitch.
    """
    out = np.zeros(int(round(duration * sample_rate)), dtype=np.float64)
    harmonics = np.arange(1, 7)[:, None]
    for turn in turns:
        t = turn.start
        while t < turn.end - 0.1:
            length = min(rng.uniform(0.12, 0.3), turn.end - t)
            n = int(length * sample_rate)
            glide = 1.0 + rng.uniform(-0.2, 0.2) * np.linspace(0.0, 1.0, n)
            phase = 2 * np.pi * np.cumsum(turn.pitch_hz * glide) / sample_rate
            voiced = (np.sin(harmonics * phase) / harmonics).sum(axis=0)
            begin = int(t * sample_rate)
            out[begin : begin + n] += 0.25 * np.hanning(n) * voiced[: len(out) - begin]
            # Short gaps between syllables, a longer one now and then between words.
            t += length + (rng.uniform(0.15, 0.35) if rng.random() < 0.3 else rng.uniform(0.02, 0.08))
    out += rng.normal(0.0, 0.003, size=out.shape)  # a faint noise floor, as in any room
    return np.clip(out, -1.0, 1.0).astype(np.float32)


def write_wav(path: Path, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """16-bit PCM mono WAV (stdlib ``wave``: no metadata, so bytes repeat)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(sample_rate)
        handle.writeframes(pcm.tobytes())


# ---------------------------------------------------------------------------------------------- video


@dataclass(frozen=True)
class Appearance:
    """A coloured rectangle on screen from ``start`` (inclusive) to ``end`` (exclusive) seconds,
    sliding horizontally from ``x_from`` to ``x_to`` (fractions of the free width)."""

    color: str
    start: float
    end: float
    size: tuple[int, int]
    y: float = 0.5
    x_from: float = 0.5
    x_to: float = 0.5


@dataclass(frozen=True)
class Caption:
    """On-screen text from ``start`` to ``end`` seconds, drawn as a banner along the bottom edge."""

    text: str
    start: float
    end: float


def video_frames(
    size: tuple[int, int],
    fps: int,
    duration: float,
    background: str,
    appearances: Sequence[Appearance],
    captions: Sequence[Caption] = (),
) -> Iterator[np.ndarray]:
    """RGB frames; frame ``k`` shows what is on screen at ``k / fps`` seconds."""
    width, height = size
    banners = {caption: _banner(caption.text, width, max(12, height // 6)) for caption in captions}
    base = np.empty((height, width, 3), dtype=np.uint8)
    base[:] = BACKGROUND_RGB[background]
    for k in range(int(round(duration * fps))):
        t = k / fps
        frame = base.copy()
        for item in appearances:
            if item.start <= t < item.end:
                progress = (t - item.start) / max(item.end - item.start, 1e-9)
                w, h = item.size
                x = int((item.x_from + (item.x_to - item.x_from) * progress) * (width - w))
                y = int(item.y * (height - h))
                frame[y : y + h, x : x + w] = COLOR_RGB[item.color]
        for caption, banner in banners.items():
            if caption.start <= t < caption.end:
                frame[height - banner.shape[0] :, :] = banner
        yield frame


def _banner(text: str, width: int, height: int) -> np.ndarray:
    image = Image.new("RGB", (width, height), (20, 20, 20))
    face = fitting_font(text, int(width * 0.95), int(height * 0.8), min_size=6)
    ImageDraw.Draw(image).text((width // 2, height // 2), text, fill=(255, 230, 0), font=face, anchor="mm")
    return np.asarray(image)
