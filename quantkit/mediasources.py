"""Where media may come from: the places the user named (the pool's folder, every ``--media-root``)
and media that arrive as bytes (data URIs, datasets features), stored as content-addressed files."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from quantkit.media import EXTENSIONS, NOT_A_FILE, MediaError

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
