"""Reading media: cheap header probes for stratification, and decoding for the model's processor.

Probes never decode pixels or samples (a pool of 100,000 records must stratify in bounded memory);
decoders sample only the frames the processor will use.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

import numpy as np

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif"}
VIDEO_EXTENSIONS = {".mp4", ".mkv", ".webm", ".avi", ".mov"}
AUDIO_EXTENSIONS = {".wav", ".flac", ".mp3", ".ogg", ".m4a"}
EXTENSIONS = {"image": IMAGE_EXTENSIONS, "video": VIDEO_EXTENSIONS, "audio": AUDIO_EXTENSIONS}

AUDIO_SAMPLE_RATE = 16_000  # what Whisper-style feature extractors expect


# What stat says is at a path where a regular file belongs, in words for a message.
NOT_A_FILE = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


class MediaError(ValueError):
    """A media file that cannot be probed or decoded; the message says why."""


def require_regular_file(path: Path) -> os.stat_result:
    """``path``'s stat when it is a regular file (symlinks followed); MediaError otherwise, before
    anything opens it (opening a FIFO blocks until a writer comes)."""
    try:
        info = os.stat(path)
    except OSError as err:
        raise MediaError(f"cannot read media file: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = NOT_A_FILE.get(stat.S_IFMT(info.st_mode), "not a regular file")
        raise MediaError(f"the media path is {kind}, not a regular file")
    return info


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

    require_regular_file(path)

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

    require_regular_file(path)
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

    require_regular_file(path)
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


# --- verifying media past their headers (calibrate --verify-media) -----------------------------


def verify_image(path: Path) -> None:
    """Beyond the header probe: a JPEG must end with its end-of-image marker (a file cut after its
    header passes Pillow's verify()); other formats are checked by Pillow's verify() in the probe."""
    if path.suffix.lower() in (".jpg", ".jpeg"):
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64))
            tail = handle.read()
        if b"\xff\xd9" not in tail:
            raise MediaError("truncated JPEG: no end-of-image marker (the file was cut)")


def _decode_tail(path: Path, kind: str) -> None:
    """Seek to the last second of the file's first ``kind`` stream and decode to its end: a file
    cut short fails here, not later in quantize."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = (container.streams.audio if kind == "audio" else container.streams.video)[0]
            duration = _stream_duration(stream, container)
            if duration > 1 and stream.time_base:
                container.seek(
                    int((duration - 1) / stream.time_base), stream=stream, any_frame=kind == "audio"
                )
            reached = None  # where the last decoded frame ends, in seconds
            for frame in container.decode(stream):
                if frame.time is not None:
                    length = frame.samples / frame.sample_rate if kind == "audio" else 0.0
                    reached = max(reached or 0.0, frame.time + length)
            if reached is None:
                raise MediaError(f"{kind} decodes to no frame near its end (truncated file?)")
            # The header's duration with a frame's slack: a file cut short decodes to an earlier end.
            if duration > 1 and reached < duration - max(1.0, 0.05 * duration):
                raise MediaError(
                    f"{kind} does not decode to its end: its header says {duration:.1f} s, "
                    f"the data ends at {reached:.1f} s (truncated file?)"
                )
    except MediaError:
        raise
    except (av.error.FFmpegError, OSError, ValueError, IndexError) as err:
        raise MediaError(f"{kind} does not decode to its end: {err}") from None


def verify_audio(path: Path) -> None:
    """Decode the last audio frames (a WAV's probe already checked its sample bytes are all there)."""
    if path.suffix.lower() == ".wav" and _probe_wav(path) is not None:
        return
    _decode_tail(path, "audio")


def verify_video(path: Path) -> None:
    """Seek to the last second and decode its packets."""
    _decode_tail(path, "video")


VERIFIERS = {"image": verify_image, "video": verify_video, "audio": verify_audio}


# --- writing video (frame lists as MP4s; the zoo's generated clips) --------------------------


@lru_cache(maxsize=1)
def video_codec() -> str:
    """H.264 where this PyAV build has libx264, else MPEG-4 Part 2 (both play in an MP4)."""
    import av

    try:
        av.codec.Codec("libx264", "w")
        return "libx264"
    except Exception:  # noqa: BLE001 - any failure to find the encoder means "use the fallback"
        return "mpeg4"


def write_mp4(
    path: Path,
    frames: Iterator[np.ndarray],
    size: tuple[int, int],
    fps: int,
    audio: np.ndarray | None = None,
    sample_rate: int = AUDIO_SAMPLE_RATE,
) -> None:
    """An MP4 with one yuv420p video stream and, when ``audio`` is given, one mono AAC stream.

    Determinism: with CRF rate control, libx264 gave a differently coded (though identically
    decoding) stream now and then for the same frames, even on one thread; the rate control and
    the lookahead work on half-resolution copies of the frames, the suspected source. So: constant
    QP (which also turns off mbtree and adaptive quantisation), no B-frames, no scene-cut or
    weighted-prediction analysis, which leaves x264 no use for the lookahead at all; one thread;
    and the muxer's ``bitexact`` flag. The MP4 muxer writes no creation time unless asked.
    """
    import av

    width, height = size
    assert width % 2 == 0 and height % 2 == 0, "yuv420p needs even frame dimensions"
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w", format="mp4", options={"fflags": "+bitexact"}) as container:
        video = container.add_stream(video_codec(), rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.time_base = Fraction(1, fps)
        video.codec_context.thread_count = 1
        if video_codec() == "libx264":
            video.options = {
                "preset": "veryfast",
                "qp": "28",
                "x264-params": "bframes=0:scenecut=0:weightp=0",
            }
        sound = None
        if audio is not None:
            sound = container.add_stream("aac", rate=sample_rate, layout="mono")
            sound.bit_rate = 24_000
        for index, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts = index
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
        if sound is not None and audio is not None:
            for offset in range(0, len(audio), 1024):
                chunk = av.AudioFrame.from_ndarray(
                    audio[None, offset : offset + 1024], format="fltp", layout="mono"
                )
                chunk.sample_rate = sample_rate
                chunk.pts = offset
                container.mux(sound.encode(chunk))
            container.mux(sound.encode(None))


def frames_to_mp4(frames: list[Path], fps: int) -> bytes:
    """An MP4 (as ``write_mp4`` writes it) of image files played at ``fps``, every frame resized
    to the first one's size (rounded down to even numbers, as yuv420p needs)."""
    import tempfile

    from PIL import Image

    pictures = []
    for path in frames:
        try:
            with Image.open(path) as image:
                pictures.append(image.convert("RGB"))
        except (OSError, ValueError) as err:
            raise MediaError(f"video frame {path.name}: unreadable image: {err}") from None
    width, height = pictures[0].size
    size = (max(2, width - width % 2), max(2, height - height % 2))
    arrays = (np.asarray(p if p.size == size else p.resize(size)) for p in pictures)
    with tempfile.TemporaryDirectory(prefix="quantkit-frames-") as folder:
        target = Path(folder) / "frames.mp4"
        write_mp4(target, arrays, size, fps)
        return target.read_bytes()
