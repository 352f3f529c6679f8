"""Media parts made from bytes, files and URIs."""

from __future__ import annotations

import os
import tempfile
import unittest

import turnstile_client as ts

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"


class MediaTest(unittest.TestCase):
    def test_media_type(self) -> None:
        for name, data, want in [
            ("shot.PNG", b"", "image/png"),
            ("talk.mp3", b"", "audio/mpeg"),
            ("shot", PNG, "image/png"),
            ("report", b"%PDF-1.7\n", "application/pdf"),
            ("voice", b"RIFF\x24\x00\x00\x00WAVEfmt ", "audio/wav"),
            ("notes", b"plain words", ""),
        ]:
            self.assertEqual(ts.media_type(name, data), want, name)

    def test_parts(self) -> None:
        p = ts.media_part(PNG, name="/tmp/dir/shot").media
        self.assertEqual((p.mime_type, p.name, p.data), ("image/png", "shot", PNG))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "doc.pdf")
            with open(path, "wb") as f:
                f.write(b"%PDF-1.7")
            f = ts.media_file_part(path).media
            self.assertEqual((f.mime_type, f.name, f.data), ("application/pdf", "doc.pdf", b"%PDF-1.7"))
        u = ts.media_uri_part("https://example.com/a.pdf", "application/pdf").media
        self.assertEqual((u.WhichOneof("source"), u.uri), ("uri", "https://example.com/a.pdf"))
