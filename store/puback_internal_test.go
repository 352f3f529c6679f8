package store

import (
	"errors"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDecodePubAckFromServer: the acknowledgements and refusals the
// embedded server really sends are read by the store's decoder as nats.go
// reads them, without falling back to encoding/json, and each refusal
// falls in the class the store's code tests for it.
func TestDecodePubAckFromServer(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	s, err := Open(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if !s.pub.ownAcks {
		t.Fatal("the embedded store does not read its own acknowledgements")
	}
	ctx := t.Context()
	// A small stream that keeps message ids and refuses what does not fit.
	_, err = s.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "ACKS", Subjects: []string{"acks.>"}, Storage: jetstream.MemoryStorage,
		MaxBytes: 600, Discard: jetstream.DiscardNew, Duplicates: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	msg := func(subj, data string, hdr ...string) *nats.Msg {
		m := &nats.Msg{Subject: subj, Data: []byte(data), Header: nats.Header{}}
		for i := 0; i < len(hdr); i += 2 {
			m.Header.Set(hdr[i], hdr[i+1])
		}
		return m
	}
	tests := []struct {
		name string
		msg  *nats.Msg
		// check tests the decoded answer's class and content.
		check func(t *testing.T, ack *jetstream.PubAck, err error)
	}{{
		name: "stored",
		msg:  msg("acks.a.own", "record", jetstream.ExpectedLastSubjSeqHeader, "0"),
		check: func(t *testing.T, ack *jetstream.PubAck, err error) {
			if err != nil || ack.Stream != "ACKS" || ack.Sequence != 1 || ack.Duplicate {
				t.Errorf("ack %+v, %v; want stream ACKS, seq 1", ack, err)
			}
		},
	}, {
		name: "stored under the owner fence",
		msg: msg("acks.a.ev", "frame", jetstream.ExpectedLastSubjSeqHeader, "1",
			jetstream.ExpectedLastSubjSeqSubjHeader, "acks.a.own", jetstream.MsgIDHeader, "f1"),
		check: func(t *testing.T, ack *jetstream.PubAck, err error) {
			if err != nil || ack.Sequence != 2 || ack.Duplicate {
				t.Errorf("ack %+v, %v; want seq 2", ack, err)
			}
		},
	}, {
		name: "a message id seen before",
		msg:  msg("acks.a.ev", "frame", jetstream.MsgIDHeader, "f1"),
		check: func(t *testing.T, ack *jetstream.PubAck, err error) {
			if err != nil || ack.Sequence != 2 || !ack.Duplicate {
				t.Errorf("ack %+v, %v; want the duplicate of seq 2", ack, err)
			}
		},
	}, {
		name: "a run created twice",
		msg:  msg("acks.a.own", "record", jetstream.ExpectedLastSubjSeqHeader, "0"),
		check: func(t *testing.T, ack *jetstream.PubAck, err error) {
			if !isWrongLastSeq(err) || isInFlightConflict(err) || roomError(err) != nil || mayPass(err, true) {
				t.Errorf("%v: want a wrong last sequence, final", err)
			}
		},
	}, {
		name: "fenced out",
		msg: msg("acks.a.ev", "frame", jetstream.ExpectedLastSubjSeqHeader, "7",
			jetstream.ExpectedLastSubjSeqSubjHeader, "acks.a.own"),
		check: func(t *testing.T, ack *jetstream.PubAck, err error) {
			var apiErr *jetstream.APIError
			if !isWrongLastSeq(err) || !errors.As(err, &apiErr) || apiErr.Code != 400 ||
				apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
				t.Errorf("%v: want a wrong last sequence (400, 10071)", err)
			}
		},
	}, {
		name: "the stream full",
		msg:  msg("acks.b.ev", string(make([]byte, 1000))),
		check: func(t *testing.T, ack *jetstream.PubAck, err error) {
			if !errors.Is(roomError(err), ErrFull) || isWrongLastSeq(err) || mayPass(err, true) {
				t.Errorf("%v: want ErrFull (maximum bytes exceeded), final", err)
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := s.nc.RequestMsg(copyMsg(tt.msg), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s", resp.Data)
			if _, _, ok := scanPubAck(resp.Data); !ok {
				t.Errorf("%s: not of the known form", resp.Data)
			}
			ack, err := decodePubAck(resp.Data)
			wantAck, wantErr := decodePubAckJSON(resp.Data)
			if !reflect.DeepEqual(ack, wantAck) || !reflect.DeepEqual(err, wantErr) {
				t.Errorf("decoded %+v, %#v; encoding/json: %+v, %#v", ack, err, wantAck, wantErr)
			}
			tt.check(t, ack, err)
		})
	}
	// The publish the store makes: the same answers, through its own
	// request; the same classes as nats.go's client gives.
	t.Run("publishMsg", func(t *testing.T) {
		m := msg("acks.c.own", "record", jetstream.ExpectedLastSubjSeqHeader, "0")
		ack, err := s.pub.publishMsg(ctx, copyMsg(m))
		if err != nil || ack.Stream != "ACKS" {
			t.Fatalf("ack %+v, %v", ack, err)
		}
		_, err = s.pub.publishMsg(ctx, copyMsg(m))
		_, jsErr := s.js.PublishMsg(ctx, copyMsg(m))
		if !isWrongLastSeq(err) || err.Error() != jsErr.Error() {
			t.Errorf("a second record: %v; nats.go's client: %v", err, jsErr)
		}
		_, err = s.pub.publishMsg(ctx, msg("nowhere.own", "x"))
		if !errors.Is(err, jetstream.ErrNoStreamResponse) || !mayPass(err, false) {
			t.Errorf("a publish no stream takes: %v, want ErrNoStreamResponse, may pass", err)
		}
	})
	// The acknowledgement of a publish not waited on, as the lease's
	// first write is made.
	t.Run("publishAsync", func(t *testing.T) {
		f, err := s.pub.publishAsync(msg("acks.d.own", "lease"))
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ack := <-f.Ok():
			if ack.Stream != "ACKS" || ack.Sequence == 0 {
				t.Errorf("ack %+v", ack)
			}
		case err := <-f.Err():
			t.Errorf("async publish: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("no acknowledgement")
		}
		f, err = s.pub.publishAsync(msg("nowhere.lease", "lease"))
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ack := <-f.Ok():
			t.Errorf("a publish no stream takes acknowledged: %+v", ack)
		case err := <-f.Err():
			if !errors.Is(err, jetstream.ErrNoStreamResponse) {
				t.Errorf("async publish no stream takes: %v, want ErrNoStreamResponse", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no answer")
		}
		// A future given up is forgotten: the inbox holds none.
		f, err = s.pub.publishAsync(msg("acks.d.own", "lease"))
		if err != nil {
			t.Fatal(err)
		}
		s.pub.forgetAck(f)
		s.pub.acks.mu.Lock()
		n := len(s.pub.acks.pending)
		s.pub.acks.mu.Unlock()
		if n != 0 {
			t.Errorf("%d futures pending, want 0", n)
		}
	})
}

func copyMsg(m *nats.Msg) *nats.Msg {
	c := &nats.Msg{Subject: m.Subject, Data: m.Data, Header: nats.Header{}}
	for k, v := range m.Header {
		c.Header[k] = append([]string(nil), v...)
	}
	return c
}

// TestDecodePubAckForms: forms the server does not send today (escaped
// strings, other fields, bad JSON) are read as nats.go's client reads
// them.
func TestDecodePubAckForms(t *testing.T) {
	for _, data := range []string{
		`{"stream":"S","seq":12}`,
		`{"stream":"S","seq":12,"duplicate": true}`,
		`{"stream":"S","domain":"hub","seq":18446744073709551615}`,
		` { "stream" : "S" , "seq" : 3 } `,
		`{"error":{"code":503,"err_code":10077,"description":"stream store failed: no space left on device"}}`,
		`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 4 \u003e 3"}}`,
		`{"error":{"code":400,"description":"a \"quoted\" word"}}`,
		`{"stream":"S","seq":1,"val":"5"}`,
		`{"stream":"S","seq":1,"batch":"b","count":2}`,
		`{"seq":1}`,
		`{"stream":"","seq":1}`,
		`{}`,
		`{"stream":"S","seq":-1}`,
		`{"stream":"S","seq":01}`,
		`{"stream":"S","seq":1}x`,
		`{"stream":"S","seq":1,}`,
		`{"stream":"S","seq":99999999999999999999}`,
		`{"error":{"code":400,"err_code":70000}}`,
		`{"stream":"S","seq":1,"duplicate":null}`,
		"{\"stream\":\"S\xff\",\"seq\":1}",
		`{"Stream":"S","SEQ":1}`,
		`{"error":{}}`,
		`{"error":null,"stream":"S","seq":2}`,
		`not json`,
		``,
	} {
		ack, err := decodePubAck([]byte(data))
		wantAck, wantErr := decodePubAckJSON([]byte(data))
		if !reflect.DeepEqual(ack, wantAck) || !reflect.DeepEqual(err, wantErr) {
			t.Errorf("%s: decoded %+v, %v; encoding/json: %+v, %v", data, ack, err, wantAck, wantErr)
		}
	}
}

// FuzzDecodePubAck: whatever an answer holds, the store's decoder reads
// it as encoding/json does.
func FuzzDecodePubAck(f *testing.F) {
	f.Add([]byte(`{"stream":"S","seq":12,"duplicate":true}`))
	f.Add([]byte(`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 4"}}`))
	f.Add([]byte(`{"stream":"S","domain":"d","seq":` + strconv.FormatUint(1<<63, 10) + `}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ack, err := decodePubAck(data)
		wantAck, wantErr := decodePubAckJSON(data)
		if !reflect.DeepEqual(ack, wantAck) || !reflect.DeepEqual(err, wantErr) {
			t.Errorf("%q: decoded %+v, %v; encoding/json: %+v, %v", data, ack, err, wantAck, wantErr)
		}
	})
}

// BenchmarkDecodePubAck: an acknowledgement of a frame, read by the
// store's decoder and by encoding/json as nats.go reads it.
//
//	go test -run XXX -bench DecodePubAck -benchmem ./store
func BenchmarkDecodePubAck(b *testing.B) {
	data := []byte(`{"stream":"TURNSTILE_RUNS","seq":123456}`)
	for _, d := range []struct {
		name   string
		decode func([]byte) (*jetstream.PubAck, error)
	}{{"scan", decodePubAck}, {"encoding-json", decodePubAckJSON}} {
		b.Run(d.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := d.decode(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
