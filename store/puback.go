package store

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream's publish acknowledgements, read without reflection.
//
// Every frame, run record and lease the store writes is answered by the
// stream with a small JSON object of a fixed form: {"stream":..,"seq":..}
// (with "duplicate":true for a message id seen before, and "domain" in a
// domain), or {"error":{"code":..,"err_code":..,"description":..}}.
// nats.go decodes each with encoding/json, by reflection, about 1% of a
// turn's CPU with the store on for the frames and the record and 2.5% for
// the lease's asynchronous acknowledgement (BENCHMARKS.md, issue #26). The
// store reads them itself, and gives the same results nats.go gives: a
// *jetstream.PubAck, or the failure wrapped as nats.go wraps it (a
// *jetstream.APIError, [jetstream.ErrNoStreamResponse],
// [jetstream.ErrInvalidJSAck]), so every error class the store tests
// (isWrongLastSeq, isInFlightConflict, roomError, mayPass) reads the same.

// decodePubAck returns the acknowledgement data holds, or the failure it
// reports, as nats.go's jetstream client returns them. A form it does not
// know (a field of another type, an escaped string) is decoded by
// encoding/json, so no answer is read differently from nats.go's.
func decodePubAck(data []byte) (*jetstream.PubAck, error) {
	ack, apiErr, ok := scanPubAck(data)
	if !ok {
		return decodePubAckJSON(data)
	}
	if apiErr != nil {
		return nil, fmt.Errorf("nats: %w", apiErr)
	}
	if ack.Stream == "" {
		return nil, jetstream.ErrInvalidJSAck
	}
	return ack, nil
}

// decodePubAckJSON is decodePubAck by encoding/json, as nats.go does it.
func decodePubAckJSON(data []byte) (*jetstream.PubAck, error) {
	var resp struct {
		Error *jetstream.APIError `json:"error,omitempty"`
		*jetstream.PubAck
	}
	if err := json.Unmarshal(data, &resp); err != nil {
		return nil, jetstream.ErrInvalidJSAck
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("nats: %w", resp.Error)
	}
	if resp.PubAck == nil || resp.Stream == "" {
		return nil, jetstream.ErrInvalidJSAck
	}
	return resp.PubAck, nil
}

// scanPubAck reads an acknowledgement of the known form; ok is false for
// anything else.
func scanPubAck(data []byte) (ack *jetstream.PubAck, apiErr *jetstream.APIError, ok bool) {
	sc := ackScanner{data: data}
	ack = &jetstream.PubAck{}
	ok = sc.object(func(key []byte) bool {
		switch string(key) {
		case "stream":
			ack.Stream, ok = sc.str()
		case "domain":
			ack.Domain, ok = sc.str()
		case "seq":
			ack.Sequence, ok = sc.uint()
		case "duplicate":
			ack.Duplicate, ok = sc.bool()
		case "error":
			apiErr = &jetstream.APIError{}
			ok = sc.object(func(key []byte) bool {
				switch string(key) {
				case "code":
					n, ok := sc.uint()
					apiErr.Code = int(n)
					return ok && n <= 1<<31
				case "err_code":
					n, ok := sc.uint()
					apiErr.ErrorCode = jetstream.ErrorCode(n)
					return ok && n <= 1<<16-1
				case "description":
					apiErr.Description, ok = sc.str()
					return ok
				}
				return false
			})
		default:
			return false
		}
		return ok
	})
	sc.space()
	return ack, apiErr, ok && sc.i == len(sc.data)
}

// ackScanner reads the JSON of an acknowledgement: objects, unescaped
// strings, unsigned integers and booleans, which is all the form holds.
type ackScanner struct {
	data []byte
	i    int
}

func (sc *ackScanner) space() {
	for sc.i < len(sc.data) && (sc.data[sc.i] == ' ' || sc.data[sc.i] == '\t' || sc.data[sc.i] == '\n' || sc.data[sc.i] == '\r') {
		sc.i++
	}
}

// take skips c, after any space, and reports whether it was there.
func (sc *ackScanner) take(c byte) bool {
	sc.space()
	if sc.i < len(sc.data) && sc.data[sc.i] == c {
		sc.i++
		return true
	}
	return false
}

// object reads an object, calling field with each key to read its value.
func (sc *ackScanner) object(field func(key []byte) bool) bool {
	if !sc.take('{') {
		return false
	}
	if sc.take('}') {
		return true
	}
	for {
		key, ok := sc.raw()
		if !ok || !sc.take(':') || !field(key) {
			return false
		}
		if sc.take('}') {
			return true
		}
		if !sc.take(',') {
			return false
		}
	}
}

// leaseStream is the stream behind the lease bucket.
const leaseStream = "KV_" + LeaseBucket

// str reads a string of ASCII without escapes (encoding/json replaces
// bytes that are not UTF-8).
func (sc *ackScanner) str() (string, bool) {
	b, ok := sc.raw()
	if !ok {
		return "", false
	}
	// The store's streams' names, without a copy.
	switch string(b) {
	case StreamName:
		return StreamName, true
	case leaseStream:
		return leaseStream, true
	}
	return string(b), true
}

// raw reads a string as str does, and returns its bytes in data.
func (sc *ackScanner) raw() ([]byte, bool) {
	if !sc.take('"') {
		return nil, false
	}
	start := sc.i
	for sc.i < len(sc.data) {
		switch c := sc.data[sc.i]; {
		case c == '"':
			sc.i++
			return sc.data[start : sc.i-1], true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, false
		}
		sc.i++
	}
	return nil, false
}

func (sc *ackScanner) uint() (uint64, bool) {
	sc.space()
	start := sc.i
	for sc.i < len(sc.data) && sc.data[sc.i] >= '0' && sc.data[sc.i] <= '9' {
		sc.i++
	}
	if sc.i == start || sc.i-start > 1 && sc.data[start] == '0' {
		return 0, false
	}
	var n uint64
	for _, c := range sc.data[start:sc.i] {
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, false // out of range
		}
		n = n*10 + d
	}
	return n, true
}

func (sc *ackScanner) bool() (bool, bool) {
	sc.space()
	rest := string(sc.data[sc.i:])
	switch {
	case strings.HasPrefix(rest, "true"):
		sc.i += 4
		return true, true
	case strings.HasPrefix(rest, "false"):
		sc.i += 5
		return false, true
	}
	return false, false
}

// statusNoResponders is the status of the answer NATS sends in place of a
// reply when nothing subscribes to the subject (here: no stream).
const statusNoResponders = "503"

// ackInbox is the store's own reply subscription for the acknowledgements
// of publishes it does not wait on (the first write of each run's lease),
// in place of nats.go's asynchronous publisher, which decodes each with
// encoding/json, and of the frames of the embedded store, which wait for
// theirs after their publish returned ([ackInbox.wait]), not inside it.
type ackInbox struct {
	prefix string // the reply subjects' prefix; a token follows it
	sub    *nats.Subscription

	mu      sync.Mutex
	next    uint64
	pending map[string]*ackFuture
}

// ackFuture is the acknowledgement of one publish: a
// [jetstream.PubAckFuture], so the lease's code takes it as it took
// nats.go's.
type ackFuture struct {
	token string
	msg   *nats.Msg
	ok    chan *jetstream.PubAck
	err   chan error
}

// Ok returns the channel of the acknowledgement.
func (f *ackFuture) Ok() <-chan *jetstream.PubAck { return f.ok }

// Err returns the channel of the failure.
func (f *ackFuture) Err() <-chan error { return f.err }

// Msg returns the message published.
func (f *ackFuture) Msg() *nats.Msg { return f.msg }

// listen subscribes the inbox on nc.
func (in *ackInbox) listen(nc *nats.Conn) error {
	in.prefix = nc.NewInbox() + "."
	in.pending = map[string]*ackFuture{}
	sub, err := nc.Subscribe(in.prefix+"*", in.deliver)
	if err != nil {
		return fmt.Errorf("store: acknowledgements' inbox: %w", err)
	}
	in.sub = sub
	return nil
}

// publishAsync publishes msg with a reply subject of the inbox and returns
// the future of its acknowledgement. Its taker must [ackInbox.forget] it
// when it stops waiting without an answer.
func (in *ackInbox) publishAsync(nc *nats.Conn, msg *nats.Msg) (*ackFuture, error) {
	in.mu.Lock()
	in.next++
	f := &ackFuture{token: strconv.FormatUint(in.next, 36), msg: msg, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	in.pending[f.token] = f
	in.mu.Unlock()
	msg.Reply = in.prefix + f.token
	if err := nc.PublishMsg(msg); err != nil {
		in.forget(f)
		return nil, err
	}
	return f, nil
}

// wait waits for f's answer, within ctx and until closed is, and forgets
// f when it stops waiting without one: the acknowledgement of a publish
// made with [ackInbox.publishAsync], or its failure, as
// [publisher.publishMsg] returns them.
func (in *ackInbox) wait(ctx context.Context, f *ackFuture, closed <-chan struct{}) (*jetstream.PubAck, error) {
	select {
	case ack := <-f.ok:
		return ack, nil
	case err := <-f.err:
		return nil, err
	case <-ctx.Done():
		in.forget(f)
		return nil, ctx.Err()
	case <-closed:
		in.forget(f)
		return nil, ErrClosed
	}
}

// forget drops f, whose answer nobody waits for any more.
func (in *ackInbox) forget(f *ackFuture) {
	in.mu.Lock()
	delete(in.pending, f.token)
	in.mu.Unlock()
}

// deliver answers the future m is the acknowledgement of.
func (in *ackInbox) deliver(m *nats.Msg) {
	token := strings.TrimPrefix(m.Subject, in.prefix)
	in.mu.Lock()
	f := in.pending[token]
	delete(in.pending, token)
	in.mu.Unlock()
	if f == nil {
		return
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == statusNoResponders {
		f.err <- jetstream.ErrNoStreamResponse
		return
	}
	ack, err := decodePubAck(m.Data)
	if err != nil {
		f.err <- err
		return
	}
	f.ok <- ack
}
