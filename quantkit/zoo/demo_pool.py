"""The built-in demo pool: every taxonomy task in every modality combination it lists, with real
media made on the spot and answers that are true for that media (the OCR text actually drawn, the
box actually drawn, the seconds when the product is actually on screen).

The tasks follow the e-commerce live-stream model of seed article 000: contextual ASR and speaker
separation (audio), product time segmentation and selling points (video), product grounding and
fine-grained OCR (image), captions and plain text.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from quantkit import media as media_files
from quantkit.errors import InputError
from quantkit.fsutil import atomic_output_dir
from quantkit.synthetic import media
from quantkit.synthetic.media import Appearance, Box, Caption, Shape, Turn
from quantkit.zoo.vocabulary import ADJECTIVES, COLORS, INSTRUCTIONS, PRODUCTS, SELLING_POINTS

TAXONOMY_PATH = Path(__file__).resolve().parents[2] / "calibration" / "taxonomy.yaml"

# Sizes cycle per record so that every image task spans the taxonomy's vision-token buckets
# (Qwen2-VL rule, tokens ~ (h/28)*(w/28)): 224x224 -> 64 and 320x240 -> 99 (small),
# 640x480 / 480x640 -> 391 and 800x600 -> 609 (medium), 1600x1200 -> 2451 (large).
IMAGE_SIZES = [(224, 224), (640, 480), (800, 600), (1600, 1200), (320, 240), (480, 640)]
# Video and audio durations cycle the same way across the 10 s / 60 s and 10 s / 30 s edges.
VIDEO_SECONDS = [3, 12, 6, 25, 65, 8]
# WAV is uncompressed (32 kB/s), so long clips come once per 12 records to keep the pool small.
AUDIO_SECONDS = [3, 15, 4, 35, 2, 6, 3, 12, 5, 2, 4, 3]
SPEAKER_SECONDS = [4, 15, 6, 35, 5, 8, 4, 12, 6, 5, 4, 7]  # at least 4 s: room for two turns
QUESTION_SECONDS = [3, 4, 11, 2, 5, 3]  # spoken questions are short
VIDEO_FPS = 2  # times in answers sit on a 0.5 s grid, so every answer is exact to the frame
SMALL_FRAME = (96, 64)
TEXT_FRAME = (192, 108)  # selling points are shown as on-screen banners, which need some width
SHAPE_NAMES = {"box": "rectangle", "circle": "circle", "triangle": "triangle"}


@dataclass(frozen=True)
class DemoPoolSummary:
    jsonl: Path
    records: int
    media_files: int
    by_task: dict[str, int]
    by_modality: dict[str, int]


def load_task_modalities(path: Path = TAXONOMY_PATH) -> dict[str, list[str]]:
    """Task name -> the modality combinations the taxonomy lists for it, in taxonomy order."""
    with open(path, encoding="utf-8") as handle:
        taxonomy = yaml.safe_load(handle)
    return {task["name"]: list(task["modalities"]) for task in taxonomy["tasks"]}


@dataclass
class Slot:
    """One record being made: its id, random source, modality combination and the files it writes."""

    record_id: str
    task: str
    combo: str
    index: int
    rng: np.random.Generator
    root: Path
    images: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    audios: list[str] = field(default_factory=list)

    @property
    def with_audio(self) -> bool:
        return "audio" in self.combo.split("+")

    def _new(self, kind: list[str], suffix: str) -> Path:
        relative = f"media/{self.task}/{self.record_id}-{len(self.images) + len(self.videos) + len(self.audios)}{suffix}"
        kind.append(relative)
        return self.root / relative

    def new_image(self) -> Path:
        # Every third image is a JPEG, so both decoders and both kinds of artefacts are calibrated.
        suffix = ".jpg" if (self.index + len(self.images)) % 3 == 2 else ".png"
        return self._new(self.images, suffix)

    def new_video(self) -> Path:
        return self._new(self.videos, ".mp4")

    def new_audio(self) -> Path:
        return self._new(self.audios, ".wav")

    def image_size(self, offset: int = 0) -> tuple[int, int]:
        return IMAGE_SIZES[(self.index + offset) % len(IMAGE_SIZES)]

    def pick(self, options: list, k: int | None = None):
        """One option (``k=None``) or ``k`` distinct options, drawn from this record's generator."""
        if k is None:
            return options[int(self.rng.integers(len(options)))]
        return [options[i] for i in self.rng.choice(len(options), size=k, replace=False)]


@dataclass(frozen=True)
class Chat:
    user: str
    answer: str
    system: str | None = None


# ---------------------------------------------------------------------------------------------- text


def price(slot: Slot) -> int:
    return int(slot.rng.integers(9, 1000))


def spoken_sentence(slot: Slot, product: str, color: str) -> str:
    templates = [
        "Welcome to the live room, today we have the {color} {product}.",
        "It is {adjective} and the price is only {price} yuan.",
        "{point}, so add it to your cart now.",
        "Look at this {adjective} {product}, it comes in {color}.",
        "The first {count} orders get {point}.",
    ]
    sentence = slot.pick(templates).format(
        color=color,
        product=product,
        adjective=slot.pick(ADJECTIVES),
        price=price(slot),
        point=slot.pick(SELLING_POINTS),
        count=int(slot.rng.integers(2, 20)) * 10,
    )
    return sentence[0].upper() + sentence[1:]


def ocr_lines(slot: Slot) -> list[str]:
    """Shop-sign text with digits in it, since digits are where quantization error shows ("8" -> "0")."""
    product, color = slot.pick(PRODUCTS), slot.pick(COLORS)
    choices = [
        [product.upper(), f"PRICE {price(slot)} YUAN"],
        [slot.pick(SELLING_POINTS).upper(), f"ONLY {price(slot)} YUAN"],
        [f"ORDER NO. {int(slot.rng.integers(10**9, 10**10))}", "SHIPS TOMORROW"],
        [
            f"{color} {product}".upper(),
            f"{int(slot.rng.integers(1, 10)) * 10}% OFF",
            f"CODE {int(slot.rng.integers(1000, 9999))}",
        ],
    ]
    return slot.pick(choices)


def numbered(images: int) -> str:
    return "".join(f"Image {k + 1}: <image>\n" for k in range(images)) if images > 1 else "<image>"


def image_count(slot: Slot) -> int:
    return 2 if slot.combo == "multi-image" else 1


# ---------------------------------------------------------------------------------------------- image tasks


def build_ocr(slot: Slot) -> Chat:
    texts = []
    for k in range(image_count(slot)):
        background = media.BACKGROUND_RGB[slot.pick(list(media.BACKGROUND_RGB))]
        ink = media.COLOR_RGB[slot.pick(media.contrasting_colors(background))]
        lines = ocr_lines(slot)
        media.save_image(media.text_image(lines, slot.image_size(k), background, ink), slot.new_image())
        texts.append("\n".join(lines))
    if len(texts) == 1:
        return Chat(numbered(1) + INSTRUCTIONS[1], texts[0])
    answer = "\n\n".join(f"Image {k + 1}:\n{text}" for k, text in enumerate(texts))
    return Chat(numbered(len(texts)) + "Read all the text in each image exactly as written.", answer)


def build_ocr_markdown(slot: Slot) -> Chat:
    products = slot.pick(PRODUCTS, k=int(slot.rng.integers(2, 5)))
    if slot.rng.random() < 0.5:
        rows = [["item", "price", "stock"]] + [
            [p, str(price(slot)), str(int(slot.rng.integers(0, 500)))] for p in products
        ]
    else:
        rows = [["product", "color", "price"]] + [[p, slot.pick(COLORS), str(price(slot))] for p in products]
    media.save_image(media.table_image(rows, slot.image_size()), slot.new_image())
    markdown = [f"| {' | '.join(rows[0])} |", "|" + "---|" * len(rows[0])]
    markdown += [f"| {' | '.join(row)} |" for row in rows[1:]]
    return Chat(numbered(1) + INSTRUCTIONS[2], "\n".join(markdown))


def product_scene(slot: Slot, size: tuple[int, int], target: tuple[str, str]) -> tuple[list[Shape], str, Box]:
    """The target product and one or two distractors, one per column so that none overlap."""
    background = slot.pick(list(media.BACKGROUND_RGB))
    target_color, target_product = target
    others = [c for c in media.contrasting_colors(media.BACKGROUND_RGB[background]) if c != target_color]
    width, height = size
    columns = 3
    target_column = int(slot.rng.integers(columns))
    shapes: list[Shape] = []
    target_box: Box = (0, 0, 0, 0)
    for column in range(columns):
        if column != target_column and slot.rng.random() < 0.3:
            continue  # an empty column now and then: scenes differ in clutter
        cell = width // columns
        w = int(cell * slot.rng.uniform(0.45, 0.85))
        h = int(height * slot.rng.uniform(0.2, 0.55))
        x1 = column * cell + int(slot.rng.integers(0, cell - w))
        y1 = int(slot.rng.integers(0, height - h))
        box = (x1, y1, x1 + w - 1, y1 + h - 1)
        if column == target_column:
            shapes.append(Shape("box", target_color, box, label=target_product))
            target_box = box
        else:
            shapes.append(
                Shape(
                    "box",
                    slot.pick(others),
                    box,
                    label=slot.pick([p for p in PRODUCTS if p != target_product]),
                )
            )
    return shapes, background, target_box


def build_visual_grounding(slot: Slot) -> Chat:
    color = slot.pick(media.contrasting_colors(media.BACKGROUND_RGB["light gray"]))
    product = slot.pick(PRODUCTS)
    boxes = []
    for k in range(image_count(slot)):
        size = slot.image_size(k)
        shapes, background, box = product_scene(slot, size, (color, product))
        media.save_image(media.scene_image(size, background, shapes), slot.new_image())
        boxes.append(box)
    # Boxes are absolute pixels of the image as stored (Qwen2.5-VL style), not 0-1000 normalised.
    as_text = [f"[{x1}, {y1}, {x2}, {y2}]" for x1, y1, x2, y2 in boxes]
    instruction = INSTRUCTIONS[3].format(product=f"{color} {product}")
    if len(boxes) == 1:
        return Chat(numbered(1) + instruction, as_text[0])
    instruction = instruction.replace(" as [", " in each image as [")
    return Chat(
        numbered(len(boxes)) + instruction,
        "\n".join(f"Image {k + 1}: {box}" for k, box in enumerate(as_text)),
    )


def build_short_caption(slot: Slot) -> Chat:
    size = slot.image_size()
    width, height = size
    background = slot.pick(list(media.BACKGROUND_RGB))
    count = int(slot.rng.integers(1, 3))
    colors = slot.pick(media.contrasting_colors(media.BACKGROUND_RGB[background]), k=count)
    shapes = []
    for k, color in enumerate(colors):
        kind = slot.pick(list(SHAPE_NAMES))
        side = int(min(width / count, height) * slot.rng.uniform(0.35, 0.7))
        x1 = int(k * width / count + slot.rng.integers(0, width / count - side))
        y1 = int(slot.rng.integers(0, height - side))
        shapes.append(Shape(kind, color, (x1, y1, x1 + side - 1, y1 + side - 1)))
    media.save_image(media.scene_image(size, background, shapes), slot.new_image())
    named = [f"a {s.color} {SHAPE_NAMES[s.kind]}" for s in shapes]
    if count == 1:
        caption = f"{named[0].capitalize()} on a {background} background."
    else:
        caption = (
            f"{named[0].capitalize()} on the left and {named[1]} on the right, on a {background} background."
        )
    return Chat(numbered(1) + INSTRUCTIONS[0], caption)


# ---------------------------------------------------------------------------------------------- video tasks


def video_seconds(slot: Slot) -> int:
    return VIDEO_SECONDS[slot.index % len(VIDEO_SECONDS)]


def half_seconds(slot: Slot, low: float, high: float) -> float:
    """A time on the 0.5 s grid in [low, high]."""
    return float(slot.rng.integers(int(low * 2), int(high * 2) + 1)) / 2


def host_voice(slot: Slot, seconds: float) -> np.ndarray | None:
    """The host talking through the whole clip, for video+audio records; None for silent video."""
    if not slot.with_audio:
        return None
    return media.speech_like([Turn(0.3, seconds - 0.3, slot.rng.uniform(110, 240))], seconds, slot.rng)


def save_video(
    slot: Slot, seconds: float, size: tuple[int, int], background: str, appearances, captions=()
) -> None:
    frames = media.video_frames(size, VIDEO_FPS, seconds, background, appearances, captions)
    media_files.write_mp4(slot.new_video(), frames, size, VIDEO_FPS, audio=host_voice(slot, seconds))


def video_colors(slot: Slot, background: str, k: int) -> list[str]:
    return slot.pick(media.contrasting_colors(media.BACKGROUND_RGB[background]), k=k)


def build_temporal_grounding(slot: Slot) -> Chat:
    seconds = video_seconds(slot)
    background = slot.pick(list(media.BACKGROUND_RGB))
    (color,) = video_colors(slot, background, 1)
    product = slot.pick(PRODUCTS)
    start = half_seconds(slot, 0, seconds * 0.6)
    end = half_seconds(slot, start + 1, seconds)
    w, h = SMALL_FRAME
    item = Appearance(color, start, end, (w // 4, h // 3), y=slot.rng.uniform(0.1, 0.9), x_from=0.0, x_to=1.0)
    save_video(slot, seconds, SMALL_FRAME, background, [item])
    prompt = (
        "<video>" + INSTRUCTIONS[4].format(product=f"{color} {product}") + f" It is the {color} rectangle."
    )
    return Chat(prompt, f"The {color} {product} is on screen from {start:.1f} s to {end:.1f} s.")


def build_product_segmentation(slot: Slot) -> Chat:
    seconds = video_seconds(slot)
    count = int(np.clip(seconds // 4, 2, 4))
    background = slot.pick(list(media.BACKGROUND_RGB))
    colors = video_colors(slot, background, count)
    products = slot.pick(PRODUCTS, k=count)
    grid = np.arange(1, seconds * 2) / 2  # cut points on the 0.5 s grid, strictly inside the clip
    cuts = sorted(float(t) for t in slot.rng.choice(grid, size=count - 1, replace=False))
    bounds = [0.0, *cuts, float(seconds)]
    w, h = SMALL_FRAME
    appearances, lines = [], []
    for k, (color, product) in enumerate(zip(colors, products, strict=True)):
        start, end = bounds[k], bounds[k + 1]
        x = slot.rng.uniform(0.2, 0.8)
        appearances.append(Appearance(color, start, end, (w // 3, h // 2), y=0.5, x_from=x, x_to=x))
        lines.append(f"{start:.1f} s - {end:.1f} s: {color} {product}")
    save_video(slot, seconds, SMALL_FRAME, background, appearances)
    legend = ", ".join(f"the {c} one is the {p}" for c, p in zip(colors, products, strict=True))
    return Chat(
        "<video>" + INSTRUCTIONS[5] + f" Products are shown as coloured rectangles: {legend}.",
        "\n".join(lines),
    )


def build_selling_points(slot: Slot) -> Chat:
    seconds = video_seconds(slot)
    background = slot.pick(list(media.BACKGROUND_RGB))
    (color,) = video_colors(slot, background, 1)
    product = slot.pick(PRODUCTS)
    points = slot.pick(SELLING_POINTS, k=int(min(3, max(1, seconds // 2))))
    # Each point is a banner for its own slice of the clip, as live-stream overlays are.
    span = seconds / len(points)
    captions = [Caption(p, k * span, (k + 1) * span - 0.5) for k, p in enumerate(points)]
    w, h = TEXT_FRAME
    item = Appearance(color, 0.0, float(seconds), (w // 4, h // 3), y=0.2, x_from=0.3, x_to=0.7)
    save_video(slot, seconds, TEXT_FRAME, background, [item], captions)
    prompt = (
        "<video>"
        + INSTRUCTIONS[6].format(product=f"{color} {product}")
        + " They appear as on-screen banners."
    )
    return Chat(prompt, "\n".join(f"- {p}" for p in points))


def build_video_caption(slot: Slot) -> Chat:
    seconds = video_seconds(slot)
    background = slot.pick(list(media.BACKGROUND_RGB))
    (color,) = video_colors(slot, background, 1)
    rightwards = bool(slot.rng.random() < 0.5)
    w, h = SMALL_FRAME
    item = Appearance(
        color,
        0.0,
        float(seconds),
        (w // 4, h // 3),
        y=slot.rng.uniform(0.2, 0.8),
        x_from=0.0 if rightwards else 1.0,
        x_to=1.0 if rightwards else 0.0,
    )
    save_video(slot, seconds, SMALL_FRAME, background, [item])
    direction = "from left to right" if rightwards else "from right to left"
    return Chat(
        "<video>Describe the video in one short sentence.",
        f"A {color} rectangle moves {direction} across a {background} background.",
    )


# ---------------------------------------------------------------------------------------------- audio tasks


def build_asr(slot: Slot) -> Chat:
    seconds = AUDIO_SECONDS[slot.index % len(AUDIO_SECONDS)]
    product, color = slot.pick(PRODUCTS), slot.pick(COLORS)
    transcript = " ".join(spoken_sentence(slot, product, color) for _ in range(max(1, round(seconds / 4))))
    voice = media.speech_like([Turn(0.3, seconds - 0.3, slot.rng.uniform(110, 240))], seconds, slot.rng)
    media.write_wav(slot.new_audio(), voice)
    # Contextual ASR: the product being sold is given as context, as the live-stream model gets it.
    return Chat(
        "<audio>" + INSTRUCTIONS[7], transcript, system=f"Context: a live stream selling a {color} {product}."
    )


def build_speaker_separation(slot: Slot) -> Chat:
    seconds = SPEAKER_SECONDS[slot.index % len(SPEAKER_SECONDS)]
    pitches = (slot.rng.uniform(100, 140), slot.rng.uniform(190, 260))  # two clearly different voices
    product, color = slot.pick(PRODUCTS), slot.pick(COLORS)
    turns, lines = [], []
    start, speaker = 0.0, 0
    while start < seconds:
        latest = seconds - 2.0  # room left for a pause and one more 1.5 s turn
        end = (
            float(seconds)
            if start + 1.5 > latest
            else half_seconds(slot, start + 1.5, min(start + 5, latest))
        )
        turns.append(Turn(start, end, pitches[speaker]))
        lines.append(
            f"Speaker {speaker + 1} ({start:.1f} s - {end:.1f} s): {spoken_sentence(slot, product, color)}"
        )
        start, speaker = end + 0.5, 1 - speaker  # a half-second pause between turns
    media.write_wav(slot.new_audio(), media.speech_like(turns, seconds, slot.rng))
    return Chat("<audio>" + INSTRUCTIONS[8] + " Give each turn's start and end in seconds.", "\n".join(lines))


def build_audio_image_qa(slot: Slot) -> Chat:
    size = slot.image_size()
    width, height = size
    background = slot.pick(list(media.BACKGROUND_RGB))
    color = slot.pick(media.contrasting_colors(media.BACKGROUND_RGB[background]))
    product, cost = slot.pick(PRODUCTS), price(slot)
    product_box = (width // 8, height // 6, width // 2, height * 5 // 6)
    tag_box = (width * 5 // 8, height * 2 // 5, width * 15 // 16, height * 3 // 5)
    shapes = [
        Shape("box", color, product_box, label=product),
        Shape("box", "white", tag_box, label=f"{cost} YUAN"),
    ]
    media.save_image(media.scene_image(size, background, shapes), slot.new_image())
    seconds = QUESTION_SECONDS[slot.index % len(QUESTION_SECONDS)]
    question = media.speech_like([Turn(0.2, seconds - 0.2, slot.rng.uniform(110, 260))], seconds, slot.rng)
    media.write_wav(slot.new_audio(), question)
    return Chat(
        "<image><audio>Answer the customer's spoken question about the product in the picture.",
        f"This is the {color} {product}, and the price tag in the picture says {cost} yuan.",
    )


# ---------------------------------------------------------------------------------------------- text


def build_text_chat(slot: Slot) -> Chat:
    product, color, adjective, point = (
        slot.pick(PRODUCTS),
        slot.pick(COLORS),
        slot.pick(ADJECTIVES),
        slot.pick(SELLING_POINTS),
    )
    cost = price(slot)
    kind = slot.index % 3
    if kind == 0:
        return Chat(
            INSTRUCTIONS[10].format(color=color, adjective=adjective, product=product),
            f"{adjective.capitalize()} {color.capitalize()} {product.title()} - {point.capitalize()}",
        )
    if kind == 1:
        return Chat(
            INSTRUCTIONS[11].format(product=product) + f" Customer: Is the {product} {adjective}?",
            f"Yes, the {product} is {adjective}, and today we offer {point}. Thank you for asking!",
        )
    return Chat(
        f"How much is the {color} {product}?",
        f"The {color} {product} costs {cost} yuan today, with {point}.",
        system=f"You are a live-stream shop assistant. The {color} {product} costs {cost} yuan; {point}.",
    )


BUILDERS: dict[str, tuple[Callable[[Slot], Chat], frozenset[str]]] = {
    "ocr": (build_ocr, frozenset({"image", "multi-image"})),
    "ocr_markdown": (build_ocr_markdown, frozenset({"image"})),
    "visual_grounding": (build_visual_grounding, frozenset({"image", "multi-image"})),
    "short_caption": (build_short_caption, frozenset({"image"})),
    "temporal_grounding": (build_temporal_grounding, frozenset({"video", "video+audio"})),
    "product_segmentation": (build_product_segmentation, frozenset({"video", "video+audio"})),
    "selling_points": (build_selling_points, frozenset({"video", "video+audio"})),
    "video_caption": (build_video_caption, frozenset({"video", "video+audio"})),
    "asr": (build_asr, frozenset({"audio"})),
    "speaker_separation": (build_speaker_separation, frozenset({"audio"})),
    "audio_image_qa": (build_audio_image_qa, frozenset({"image+audio"})),
    "text_chat": (build_text_chat, frozenset({"text"})),
}


# ---------------------------------------------------------------------------------------------- pool


def check_builders_cover(tasks: dict[str, list[str]]) -> None:
    """Fail before writing anything if the taxonomy asks for a task or combination with no generator."""
    for task, combos in tasks.items():
        if task not in BUILDERS:
            raise InputError(f"the demo pool has no generator for task {task!r}", path=TAXONOMY_PATH)
        missing = set(combos) - BUILDERS[task][1]
        if missing:
            raise InputError(
                f"the demo pool cannot make {sorted(missing)} records for task {task!r}", path=TAXONOMY_PATH
            )


def make_record(slot: Slot) -> dict:
    build, _ = BUILDERS[slot.task]
    chat = build(slot)
    messages = [{"role": "system", "content": chat.system}] if chat.system else []
    messages += [{"role": "user", "content": chat.user}, {"role": "assistant", "content": chat.answer}]
    for placeholder, paths in (("<image>", slot.images), ("<video>", slot.videos), ("<audio>", slot.audios)):
        assert chat.user.count(placeholder) == len(paths), f"{slot.record_id}: {placeholder} count != files"
    return {
        "id": slot.record_id,
        "task": slot.task,
        "messages": messages,
        "images": slot.images,
        "videos": slot.videos,
        "audios": slot.audios,
    }


def write_demo_pool(
    output: Path, *, per_task: int = 12, seed: int = 0, force: bool = False
) -> DemoPoolSummary:
    """Write ``output/pool.jsonl`` and ``output/media/``: ``per_task`` records for every task and
    every modality combination the taxonomy lists. The same seed gives byte-identical files."""
    output = Path(output)
    if per_task < 1:
        raise InputError(f"--per-task must be at least 1, got {per_task}")
    if seed < 0:
        raise InputError(f"--seed must be zero or positive, got {seed}")
    tasks = load_task_modalities()
    check_builders_cover(tasks)
    by_task: Counter[str] = Counter()
    by_modality: Counter[str] = Counter()
    media_files = 0
    with (
        atomic_output_dir(output, force=force) as staging,
        open(staging / "pool.jsonl", "w", encoding="utf-8", newline="\n") as jsonl,
    ):
        for task, combos in tasks.items():
            for combo_index, combo in enumerate(combos):
                for index in range(per_task):
                    # Seeded per record, so a record does not change when another task is added.
                    rng = np.random.default_rng([seed, zlib.crc32(task.encode()), combo_index, index])
                    record_id = f"{task}-{combo.replace('+', '_')}-{index:04d}"
                    record = make_record(Slot(record_id, task, combo, index, rng, staging))
                    jsonl.write(json.dumps(record, ensure_ascii=False) + "\n")
                    by_task[task] += 1
                    by_modality[combo] += 1
                    media_files += len(record["images"]) + len(record["videos"]) + len(record["audios"])
    return DemoPoolSummary(
        output / "pool.jsonl", sum(by_task.values()), media_files, dict(by_task), dict(by_modality)
    )
