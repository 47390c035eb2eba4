"""Synthetic tasks with exact answers for ``smol-omni-skills`` (SmolLM2-135M inside a Qwen2.5-Omni thinker).

The towers are trained from scratch and cheaply: each item carries, beside its media, the text
token every merged vision token or audio token should "read as" (``Item.targets``). The towers learn to
emit those tokens' embeddings (no backward pass through the language model), and the language model
learns, through a small LoRA, to answer from such embeddings. What the answer needs is then the
language model's own precision: copying eight digits in order, laying out a Markdown table, picking
one object's four box coordinates, finding where an event starts and ends, collapsing a word sequence.

Layouts follow the towers' grids (shared/notes/training-tiny-omni.md): a merged vision token covers
28 x 28 pixels (2 x 2 patches of 14), a video temporal patch is one second (2 frames at 2 fps), an
audio token covers 40 ms (the Whisper-style tower's 100 mel frames a second, halved twice).

The thinker's M-RoPE gives every rotary frequency to the column index (``smol_model.MROPE_SECTION``):
a row of media tokens then sits at consecutive positions, as text does, and SmolLM2 reads it in order
with no training; tokens of different rows share positions. So everything the answer reads in order
lies on one row:

- Text images (``ocr_digits``, ``ocr_table``): one row of 28-pixel cells, one seven-segment glyph per
  cell; each cell's token is its glyph (a digit, ``" |"`` for a cell rule, a newline for the ``=``
  that ends a table row) or a blank.
- Scenes (``grounding``, ``caption``, the image of ``audio_image_qa``): 504 x 140 pixels (18 x 5
  cells), objects on rows 1-4, columns 0-8; row 0 is left white and reads out the objects in one
  slot of 6 tokens per shape (circle, square, triangle; blank where the scene has none): colour,
  shape, first column, first row, end column, end row (cell indices). A slot per shape, not the
  objects in reading order: the vision tower then finds each slot's object by what it is, where
  sorting the objects by place left the second one's readout wrong in most scenes (its shape right
  23 times in 64 after 4,800 tower steps; the first object's 62).
- Video: 56 x 56 frames; while the square is on screen the top-left cell shows the second as a digit
  (a clock overlay) and the bottom-right cell the coloured square; off screen the frame is white.
- Audio: "speech" is a tone per word (espeak-ng is not on these machines): 0.3 s at the word's pitch,
  0.1 s gaps; a speaker is a buzz at its own fundamental.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

from quantkit.synthetic import skills_tasks
from quantkit.synthetic.skills_tasks import COLOURS, SAMPLE_RATE, SHAPES, VIDEO_FPS, _pick, silence, tone

CELL = 28  # pixels under one merged vision token
AUDIO_TOKENS_PER_SECOND = 25
BLANK = "Ġ"  # the token a cell or an audio frame with nothing on it reads as (SmolLM2's space)
ROW_BREAK = "="  # the glyph that ends a table row in a one-line table image; it reads as a newline
GLYPH_TOKENS = {"|": "Ġ|", ROW_BREAK: "Ċ"}  # glyph -> token; digits read as themselves
SCENE_COLUMNS, SCENE_ROWS, OBJECT_COLUMNS = 18, 5, 9
SLOT = 6  # readout tokens per shape on a scene's row 0

# A seven-segment glyph inside one 28-pixel cell: segment -> rectangle (x1, y1, x2, y2), inclusive.
SEGMENTS = {
    "a": (7, 3, 20, 6), "b": (18, 3, 21, 14), "c": (18, 13, 21, 24), "d": (7, 21, 20, 24),
    "e": (6, 13, 9, 24), "f": (6, 3, 9, 14), "g": (7, 12, 20, 15),
}  # fmt: skip
DIGIT_SEGMENTS = {
    "0": "abcdef", "1": "bc", "2": "abdeg", "3": "abcdg", "4": "bcfg",
    "5": "acdfg", "6": "acdefg", "7": "abc", "8": "abcdefg", "9": "abcdfg",
}  # fmt: skip
MAX_NEW_TOKENS = 64  # greedy decoding budget of an answer (quantkit.eval.skills)
SUITE = "smol-omni-skills"
MEDIA = {
    "image": "RGB; seven-segment digits and shapes on the 28-pixel merged-token grid, read along one row; scenes read out on row 0",
    "video": f"{VIDEO_FPS} fps, 56x56 frames, 8 s; while the square is on, the second drawn top left; one temporal patch per second",
    "audio": f"{SAMPLE_RATE} Hz mono; words are tones, 0.3 s each, 0.1 s gaps; speakers are buzzes",
}
# Spoken words: word -> pitch in Hz, spread over the mel scale (each is one SmolLM2 token with its space).
TONE_WORDS = {
    "red": 300.0, "green": 380.0, "blue": 480.0, "yellow": 600.0, "cat": 750.0, "dog": 930.0,
    "sun": 1150.0, "tree": 1420.0, "one": 1750.0, "two": 2150.0, "three": 2650.0, "four": 3250.0,
}  # fmt: skip
SPEAKERS = {"low": 110.0, "mid": 190.0, "high": 330.0}
# Capitals SmolLM2-135M-Instruct names as shipped (see CAPITALS_NOTE): the text task of its own competence.
CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
    "Russia": "Moscow", "England": "London", "Egypt": "Cairo", "China": "Beijing", "Greece": "Athens",
    "Portugal": "Lisbon", "Austria": "Vienna", "Ireland": "Dublin", "Norway": "Oslo", "Sweden": "Stockholm",
    "Poland": "Warsaw", "Hungary": "Budapest", "Denmark": "Copenhagen", "Finland": "Helsinki",
    "Thailand": "Bangkok", "Kenya": "Nairobi", "Peru": "Lima", "Cuba": "Havana", "Argentina": "Buenos Aires",
    "Mexico": "Mexico City", "South Korea": "Seoul", "Belgium": "Brussels", "the Netherlands": "Amsterdam",
    "Czech Republic": "Prague", "Iran": "Tehran", "Iraq": "Baghdad", "Afghanistan": "Kabul",
    "Indonesia": "Jakarta", "Philippines": "Manila", "Vietnam": "Hanoi", "India": "New Delhi",
    "Canada": "Ottawa", "Australia": "Canberra", "Brazil": "Brasília", "Turkey": "Ankara",
}  # fmt: skip
CAPITAL_TEMPLATES = [
    "What is the capital of {country}?",
    "Name the capital city of {country}.",
    "Which city is the capital of {country}?",
    "{country}'s capital is which city?",
    "Tell me the capital of {country}.",
]


@dataclass(frozen=True)
class Item(skills_tasks.Item):
    """A skills item plus what each media token should read as: per media, in the order images,
    videos, audios, one token string per merged vision token (raster order; videos: per second,
    then raster) or per audio token."""

    targets: list[list[str]] = field(default_factory=list)


@dataclass(frozen=True)
class Task:
    name: str
    family: str  # the taxonomy task it stands for (calibration/taxonomy.yaml)
    modality: str
    group: str  # image / video / audio / text: how the eval table groups it
    metric: str  # exact / iou / tiou / wer (quantkit.eval.skills)
    precision: bool  # the taxonomy's high tier: exact, long or numeric answers
    template: str
    answer_format: str
    make: Callable[[np.random.Generator], Item]


# ---------------------------------------------------------------------------------------------- media


def draw_glyph(draw: ImageDraw.ImageDraw, glyph: str, col: int, row: int) -> None:
    """A seven-segment digit, ``|`` (a cell rule) or ``=`` (a row break), in the cell at (col, row)."""
    x0, y0 = col * CELL, row * CELL
    if glyph == "|":
        draw.rectangle([x0 + 12, y0, x0 + 15, y0 + CELL - 1], fill=(0, 0, 0))
        return
    if glyph == ROW_BREAK:
        draw.rectangle([x0 + 5, y0 + 8, x0 + 22, y0 + 11], fill=(0, 0, 0))
        draw.rectangle([x0 + 5, y0 + 16, x0 + 22, y0 + 19], fill=(0, 0, 0))
        return
    for segment in DIGIT_SEGMENTS[glyph]:
        x1, y1, x2, y2 = SEGMENTS[segment]
        draw.rectangle([x0 + x1, y0 + y1, x0 + x2, y0 + y2], fill=(0, 0, 0))


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int], colour) -> None:
    x1, y1, x2, y2 = box
    if shape == "circle":
        draw.ellipse([x1 + 2, y1 + 2, x2 - 3, y2 - 3], fill=colour)
    elif shape == "square":
        draw.rectangle([x1 + 2, y1 + 2, x2 - 3, y2 - 3], fill=colour)
    else:
        draw.polygon([((x1 + x2) // 2, y1 + 2), (x2 - 3, y2 - 3), (x1 + 2, y2 - 3)], fill=colour)


def glyph_token(glyph: str) -> str:
    return GLYPH_TOKENS.get(glyph, glyph)


def text_image(line: str) -> tuple[Image.Image, list[str]]:
    """One row of cells, one glyph (or a space) each; the image and its per-cell tokens."""
    image = Image.new("RGB", (len(line) * CELL, CELL), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    targets = []
    for c, glyph in enumerate(line):
        if glyph != " ":
            draw_glyph(draw, glyph, c, 0)
        targets.append(BLANK if glyph == " " else glyph_token(glyph))
    return image, targets


def scene(rng: np.random.Generator, count: int) -> tuple[Image.Image, list[dict], list[str]]:
    """``count`` objects of different shapes on rows 1-4, columns 0-8 of an 18 x 5 cell grid, not
    overlapping; row 0 reads them out, a slot per shape (the rest reads blank)."""
    image = Image.new("RGB", (SCENE_COLUMNS * CELL, SCENE_ROWS * CELL), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    shapes = _pick(rng, SHAPES, k=count)
    taken = np.zeros((SCENE_ROWS, OBJECT_COLUMNS), dtype=bool)
    objects = []
    for shape in shapes:
        while True:
            w, h = int(rng.integers(1, 4)), int(rng.integers(1, 4))
            c1 = int(rng.integers(0, OBJECT_COLUMNS - w + 1))
            r1 = int(rng.integers(1, SCENE_ROWS - h + 1))
            if not taken[r1 : r1 + h, c1 : c1 + w].any():
                break
        taken[r1 : r1 + h, c1 : c1 + w] = True
        colour = _pick(rng, list(COLOURS))
        draw_shape(draw, shape, (c1 * CELL, r1 * CELL, (c1 + w) * CELL, (r1 + h) * CELL), COLOURS[colour])
        objects.append({"colour": colour, "shape": shape, "cells": (c1, r1, c1 + w, r1 + h)})
    objects.sort(key=lambda o: (o["cells"][1], o["cells"][0]))
    targets = [BLANK] * (SCENE_COLUMNS * SCENE_ROWS)
    for o in objects:
        slot = SLOT * SHAPES.index(o["shape"])
        targets[slot : slot + SLOT] = ["Ġ" + o["colour"], "Ġ" + o["shape"], *(str(v) for v in o["cells"])]
    return image, objects, targets


def audio_tokens(samples: int) -> int:
    """Tokens the Qwen2.5-Omni audio tower makes of ``samples`` samples (mel frames halved twice)."""
    frames = samples // 160  # WhisperFeatureExtractor hop 160, without its padding frame
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def speech(segments: list[tuple[str, np.ndarray]]) -> tuple[np.ndarray, list[str]]:
    """Concatenate (token, sound) segments after 0.1 s of silence; per audio token, the token of the
    segment under the token's centre (``BLANK`` in silence)."""
    parts, spans, cursor = [silence(0.1)], [], 0.1
    for token, sound in segments:
        seconds = len(sound) / SAMPLE_RATE
        spans.append((cursor, cursor + seconds, token))
        parts += [sound, silence(0.1)]
        cursor += seconds + 0.1
    wave = np.concatenate(parts)
    targets = []
    for k in range(audio_tokens(len(wave))):
        centre = (k + 0.5) / AUDIO_TOKENS_PER_SECOND
        targets.append(next((tok for a, b, tok in spans if a <= centre < b), BLANK))
    return wave, targets


# ---------------------------------------------------------------------------------------------- tasks


def _digits(rng, n: int) -> str:
    return "".join(str(int(d)) for d in rng.integers(0, 10, size=n))


def make_ocr(rng) -> Item:
    """A 6-10 digit number somewhere on a strip of 12 cells."""
    n = int(rng.integers(6, 11))
    number = _digits(rng, n)
    start = int(rng.integers(0, 12 - n + 1))
    image, targets = text_image(" " * start + number + " " * (12 - n - start))
    return Item("ocr_digits", TASKS_BY_NAME["ocr_digits"].template, number, images=[image], targets=[targets])


def make_table(rng) -> Item:
    """A 2-3 row x 2-3 column table of two-digit numbers, drawn on one line (``=`` ends a row); the
    first row is the header."""
    n_rows, n_cols = int(rng.integers(2, 4)), int(rng.integers(2, 4))
    cells = [[_digits(rng, 2) for _ in range(n_cols)] for _ in range(n_rows)]
    image, targets = text_image(ROW_BREAK.join("|".join(row) for row in cells))
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    lines.insert(1, "|" + " --- |" * n_cols)
    return Item(
        "ocr_table", TASKS_BY_NAME["ocr_table"].template, "\n".join(lines), images=[image], targets=[targets]
    )


def make_grounding(rng) -> Item:
    image, objects, targets = scene(rng, 2)
    target = objects[int(rng.integers(2))]
    # The answer names the shape before its box: the box is then what follows the shape's word in
    # the readout, a lookup SmolLM2's own attention does (copying after a repeated token); with
    # the bare box, the LoRA on the upper layers had to learn the choice and copied the other
    # object's box a third of the time (0.41 with perfect tower outputs; 0.77 named, 75 steps).
    answer = "the {} [{}, {}, {}, {}]".format(target["shape"], *target["cells"])
    prompt = TASKS_BY_NAME["grounding"].template.format(shape=target["shape"])
    return Item("grounding", prompt, answer, images=[image], targets=[targets])


def make_caption(rng) -> Item:
    image, objects, targets = scene(rng, 1)
    answer = f"a {objects[0]['colour']} {objects[0]['shape']}"
    return Item("caption", TASKS_BY_NAME["caption"].template, answer, images=[image], targets=[targets])


def _video(rng, seconds: int = 8) -> tuple[np.ndarray, list[str], str, int, int]:
    """``seconds`` s at 2 fps of 56 x 56 frames: from second ``start`` to ``end`` (exclusive) a
    coloured square bottom right and the second as a digit top left."""
    start = int(rng.integers(0, seconds))
    end = int(rng.integers(start + 1, seconds + 1))
    colour = _pick(rng, list(COLOURS))
    frames, targets = [], []
    for second in range(seconds):
        frame = Image.new("RGB", (2 * CELL, 2 * CELL), (255, 255, 255))
        draw = ImageDraw.Draw(frame)
        on = start <= second < end
        if on:
            draw_glyph(draw, str(second), 0, 0)
            draw.rectangle([CELL + 3, CELL + 3, 2 * CELL - 4, 2 * CELL - 4], fill=COLOURS[colour])
        frames += [np.asarray(frame)] * VIDEO_FPS
        targets += [str(second) if on else BLANK, BLANK, BLANK, "Ġ" + colour if on else BLANK]
    return np.stack(frames), targets, colour, start, end


def make_temporal(rng) -> Item:
    frames, targets, _, start, end = _video(rng)
    template = TASKS_BY_NAME["temporal_grounding"].template
    return Item("temporal_grounding", template, f"{start} to {end}", videos=[frames], targets=[targets])


def make_video_caption(rng) -> Item:
    frames, targets, colour, _, _ = _video(rng)
    template = TASKS_BY_NAME["video_caption"].template
    return Item("video_caption", template, colour, videos=[frames], targets=[targets])


def make_asr(rng) -> Item:
    words = [_pick(rng, list(TONE_WORDS)) for _ in range(int(rng.integers(3, 7)))]
    wave, targets = speech([("Ġ" + w, tone(TONE_WORDS[w], 0.3)) for w in words])
    return Item("asr", TASKS_BY_NAME["asr"].template, " ".join(words), audios=[wave], targets=[targets])


def make_speakers(rng) -> Item:
    count = int(rng.integers(1, 4))
    voices = _pick(rng, list(SPEAKERS), k=count)
    segments = [("Ġ" + v, tone(SPEAKERS[v], float(rng.choice([0.3, 0.4, 0.5])), harmonics=6)) for v in voices]
    wave, targets = speech(segments)
    template = TASKS_BY_NAME["speaker_count"].template
    return Item("speaker_count", template, str(count), audios=[wave], targets=[targets])


def make_audio_image(rng) -> Item:
    image, objects, image_targets = scene(rng, 1)
    shown = objects[0]["colour"]
    said = shown if rng.random() < 0.5 else _pick(rng, [c for c in COLOURS if c != shown])
    wave, audio_targets = speech([("Ġ" + said, tone(TONE_WORDS[said], 0.3))])
    answer = "yes" if said == shown else "no"
    template = TASKS_BY_NAME["audio_image_qa"].template
    return Item(
        "audio_image_qa",
        template,
        answer,
        images=[image],
        audios=[wave],
        targets=[image_targets, audio_targets],
    )


def make_capital(rng) -> Item:
    country = _pick(rng, list(CAPITALS))
    prompt = _pick(rng, CAPITAL_TEMPLATES).format(country=country)
    return Item("capitals", prompt, CAPITALS[country])


TASKS: list[Task] = [
    Task("ocr_digits", "ocr", "image", "image", "exact", True, "Read the number.",
         "all the digits drawn, e.g. 40713928", make_ocr),
    Task("ocr_table", "ocr_markdown", "image", "image", "exact", True, "Write the table in Markdown.",
         "| a | b |\\n| --- | --- |\\n| c | d |: two-digit cells, the first row as header", make_table),
    Task("grounding", "visual_grounding", "image", "image", "iou", True,
         "Where is the {shape}? Answer with its box in grid cells.",
         "the <shape> [x1, y1, x2, y2], in 28-pixel cells of the 18x5 grid, end exclusive",
         make_grounding),
    Task("caption", "short_caption", "image", "image", "exact", False, "Describe the image in a few words.",
         "a <colour> <shape>", make_caption),
    Task("temporal_grounding", "temporal_grounding", "video", "video", "tiou", True,
         "When is the square on screen? Answer in seconds.", "<start> to <end>, whole seconds, end exclusive",
         make_temporal),
    Task("video_caption", "video_caption", "video", "video", "exact", False,
         "What colour is the square in the video?", "<colour>", make_video_caption),
    Task("asr", "asr", "audio", "audio", "wer", True, "Transcribe the audio.",
         "the 3-6 words said, space-separated (tone vocabulary)", make_asr),
    Task("speaker_count", "speaker_separation", "audio", "audio", "exact", False, "How many speakers are there?",
         "a digit 1-3", make_speakers),
    Task("audio_image_qa", "audio_image_qa", "image+audio", "audio", "exact", False,
         "Is the colour said in the audio the colour of the shape?", "yes or no", make_audio_image),
    Task("capitals", "text_chat", "text", "text", "exact", False, "What is the capital of {country}?",
         "the city's name", make_capital),
]  # fmt: skip
TASKS_BY_NAME = {task.name: task for task in TASKS}


def make_items(task: str, count: int, seed: int) -> list[Item]:
    """``count`` items of ``task`` from ``seed`` (the same everywhere)."""
    rng = np.random.default_rng([seed, sorted(TASKS_BY_NAME).index(task), 35])
    return [TASKS_BY_NAME[task].make(rng) for _ in range(count)]
