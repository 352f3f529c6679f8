package durable

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// TestRunRecordReadsBack: a run's record reads back as it was written,
// with a deadline or none, and so does the JSON record of the version
// before (the request in base64), which a replica of this version reads
// for as long as the log keeps such runs. What is neither is an error.
func TestRunRecordReadsBack(t *testing.T) {
	req := &turnstilev1.RunTurnRequest{TurnId: "t1", Attempt: 2, Model: "m", Messages: []*turnstilev1.Message{{
		Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hello"}}},
	}}}
	hash, wireForm, err := requestContent(req)
	if err != nil {
		t.Fatal(err)
	}
	started := time.Date(2026, 11, 20, 9, 30, 0, 123456789, time.UTC)
	for _, want := range []runRecord{
		{Hash: hash, Request: wireForm, Started: started, Model: "sim", Client: "team-a"},
		{Hash: hash, Request: wireForm, Started: started, Deadline: started.Add(time.Minute)},
	} {
		got, err := readRecord(want.marshal())
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("read back (-written +read):\n%s", diff)
		}
	}

	// The version before's record, as its json.Marshal of the record wrote
	// it.
	old := map[string]any{"hash": hash, "request": wireForm, "started": started, "deadline": started.Add(time.Minute), "model": "sim", "client": "team-a"}
	b, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"request":"`)) {
		t.Fatalf("not the version before's form: %s", b)
	}
	got, err := readRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	want := runRecord{Hash: hash, Request: wireForm, Started: started, Deadline: started.Add(time.Minute), Model: "sim", Client: "team-a"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the version before's record (-want +read):\n%s", diff)
	}
	back := &turnstilev1.RunTurnRequest{}
	if err := proto.Unmarshal(got.Request, back); err != nil || !proto.Equal(back, req) {
		t.Errorf("its request reads back as %v, %v", back, err)
	}

	for _, bad := range []string{"", "{", "not a record", "\x0a\x00"} {
		if r, err := readRecord([]byte(bad)); err == nil {
			t.Errorf("readRecord(%q) = %+v, want an error", bad, r)
		}
	}
}

// TestRunRecordSize: a record is its request and a few hundred bytes, so
// a request as large as a store record less the margin config leaves
// (64 KiB; config.MaxStoredRequestBytes) fits one. The version before's,
// the request in base64 in JSON, was a third larger.
func TestRunRecordSize(t *testing.T) {
	const record, margin = 8 << 20, 64 << 10
	req := &turnstilev1.RunTurnRequest{TurnId: strings.Repeat("t", 128), Messages: []*turnstilev1.Message{{
		Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: strings.Repeat("x", record-margin-200)}}},
	}}}
	hash, wireForm, err := requestContent(req)
	if err != nil {
		t.Fatal(err)
	}
	if len(wireForm) > record-margin {
		t.Fatalf("the request is %d bytes, more than the %d allowed", len(wireForm), record-margin)
	}
	started := time.Now()
	r := runRecord{Hash: hash, Request: wireForm, Started: started, Deadline: started.Add(time.Hour),
		Model: strings.Repeat("m", 256), Client: strings.Repeat("k", 256)}
	b := r.marshal()
	if over := len(b) - len(wireForm); over > 1024 || len(b) > record {
		t.Errorf("a record of a %d-byte request is %d bytes: %d more", len(wireForm), len(b), over)
	}
	old, err := json.Marshal(jsonRecord(r))
	if err != nil {
		t.Fatal(err)
	}
	if len(old) <= record {
		t.Errorf("the version before's record of the same request is %d bytes: it fitted", len(old))
	}
}
