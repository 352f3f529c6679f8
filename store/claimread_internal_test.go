package store

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// TestClaimNumberedByItsFence (issue 37, row 4): a claim's number (how
// many times the run's owner went away) comes from the owner record its
// fence follows, not from a count of the run's owner records that the
// stream is asked for (a JetStream API request of its own, one more round
// trip of every claim). A run handed from replica to replica is claimed
// 1, 2, 3 times; after an owner record of the version before, which
// carries no number, the stream counts them again. The test watches the
// stream's info requests that name the run.
func TestClaimNumberedByItsFence(t *testing.T) {
	const ttl = time.Second
	url := natstest.Start(t)
	replicas := []*Store{openTestReplica(t, url, ttl), openTestReplica(t, url, ttl), openTestReplica(t, url, ttl)}
	ctx := t.Context()
	nop := func(string) []byte { return nil }

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	infos := make(chan *nats.Msg, 64)
	if _, err := nc.ChanSubscribe("$JS.API.STREAM.INFO."+StreamName, infos); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const id = "numbered"
	k := runKey{id, 1}
	counted := func() int {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			select {
			case m := <-infos:
				if bytes.Contains(m.Data, []byte(k.own())) {
					n++
				}
			default:
				return n
			}
		}
	}

	if created, _, err := replicas[0].Create(ctx, id, 1, []byte("req"), nop); err != nil || !created {
		t.Fatalf("Create = %v, %v", created, err)
	}
	owner := replicas[0]
	for want := 1; want <= 3; want++ {
		if err := owner.Release(ctx, id, 1); err != nil {
			t.Fatal(err)
		}
		owner = replicas[want%len(replicas)]
		record, _, claims, err := owner.Claim(ctx, id, 1, nop)
		if err != nil {
			t.Fatalf("claim %d: %v", want, err)
		}
		if claims != want || string(record) != "req" {
			t.Fatalf("claim %d: claims %d, record %q; want %d, %q", want, claims, record, want, "req")
		}
		if n := counted(); n != 0 {
			t.Errorf("claim %d asked the stream for the run's owner records %d times, want 0", want, n)
		}
	}

	// An owner record of the version before: a claim's, naming its
	// replica, without a number.
	if err := owner.Release(ctx, id, 1); err != nil {
		t.Fatal(err)
	}
	last, err := owner.stream.GetLastMsgForSubject(ctx, k.own())
	if err != nil {
		t.Fatal(err)
	}
	old := &nats.Msg{Subject: k.own(), Data: []byte("claimed by " + owner.id), Header: nats.Header{ownerHeader: {owner.id}}}
	if _, err := owner.js.PublishMsg(ctx, old, jetstream.WithExpectLastSequencePerSubject(last.Sequence)); err != nil {
		t.Fatal(err)
	}
	next := replicas[0]
	if next == owner {
		next = replicas[1]
	}
	if _, _, claims, err := next.Claim(ctx, id, 1, nop); err != nil || claims != 5 {
		t.Fatalf("the claim after an unnumbered owner record: claims %d, %v; want 5", claims, err)
	}
	if n := counted(); n != 1 {
		t.Errorf("the claim after an unnumbered owner record asked the stream %d times, want 1", n)
	}
	// And the one after it is numbered from it again.
	if err := next.Release(ctx, id, 1); err != nil {
		t.Fatal(err)
	}
	if _, _, claims, err := owner.Claim(ctx, id, 1, nop); err != nil || claims != 6 {
		t.Fatalf("the claim after a counted one: claims %d, %v; want 6", claims, err)
	}
	if n := counted(); n != 0 {
		t.Errorf("the claim after a counted one asked the stream %d times, want 0", n)
	}
}

// TestClaimNumber: the number of a claim from the owner record it
// follows. The creator's record is told by the expectation it was written
// with (none before it on its subject), which the stream keeps in its
// header.
func TestClaimNumber(t *testing.T) {
	for _, tc := range []struct {
		name     string
		expected string // the record's Nats-Expected-Last-Subject-Sequence
		header   string // its claimHeader
		want     int
		ok       bool
	}{
		{"the creator's record", "0", "", 1, true},
		{"a numbered claim's", "5", "1", 2, true},
		{"a later one's", "29", "41", 42, true},
		{"the version before's", "5", "", 0, false},
		{"without an expectation", "", "", 0, false},
		{"not a number", "5", "x", 0, false},
		{"zero", "5", "0", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &jetstream.RawStreamMsg{Sequence: 9, Header: nats.Header{}}
			if tc.expected != "" {
				m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, tc.expected)
			}
			if tc.header != "" {
				m.Header.Set(claimHeader, tc.header)
			}
			if n, ok := claimNumber(m); n != tc.want || ok != tc.ok {
				t.Errorf("claimNumber = %d, %v; want %d, %v", n, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestLosingClaimReadsNoRequest (issue 37, row 4): of two replicas that
// claim a released run at once, the one that loses at the lease does not
// read the run's first record, which holds its request (with many runs
// handed off, one such read per run and replica): only the winner does,
// beside its fence. The test counts the direct gets of the run's first
// owner record.
func TestLosingClaimReadsNoRequest(t *testing.T) {
	const ttl = time.Second
	url := natstest.Start(t)
	a, b, c := openTestReplica(t, url, ttl), openTestReplica(t, url, ttl), openTestReplica(t, url, ttl)
	ctx := t.Context()
	nop := func(string) []byte { return nil }
	const id = "contested"
	k := runKey{id, 1}
	if created, _, err := a.Create(ctx, id, 1, []byte("req"), nop); err != nil || !created {
		t.Fatalf("Create = %v, %v", created, err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	gets, err := nc.SubscribeSync(directGetPrefix + StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, id, 1); err != nil {
		t.Fatal(err)
	}
	type result struct {
		record []byte
		err    error
	}
	results := make(chan result, 2)
	for _, s := range []*Store{b, c} {
		go func() {
			record, _, _, err := s.Claim(ctx, id, 1, nop)
			results <- result{record, err}
		}()
	}
	won := 0
	for range 2 {
		r := <-results
		switch {
		case r.err == nil && string(r.record) == "req":
			won++
		case r.err == nil:
			t.Errorf("the winning claim's record is %q, want %q", r.record, "req")
		case !errors.Is(r.err, ErrNotClaimed):
			t.Errorf("the losing claim failed with %v, want ErrNotClaimed", r.err)
		}
	}
	if won != 1 {
		t.Fatalf("%d claims won, want 1", won)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	firsts := 0
	for {
		m, err := gets.NextMsg(0)
		if err != nil {
			break // none left: every request made before the flush's is in
		}
		if bytes.Contains(m.Data, []byte(`"next_by_subj":"`+k.own()+`"`)) {
			firsts++
		}
	}
	if firsts != 1 {
		t.Errorf("the run's first record was read %d times, want once (the winner's)", firsts)
	}
}

// TestFenceOverANewerRecord: a claim reads the run's last owner record
// before it takes the lease, so another claim's fence may come between
// (one whose lease expired before its fence: it held the lease before
// this claim did). The fence then reads the record again and is made over
// it, as it was when a claim read the record after taking the lease: the
// other claimer is fenced out (its appends fail).
func TestFenceOverANewerRecord(t *testing.T) {
	const ttl = time.Second
	url := natstest.Start(t)
	a, b, c := openTestReplica(t, url, ttl), openTestReplica(t, url, ttl), openTestReplica(t, url, ttl)
	ctx := t.Context()
	nop := func(string) []byte { return nil }
	const id = "fenced"
	k := runKey{id, 1}
	if created, _, err := a.Create(ctx, id, 1, []byte("req"), nop); err != nil || !created {
		t.Fatalf("Create = %v, %v", created, err)
	}
	if err := a.Append(ctx, id, 1, []byte("e1"), func(error) {}); err != nil {
		t.Fatal(err)
	}
	reads, err := c.readForClaim(ctx, k) // c's, before b's fence
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, id, 1); err != nil {
		t.Fatal(err)
	}
	if _, events, _, err := b.Claim(ctx, id, 1, nop); err != nil || len(events) != 1 {
		t.Fatalf("b's claim: %d events, %v", len(events), err)
	}

	ack, last, n, err := c.fence(ctx, k, reads.last)
	if err != nil {
		t.Fatalf("c's fence over the record before b's: %v", err)
	}
	if last.Sequence == reads.last.Sequence || last.Header.Get(ownerHeader) != b.id {
		t.Errorf("c's fence followed the record at %d of %q, want b's", last.Sequence, last.Header.Get(ownerHeader))
	}
	if n != 2 {
		t.Errorf("c's fence is claim %d, want 2", n)
	}
	// b is fenced out: its append fails.
	failed := make(chan error, 1)
	if err := b.Append(ctx, id, 1, []byte("e2"), func(err error) { failed <- err }); err == nil {
		if err = <-failed; err == nil {
			t.Fatal("b's append after c's fence was stored")
		}
	}
	now, err := c.stream.GetLastMsgForSubject(ctx, k.own())
	if err != nil || now.Sequence != ack.Sequence || now.Header.Get(claimHeader) != "2" {
		t.Fatalf("the last owner record is at %d, claim %q (%v); want c's at %d, claim 2", now.Sequence, now.Header.Get(claimHeader), err, ack.Sequence)
	}
}
