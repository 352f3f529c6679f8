package durable

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	durablev1 "github.com/turnstile-dev/turnstile/gen/turnstile/durable/v1"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// runRecord is the first record of a run's log: the request that created
// the run and what a replica needs to attach to it, tell whose it is, and
// take it over. It is stored as a durablev1.RunRecord, the request in its
// wire form as it is (marshal), so a request up to the record's size less
// a margin fits; readRecord also reads the JSON of the version before.
type runRecord struct {
	// Hash identifies the request's content: every field but turn_id and
	// attempt.
	Hash []byte
	// Request is the request as the client sent it, in its wire form.
	Request []byte
	// Started is when the run was created.
	Started time.Time
	// Deadline is the turn's deadline, the first request's; zero is none.
	Deadline time.Time
	// Model is the alias the turn runs on, as the server resolved it (a
	// client key may change the default).
	Model string
	// Client is the name of the client key that created the run; only
	// that key may watch, cancel or attach to it. Empty without keys.
	Client string
}

// marshal returns r as the log stores it: a durablev1.RunRecord in
// protobuf's deterministic encoding, whose first byte is never '{' (its
// first field, the hash, is always set; see readRecord).
func (r runRecord) marshal() []byte {
	m := &durablev1.RunRecord{Hash: r.Hash, Request: r.Request, Started: timestamppb.New(r.Started), Model: r.Model, Client: r.Client}
	if !r.Deadline.IsZero() {
		m.Deadline = timestamppb.New(r.Deadline)
	}
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	return b
}

// readRecord reads a run's first record: a durablev1.RunRecord, or the
// JSON object the version before wrote (the request in base64), which
// starts with '{' where a RunRecord's encoding starts with its hash's tag.
// A replica of this version reads the runs a replica of the version
// before created for as long as the log keeps them (store.retention); the
// version before cannot read this version's (docs/durable-turns.md).
func readRecord(b []byte) (runRecord, error) {
	if len(b) > 0 && b[0] == '{' {
		var old jsonRecord
		if err := json.Unmarshal(b, &old); err != nil {
			return runRecord{}, fmt.Errorf("run record (JSON): %w", err)
		}
		return runRecord(old), nil
	}
	var m durablev1.RunRecord
	if err := proto.Unmarshal(b, &m); err != nil {
		return runRecord{}, fmt.Errorf("run record: %w", err)
	}
	if len(m.GetHash()) == 0 {
		return runRecord{}, errors.New("run record: no request hash")
	}
	r := runRecord{Hash: m.GetHash(), Request: m.GetRequest(), Started: m.GetStarted().AsTime(), Model: m.GetModel(), Client: m.GetClient()}
	if m.GetDeadline() != nil {
		r.Deadline = m.GetDeadline().AsTime()
	}
	return r, nil
}

// jsonRecord is the run record as the version before this one wrote it:
// JSON, the request in base64 (a third larger, which bounded
// server.max_request_bytes with a store to 6242304). Read only.
type jsonRecord struct {
	Hash     []byte    `json:"hash"`
	Request  []byte    `json:"request"`
	Started  time.Time `json:"started"`
	Deadline time.Time `json:"deadline,omitzero"`
	Model    string    `json:"model,omitempty"`
	Client   string    `json:"client,omitempty"`
}

// requestContent returns the request's wire form, in protobuf's
// deterministic encoding, and the hash of its content: every field but
// turn_id and attempt. The fields of a deterministic encoding come one
// record each, in field-number order, so the records of the whole
// request less those two are the encoding of the request without them:
// the hash is that of a copy with both cleared (requestHashTest), made
// without copying the request and without a second encoding.
func requestContent(req *turnstilev1.RunTurnRequest) (hash, wire []byte, err error) {
	wire, err = proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return nil, nil, err
	}
	h := sha256.New()
	for b := wire; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, nil, protowire.ParseError(m)
		}
		if num != turnIDField && num != attemptField {
			h.Write(b[:n+m])
		}
		b = b[n+m:]
	}
	return h.Sum(nil), wire, nil
}

// The field numbers of RunTurnRequest that are not its content.
var (
	turnIDField  = requestField("turn_id")
	attemptField = requestField("attempt")
)

// requestField returns the number of RunTurnRequest's field name.
func requestField(name protoreflect.Name) protowire.Number {
	return (*turnstilev1.RunTurnRequest)(nil).ProtoReflect().Descriptor().Fields().ByName(name).Number()
}
