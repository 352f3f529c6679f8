import { create } from "@bufbuild/protobuf";
import { type Part, PartSchema } from "./gen/turnstile/v1/conversation_pb.js";

/** The media types the server takes, by file extension. */
const EXTENSION_TYPES: Record<string, string> = {
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  webp: "image/webp",
  pdf: "application/pdf",
  wav: "audio/wav",
  mp3: "audio/mpeg",
};

function startsWith(data: Uint8Array, prefix: string, at = 0): boolean {
  if (data.length < at + prefix.length) return false;
  for (let i = 0; i < prefix.length; i++) if (data[at + i] !== prefix.charCodeAt(i)) return false;
  return true;
}

/**
 * mediaType returns the media type of a file named name holding data: by its
 * extension when it is one of the server's types (.png, .jpg, .jpeg, .gif,
 * .webp, .pdf, .wav, .mp3), else from data's first bytes; "" when neither
 * says.
 */
export function mediaType(name: string, data: Uint8Array): string {
  const dot = name.lastIndexOf(".");
  const byExt = dot >= 0 ? EXTENSION_TYPES[name.slice(dot + 1).toLowerCase()] : undefined;
  if (byExt) return byExt;
  if (startsWith(data, "\x89PNG\r\n\x1a\n")) return "image/png";
  if (data.length >= 3 && data[0] === 0xff && data[1] === 0xd8 && data[2] === 0xff) return "image/jpeg";
  if (startsWith(data, "GIF87a") || startsWith(data, "GIF89a")) return "image/gif";
  if (startsWith(data, "RIFF") && startsWith(data, "WEBPVP", 8)) return "image/webp";
  if (startsWith(data, "RIFF") && startsWith(data, "WAVE", 8)) return "audio/wav";
  if (startsWith(data, "%PDF-")) return "application/pdf";
  if (startsWith(data, "ID3")) return "audio/mpeg";
  return "";
}

/**
 * mediaPart returns a user message part holding data as media (an image, a
 * PDF, audio), named name (optional; a path is cut to its file name). Without
 * mimeType, mediaType works it out.
 */
export function mediaPart(data: Uint8Array, mimeType?: string, name = ""): Part {
  const base = name.split(/[\\/]/).pop() ?? "";
  return create(PartSchema, {
    kind: {
      case: "media",
      value: { mimeType: mimeType || mediaType(name, data), name: base, source: { case: "data", value: data } },
    },
  });
}

/** mediaUriPart returns a user message part of media the provider fetches from uri (https). */
export function mediaUriPart(uri: string, mimeType: string): Part {
  return create(PartSchema, { kind: { case: "media", value: { mimeType, source: { case: "uri", value: uri } } } });
}
