package stream

import (
	"context"
	"errors"
	"io"
	"iter"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/llm"
)

// textDecoder decodes events that are plain strings: "stop" finishes the
// reply, "bad" is a decoding failure, "usage" yields usage (no output),
// and anything else is text.
type textDecoder struct{ finished bool }

func (d *textDecoder) Decode(ev string, emit func(llm.Chunk) bool) (bool, *llm.Error) {
	switch ev {
	case "stop":
		d.finished = true
		return true, nil
	case "bad":
		return false, &llm.Error{Kind: llm.KindServerError, Message: "bad event", Provider: "p"}
	case "usage":
		return emit(llm.Chunk{Kind: llm.ChunkUsage, Usage: llm.Usage{OutputTokens: 1}}), nil
	}
	return emit(llm.Chunk{Kind: llm.ChunkText, Text: ev}), nil
}

func (d *textDecoder) Finish() (llm.StopReason, bool) { return llm.StopEndTurn, d.finished }

func (d *textDecoder) Model() string      { return "text-1" }
func (d *textDecoder) ResponseID() string { return "" }

// seq yields evs, then err when it is not nil.
func seq(err error, evs ...string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for _, ev := range evs {
			if !yield(ev, nil) {
				return
			}
		}
		if err != nil {
			yield("", err)
		}
	}
}

// call returns a Call over events whose response has status 200 and
// request id "req", and whose Classify wraps the error as
// KindOverloaded.
func call(events iter.Seq2[string, error]) Call[string] {
	return Call[string]{
		Events:  events,
		Decoder: &textDecoder{},
		Classify: func(err error) *llm.Error {
			return &llm.Error{Kind: llm.KindOverloaded, Message: "classified", Provider: "p", Err: err}
		},
		Response: func() (int, string) { return 200, "req" },
	}
}

// collect runs Consume and returns the chunks and the error it yielded,
// failing t when anything follows an error.
func collect(t *testing.T, ctx context.Context, c Call[string]) ([]llm.Chunk, error) {
	t.Helper()
	var (
		chunks []llm.Chunk
		got    error
	)
	Consume(ctx, "p", c, func(ch llm.Chunk, err error) bool {
		if got != nil {
			t.Fatalf("yield after the error %v: %+v, %v", got, ch, err)
		}
		if err != nil {
			got = err
			return true
		}
		chunks = append(chunks, ch)
		return true
	})
	return chunks, got
}

func TestConsume(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	tests := []struct {
		name      string
		events    iter.Seq2[string, error]
		want      []llm.Chunk
		wantErr   *llm.Error // compared without Err
		wantCause error
	}{
		{
			name:   "finished reply ends with a stop",
			events: seq(nil, "Hel", "lo", "stop"),
			want: []llm.Chunk{
				{Kind: llm.ChunkText, Text: "Hel"}, {Kind: llm.ChunkText, Text: "lo"},
				{Kind: llm.ChunkStop, Stop: llm.StopEndTurn, Model: "text-1"},
			},
		},
		{
			name:    "missing finish after output",
			events:  seq(nil, "Hel"),
			want:    []llm.Chunk{{Kind: llm.ChunkText, Text: "Hel"}},
			wantErr: &llm.Error{Kind: llm.KindStreamInterrupted, Provider: "p", StatusCode: 200, RequestID: "req"},
		},
		{
			name:    "missing finish without output",
			events:  seq(nil, "usage"),
			want:    []llm.Chunk{{Kind: llm.ChunkUsage, Usage: llm.Usage{OutputTokens: 1}}},
			wantErr: &llm.Error{Kind: llm.KindServerError, Provider: "p", StatusCode: 200, RequestID: "req"},
		},
		{
			name:    "decoding failure gets the status and request id",
			events:  seq(nil, "a", "bad", "b"),
			want:    []llm.Chunk{{Kind: llm.ChunkText, Text: "a"}},
			wantErr: &llm.Error{Kind: llm.KindServerError, Message: "bad event", Provider: "p", StatusCode: 200, RequestID: "req"},
		},
		{
			name:      "stream error is classified",
			events:    seq(boom, "a"),
			want:      []llm.Chunk{{Kind: llm.ChunkText, Text: "a"}},
			wantErr:   &llm.Error{Kind: llm.KindOverloaded, Message: "classified", Provider: "p"},
			wantCause: boom,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			chunks, err := collect(t, t.Context(), call(tt.events))
			if diff := cmp.Diff(tt.want, chunks); diff != "" {
				t.Errorf("chunks (-want +got):\n%s", diff)
			}
			if tt.wantErr == nil {
				if err != nil {
					t.Errorf("error = %v, want none", err)
				}
				return
			}
			var e *llm.Error
			if !errors.As(err, &e) {
				t.Fatalf("error = %v, want a *llm.Error", err)
			}
			ignoreMessage := tt.wantErr.Message == ""
			got := *e
			got.Err = nil
			if ignoreMessage {
				got.Message = ""
			}
			if diff := cmp.Diff(tt.wantErr, &got); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if tt.wantCause != nil && !errors.Is(err, tt.wantCause) {
				t.Errorf("error %v does not wrap %v", err, tt.wantCause)
			}
		})
	}
}

// When the caller's context is done, its error is yielded unchanged and
// the stream's error is not classified, whether the events end with an
// error or cleanly.
func TestConsumeCallerCancelled(t *testing.T) {
	t.Parallel()
	for _, events := range []iter.Seq2[string, error]{seq(errors.New("read: context canceled"), "a"), seq(nil, "a", "stop")} {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		c := call(events)
		c.Classify = func(err error) *llm.Error {
			t.Errorf("Classify(%v) called for a cancelled caller", err)
			return &llm.Error{}
		}
		if _, err := collect(t, ctx, c); err != context.Canceled {
			t.Errorf("error = %v, want context.Canceled itself", err)
		}
	}
}

func TestConsumeStopsWithTheCaller(t *testing.T) {
	t.Parallel()
	pulled := 0
	events := func(yield func(string, error) bool) {
		for _, ev := range []string{"a", "b", "c", "stop"} {
			pulled++
			if !yield(ev, nil) {
				return
			}
		}
	}
	var got []llm.Chunk
	Consume(t.Context(), "p", call(events), func(ch llm.Chunk, err error) bool {
		got = append(got, ch)
		return false
	})
	if len(got) != 1 || pulled != 1 {
		t.Errorf("after the caller stopped: %d chunks yielded, %d events pulled, want 1 and 1", len(got), pulled)
	}
}

// reader is a Reader over events, then err.
type reader struct {
	events []string
	err    error
	cur    string
	closed bool
}

func (r *reader) Next() bool {
	if len(r.events) == 0 {
		return false
	}
	r.cur, r.events = r.events[0], r.events[1:]
	return true
}

func (r *reader) Current() string { return r.cur }
func (r *reader) Err() error      { return r.err }
func (r *reader) Close() error    { r.closed = true; return nil }

func TestEvents(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	var got []string
	var gotErr error
	for ev, err := range Events[string](&reader{events: []string{"a", "b"}, err: boom}) {
		if err != nil {
			gotErr = err
			continue
		}
		got = append(got, ev)
	}
	if diff := cmp.Diff([]string{"a", "b"}, got); diff != "" || gotErr != boom {
		t.Errorf("events (-want +got):\n%s\nerror = %v, want %v", diff, gotErr, boom)
	}
	for range Events[string](&reader{events: []string{"a", "b"}}) {
		break // must not panic: Events stops when yield returns false
	}
}

func TestSSE(t *testing.T) {
	t.Parallel()
	resp := &http.Response{StatusCode: 200, Header: http.Header{"X-Request-Id": {"req_sse"}}}
	var classified *http.Response
	c := SSE[string](&reader{events: []string{"a"}, err: errors.New("cut")}, resp, &textDecoder{},
		func(err error, r *http.Response) *llm.Error {
			classified = r
			return &llm.Error{Kind: llm.KindNetwork, Provider: "p", Err: err}
		})
	if code, id := c.Response(); code != 200 || id != "req_sse" {
		t.Errorf("Response() = %d, %q, want 200, req_sse", code, id)
	}
	_, err := collect(t, t.Context(), c)
	var e *llm.Error
	if !errors.As(err, &e) || e.Kind != llm.KindNetwork || classified != resp {
		t.Errorf("error = %v (classified with %p), want KindNetwork classified with the response %p", err, classified, resp)
	}
	if code, id := SSE[string](&reader{}, nil, &textDecoder{}, nil).Response(); code != 0 || id != "" {
		t.Errorf("Response() without a response = %d, %q", code, id)
	}
}

func TestRun(t *testing.T) {
	t.Parallel()
	req := &llm.Request{Model: "m"}
	kindOf := func(seq iter.Seq2[llm.Chunk, error]) llm.Kind {
		t.Helper()
		var kinds []llm.Kind
		for _, err := range seq {
			var e *llm.Error
			if errors.As(err, &e) {
				kinds = append(kinds, e.Kind)
			}
		}
		if len(kinds) != 1 {
			t.Fatalf("errors of kinds %v, want exactly one", kinds)
		}
		return kinds[0]
	}
	noSend := func(string, func(llm.Chunk, error) bool) { t.Error("send called") }
	build := func(r *llm.Request) (string, error) { return r.Model, nil }
	if k := kindOf(Run("p", nil, build, noSend)); k != llm.KindInvalidRequest {
		t.Errorf("nil request: %v, want INVALID_REQUEST", k)
	}
	bad := func(*llm.Request) (string, error) { return "", errors.New("tool t: schema is not a JSON object") }
	if k := kindOf(Run("p", req, bad, noSend)); k != llm.KindInvalidRequest {
		t.Errorf("unmappable request: %v, want INVALID_REQUEST", k)
	}
	panics := func(string, func(llm.Chunk, error) bool) { panic("interface conversion") }
	if k := kindOf(Run("p", req, build, panics)); k != llm.KindServerError {
		t.Errorf("decoder panic: %v, want SERVER_ERROR", k)
	}
	var sent string
	for c, err := range Run("p", req, build, func(params string, yield func(llm.Chunk, error) bool) {
		sent = params
		yield(llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn}, nil)
	}) {
		if err != nil || c.Kind != llm.ChunkStop {
			t.Errorf("got %+v, %v, want the stop", c, err)
		}
	}
	if sent != "m" {
		t.Errorf("send got %q, want build's result", sent)
	}
}

func TestStainless(t *testing.T) {
	t.Parallel()
	type option struct{ dst **http.Response }
	resp := &http.Response{StatusCode: 200}
	r := &reader{events: []string{"a", "stop"}}
	newStreaming := func(ctx context.Context, params string, opts ...option) *reader {
		if params != "m" || len(opts) != 1 {
			t.Errorf("newStreaming(%q, %d options), want m and one option", params, len(opts))
		}
		*opts[0].dst = resp // the SDK fills the response in before it returns
		return r
	}
	responseInto := func(dst **http.Response) option { return option{dst} }
	var consumed *http.Response
	consume := func(ctx context.Context, s *reader, got *http.Response, yield func(llm.Chunk, error) bool) {
		consumed = got
		Consume(ctx, "p", SSE[string](s, got, &textDecoder{}, nil), yield)
	}
	build := func(r *llm.Request) (string, error) { return r.Model, nil }
	var chunks []llm.Chunk
	for c, err := range Stainless(t.Context(), "p", &llm.Request{Model: "m"}, build, newStreaming, responseInto, consume) {
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, c)
	}
	if len(chunks) != 2 || consumed != resp || !r.closed {
		t.Errorf("chunks %+v, consumed with %p (want %p), closed %v: want two chunks, the response, and the stream closed",
			chunks, consumed, resp, r.closed)
	}
}

// TestEventReaderLongLines reads events whose lines are shorter than,
// exactly as long as, and far longer than a scanner's initial buffer,
// whole and one byte per read: the buffer grows for a long line and the
// events come out whole, as the SDKs split them.
func TestEventReaderLongLines(t *testing.T) {
	t.Parallel()
	for _, n := range []int{10, scanStart - len("data: \n"), scanStart - len("data: "), scanStart, scanStart + 1, 5 * scanStart, 70 << 10} {
		long := strings.Repeat("x", n)
		body := "event: a\ndata: " + long + "\n\ndata: short\r\n\r\n: comment\ndata: " + long + "\ndata: two\n\n"
		want := []string{"a|" + long + "\n", "|short\n", "|" + long + "\ntwo\n"}
		for name, r := range map[string]io.Reader{"whole": strings.NewReader(body), "byte by byte": iotest.OneByteReader(strings.NewReader(body))} {
			er := NewEventReader(r, false)
			var got []string
			for er.Next() {
				got = append(got, string(er.Type())+"|"+string(er.Data()))
			}
			if er.Err() != nil || !slices.Equal(got, want) {
				t.Errorf("line of %d bytes, %s: events %.80q, err %v: want %.80q", n, name, got, er.Err(), want)
			}
			er.Release()
		}
	}
}
