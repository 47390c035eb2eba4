"""Reading media: cheap header probes for stratification, and decoding for the model's processor.

Probes never decode pixels or samples (a pool of 100,000 records must stratify in bounded memory);
decoders sample only the frames the processor will use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif"}
VIDEO_EXTENSIONS = {".mp4", ".mkv", ".webm", ".avi", ".mov"}
AUDIO_EXTENSIONS = {".wav", ".flac", ".mp3", ".ogg", ".m4a"}
EXTENSIONS = {"image": IMAGE_EXTENSIONS, "video": VIDEO_EXTENSIONS, "audio": AUDIO_EXTENSIONS}

AUDIO_SAMPLE_RATE = 16_000  # what Whisper-style feature extractors expect


class MediaError(ValueError):
    """A media file that cannot be probed or decoded; the message says why."""


@dataclass(frozen=True)
class ImageInfo:
    width: int
    height: int


@dataclass(frozen=True)
class VideoInfo:
    width: int
    height: int
    duration_s: float
    fps: float
    frames: int
    has_audio: bool


@dataclass(frozen=True)
class AudioInfo:
    duration_s: float
    sample_rate: int


def check_extension(path: Path, kind: str) -> None:
    if path.suffix.lower() not in EXTENSIONS[kind]:
        allowed = ", ".join(sorted(EXTENSIONS[kind]))
        raise MediaError(f"unsupported {kind} extension {path.suffix or '(none)'!r}; supported: {allowed}")


def probe_image(path: Path) -> ImageInfo:
    """Width and height from the file header (PIL opens lazily), plus a check that it is complete."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            width, height = image.size
            image.verify()  # parses the file structure without decoding pixels; catches truncation
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise MediaError(f"unreadable image: {err}") from None
    if width <= 0 or height <= 0:
        raise MediaError(f"image has no pixels ({width}x{height})")
    return ImageInfo(width, height)


def _stream_duration(stream, container) -> float:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # av.time_base is microseconds
    return 0.0


def probe_video(path: Path) -> VideoInfo:
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise MediaError("file has no video stream")
            stream = container.streams.video[0]
            fps = float(stream.average_rate or stream.guessed_rate or 0)
            duration = _stream_duration(stream, container)
            frames = stream.frames or int(round(duration * fps))
            info = VideoInfo(
                width=stream.codec_context.width,
                height=stream.codec_context.height,
                duration_s=duration,
                fps=fps,
                frames=frames,
                has_audio=bool(container.streams.audio),
            )
    except MediaError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as err:
        raise MediaError(f"unreadable video: {err}") from None
    if info.duration_s <= 0 or info.width <= 0 or info.height <= 0:
        raise MediaError("video header gives no duration or frame size (truncated file?)")
    return info


def _probe_wav(path: Path) -> AudioInfo | None:
    """PCM WAV headers with the standard library (~30x cheaper than opening a container);
    None for WAVs it cannot read (compressed formats), which PyAV then handles."""
    import wave

    try:
        with wave.open(str(path), "rb") as handle:
            rate, frames = handle.getframerate(), handle.getnframes()
            data_bytes = frames * handle.getnchannels() * handle.getsampwidth()
    except (wave.Error, EOFError):
        return None
    if os.path.getsize(path) < data_bytes:
        raise MediaError("truncated WAV: the header promises more samples than the file holds")
    return AudioInfo(frames / rate, rate) if rate > 0 and frames > 0 else None


def probe_audio(path: Path) -> AudioInfo:
    if path.suffix.lower() == ".wav" and (info := _probe_wav(path)) is not None:
        return info
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise MediaError("file has no audio stream")
            stream = container.streams.audio[0]
            duration = _stream_duration(stream, container)
            rate = stream.codec_context.sample_rate or stream.rate or 0
    except MediaError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as err:
        raise MediaError(f"unreadable audio: {err}") from None
    if duration <= 0:
        raise MediaError("audio header gives no duration (truncated file?)")
    return AudioInfo(duration, rate)


# --- decoding, for the processor -------------------------------------------------------------


def load_image(path: Path):
    from PIL import Image

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except OSError as err:
        raise MediaError(f"cannot decode image: {err}") from None


@dataclass
class DecodedVideo:
    frames: np.ndarray  # (T, H, W, 3) uint8
    metadata: dict  # what transformers' video processors take as video_metadata


def load_video(path: Path, *, fps: float, max_frames: int, min_frames: int = 2) -> DecodedVideo:
    """Decode only the frames a processor sampling at ``fps`` (at most ``max_frames``) would keep.

    Returns frames and the metadata (source fps, kept frame indices, total frames) that
    transformers' Qwen video processors use to place timestamps.
    """
    import av

    info = probe_video(path)
    total = max(info.frames, 1)
    wanted = int(round(info.duration_s * fps))
    count = int(min(max(wanted, min_frames), max_frames, total))
    count = max(count, 1)
    indices = np.linspace(0, total - 1, count).round().astype(int)
    keep = set(indices.tolist())
    frames: list[np.ndarray] = []
    try:
        with av.open(str(path)) as container:
            for i, frame in enumerate(container.decode(video=0)):
                if i in keep:
                    frames.append(frame.to_ndarray(format="rgb24"))
                if i >= indices[-1]:
                    break
    except (av.error.FFmpegError, OSError) as err:
        raise MediaError(f"cannot decode video: {err}") from None
    if not frames:
        raise MediaError("video decoded to no frames")
    # Streams whose header overstates the frame count: keep what decoded, in order.
    kept = sorted(keep)[: len(frames)]
    # Temporal patches come in pairs: repeat the last frame rather than fail on an odd count.
    if len(frames) % 2:
        frames.append(frames[-1])
        kept.append(kept[-1])
    metadata = {
        "fps": info.fps,
        "frames_indices": kept,
        "total_num_frames": total,
        "duration": info.duration_s,
        "height": info.height,
        "width": info.width,
    }
    return DecodedVideo(np.stack(frames), metadata)


def load_audio(
    path: Path, *, sample_rate: int = AUDIO_SAMPLE_RATE, max_seconds: float | None = None
) -> np.ndarray:
    """Decode the first audio stream of ``path`` (an audio file or a video's track) to mono float32."""
    import av

    resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
    chunks: list[np.ndarray] = []
    limit = int(max_seconds * sample_rate) if max_seconds else None
    got = 0
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise MediaError("file has no audio stream")
            for frame in container.decode(audio=0):
                for out in resampler.resample(frame):
                    array = out.to_ndarray().reshape(-1)
                    chunks.append(array)
                    got += array.size
                if limit is not None and got >= limit:
                    break
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
    except MediaError:
        raise
    except (av.error.FFmpegError, OSError) as err:
        raise MediaError(f"cannot decode audio: {err}") from None
    if not chunks:
        raise MediaError("audio decoded to no samples")
    audio = np.concatenate(chunks).astype(np.float32)
    return audio[:limit] if limit is not None else audio
