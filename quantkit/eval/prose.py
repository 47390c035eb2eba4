"""Real English prose for evaluation, from a file every Python ships: ``pydoc_data/topics.py``.

Why this source: the task data must exist on a bare CI machine with nothing but ``make install``
and no hub. CPython's standard library carries the text of the Python Language Reference as
``pydoc_data.topics.topics`` (~465,000 characters of edited, human-written English in 79 topics;
it is what ``help("assignment")`` prints). No package to install, no download, the same on every
machine with the same Python version. The Jargon File (Debian ``jargon-text``) is more varied prose
but comes from an OS package that CI machines do not have; pydoc's text is technical, which a
perplexity or next-sentence task does not mind.

Paragraphs of flowing prose are kept (no grammar rules, code, tables or bullet lists), reflowed to
one line each, and split by topic into two disjoint halves: ``test`` (the evaluation tasks) and
``calibration`` (for benchmarks that calibrate on real prose and must not be scored on the same
text). Everything here is deterministic: the same Python version gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

SOURCE = "pydoc_data.topics (CPython's Python Language Reference text, shipped with every Python)"
SPLITS = ("test", "calibration")

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"“(])")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "cf.", "vs.", "resp.", "Ex.", "No.")
_LAST_WORD = re.compile(r"^(?P<context>.+\S)\s+(?P<word>[A-Za-z]{3,})\.$", re.DOTALL)

PPL_DOC_WORDS = 200  # words per perplexity document (whole paragraphs, at most this many)
CHOICES = 4  # next-sentence task: the true sentence and three from other topics


@dataclass(frozen=True)
class Paragraph:
    topic: str
    text: str

    @property
    def words(self) -> int:
        return len(self.text.split())


def _topics() -> dict[str, str]:
    from pydoc_data.topics import topics

    return dict(topics)


def _is_prose(block: str) -> bool:
    if not block or block[0].isspace() or block.startswith(("*", "-", "+", "|", "=")):
        return False  # indented code or grammar, bullets, tables, headings' underlines
    if "::=" in block or ">>>" in block:
        return False
    text = " ".join(block.split())
    if len(text.split()) < 15 or not text.endswith("."):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in text)
    return letters / len(text) >= 0.9


def _split_of(topic: str) -> str:
    """Half the topics are for tests, half for calibration; by a hash, so the split of a topic does
    not move when a Python release adds or drops another topic."""
    return SPLITS[hashlib.sha256(topic.encode()).digest()[0] % 2]


def prose_paragraphs(split: str = "test") -> list[Paragraph]:
    """Paragraphs of prose from the ``test`` or ``calibration`` half, in topic order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    out = []
    for topic, text in sorted(_topics().items()):
        if _split_of(topic) != split:
            continue
        for block in re.split(r"\n\s*\n", text):
            if _is_prose(block):
                out.append(Paragraph(topic, " ".join(block.split())))
    return out


def sentences(text: str) -> list[str]:
    """Split at sentence ends, keeping abbreviations such as "e.g." inside their sentence."""
    parts: list[str] = []
    for piece in _SENTENCE_END.split(text):
        if parts and parts[-1].endswith(_ABBREVIATIONS):
            parts[-1] = parts[-1] + " " + piece
        else:
            parts.append(piece)
    return [p.strip() for p in parts if p.strip()]


# ---------------------------------------------------------------------- task records


def perplexity_docs(paragraphs: list[Paragraph], max_words: int = PPL_DOC_WORDS) -> list[dict]:
    """Whole paragraphs of one topic joined (blank line between) up to ``max_words`` per document."""
    docs: list[dict] = []
    current: list[Paragraph] = []

    def flush() -> None:
        if current:
            docs.append({"topic": current[0].topic, "text": "\n\n".join(p.text for p in current)})
            current.clear()

    for paragraph in paragraphs:
        if current and (
            paragraph.topic != current[0].topic or sum(p.words for p in current) + paragraph.words > max_words
        ):
            flush()
        current.append(paragraph)
    flush()
    return docs


def next_sentence_items(paragraphs: list[Paragraph], *, seed: int = 0) -> list[dict]:
    """Multiple choice: up to three sentences of a paragraph, then which of four sentences comes
    next. The wrong choices are sentences of similar length from other topics."""
    rng = random.Random(seed)
    split = [(p.topic, sentences(p.text)) for p in paragraphs]
    pool = [(topic, s) for topic, ss in split for s in ss if len(s.split()) >= 6]
    items = []
    for topic, ss in split:
        if len(ss) < 2 or len(ss[-1].split()) < 6:
            continue
        answer = ss[-1]
        length = len(answer.split())
        candidates = sorted(
            {s for t, s in pool if t != topic and 0.6 * length <= len(s.split()) <= 1.6 * length}
        )
        if len(candidates) < CHOICES - 1:
            continue
        choices = [answer, *rng.sample(candidates, CHOICES - 1)]
        rng.shuffle(choices)
        items.append(
            {
                "topic": topic,
                "context": " ".join(ss[-4:-1]),
                "choices": choices,
                "label": choices.index(answer),
            }
        )
    return items


def last_word_items(paragraphs: list[Paragraph]) -> list[dict]:
    """LAMBADA-style: a paragraph without its final word, and that word (full stop dropped)."""
    items = []
    for paragraph in paragraphs:
        match = _LAST_WORD.match(paragraph.text)
        if match:
            items.append({"topic": paragraph.topic, "context": match["context"], "target": match["word"]})
    return items


def task_records() -> dict[str, list[dict]]:
    """Every data file the built-in eval tasks read, by file name."""
    test = prose_paragraphs("test")
    return {
        "prose_ppl.jsonl": perplexity_docs(test),
        "prose_next_sentence.jsonl": next_sentence_items(test),
        "prose_last_word.jsonl": last_word_items(test),
    }


# ---------------------------------------------------------------------- files


@dataclass(frozen=True)
class TaskData:
    """The generated data files and where they came from (goes into eval.json)."""

    directory: Path
    files: dict[str, Path]
    sha256: str
    records: dict[str, int]

    def provenance(self) -> dict:
        return {
            "source": SOURCE,
            "python": sys.version.split()[0],
            "sha256": self.sha256,
            "records": dict(self.records),
        }


def _jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records).encode()


def _write_if_changed(path: Path, data: bytes) -> None:
    if path.is_file() and path.read_bytes() == data:
        return  # same bytes: keep the mtime, so the datasets cache keeps hitting
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path)


def write_task_data(directory: Path) -> TaskData:
    """Write the task data files into ``directory`` (only those whose bytes changed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    files, counts = {}, {}
    for name, records in sorted(task_records().items()):
        data = _jsonl(records)
        digest.update(name.encode() + b"\0" + data)
        _write_if_changed(directory / name, data)
        files[name], counts[name] = directory / name, len(records)
    return TaskData(directory, files, digest.hexdigest(), counts)
