// Package client is the Go client of turnstile.v1.AgentService.
//
// A [Client] runs agent turns with [Client.RunTurn] and streams every step
// of them as an iterator of [Event] values. When the stream of a turn
// breaks (a connection reset, a replica that went away), the client
// re-attaches to the same run with WatchTurn from the last event it
// received, on any replica of a server with a turn store, and the turn
// goes on. When a turn fails in a way the server says is worth retrying (an
// error event with retryable set to true), or its stream breaks and cannot
// be re-attached, the client runs the failed step again: it resumes the
// turn as a new attempt, re-sending the conversation plus every message
// the failed attempt committed, under the same turn id, so a server-side
// tool that already ran is never run twice. See [Client.RunTurn].
//
// The package imports only the generated code, gRPC and the standard
// library; it never imports the server or the runtime.
//
// # Cancelling and leaving
//
// A server with a turn store takes a dropped stream for a detach: it keeps
// running the turn for turn.detach_grace (30s), so that a client that
// crashed can re-attach. Cancelling is therefore explicit: when the
// context a turn runs with ends, or [Turn.Close] is called before the
// turn's end, the client calls CancelTurn and reads the events the server
// sends as it stops the turn (for at most [WithCancelTimeout], 2s), and
// the turn fails CANCELLED with every message it committed in
// [TurnError.Messages], from which the next turn continues. Only leaving
// (the process dying, or breaking out of [Turn.Events] without Close) is a
// detach.
//
// # Compaction
//
// When the server compacts a turn's conversation (its model nears its
// context window, or the provider found it too long), the compaction event
// says what replaces what, and the turn applies it: a step retry re-sends
// the compacted conversation, and [Result.Conversation] (and
// [TurnError.Conversation]) is the conversation the next turn sends, so a
// long session is compacted once, not on every turn. [ApplyCompaction]
// applies one event for a caller that follows a turn's events itself.
//
// # Re-attaching
//
// The client keeps re-attaching to a broken stream for
// [DefaultReattachTimeout] (30s) from the break, as long as a server takes
// to restart plus the lease TTL, with margin; see [WithReattachTimeout].
//
// # Approval and steering
//
// A server-side tool the server lists under require_approval waits, quiet,
// for a decision: the turn yields a tool_approval_requested event and the
// call runs only once ApproveToolCall approves it (a denial is an error
// result the model sees). [OnApproval] answers each request in the event
// loop, once per call id and attempt; [Turn.Approve] and
// [Client.ApproveToolCall] decide from anywhere. [Turn.Steer] and
// [Client.SteerTurn] give a running turn a user message, which it takes at
// its next step boundary. A turn waiting for a decision sends nothing for
// as long as it waits: its stream stays open, and re-attaching after a
// break does not count the quiet time as an outage (see
// [WithReattachTimeout]).
//
// # Tracing
//
// The client starts no spans and sends no trace context on its own: it
// does not depend on OpenTelemetry (which would add some 30 packages and
// 1.2 MB to every program using it). A program that traces with
// OpenTelemetry adds otelgrpc's client stats handler through
// [WithDialOptions], as the example of WithDialOptions shows: each RPC is
// then a client span under the span of the context the turn runs with,
// and its W3C traceparent makes the server's spans (RunTurn, invoke_agent,
// every model call and tool) part of the program's trace. otelgrpc takes
// OpenTelemetry's global tracer provider and propagator unless given its
// own; the global propagator sends nothing until the program sets one.
package client

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// AttemptHeader is the request metadata key in which the client numbers its
// attempts at one turn id, from 1, so the server's logs tie them together.
const AttemptHeader = "turnstile-attempt"

// roundRobin is the default service config: spread RPCs over every address
// the resolver returns. It holds no retryPolicy on purpose: a transport
// retry of RunTurn stacked on the client's step retry would multiply the
// attempts.
const roundRobin = `{"loadBalancingConfig":[{"round_robin":{}}]}`

// Client runs turns on a turnstile server. It is safe for concurrent use;
// Close releases its connection.
type Client struct {
	conn   *grpc.ClientConn
	rpc    turnstilev1.AgentServiceClient
	logger *slog.Logger
	opts   options
}

type options struct {
	creds         credentials.TransportCredentials
	token         string
	maxEvent      int
	perRPC        []credentials.PerRPCCredentials
	dialOpts      []grpc.DialOption
	logger        *slog.Logger
	maxRetries    int
	maxReattaches int  // with capReattaches, the most re-attaches in a row
	capReattaches bool // WithMaxReattaches was given
	reattachFor   time.Duration
	cancelWait    time.Duration
	reattach      Backoff
	backoff       Backoff
	maxDelay      time.Duration
	jitter        func() float64
	insecureSet   bool
	tlsSet        bool
}

// Option configures a [Client].
type Option func(*options)

// WithInsecure connects in plaintext, without TLS. Without it (or
// [WithTLS] or [WithTransportCredentials]) the client uses TLS with the
// system's root certificates.
func WithInsecure() Option {
	return func(o *options) { o.creds, o.insecureSet = insecure.NewCredentials(), true }
}

// WithTLS connects over TLS configured by cfg (default: TLS with the
// system's root certificates).
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) { o.creds, o.tlsSet = credentials.NewTLS(cfg), true }
}

// WithTransportCredentials sets the transport credentials directly, for
// example for mTLS or ALTS (default: TLS with the system's root
// certificates).
func WithTransportCredentials(c credentials.TransportCredentials) Option {
	return func(o *options) { o.creds, o.tlsSet = c, true }
}

// WithPerRPCCredentials attaches c to every RPC, for example a bearer
// token (default: none). It may be given several times.
func WithPerRPCCredentials(c credentials.PerRPCCredentials) Option {
	return func(o *options) { o.perRPC = append(o.perRPC, c) }
}

// WithBearerToken sends token as the client key of every RPC
// ("authorization: Bearer <token>"), for a server with auth keys (default:
// none). The token is sent only over TLS, unless the client was made
// [WithInsecure].
func WithBearerToken(token string) Option { return func(o *options) { o.token = token } }

// DefaultMaxEventBytes is the largest event the client accepts by default:
// gRPC's default receive limit, twice the server's default event size
// limit (server.max_event_bytes).
const DefaultMaxEventBytes = 4 << 20

// WithMaxEventBytes sets the largest event the client accepts (default
// [DefaultMaxEventBytes]). Set it to at least the server's
// server.max_event_bytes: a larger event would end the stream.
func WithMaxEventBytes(n int) Option { return func(o *options) { o.maxEvent = n } }

// WithDialOptions passes opts through to [grpc.NewClient], after the
// client's own (default: none). They may override the client's defaults,
// such as its round-robin service config.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// WithLogger sets the logger that receives one structured line per
// re-attach (info, "turnstile: re-attaching to the turn") and per step
// retry (warn, "turnstile: retrying turn step") (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithMaxStepRetries sets how many times a failed step of a turn is run
// again (default 1; 0 disables step retries). See [Client.RunTurn].
func WithMaxStepRetries(n int) Option { return func(o *options) { o.maxRetries = n } }

// DefaultReattachTimeout is how long the client keeps re-attaching to a
// run whose stream broke, by default: longer than a server process takes
// to restart plus the store's lease TTL (2s) with margin, and as long as
// the server keeps a turn nobody watches (turn.detach_grace, 30s).
const DefaultReattachTimeout = 30 * time.Second

// WithReattachTimeout sets how long the client keeps re-attaching to a run
// whose stream broke, with WatchTurn from the last seq received, before it
// gives the attempt up (default [DefaultReattachTimeout]; 0 never
// re-attaches). The time counts from the break and starts again with every
// event received, and when a re-attached stream that stayed open for at
// least the timeout breaks (it was attached to a quiet run, such as a turn
// waiting for approval); no re-attach starts once its delay would end past
// it. A stream that stays open is never given up, however quiet.
func WithReattachTimeout(d time.Duration) Option { return func(o *options) { o.reattachFor = d } }

// WithMaxReattaches also caps how many times in a row the client
// re-attaches to a run whose stream broke, within the re-attach timeout
// (default: no cap; 0 never re-attaches). The count starts again with
// every event received.
//
// Deprecated: a count of tries is no measure of an outage, which is what
// the client must outlast; use [WithReattachTimeout]. WithMaxReattaches
// still works, as a cap on top of the timeout.
func WithMaxReattaches(n int) Option {
	return func(o *options) { o.maxReattaches, o.capReattaches = n, true }
}

// WithReattachBackoff sets the delays before re-attaching to a broken
// stream (default 50ms doubling up to 1s, spread by ±20%).
func WithReattachBackoff(b Backoff) Option { return func(o *options) { o.reattach = b } }

// DefaultCancelTimeout is how long, by default, a turn whose caller
// cancels it waits for the server to stop it.
const DefaultCancelTimeout = 2 * time.Second

// WithCancelTimeout sets how long the client spends cancelling a turn on
// the server once its caller cancels it (the turn's context ends, or
// [Turn.Close] is called before its end): the CancelTurn call and the
// events the server sends until its CANCELLED error, the messages the
// turn committed among them (default [DefaultCancelTimeout]). With 0 the
// client does not call CancelTurn: it only drops the stream, which a
// server with a turn store takes for a detach and goes on running the
// turn for turn.detach_grace.
func WithCancelTimeout(d time.Duration) Option { return func(o *options) { o.cancelWait = d } }

// WithBackoff sets the delays between step retries when the server gives
// no retry delay (default [DefaultBackoff]).
func WithBackoff(b Backoff) Option { return func(o *options) { o.backoff = b } }

// WithMaxRetryDelay sets the longest delay the client waits before a step
// retry (default 1 minute). When the server advises a longer wait, the
// error is returned at once, with its RetryAfter, for the caller to decide.
func WithMaxRetryDelay(d time.Duration) Option { return func(o *options) { o.maxDelay = d } }

// Backoff describes the jittered exponential delays between step retries
// when the server gives no delay: retry n (from 1) waits
// Initial × Multiplier^(n-1), capped at Max, then spread uniformly by
// ± Jitter (a fraction).
type Backoff struct {
	Initial    time.Duration
	Max        time.Duration
	Multiplier float64
	Jitter     float64
}

// DefaultBackoff returns the default backoff: 1s doubling up to 30s,
// spread by ±20%.
func DefaultBackoff() Backoff {
	return Backoff{Initial: time.Second, Max: 30 * time.Second, Multiplier: 2, Jitter: 0.2}
}

// delay returns the wait before retry n (n >= 1) for the jitter draw u in
// [0, 1).
func (b Backoff) delay(n int, u float64) time.Duration {
	d := float64(b.Initial)
	for i := 1; i < n; i++ {
		d *= max(b.Multiplier, 1)
		if b.Max > 0 && d >= float64(b.Max) {
			break
		}
	}
	if b.Max > 0 {
		d = min(d, float64(b.Max))
	}
	d *= 1 + b.Jitter*(2*u-1)
	return time.Duration(max(d, 0))
}

// New returns a Client for target, a gRPC target such as
// "dns:///turnstile.internal:7700" (every address the name resolves to is
// used, round robin) or "127.0.0.1:7700". A comma-separated list of
// host:port addresses ("10.0.0.1:7700,10.0.0.2:7700") is served by a
// static resolver and is balanced round robin too. New does not connect;
// the first RPC does. The caller must Close the client.
func New(target string, opts ...Option) (*Client, error) {
	o := options{
		logger:      slog.New(slog.DiscardHandler),
		maxRetries:  1,
		reattachFor: DefaultReattachTimeout,
		cancelWait:  DefaultCancelTimeout,
		reattach:    Backoff{Initial: 50 * time.Millisecond, Max: time.Second, Multiplier: 2, Jitter: 0.2},
		backoff:     DefaultBackoff(),
		maxDelay:    time.Minute,
		jitter:      mathrand.Float64,
		maxEvent:    DefaultMaxEventBytes,
	}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case target == "":
		return nil, errors.New("client: empty target")
	case o.maxRetries < 0:
		return nil, errors.New("client: max step retries must not be negative")
	case o.capReattaches && o.maxReattaches < 0:
		return nil, errors.New("client: max re-attaches must not be negative")
	case o.reattachFor < 0:
		return nil, errors.New("client: the re-attach timeout must not be negative")
	case o.cancelWait < 0:
		return nil, errors.New("client: the cancel timeout must not be negative")
	case o.backoff.Initial < 0 || o.backoff.Max < 0 || o.backoff.Jitter < 0 || o.backoff.Jitter > 1:
		return nil, errors.New("client: invalid backoff")
	case o.insecureSet && o.tlsSet:
		return nil, errors.New("client: WithInsecure conflicts with TLS credentials")
	case o.maxEvent < 1:
		return nil, errors.New("client: max event bytes must be positive")
	}
	if o.creds == nil {
		o.creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(o.creds),
		grpc.WithDefaultServiceConfig(roundRobin),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.maxEvent)),
	}
	if o.token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(bearer{token: o.token, secure: !o.insecureSet}))
	}
	for _, c := range o.perRPC {
		dial = append(dial, grpc.WithPerRPCCredentials(c))
	}
	if addrs, ok := addressList(target); ok {
		r := manual.NewBuilderWithScheme("turnstile-static-" + randomHex(6))
		var st resolver.State
		for _, a := range addrs {
			st.Addresses = append(st.Addresses, resolver.Address{Addr: a})
		}
		r.InitialState(st)
		dial = append(dial, grpc.WithResolvers(r))
		target = r.Scheme() + ":///static"
	}
	dial = append(dial, o.dialOpts...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return &Client{conn: conn, rpc: turnstilev1.NewAgentServiceClient(conn), logger: o.logger, opts: o}, nil
}

// addressList splits a comma-separated list of addresses; it reports false
// for any other target, which gRPC resolves itself.
func addressList(target string) ([]string, bool) {
	if !strings.Contains(target, ",") || strings.Contains(target, "://") {
		return nil, false
	}
	var out []string
	for a := range strings.SplitSeq(target, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out, len(out) > 0
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// bearer sends a client key.
type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

// Close closes the client's connection; turns still running fail with a
// CANCELLED error.
func (c *Client) Close() error {
	if err := c.conn.Close(); err != nil {
		return fmt.Errorf("client: close: %w", err)
	}
	return nil
}

// Conn returns the client's underlying connection, for other services on
// the same server such as health. The client owns it.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }
