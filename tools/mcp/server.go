package mcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/turnstile-dev/turnstile/llm"
)

// errClosed is returned by calls made after [Toolset.Close].
var errClosed = errors.New("toolset closed")

// server is the connection to one MCP server. It holds at most one live
// session, replaces it when it dies, and routes progress notifications to
// the calls that asked for them.
type server struct {
	cfg  ServerConfig
	opts *options

	client *sdk.Client
	// httpTransport is the HTTP server's own transport, whose idle
	// connections Close drops; nil for stdio servers.
	httpTransport *http.Transport

	// progress maps a progress token (string) to its call's *progressSink.
	progress  sync.Map
	nextToken atomic.Uint64

	// connecting is a one-slot semaphore held while (re)connecting, so that
	// concurrent calls on a dead server start one process, not several.
	connecting chan struct{}

	mu        sync.Mutex
	sess      *sdk.ClientSession // nil when disconnected
	closed    bool
	failures  int       // consecutive failed reconnect rounds
	downUntil time.Time // no reconnect attempt before this
	lastErr   error     // why the last reconnect round failed
	calls     map[uint64]context.CancelFunc
	nextCall  uint64

	// secretsMu guards secrets, the values to redact from errors; redact
	// is called with mu held.
	secretsMu sync.Mutex
	secrets   []string

	// bg counts the goroutines that watch or close sessions.
	bg sync.WaitGroup
}

func newServer(cfg ServerConfig, o *options) *server {
	s := &server{
		cfg:        cfg,
		opts:       o,
		connecting: make(chan struct{}, 1),
		calls:      map[uint64]context.CancelFunc{},
	}
	s.client = sdk.NewClient(&sdk.Implementation{Name: "turnstile", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: s.onProgress,
		// Roots are not offered: turnstile exposes no file system to servers.
		Capabilities: &sdk.ClientCapabilities{},
	})
	if cfg.URL != "" {
		s.httpTransport = http.DefaultTransport.(*http.Transport).Clone()
		s.addSecrets(urlSecrets(cfg.URL)...)
		for _, v := range cfg.Headers {
			s.addSecrets(v)
		}
	}
	return s
}

// transport returns a fresh transport for one connection attempt.
func (s *server) transport() sdk.Transport {
	if s.cfg.URL != "" {
		h := http.Header{}
		for k, v := range s.cfg.Headers {
			h.Set(k, v)
		}
		var fromEnv []string
		for k, env := range s.cfg.HeadersFromEnv {
			v := os.Getenv(env)
			h.Set(k, v)
			fromEnv = append(fromEnv, v)
		}
		s.addSecrets(fromEnv...)
		endpoint, private := splitURL(s.cfg.URL)
		return &sdk.StreamableClientTransport{
			// The SDK, net/http and every error they make see the URL
			// without its credentials and query: the transport adds them
			// back to the requests it sends to the same origin.
			Endpoint:   endpoint,
			HTTPClient: &http.Client{Transport: &headerTransport{base: s.httpTransport, header: h, private: private}},
			// Progress arrives on each call's own response stream; no
			// standalone stream is needed, and none outlives a session.
			DisableStandaloneSSE: true,
			// Retries are ours (reconnect with backoff), not the transport's.
			MaxRetries: -1,
		}
	}
	cmd := exec.Command(s.cfg.Command, s.cfg.Args...)
	cmd.Env = s.environ()
	cmd.Stderr = s.opts.stderr
	return &sdk.CommandTransport{Command: cmd, TerminateDuration: s.opts.terminateGrace}
}

// environ is the stdio process's environment: PATH and HOME, the EnvFrom
// variables, then Env.
func (s *server) environ() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	for _, k := range s.cfg.EnvFrom {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	for k, v := range s.cfg.Env {
		env = append(env, k+"="+v)
	}
	return env
}

// connect opens a new session, bounded by the connect timeout.
func (s *server) connect(ctx context.Context) (*sdk.ClientSession, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.connectTimeout())
	defer cancel()
	sess, err := s.client.Connect(ctx, s.transport(), nil)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("connect timed out after %s: %w", s.cfg.connectTimeout(), err)
		}
		return nil, err
	}
	return sess, nil
}

// install makes sess the live session and watches it: when it ends (the
// process died, the connection broke), the server forgets it so that the next
// call reconnects.
func (s *server) install(sess *sdk.ClientSession) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.closeInBackground(sess)
		return errClosed
	}
	s.sess = sess
	s.failures = 0
	s.lastErr = nil
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		_ = sess.Wait()
		s.retire(sess, "session ended")
	}()
	return nil
}

// retire forgets sess if it is the live session and closes it, which also
// reaps a stdio process.
func (s *server) retire(sess *sdk.ClientSession, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess != sess {
		return
	}
	s.sess = nil
	if !s.closed {
		s.opts.logger.Warn("mcp server disconnected; will reconnect on the next call", "server", s.cfg.Name, "reason", s.redact(errors.New(why)).Error())
	}
	s.closeInBackground(sess)
}

// closeInBackground closes sess without blocking the caller: Close waits for
// calls in flight and for a stdio process to exit. s.mu must be held or s
// must not be shared yet.
func (s *server) closeInBackground(sess *sdk.ClientSession) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		_ = sess.Close()
	}()
}

// session returns the live session, reconnecting if there is none: up to
// opts.attempts tries with exponential backoff, within ctx. After a failed
// round, calls fail fast until a cool-down (growing with each failed round)
// has passed, so a dead server does not slow every call.
func (s *server) session(ctx context.Context) (*sdk.ClientSession, error) {
	if sess, err := s.current(); sess != nil || err != nil {
		return sess, err
	}
	select {
	case s.connecting <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-s.connecting }()
	// Another call may have reconnected while this one waited.
	if sess, err := s.current(); sess != nil || err != nil {
		return sess, err
	}

	delay := s.opts.backoff
	var err error
	for attempt := range s.opts.attempts {
		if attempt > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
			delay *= 2
		}
		var sess *sdk.ClientSession
		sess, err = s.connect(ctx)
		if err == nil {
			if err := s.install(sess); err != nil {
				return nil, err
			}
			s.opts.logger.Info("mcp server reconnected", "server", s.cfg.Name, "attempt", attempt+1)
			return sess, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	s.failures++
	s.lastErr = err
	cool := min(s.opts.backoff<<min(s.failures, 16), s.opts.maxCooldown)
	s.downUntil = time.Now().Add(cool)
	s.mu.Unlock()
	return nil, fmt.Errorf("reconnecting failed after %d attempts: %w", s.opts.attempts, err)
}

// current returns the live session, or an error if calls must not try to
// reconnect now, or neither.
func (s *server) current() (*sdk.ClientSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, errClosed
	case s.sess != nil:
		return s.sess, nil
	case s.lastErr != nil && time.Now().Before(s.downUntil):
		return nil, fmt.Errorf("unavailable (retrying in %s): %w", time.Until(s.downUntil).Round(time.Millisecond), s.lastErr)
	}
	return nil, nil
}

// track registers a call's cancel function so that Close can stop it; the
// returned func unregisters it. It fails once the server is closed.
func (s *server) track(cancel context.CancelFunc) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	id := s.nextCall
	s.nextCall++
	s.calls[id] = cancel
	return func() {
		s.mu.Lock()
		delete(s.calls, id)
		s.mu.Unlock()
	}, nil
}

// close cancels calls in flight, ends the session and waits for its
// goroutines and process.
func (s *server) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	for _, cancel := range s.calls {
		cancel()
	}
	if s.sess != nil {
		s.closeInBackground(s.sess)
		s.sess = nil
	}
	s.mu.Unlock()
	// Wait out a reconnect in progress (its call was just cancelled): it
	// closes the session it made, having seen s.closed.
	s.connecting <- struct{}{}
	s.bg.Wait()
	if s.httpTransport != nil {
		s.httpTransport.CloseIdleConnections()
	}
}

// redact returns err with the server's secrets removed from its text: the
// URL (a URL may carry a token in its query), its password and query
// values, and header values. It keeps err in the chain for [errors.Is].
// The SDK never sees the URL's secrets ([splitURL]); this catches what a
// server or library may still repeat.
func (s *server) redact(err error) error {
	if err == nil || s.cfg.URL == "" {
		return err
	}
	msg := err.Error()
	forms := []string{s.cfg.URL}
	if u, perr := url.Parse(s.cfg.URL); perr == nil {
		forms = append(forms, u.String(), u.Redacted())
	}
	for _, f := range forms {
		msg = strings.ReplaceAll(msg, f, "<url>")
	}
	for _, secret := range s.secretValues() {
		msg = strings.ReplaceAll(msg, secret, "[redacted]")
	}
	if msg == err.Error() {
		return err
	}
	return &redactedError{msg: msg, err: err}
}

// minSecret is the shortest value redacted: shorter ones are not real
// secrets, and replacing them would mangle ordinary words.
const minSecret = 6

// addSecrets records values to redact from errors.
func (s *server) addSecrets(values ...string) {
	s.secretsMu.Lock()
	defer s.secretsMu.Unlock()
	for _, v := range values {
		if len(v) >= minSecret && !slices.Contains(s.secrets, v) {
			s.secrets = append(s.secrets, v)
		}
	}
}

func (s *server) secretValues() []string {
	s.secretsMu.Lock()
	defer s.secretsMu.Unlock()
	return slices.Clone(s.secrets)
}

// privateParts are what of an MCP server's URL is kept from the SDK: its
// user and password, and its query.
type privateParts struct {
	scheme, host string // the origin they are sent to
	user         *url.Userinfo
	query        string
}

// splitURL returns raw without user, password, query and fragment, and
// those parts; an unparsable raw is returned as it is.
func splitURL(raw string) (string, *privateParts) {
	u, err := url.Parse(raw)
	if err != nil {
		return raw, nil
	}
	p := &privateParts{scheme: u.Scheme, host: u.Host, user: u.User, query: u.RawQuery}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	return u.String(), p
}

// urlSecrets returns the values of raw's user info and query, to redact.
func urlSecrets(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	var out []string
	if u.User != nil {
		out = append(out, u.User.Username())
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw, url.QueryEscape(pw))
		}
	}
	if u.RawQuery != "" {
		out = append(out, u.RawQuery)
		for _, vs := range u.Query() {
			for _, v := range vs {
				out = append(out, v, url.QueryEscape(v))
			}
		}
	}
	return out
}

// redactedError is an error whose text had secrets removed.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// progressSink delivers one call's progress notifications, until the call
// returns.
type progressSink struct {
	mu   sync.Mutex
	fn   func(llm.ToolProgress)
	done bool
}

func (p *progressSink) send(tp llm.ToolProgress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done {
		p.fn(tp)
	}
}

// stop ends delivery; it waits for a notification being delivered, so none
// reaches fn after stop returns.
func (p *progressSink) stop() {
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
}

// watchProgress registers fn for a new progress token and returns the token
// and a func that unregisters it.
func (s *server) watchProgress(fn func(llm.ToolProgress)) (string, func()) {
	token := fmt.Sprintf("turnstile-%d", s.nextToken.Add(1))
	sink := &progressSink{fn: fn}
	s.progress.Store(token, sink)
	return token, func() {
		s.progress.Delete(token)
		sink.stop()
	}
}

// onProgress routes a progress notification to the call that sent its token.
// The SDK may deliver a notification after the call's result; such late
// notifications are dropped.
func (s *server) onProgress(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
	token, ok := req.Params.ProgressToken.(string)
	if !ok {
		return
	}
	if v, ok := s.progress.Load(token); ok {
		v.(*progressSink).send(llm.ToolProgress{
			Message:  req.Params.Message,
			Progress: req.Params.Progress,
			Total:    req.Params.Total,
		})
	}
}

// headerTransport adds the configured headers, and the URL's user and
// query, to every request to the server's origin; a redirect elsewhere
// gets none of them.
type headerTransport struct {
	base    http.RoundTripper
	header  http.Header
	private *privateParts
}

// RoundTrip implements [http.RoundTripper].
func (t *headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	p := t.private
	if p == nil || r.URL.Scheme != p.scheme || r.URL.Host != p.host {
		return t.base.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	for k, v := range t.header {
		r.Header[k] = v
	}
	if p.query != "" {
		u := *r.URL
		if u.RawQuery == "" {
			u.RawQuery = p.query
		} else {
			u.RawQuery = p.query + "&" + u.RawQuery
		}
		r.URL = &u
	}
	if p.user != nil && r.Header.Get("Authorization") == "" {
		pw, _ := p.user.Password()
		r.SetBasicAuth(p.user.Username(), pw)
	}
	return t.base.RoundTrip(r)
}
