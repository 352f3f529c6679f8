package guard

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"
)

// sampler bounds the lines written per peer: a token bucket of
// sampleBurst lines, refilled at sampleRate a second. Peers idle long
// enough to have a full bucket are forgotten when there are many.
type sampler struct {
	mu    sync.Mutex
	peers map[string]*logBucket
}

// Log sampling per peer.
const (
	sampleBurst    = 5
	sampleRate     = 1.0
	samplerMaxKeys = 4096
)

type logBucket struct {
	tokens     float64
	at         time.Time
	suppressed int
}

func newSampler() *sampler { return &sampler{peers: map[string]*logBucket{}} }

// allow reports whether a line for peer may be written at now, and how
// many lines of peer were left out since the last one written.
func (s *sampler) allow(peer string, now time.Time) (ok bool, suppressed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.peers[peer]
	if b == nil {
		if len(s.peers) >= samplerMaxKeys {
			s.prune(now)
		}
		if len(s.peers) >= samplerMaxKeys {
			// Too many peers at once: they share one bucket.
			peer = ""
			if b = s.peers[peer]; b == nil {
				b = &logBucket{tokens: sampleBurst, at: now}
				s.peers[peer] = b
			}
		} else {
			b = &logBucket{tokens: sampleBurst, at: now}
			s.peers[peer] = b
		}
	}
	b.tokens = min(sampleBurst, b.tokens+now.Sub(b.at).Seconds()*sampleRate)
	b.at = now
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	suppressed, b.suppressed = b.suppressed, 0
	return true, suppressed
}

// prune forgets the peers whose bucket has refilled and who have no
// left-out line to report.
func (s *sampler) prune(now time.Time) {
	for k, b := range s.peers {
		if b.suppressed == 0 && b.tokens+now.Sub(b.at).Seconds()*sampleRate >= sampleBurst {
			delete(s.peers, k)
		}
	}
}

// unservedCodes are the statuses of an RPC that ended before any work
// when it ran no turn: cancelled or reset by its client, out of time,
// unauthenticated, or refused by a limit or a drain. Their log lines are
// sampled per peer and they are counted by code.
var unservedCodes = func() map[string]codes.Code {
	m := map[string]codes.Code{}
	for _, c := range []codes.Code{codes.Canceled, codes.DeadlineExceeded, codes.Unauthenticated, codes.PermissionDenied, codes.ResourceExhausted, codes.Unavailable} {
		m[c.String()] = c
	}
	return m
}()

// LogRPC writes an RPC's line (fields as the logging interceptor gives
// them) at level; that of an RPC that ended before any work is counted,
// and written only within its peer's share of lines.
func (g *Guard) LogRPC(ctx context.Context, level slog.Level, msg string, fields []any) {
	var code, addr string
	ran := false
	for i := 0; i+1 < len(fields); i += 2 {
		switch fields[i] {
		case "grpc.code":
			code, _ = fields[i+1].(string)
		case "peer.address":
			addr, _ = fields[i+1].(string)
		case RanField:
			ran = true
		}
	}
	if c, ok := unservedCodes[code]; ok && !ran {
		g.unserved.Add(ctx, 1, metric.WithAttributes(attribute.Int("rpc.grpc.status_code", int(c))))
		if level > slog.LevelDebug && g.logger.Enabled(ctx, level) {
			host := addr
			if h, _, err := net.SplitHostPort(addr); err == nil {
				host = h
			}
			ok, suppressed := g.sampler.allow(host, g.now())
			if !ok {
				return
			}
			if suppressed > 0 {
				fields = append(fields, "suppressed", suppressed)
			}
		}
	}
	g.logger.Log(ctx, level, msg, fields...)
}
