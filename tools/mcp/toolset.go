// Package mcp exposes the tools of MCP (Model Context Protocol) servers as
// turnstile tools. A [Toolset] connects to each configured server at start,
// over stdio (a child process) or streamable HTTP, lists its tools and
// offers each as a [llm.Tool] whose calls run on that server.
//
// The tool list is read once, by [New]; later list changes on a server are
// not followed. A server that dies or forgets the session fails the calls in
// flight with an error; the next call reconnects (see [WithReconnect]).
// Progress notifications are delivered on the SDK's reading goroutine: a
// progress callback that blocks stalls every call to that server.
//
// Arguments that are not a JSON object are refused; otherwise they are passed
// on as they are: wrap the tools with tools/argcheck to validate them against
// their schemas first.
//
// It imports llm and the official MCP Go SDK; neither llm nor the runtime imports it.
package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/turnstile-dev/turnstile/llm"
)

// Toolset is the set of tools offered by the configured MCP servers. Create
// it with [New]; its methods are safe for concurrent use. The caller owns it
// and must call [Toolset.Close].
type Toolset struct {
	servers   []*server
	tools     []*tool // sorted by name
	closeOnce sync.Once
}

type options struct {
	logger         *slog.Logger
	stderr         io.Writer
	attempts       int
	backoff        time.Duration
	maxCooldown    time.Duration
	terminateGrace time.Duration
}

// Option configures a [Toolset].
type Option func(*options)

// WithLogger sets the logger for connection events (default: none). Logs
// never include environment or header values.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithStderr sends the standard error of stdio servers to w (default:
// discarded). w must be safe for concurrent use when several servers run.
func WithStderr(w io.Writer) Option { return func(o *options) { o.stderr = w } }

// WithReconnect sets how a call reconnects to a server whose session ended:
// up to attempts tries, the first at once, then waiting backoff, doubling
// each time (default 3 tries, 200ms). After a failed round, calls to that
// server fail at once during a cool-down that starts at twice backoff and
// doubles with each failed round, up to 30s.
func WithReconnect(attempts int, backoff time.Duration) Option {
	return func(o *options) { o.attempts, o.backoff = attempts, backoff }
}

// WithTerminateGrace sets how long Close waits for a stdio server to exit
// after closing its input, before it sends SIGTERM, then SIGKILL after as long
// again (default 5s).
func WithTerminateGrace(d time.Duration) Option { return func(o *options) { o.terminateGrace = d } }

// New connects to every server, lists their tools and returns the toolset.
// It fails, closing what it opened, if a server cannot be reached, a listed
// tool in [ServerConfig.Tools] or [ServerConfig.Overrides] is not offered, or
// two servers expose the same tool name. ctx bounds the start only.
func New(ctx context.Context, servers []ServerConfig, opts ...Option) (*Toolset, error) {
	o := &options{
		logger:         slog.New(slog.DiscardHandler),
		attempts:       3,
		backoff:        200 * time.Millisecond,
		maxCooldown:    30 * time.Second,
		terminateGrace: 5 * time.Second,
	}
	for _, opt := range opts {
		opt(o)
	}
	if o.attempts < 1 || o.backoff <= 0 || o.terminateGrace <= 0 {
		return nil, errors.New("mcp: reconnect attempts, backoff and terminate grace must be positive")
	}
	names := map[string]bool{}
	for i := range servers {
		if err := servers[i].check(); err != nil {
			return nil, err
		}
		if names[servers[i].Name] {
			return nil, fmt.Errorf("mcp: server %q is configured twice", servers[i].Name)
		}
		names[servers[i].Name] = true
	}

	ts := &Toolset{}
	lists := make([][]*sdk.Tool, len(servers))
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, cfg := range servers {
		s := newServer(cfg, o)
		ts.servers = append(ts.servers, s)
		wg.Go(func() { lists[i], errs[i] = s.start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		ts.Close()
		return nil, err
	}

	owner := map[string]string{} // exposed tool name -> server name
	for i, s := range ts.servers {
		tools, err := s.expose(lists[i])
		if err != nil {
			ts.Close()
			return nil, err
		}
		for _, t := range tools {
			if other, ok := owner[t.spec.Name]; ok {
				ts.Close()
				return nil, fmt.Errorf("mcp: tool %q is offered by both server %q and server %q; "+
					"leave it out of one server's tools allowlist or set a tool_prefix", t.spec.Name, other, s.cfg.Name)
			}
			owner[t.spec.Name] = s.cfg.Name
			ts.tools = append(ts.tools, t)
		}
	}
	sort.Slice(ts.tools, func(i, j int) bool { return ts.tools[i].spec.Name < ts.tools[j].spec.Name })
	return ts, nil
}

// start opens the first session and lists the server's tools.
func (s *server) start(ctx context.Context) ([]*sdk.Tool, error) {
	sess, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("mcp: server %q: connect: %w", s.cfg.Name, s.redact(err))
	}
	if err := s.install(sess); err != nil {
		return nil, fmt.Errorf("mcp: server %q: %w", s.cfg.Name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.connectTimeout())
	defer cancel()
	var list []*sdk.Tool
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("mcp: server %q: listing tools: %w", s.cfg.Name, s.redact(err))
		}
		list = append(list, t)
	}
	return list, nil
}

// expose turns the server's tool list into tools, applying the allowlist,
// prefix and overrides.
func (s *server) expose(list []*sdk.Tool) ([]*tool, error) {
	offered := map[string]*sdk.Tool{}
	for _, t := range list {
		offered[t.Name] = t
	}
	for _, name := range s.cfg.Tools {
		if offered[name] == nil {
			return nil, fmt.Errorf("mcp: server %q: tools: the server offers no tool %q", s.cfg.Name, name)
		}
	}
	for name := range s.cfg.Overrides {
		if offered[name] == nil {
			return nil, fmt.Errorf("mcp: server %q: tool_overrides: the server offers no tool %q", s.cfg.Name, name)
		}
	}
	var out []*tool
	for _, t := range list {
		if len(s.cfg.Tools) > 0 && !slices.Contains(s.cfg.Tools, t.Name) {
			continue
		}
		tl, err := newTool(s, t, s.cfg.Overrides[t.Name])
		if err != nil {
			return nil, err
		}
		out = append(out, tl)
	}
	return out, nil
}

// Tools returns every tool of the toolset, sorted by name.
func (ts *Toolset) Tools() []llm.Tool {
	out := make([]llm.Tool, len(ts.tools))
	for i, t := range ts.tools {
		out[i] = t
	}
	return out
}

// ServerTools returns the names models see of the tools of the server
// named server, sorted; none when no server has that name.
func (ts *Toolset) ServerTools(server string) []string {
	var out []string
	for _, t := range ts.tools {
		if t.srv.cfg.Name == server {
			out = append(out, t.spec.Name)
		}
	}
	return out
}

// Select returns the tools with the given names, in that order, or every tool
// when names is empty (a model's tools list). It fails on a name that no
// server offers.
func (ts *Toolset) Select(names []string) ([]llm.Tool, error) {
	if len(names) == 0 {
		return ts.Tools(), nil
	}
	out := make([]llm.Tool, 0, len(names))
	for _, name := range names {
		i, ok := slices.BinarySearchFunc(ts.tools, name, func(t *tool, n string) int {
			switch {
			case t.spec.Name < n:
				return -1
			case t.spec.Name > n:
				return 1
			}
			return 0
		})
		if !ok {
			return nil, fmt.Errorf("mcp: no server offers tool %q", name)
		}
		out = append(out, ts.tools[i])
	}
	return out, nil
}

// Close cancels calls in flight, ends every session, stops stdio servers and
// waits for them. It is idempotent; tools called afterwards fail.
func (ts *Toolset) Close() error {
	ts.closeOnce.Do(func() {
		var wg sync.WaitGroup
		for _, s := range ts.servers {
			wg.Go(s.close)
		}
		wg.Wait()
	})
	return nil
}
