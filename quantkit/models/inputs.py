"""Turn a pool sample (chat turns with <image>/<video>/<audio> placeholders and media paths) into
model inputs through the model's own processor and chat template.

This is the one path by which media reach a model in quantkit: calibration, drift checks and
tests all call :func:`processor_inputs`, so what is calibrated is what is served.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from quantkit.chat import chat_messages, placeholder_order
from quantkit.media import load_audio, load_image, load_video, probe_video


@dataclass(frozen=True)
class Sample:
    """A conversation and the media its placeholders refer to, in placeholder order."""

    messages: list[dict]
    images: list[Path] = field(default_factory=list)
    videos: list[Path] = field(default_factory=list)
    audios: list[Path] = field(default_factory=list)

    @classmethod
    def from_row(cls, row: dict) -> Sample:
        """A sample from a samples.jsonl row of a calibration set (media as path strings)."""
        return cls(
            messages=row["messages"],
            images=[Path(p) for p in row.get("images") or []],
            videos=[Path(p) for p in row.get("videos") or []],
            audios=[Path(p) for p in row.get("audios") or []],
        )


class UnsupportedModality(ValueError):
    """The sample holds a medium the model (its processor) cannot take."""


def processor_capabilities(processor) -> set[str]:
    """The media kinds a processor can turn into inputs (a bare tokenizer takes none)."""
    kinds = set()
    if getattr(processor, "image_processor", None) is not None:
        kinds.add("image")
    if getattr(processor, "video_processor", None) is not None:
        kinds.add("video")
    if getattr(processor, "feature_extractor", None) is not None:
        kinds.add("audio")
    return kinds


def _video_settings(video_processor) -> tuple[float, int, int]:
    fps = float(getattr(video_processor, "fps", None) or 2.0)
    max_frames = int(getattr(video_processor, "max_frames", None) or 64)
    min_frames = int(getattr(video_processor, "min_frames", None) or 2)
    return fps, max_frames, min_frames


def processor_inputs(processor, sample: Sample, *, add_generation_prompt: bool = False) -> dict:
    """Render the chat template and run the processor on the decoded media; returns tensors.

    Videos with an audio track feed their sound too when the processor takes audio
    (``use_audio_in_video``, as Qwen-Omni serves them).
    """
    kinds = processor_capabilities(processor)
    order = placeholder_order(sample.messages)
    wanted = {kind for kind in order}
    missing = wanted - kinds
    if missing:
        raise UnsupportedModality(f"the model's processor takes no {', '.join(sorted(missing))} input")

    template_owner = processor if hasattr(processor, "apply_chat_template") else processor.tokenizer
    text = template_owner.apply_chat_template(
        chat_messages(sample.messages), add_generation_prompt=add_generation_prompt, tokenize=False
    )
    if not kinds:  # text-only model: the processor is the tokenizer
        return dict(processor(text, return_tensors="pt"))

    call: dict = {}
    if sample.images:
        call["images"] = [load_image(path) for path in sample.images]

    use_audio_in_video = False
    if sample.videos:
        fps, max_frames, min_frames = _video_settings(processor.video_processor)
        decoded = [
            load_video(path, fps=fps, max_frames=max_frames, min_frames=min_frames) for path in sample.videos
        ]
        call["videos"] = [video.frames for video in decoded]
        # Frames are already sampled here (only those are decoded); the processor must not resample.
        videos_kwargs = {
            "video_metadata": [video.metadata for video in decoded],
            "do_sample_frames": False,
            "size": dict(processor.video_processor.size),
        }
        if "audio" in kinds:
            use_audio_in_video = all(probe_video(path).has_audio for path in sample.videos)
            videos_kwargs["use_audio_in_video"] = use_audio_in_video
            videos_kwargs["fps"] = fps
        call["videos_kwargs"] = videos_kwargs

    # Audio clips in the order their tokens appear: a video with sound contributes its track.
    audio_sources: list[Path] = []
    audio_iter, video_iter = iter(sample.audios), iter(sample.videos)
    for kind in order:
        if kind == "audio":
            audio_sources.append(next(audio_iter))
        elif kind == "video":
            video = next(video_iter)
            if use_audio_in_video:
                audio_sources.append(video)
    if audio_sources:
        call["audio"] = [load_audio(path) for path in audio_sources]

    inputs = processor(text=[text], return_tensors="pt", **call)
    result = dict(inputs)
    if use_audio_in_video:
        result["use_audio_in_video"] = True
    return result
