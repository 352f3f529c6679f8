import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { mediaPart, mediaType, mediaUriPart } from "../src/index.js";

describe("media", () => {
  it("works out a media type from the extension, else the bytes", () => {
    const bytes = (s: string) => Uint8Array.from(s, (c) => c.charCodeAt(0));
    assert.equal(mediaType("shot.PNG", new Uint8Array()), "image/png");
    assert.equal(mediaType("talk.mp3", new Uint8Array()), "audio/mpeg");
    assert.equal(mediaType("shot", bytes("\x89PNG\r\n\x1a\n\0\0")), "image/png");
    assert.equal(mediaType("report", bytes("%PDF-1.7\n")), "application/pdf");
    assert.equal(mediaType("voice", bytes("RIFF\x24\0\0\0WAVEfmt ")), "audio/wav");
    assert.equal(mediaType("notes", bytes("plain words")), "");
  });

  it("makes media parts from bytes and from a URI", () => {
    const data = Uint8Array.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
    const p = mediaPart(data, undefined, "/tmp/dir/shot");
    assert.equal(p.kind.case, "media");
    if (p.kind.case !== "media") return;
    assert.equal(p.kind.value.mimeType, "image/png");
    assert.equal(p.kind.value.name, "shot");
    assert.deepEqual(p.kind.value.source, { case: "data", value: data });
    const u = mediaUriPart("https://example.com/a.pdf", "application/pdf");
    assert.deepEqual(u.kind.case === "media" && u.kind.value.source, { case: "uri", value: "https://example.com/a.pdf" });
  });
});
