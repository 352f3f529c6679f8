"""Media parts: images, PDF documents and audio sent with a user message."""

from __future__ import annotations

import os

from .v1 import conversation_pb2

# The media types the server takes, by file extension.
_EXTENSION_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".pdf": "application/pdf",
    ".wav": "audio/wav",
    ".mp3": "audio/mpeg",
}


def media_type(name: str, data: bytes) -> str:
    """Returns the media type of a file named name holding data.

    By its extension when it is one of the server's types (.png, .jpg, .jpeg,
    .gif, .webp, .pdf, .wav, .mp3), else from data's first bytes; "" when
    neither says.
    """
    ext = os.path.splitext(name)[1].lower()
    if ext in _EXTENSION_TYPES:
        return _EXTENSION_TYPES[ext]
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data.startswith(b"RIFF") and data[8:14] == b"WEBPVP":
        return "image/webp"
    if data.startswith(b"RIFF") and data[8:12] == b"WAVE":
        return "audio/wav"
    if data.startswith(b"%PDF-"):
        return "application/pdf"
    if data.startswith(b"ID3"):
        return "audio/mpeg"
    return ""


def media_part(data: bytes, mime_type: str = "", name: str = "") -> conversation_pb2.Part:
    """Returns a user message part holding data as media (an image, a PDF, audio).

    name is optional (a path is cut to its file name); without mime_type,
    media_type works it out.
    """
    return conversation_pb2.Part(
        media=conversation_pb2.Media(
            mime_type=mime_type or media_type(name, data), name=os.path.basename(name), data=bytes(data)
        )
    )


def media_file_part(path: str | os.PathLike[str]) -> conversation_pb2.Part:
    """Returns a media part of the file at path, its type from its name or contents."""
    with open(path, "rb") as f:
        data = f.read()
    return media_part(data, name=os.fspath(path))


def media_uri_part(uri: str, mime_type: str) -> conversation_pb2.Part:
    """Returns a user message part of media the provider fetches from uri (https)."""
    return conversation_pb2.Part(media=conversation_pb2.Media(mime_type=mime_type, uri=uri))
