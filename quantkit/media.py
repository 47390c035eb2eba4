"""Reading media: cheap header probes for stratification, and decoding for the model's processor.

Probes never decode pixels or samples (a pool of 100,000 records must stratify in bounded memory);
decoders sample only the frames the processor will use.
"""

from __future__ import annotations

import errno
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


# --- where media may come from: the places the user named -------------------------------------


MIME_EXTENSIONS = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/jpg": ".jpg",
    "image/webp": ".webp",
    "image/gif": ".gif",
    "image/bmp": ".bmp",
    "audio/wav": ".wav",
    "audio/x-wav": ".wav",
    "audio/wave": ".wav",
    "audio/flac": ".flac",
    "audio/mpeg": ".mp3",
    "audio/mp3": ".mp3",
    "audio/ogg": ".ogg",
    "audio/mp4": ".m4a",
    "video/mp4": ".mp4",
    "video/webm": ".webm",
    "video/quicktime": ".mov",
    "video/x-matroska": ".mkv",
}
# Formats named by their short spelling (OpenAI's input_audio "format", Pillow's format names).
FORMAT_EXTENSIONS = {
    "wav": ".wav",
    "mp3": ".mp3",
    "flac": ".flac",
    "ogg": ".ogg",
    "m4a": ".m4a",
    "png": ".png",
    "jpeg": ".jpg",
    "jpg": ".jpg",
    "webp": ".webp",
    "gif": ".gif",
    "bmp": ".bmp",
    "mp4": ".mp4",
}


def _sniff_extension(data: bytes, kind: str) -> str | None:
    """The file extension the bytes' magic number says, for embedded media without a name."""
    if data.startswith(b"\x89PNG"):
        return ".png"
    if data.startswith(b"\xff\xd8"):
        return ".jpg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ".webp"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return ".wav"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return ".gif"
    if data.startswith(b"BM"):
        return ".bmp"
    if data.startswith(b"fLaC"):
        return ".flac"
    if data.startswith(b"OggS"):
        return ".ogg"
    if data.startswith(b"ID3") or data[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2"):
        return ".mp3"
    if data[4:8] == b"ftyp":
        return ".mp4" if kind == "video" else ".m4a"
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return ".mkv" if kind == "video" else None
    return None


class MediaStore:
    """Media that arrive as bytes (base64 data URIs, a datasets ``Image`` / ``Audio`` feature),
    written once as content-addressed files ``<sha256[:32]><ext>`` in one folder, so that the same
    bytes always get the same path and a calibration set can carry the ones it selects."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._written: set[str] = set()

    def put(self, data: bytes, kind: str, *, name_hint: str | None = None, mime: str | None = None) -> Path:
        import hashlib

        ext = None
        if mime:
            ext = MIME_EXTENSIONS.get(mime.lower())
        if ext is None and name_hint:
            suffix = Path(name_hint).suffix.lower()
            ext = suffix if suffix in EXTENSIONS[kind] else None
        ext = ext or _sniff_extension(data, kind) or (name_hint and Path(name_hint).suffix.lower()) or ""
        name = hashlib.sha256(data).hexdigest()[:32] + ext
        path = self.folder / name
        if name not in self._written:
            self.folder.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                partial = path.with_name(f".{name}.{os.getpid()}.partial")  # processes reading parts of a pool write too
                partial.write_bytes(data)
                partial.replace(path)
            self._written.add(name)
        return path


def decode_data_uri(text: str) -> tuple[bytes, str | None]:
    """``data:[<mime>][;base64],<data>`` -> (bytes, mime). Raises MediaError for a malformed one."""
    import base64
    import binascii
    from urllib.parse import unquote_to_bytes

    head, sep, body = text.partition(",")
    if not sep or not head.startswith("data:"):
        raise MediaError("malformed data URI: expected 'data:<mime>;base64,<data>'")
    params = head[5:].split(";")
    mime = params[0] or None
    try:
        data = base64.b64decode(body, validate=False) if "base64" in params[1:] else unquote_to_bytes(body)
    except (binascii.Error, ValueError) as err:
        raise MediaError(f"malformed base64 in a data URI: {err}") from None
    if not data:
        raise MediaError("empty data URI")
    return data, mime


# What stat says is at a path where a regular file belongs, in words for a message.
NOT_A_FILE = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def file_kind(path: Path) -> str:
    """'file' (a regular file, symlinks followed), 'missing', 'too-long' (a name longer than the
    file system allows), or NOT_A_FILE's word for what is there instead."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        return "too-long" if err.errno == errno.ENAMETOOLONG else "missing"
    if stat.S_ISREG(mode):
        return "file"
    return NOT_A_FILE.get(stat.S_IFMT(mode), "not a regular file")


def is_utf8_name(text: str) -> bool:
    """``text`` (a path as Python holds it) is valid UTF-8: bytes that are not come as lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class MediaRoots:
    """The places media may come from: the pool's own folder and every ``--media-root``.

    Relative paths resolve against the pool's folder, then against each media root in order (as
    LLaMA-Factory's ``media_dir`` and ms-swift's absolute paths are meant); absolute paths and
    ``file://`` URIs must lie inside one of the roots. The file's real location (symlinks followed)
    must lie inside one too: a link that leaves the allowed places is refused."""

    def __init__(self, base: Path, media_roots: tuple[Path, ...] = ()) -> None:
        self.base = Path(os.path.normpath(Path(base).absolute()))
        self.roots = (self.base, *(Path(os.path.normpath(Path(r).absolute())) for r in media_roots))
        self.real_roots = tuple(Path(os.path.realpath(r)) for r in self.roots)
        self._near: dict[str, list[Path]] | None = None  # find_root's listing, made on first use

    def _inside(self, path: Path, roots: tuple[Path, ...]) -> bool:
        return any(root == path or root in path.parents for root in roots)

    def resolve(self, text: str) -> Path | str:
        """The absolute (lexically normalised) path of ``text``, or an error word: 'escapes',
        'missing', 'link-escapes', 'remote', 'not-utf8', 'too-long', or what is there instead of a
        file (NOT_A_FILE's values: 'a folder', 'a FIFO', ...)."""
        if text.startswith(("http://", "https://", "ftp://", "s3://", "gs://", "oss://")):
            return "remote"
        if text.startswith("file://"):
            from urllib.parse import unquote, urlparse

            text = unquote(urlparse(text).path)
        path = Path(text)
        if path.is_absolute():
            candidates = [Path(os.path.normpath(path))]
        else:
            candidates = [Path(os.path.normpath(root / path)) for root in self.roots]
        inside = [c for c in candidates if self._inside(c, self.roots)]
        if not inside:
            return "escapes"
        if not is_utf8_name(text):
            return "not-utf8"
        kinds = [file_kind(c) for c in inside]
        full = next((c for c, kind in zip(inside, kinds, strict=True) if kind == "file"), None)
        if full is None:
            return next((kind for kind in kinds if kind != "missing"), "missing")
        if not self._inside(Path(os.path.realpath(full)), self.real_roots):
            return "link-escapes"
        return full

    def relative(self, path: Path) -> str:
        """``path`` relative to the first root holding it (for ids that do not depend on where
        the pool lies), else as it is."""
        for root in self.roots:
            if root in path.parents:
                return str(path.relative_to(root))
        return str(path)

    def find_root(self, text: str) -> Path | None:
        """A folder from which relative ``text`` names an existing file, near the pool: under the
        pool folder or one of its NEAR_LEVELS parents, NEAR_DEPTH folders down (hidden ones
        skipped): the --media-root a "not found" message suggests. None if none. The folders are
        listed once (bounded), so the answer depends only on ``text`` and the files."""
        if self._near is None:
            self._near = _near_index(self.base, self.roots)
        head = Path(text).parts[0] if Path(text).parts else ""
        for folder in self._near.get(head, ()):
            if (folder / text).is_file():
                return folder
        return None

    def describe(self) -> str:
        if len(self.roots) == 1:
            return f"the pool folder {self.base}"
        return "the pool folder and the media roots: " + ", ".join(str(r) for r in self.roots)


NEAR_LEVELS, NEAR_DEPTH = 3, 3  # where find_root looks: parents of the pool folder, folders down
_NEAR_FOLDERS, _NEAR_ENTRIES = 4000, 500_000  # and at most this much of it (an error path only)


def _near_index(base: Path, roots: tuple[Path, ...]) -> dict[str, list[Path]]:
    """Entry name -> the folders (near ``base``, in a fixed order) holding an entry of that
    name; the places a relative path starting with that name could be found from."""
    index: dict[str, list[Path]] = {}
    folders = entries = 0
    seen: set[Path] = set()
    for top in [base, *base.parents][: NEAR_LEVELS + 1]:
        if top.parent == top:  # never the whole file system (and its /proc)
            break
        layer = [top]
        for _ in range(NEAR_DEPTH + 1):
            following = []
            for folder in layer:
                if folder in seen:
                    continue
                seen.add(folder)
                folders += 1
                try:
                    children = sorted(os.scandir(folder), key=lambda e: e.name)
                except OSError:
                    continue
                for entry in children:
                    if entry.name.startswith("."):
                        continue
                    if folder not in roots:
                        index.setdefault(entry.name, []).append(folder)
                        entries += 1
                    try:
                        if entry.is_dir():
                            following.append(Path(entry.path))
                    except OSError:  # unreadable: not a place media can be read from either
                        continue
                if folders >= _NEAR_FOLDERS or entries >= _NEAR_ENTRIES:
                    return index
            layer = following
    return index


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
