"""Synthetic tasks with exact answers for ``tiny-omni-skills``: one or more per taxonomy family.

Every item is drawn from a ``numpy`` generator, so a seed gives the same items everywhere. The
media are laid out on the vision tower's 14-pixel patch grid (glyphs, cells, boxes) and on the
video processor's one-second temporal patches, because a tower trained from scratch in minutes
resolves those and not free-form font rendering (shared/notes/training-tiny-omni.md).

Audio: ``espeak-ng`` is not installed on these machines, so "speech" is the documented fallback:
each word of a small vocabulary is a tone at its own pitch (TONE_WORDS), 0.3 s long with 0.1 s of
silence between words; a speaker is a buzz with its own fundamental and harmonics.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

from quantkit import media as media_files
from quantkit.errors import InputError
from quantkit.fsutil import atomic_output_dir
from quantkit.synthetic import media

PATCH = 14
SAMPLE_RATE = 16000
VIDEO_FPS = 2  # two frames per temporal patch: one merged token group per second

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 50), "blue": (30, 60, 220), "yellow": (230, 200, 20)}
SHAPES = ["circle", "square", "triangle"]
# Seven-segment layout on a 3 x 5 patch glyph: segment -> patch cells (column, row) it fills.
SEGMENT_CELLS = {
    "a": [(0, 0), (1, 0), (2, 0)],
    "b": [(2, 0), (2, 1), (2, 2)],
    "c": [(2, 2), (2, 3), (2, 4)],
    "d": [(0, 4), (1, 4), (2, 4)],
    "e": [(0, 2), (0, 3), (0, 4)],
    "f": [(0, 0), (0, 1), (0, 2)],
    "g": [(0, 2), (1, 2), (2, 2)],
}
DIGIT_SEGMENTS = {
    "0": "abcdef", "1": "bc", "2": "abdeg", "3": "abcdg", "4": "bcfg",
    "5": "acdfg", "6": "acdefg", "7": "abc", "8": "abcdefg", "9": "abcdfg",
}  # fmt: skip
# The tone vocabulary (fallback for espeak-ng): word -> pitch in Hz, spaced over the mel scale.
TONE_WORDS = {
    "red": 300.0, "green": 450.0, "blue": 650.0, "yellow": 900.0,
    "one": 1250.0, "two": 1700.0, "three": 2300.0, "four": 3100.0,
}  # fmt: skip
SPEAKERS = {"low": 110.0, "mid": 190.0, "high": 330.0}  # fundamental of each speaker's buzz


@dataclass(frozen=True)
class Item:
    """One probe: the user's text (the prompt template filled in), its media and the exact answer."""

    task: str
    prompt: str
    answer: str
    images: list[Image.Image] = field(default_factory=list)
    videos: list[np.ndarray] = field(default_factory=list)  # (frames, height, width, 3) uint8
    audios: list[np.ndarray] = field(default_factory=list)  # float32 at SAMPLE_RATE

    def messages(self) -> list[dict]:
        """The chat the model is trained and probed on (media first, then the text)."""
        content = [{"type": "image"} for _ in self.images]
        content += [{"type": "video"} for _ in self.videos]
        content += [{"type": "audio"} for _ in self.audios]
        return [{"role": "user", "content": [*content, {"type": "text", "text": self.prompt}]}]


@dataclass(frozen=True)
class Task:
    name: str  # this model's task
    family: str  # the taxonomy task it stands for (calibration/taxonomy.yaml)
    modality: str  # the taxonomy modality combination
    group: str  # image / video / audio / text: how the eval table groups it
    metric: str  # exact / iou / tiou / wer (quantkit.eval.skills)
    template: str
    answer_format: str
    make: Callable[[np.random.Generator], Item]


# ---------------------------------------------------------------------------------------------- media


def draw_digit(draw: ImageDraw.ImageDraw, digit: str, col: int, row: int, ink=(0, 0, 0)) -> None:
    """A seven-segment glyph whose top-left patch is (col, row); each lit cell is a 10-pixel square."""
    for segment in DIGIT_SEGMENTS[digit]:
        for dx, dy in SEGMENT_CELLS[segment]:
            x, y = (col + dx) * PATCH + 2, (row + dy) * PATCH + 2
            draw.rectangle([x, y, x + 9, y + 9], fill=ink)


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int], colour) -> None:
    x1, y1, x2, y2 = box
    if shape == "circle":
        draw.ellipse([x1, y1, x2 - 1, y2 - 1], fill=colour)
    elif shape == "square":
        draw.rectangle([x1, y1, x2 - 1, y2 - 1], fill=colour)
    else:
        draw.polygon([((x1 + x2) // 2, y1), (x2 - 1, y2 - 1), (x1, y2 - 1)], fill=colour)


def tone(freq: float, seconds: float, harmonics: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    wave = sum(np.sin(2 * np.pi * freq * k * t) / k for k in range(1, harmonics + 1))
    ramp = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.02)  # 20 ms fades: no clicks
    return (0.4 * wave * ramp / max(1.0, np.abs(wave).max())).astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE), dtype=np.float32)


def spoken(words: list[str]) -> np.ndarray:
    parts = [silence(0.1)]
    for word in words:
        parts += [tone(TONE_WORDS[word], 0.3), silence(0.1)]
    return np.concatenate(parts)


# ---------------------------------------------------------------------------------------------- tasks


def _pick(rng: np.random.Generator, options, k: int | None = None):
    if k is None:
        return options[int(rng.integers(len(options)))]
    return [options[i] for i in rng.choice(len(options), size=k, replace=False)]


def make_ocr(rng) -> Item:
    digits = "".join(str(int(d)) for d in rng.integers(0, 10, size=3))
    image = Image.new("RGB", (168, 112), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for k, digit in enumerate(digits):
        draw_digit(draw, digit, col=4 * k, row=1)
    return Item("ocr_digits", TASKS_BY_NAME["ocr_digits"].template, digits, images=[image])


def make_markdown(rng) -> Item:
    cells = [[str(int(d)) for d in rng.integers(0, 10, size=2)] for _ in range(2)]
    image = Image.new("RGB", (168, 168), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for r, row in enumerate(cells):
        for c, digit in enumerate(row):
            draw_digit(draw, digit, col=1 + 6 * c, row=6 * r)
    draw.line([(84, 0), (84, 167)], fill=(120, 120, 120), width=2)
    draw.line([(0, 77), (167, 77)], fill=(120, 120, 120), width=2)
    answer = f"| {cells[0][0]} | {cells[0][1]} |\n| --- | --- |\n| {cells[1][0]} | {cells[1][1]} |"
    return Item("ocr_table", TASKS_BY_NAME["ocr_table"].template, answer, images=[image])


def make_grounding(rng) -> Item:
    """Three different shapes in three of the nine 56-pixel cells; the box of the one asked for."""
    cells = _pick(rng, list(range(9)), k=3)
    shapes = _pick(rng, SHAPES, k=3)
    image = Image.new("RGB", (168, 168), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    boxes = []
    for cell, shape in zip(cells, shapes, strict=True):
        x, y = 56 * (cell % 3), 56 * (cell // 3)
        box = (x + 7, y + 7, x + 49, y + 49)
        draw_shape(draw, shape, box, COLOURS[_pick(rng, list(COLOURS))])
        boxes.append(box)
    target = int(rng.integers(3))
    template = TASKS_BY_NAME["grounding"].template
    answer = "[{}, {}, {}, {}]".format(*boxes[target])
    return Item("grounding", template.format(shape=shapes[target]), answer, images=[image])


def make_caption(rng) -> Item:
    colour, shape = _pick(rng, list(COLOURS)), _pick(rng, SHAPES)
    image = Image.new("RGB", (112, 112), (255, 255, 255))
    draw_shape(ImageDraw.Draw(image), shape, (14, 14, 98, 98), COLOURS[colour])
    return Item("caption", TASKS_BY_NAME["caption"].template, f"a {colour} {shape}", images=[image])


def _video(rng) -> tuple[np.ndarray, str, int, int]:
    """3 s at 2 fps of 56x56 frames; a coloured square is on screen from second ``start`` to ``end``."""
    seconds = 3
    start = int(rng.integers(0, seconds))
    end = int(rng.integers(start + 1, seconds + 1))
    colour = _pick(rng, list(COLOURS))
    frames = np.full((seconds * VIDEO_FPS, 56, 56, 3), 128, dtype=np.uint8)
    x, y = (int(v) * 28 for v in rng.integers(0, 2, size=2))
    frames[start * VIDEO_FPS : end * VIDEO_FPS, y : y + 28, x : x + 28] = COLOURS[colour]
    return frames, colour, start, end


def make_temporal(rng) -> Item:
    frames, _, start, end = _video(rng)
    answer = f"{start} to {end}"
    return Item("temporal_grounding", TASKS_BY_NAME["temporal_grounding"].template, answer, videos=[frames])


def make_video_caption(rng) -> Item:
    frames, colour, _, _ = _video(rng)
    return Item("video_caption", TASKS_BY_NAME["video_caption"].template, colour, videos=[frames])


def make_asr(rng) -> Item:
    words = _pick(rng, list(TONE_WORDS), k=int(rng.integers(2, 4)))
    return Item("asr", TASKS_BY_NAME["asr"].template, " ".join(words), audios=[spoken(words)])


def make_speakers(rng) -> Item:
    count = int(rng.integers(1, 4))
    voices = _pick(rng, list(SPEAKERS), k=count)
    parts = [silence(0.1)]
    for voice in voices:
        parts += [tone(SPEAKERS[voice], float(rng.choice([0.3, 0.4, 0.5])), harmonics=6), silence(0.15)]
    return Item(
        "speaker_count", TASKS_BY_NAME["speaker_count"].template, str(count), audios=[np.concatenate(parts)]
    )


def make_audio_image(rng) -> Item:
    """The image shows a shape of one colour; the audio says a colour word: do they match?"""
    shown = _pick(rng, list(COLOURS))
    said = shown if rng.random() < 0.5 else _pick(rng, [c for c in COLOURS if c != shown])
    image = Image.new("RGB", (112, 112), (255, 255, 255))
    draw_shape(ImageDraw.Draw(image), _pick(rng, SHAPES), (14, 14, 98, 98), COLOURS[shown])
    answer = "yes" if said == shown else "no"
    return Item(
        "audio_image_qa",
        TASKS_BY_NAME["audio_image_qa"].template,
        answer,
        images=[image],
        audios=[spoken([said])],
    )


def make_arithmetic(rng) -> Item:
    a, b = (int(v) for v in rng.integers(0, 10, size=2))
    template = TASKS_BY_NAME["arithmetic"].template
    return Item("arithmetic", template.format(a=a, b=b), str(a + b))


TASKS: list[Task] = [
    Task("ocr_digits", "ocr", "image", "image", "exact", "Read the number.",
         "the three digits drawn, e.g. 407", make_ocr),
    Task("ocr_table", "ocr_markdown", "image", "image", "exact", "Write the table in Markdown.",
         "| a | b |\\n| --- | --- |\\n| c | d |, one digit per cell, the first row as header", make_markdown),
    Task("grounding", "visual_grounding", "image", "image", "iou", "Where is the {shape}? Answer with its box.",
         "[x1, y1, x2, y2] in pixels of the 168x168 image", make_grounding),
    Task("caption", "short_caption", "image", "image", "exact", "Describe the image in a few words.",
         "a <colour> <shape>", make_caption),
    Task("temporal_grounding", "temporal_grounding", "video", "video", "tiou",
         "When is the square on screen? Answer in seconds.", "<start> to <end>, whole seconds", make_temporal),
    Task("video_caption", "video_caption", "video", "video", "exact", "What colour is the square in the video?",
         "<colour>", make_video_caption),
    Task("asr", "asr", "audio", "audio", "wer", "Transcribe the audio.",
         "the words said, space-separated (tone vocabulary)", make_asr),
    Task("speaker_count", "speaker_separation", "audio", "audio", "exact", "How many speakers are there?",
         "a digit 1-3", make_speakers),
    Task("audio_image_qa", "audio_image_qa", "image+audio", "audio", "exact",
         "Is the colour said in the audio the colour of the shape?", "yes or no", make_audio_image),
    Task("arithmetic", "text_chat", "text", "text", "exact", "What is {a} + {b}?", "the sum, e.g. 12",
         make_arithmetic),
]  # fmt: skip
TASKS_BY_NAME = {task.name: task for task in TASKS}


def make_items(task: str, count: int, seed: int) -> list[Item]:
    """``count`` items of ``task`` from ``seed`` (the same everywhere)."""
    rng = np.random.default_rng([seed, sorted(TASKS_BY_NAME).index(task)])
    return [TASKS_BY_NAME[task].make(rng) for _ in range(count)]


def processor_inputs(processor, items: list[Item], *, with_answers: bool) -> dict:
    """One batch through the processor and the chat template, left-padded as for generation."""
    texts = [
        processor.apply_chat_template(i.messages(), add_generation_prompt=True, tokenize=False) for i in items
    ]
    if with_answers:
        texts = [t + i.answer + "<|im_end|>" for t, i in zip(texts, items, strict=True)]
    media: dict = {}
    if items[0].images:
        media["images"] = [im for i in items for im in i.images]
    if items[0].videos:
        media["videos"] = [v for i in items for v in i.videos]
    if items[0].audios:
        media["audio"] = [a for i in items for a in i.audios]
    return dict(processor(text=texts, padding=True, return_tensors="pt", **media))


MAX_NEW_TOKENS = 32  # greedy decoding budget of an answer (quantkit.eval.skills)
SUITE = "tiny-omni-skills"
MEDIA = {
    "image": "RGB; glyphs and shapes on the 14-pixel patch grid",
    "video": f"{VIDEO_FPS} fps, 56x56 frames, 3 s; one temporal patch per second",
    "audio": f"{SAMPLE_RATE} Hz mono; words are tones: {TONE_WORDS} Hz, 0.3 s each, 0.1 s gaps",
}


def skills_manifest(suite=None) -> dict:
    """What ``skills.json`` holds: the task suite (a module with SUITE, MEDIA, TASKS and make_items;
    this one by default), each task's prompt template, answer format and metric."""
    import sys

    suite = suite or sys.modules[__name__]
    return {
        "format": "quantkit-skills/1",
        "suite": suite.SUITE,
        "chat": "one user turn: the media parts (image, video, audio, in that order), then the prompt text",
        "media": suite.MEDIA,
        "tasks": [
            {
                "name": t.name,
                "taxonomy_task": t.family,
                "modality": t.modality,
                "group": t.group,
                "metric": t.metric,
                "prompt_template": t.template,
                "answer_format": t.answer_format,
                "example": _example(suite, t.name),
            }
            for t in suite.TASKS
        ],
    }


def _example(suite, task: str) -> dict:
    item = suite.make_items(task, 1, seed=12345)[0]
    return {"prompt": item.prompt, "answer": item.answer}


def suite_module(manifest: dict):
    """The task module a skills.json names (``tiny-omni-skills`` when it names none)."""
    import importlib

    return importlib.import_module(SUITES[manifest.get("suite", SUITE)])


SUITES = {
    "tiny-omni-skills": "quantkit.synthetic.skills_tasks",
    "smol-omni-skills": "quantkit.synthetic.smol_tasks",
}


def template_fields(template: str) -> list[str]:
    return re.findall(r"{(\w+)}", template)


# ---------------------------------------------------------------------------------------------- pool


def write_skills_pool(output, *, per_task: int = 16, seed: int = 7, force: bool = False, suite=None):
    """``output/pool.jsonl`` + media in the ms-swift / LLaMA-Factory shape: ``per_task`` items of
    every task of ``suite`` (this module by default; PNG, MP4 at 2 fps, 16-bit WAV), each record's
    ``task`` its taxonomy family, so that ``quantkit calibrate`` can draw calibration sets from what
    the model was trained on."""
    import json
    import sys
    from pathlib import Path

    if per_task < 1:
        raise InputError(f"--per-task must be at least 1, got {per_task}")
    suite = suite or sys.modules[__name__]
    output = Path(output)
    with (
        atomic_output_dir(output, force=force) as staging,
        open(staging / "pool.jsonl", "w", encoding="utf-8", newline="\n") as jsonl,
    ):
        for task in suite.TASKS:
            for index, item in enumerate(suite.make_items(task.name, per_task, seed=seed)):
                record_id = f"{task.name}-{index:04d}"
                files: dict[str, list[str]] = {"images": [], "videos": [], "audios": []}
                for k, image in enumerate(item.images):
                    files["images"].append(f"media/{record_id}-{k}.png")
                    media.save_image(image, staging / files["images"][-1])
                for k, frames in enumerate(item.videos):
                    files["videos"].append(f"media/{record_id}-v{k}.mp4")
                    size = (frames.shape[2], frames.shape[1])
                    media_files.write_mp4(staging / files["videos"][-1], iter(frames), size, VIDEO_FPS)
                for k, audio in enumerate(item.audios):
                    files["audios"].append(f"media/{record_id}-a{k}.wav")
                    media.write_wav(staging / files["audios"][-1], audio, SAMPLE_RATE)
                user = (
                    "<image>" * len(item.images) + "<video>" * len(item.videos) + "<audio>" * len(item.audios)
                )
                messages = [
                    {"role": "user", "content": user + item.prompt},
                    {"role": "assistant", "content": item.answer},
                ]
                record = {"id": record_id, "task": task.family, "messages": messages, **files}
                jsonl.write(json.dumps(record, ensure_ascii=False) + "\n")
    return output / "pool.jsonl"
