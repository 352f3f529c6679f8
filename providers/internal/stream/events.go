package stream

import (
	"bufio"
	"bytes"
	"io"
	"sync"
	"time"
)

// EventReader reads the events of a text/event-stream body exactly as the
// event-stream decoders of the Stainless SDKs (openai-go and
// anthropic-sdk-go) split them — the same line scanner, buffer limit and
// field rules — without their per-event allocations: the data buffer is
// reused from one event to the next, and the scanner's buffer comes from a
// pool. An adapter that decodes the events of a successful response itself
// reads them with it, and hands any event it does not decode to its SDK.
//
// An EventReader is not safe for concurrent use. Call Release when done.
type EventReader struct {
	scn *bufio.Scanner
	buf *[]byte
	// dispatchTyped dispatches an event with a type and no data, as
	// anthropic-sdk-go does; openai-go dispatches only events with data.
	dispatchTyped bool
	typ           []byte
	data          []byte
	err           error
}

// scanStart is the size of a scanner's initial buffer, bufio's start
// size; a longer line grows it by doubling, up to the limit. (A 1 KiB start
// saved a held turn 3-4 KiB and cost every turn 2-5% more instructions:
// BENCHMARKS.md, h2bench.)
const scanStart = 4096

// scanBufs are the scanners' initial buffers, of scanStart bytes.
var scanBufs = sync.Pool{New: func() any { b := make([]byte, scanStart); return &b }}

// NewEventReader returns a reader of body's events. dispatchTyped selects
// the rule of anthropic-sdk-go (an event line alone dispatches an event);
// false selects that of openai-go (only data dispatches).
func NewEventReader(body io.Reader, dispatchTyped bool) *EventReader {
	r := &EventReader{scn: bufio.NewScanner(body), buf: scanBufs.Get().(*[]byte), dispatchTyped: dispatchTyped}
	// The SDKs' limit: bufio.MaxScanTokenSize<<9 (32 MiB) per line.
	r.scn.Buffer((*r.buf)[:0], bufio.MaxScanTokenSize<<9)
	return r
}

// Next advances to the next event and reports whether there is one. At
// the end of the body, or on a read error ([EventReader.Err]), it returns
// false; an event not ended by a blank line is dropped, as the SDKs do.
func (r *EventReader) Next() bool {
	if r.err != nil || r.scn == nil {
		return false
	}
	r.typ, r.data = r.typ[:0], r.data[:0]
	for r.scn.Scan() {
		line := r.scn.Bytes()
		if len(line) == 0 {
			if len(r.data) > 0 || r.dispatchTyped && len(r.typ) > 0 {
				return true
			}
			r.typ = r.typ[:0]
			continue
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
		switch string(name) {
		case "event":
			r.typ = append(r.typ[:0], value...)
		case "data":
			r.data = append(r.data, value...)
			r.data = append(r.data, '\n')
		}
	}
	r.err = r.scn.Err()
	return false
}

// Type returns the current event's type, empty when it has none. It is
// valid until the next call of Next.
func (r *EventReader) Type() []byte { return r.typ }

// Data returns the current event's data: its data lines, each followed by
// a newline. It is valid until the next call of Next.
func (r *EventReader) Data() []byte { return r.data }

// Err returns the read error that ended the events, nil at a clean end.
func (r *EventReader) Err() error { return r.err }

// Release returns the reader's buffer; the reader must not be used
// afterwards.
func (r *EventReader) Release() {
	if r.buf != nil {
		scanBufs.Put(r.buf)
		r.buf, r.scn = nil, nil
	}
}

// Drain reads what is left of body, up to 64 KiB, so that an HTTP/1.1
// connection whose reply ended (OpenAI's [DONE]) goes back to the pool
// instead of being closed: closing a body before its end closes the
// connection, and the next call dials again. A server that keeps the body
// open longer than wait has it closed.
func Drain(body io.ReadCloser, wait time.Duration) {
	t := time.AfterFunc(wait, func() { _ = body.Close() })
	_, _ = io.CopyN(io.Discard, body, 64<<10)
	t.Stop()
}
