package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/turnstile-dev/turnstile/llm"
)

// tool is one MCP server tool seen as a [llm.Tool].
type tool struct {
	srv     *server
	remote  string // the tool's name on the server
	spec    llm.ToolSpec
	timeout time.Duration
}

var _ llm.Tool = (*tool)(nil)

// newTool maps an MCP tool to a spec. ReadOnly and Idempotent come from the
// readOnlyHint and idempotentHint annotations (a read-only tool is also
// idempotent), then from the override.
func newTool(s *server, t *sdk.Tool, ov ToolOverride) (*tool, error) {
	schema, err := json.Marshal(t.InputSchema)
	if err != nil {
		return nil, fmt.Errorf("mcp: server %q: tool %q: input schema: %w", s.cfg.Name, t.Name, err)
	}
	if bytes.Equal(schema, []byte("null")) {
		schema = nil
	}
	spec := llm.ToolSpec{
		Name:        s.cfg.ToolPrefix + t.Name,
		Description: t.Description,
		Schema:      schema,
	}
	if spec.Description == "" {
		spec.Description = t.Title
	}
	if a := t.Annotations; a != nil {
		spec.ReadOnly = a.ReadOnlyHint
		spec.Idempotent = a.IdempotentHint || a.ReadOnlyHint
		if spec.Description == "" {
			spec.Description = a.Title
		}
	}
	if ov.ReadOnly != nil {
		spec.ReadOnly = *ov.ReadOnly
	}
	if ov.Idempotent != nil {
		spec.Idempotent = *ov.Idempotent
	}
	return &tool{srv: s, remote: t.Name, spec: spec, timeout: ov.Timeout}, nil
}

// Spec implements [llm.Tool].
func (t *tool) Spec() llm.ToolSpec { return t.spec }

// Timeout returns the tool's configured time limit (tool_overrides.timeout),
// zero when it has none; the runtime bounds each call by it.
func (t *tool) Timeout() time.Duration { return t.timeout }

// Call runs the tool on its server with tools/call, reconnecting first if
// the server's session ended. Progress notifications reach progress (if not
// nil) until Call returns. A result the server marks isError is returned as
// an output with IsError; a failure to get a result (server unreachable or
// gone mid-call, protocol error, timeout, cancellation) is an error.
func (t *tool) Call(ctx context.Context, call llm.ToolCall, progress func(llm.ToolProgress)) (llm.ToolOutput, error) {
	args := strings.TrimSpace(call.Arguments)
	if args == "" {
		args = "{}"
	}
	if !json.Valid([]byte(args)) {
		return llm.ToolOutput{IsError: true, Content: fmt.Sprintf("Invalid arguments for tool %q: they are not valid JSON.", t.spec.Name)}, nil
	}
	if args[0] != '{' {
		return llm.ToolOutput{IsError: true, Content: fmt.Sprintf("Invalid arguments for tool %q: they must be a JSON object.", t.spec.Name)}, nil
	}

	parent := ctx
	var cancel context.CancelFunc
	if t.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, t.timeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	untrack, err := t.srv.track(cancel)
	if err != nil {
		return llm.ToolOutput{}, t.fail(err)
	}
	defer untrack()

	sess, err := t.srv.session(ctx)
	if err != nil {
		return llm.ToolOutput{}, t.fail(t.ctxErr(parent, ctx, err))
	}
	params := &sdk.CallToolParams{Name: t.remote, Arguments: json.RawMessage(args)}
	if progress != nil {
		token, stop := t.srv.watchProgress(progress)
		defer stop()
		params.SetProgressToken(token)
	}
	res, err := sess.CallTool(ctx, params)
	if err != nil {
		if ctx.Err() != nil {
			return llm.ToolOutput{}, t.fail(t.ctxErr(parent, ctx, err))
		}
		return llm.ToolOutput{}, t.fail(t.callErr(sess, err))
	}
	text, media := resultContent(res)
	return llm.ToolOutput{Content: text, IsError: res.IsError, Media: media}, nil
}

// codeRejected is the JSON-RPC error code the SDK gives a request its
// transport could not deliver or got a transient HTTP error for (its
// internal jsonrpc2.ErrRejected); the session stays usable.
const codeRejected = -32005

// callErr explains a failed tools/call and retires the session when it is
// gone, so that the next call reconnects.
func (t *tool) callErr(sess *sdk.ClientSession, err error) error {
	rpcErr, isRPC := errors.AsType[*jsonrpc.Error](err)
	switch {
	case errors.Is(err, sdk.ErrSessionMissing):
		t.srv.retire(sess, "session missing")
		return fmt.Errorf("the server no longer knows the session (restarted?); it is reconnected on the next call: %w", err)
	case isRPC && rpcErr.Code == codeRejected:
		return fmt.Errorf("the request did not get through to the server: %w", err)
	case isRPC:
		// The server answered with a protocol error: the session is fine.
		return err
	}
	t.srv.retire(sess, "call failed: "+err.Error())
	what := "connection to the server lost during the call"
	if errors.Is(err, io.EOF) {
		what = "the server closed the connection during the call (a stdio server's process exited)"
	}
	return fmt.Errorf("%s; it is reconnected on the next call: %w", what, err)
}

// fail wraps err with the server and tool names, without the server's URL.
func (t *tool) fail(err error) error {
	return fmt.Errorf("mcp server %q: tool %q: %w", t.srv.cfg.Name, t.remote, t.srv.redact(err))
}

// ctxErr explains an error that happened while ctx was done: the caller's
// cancellation, this tool's own timeout, or the toolset closing.
func (t *tool) ctxErr(parent, ctx context.Context, err error) error {
	switch {
	case parent.Err() != nil:
		return parent.Err()
	case errors.Is(ctx.Err(), context.DeadlineExceeded) && t.timeout > 0:
		return fmt.Errorf("timed out after %s: %w", t.timeout, context.DeadlineExceeded)
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %w", errClosed, ctx.Err())
	}
	return err
}

// resultContent renders a tool result for the model: its text content,
// one block per line, then the structured content as JSON unless a text
// block already holds exactly that JSON; and its media. An image, audio
// or embedded resource blob of a type turnstile passes on (PNG, JPEG,
// GIF, WebP, PDF, WAV, MP3) is passed through as media; any other
// non-text block (an SVG, a resource link, which the server never
// fetches) becomes a placeholder line naming its type and size.
func resultContent(res *sdk.CallToolResult) (string, []llm.Media) {
	var (
		parts []string
		media []llm.Media
	)
	pass := func(mime string, data []byte, name string) bool {
		mime = llm.NormalizeMediaType(mime)
		if _, ok := llm.ModalityOf(mime); !ok || len(data) == 0 {
			return false
		}
		media = append(media, llm.Media{MIMEType: mime, Data: data, Name: name})
		return true
	}
	for _, c := range res.Content {
		switch c := c.(type) {
		case *sdk.TextContent:
			parts = append(parts, c.Text)
		case *sdk.ImageContent:
			if !pass(c.MIMEType, c.Data, "") {
				parts = append(parts, fmt.Sprintf("[image %s, %d bytes]", c.MIMEType, len(c.Data)))
			}
		case *sdk.AudioContent:
			if !pass(c.MIMEType, c.Data, "") {
				parts = append(parts, fmt.Sprintf("[audio %s, %d bytes]", c.MIMEType, len(c.Data)))
			}
		case *sdk.ResourceLink:
			parts = append(parts, fmt.Sprintf("[resource %s]", c.URI))
		case *sdk.EmbeddedResource:
			if r := c.Resource; r != nil && r.Text != "" {
				parts = append(parts, r.Text)
			} else if r != nil && !pass(r.MIMEType, r.Blob, resourceName(r.URI)) {
				parts = append(parts, fmt.Sprintf("[resource %s, %d bytes]", r.URI, len(r.Blob)))
			}
		}
	}
	if res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil && !containsJSON(parts, b) {
			parts = append(parts, string(b))
		}
	}
	return strings.Join(parts, "\n"), media
}

// resourceName returns the last element of a resource's URI as the name
// of its media, "" when there is none that fits a name.
func resourceName(uri string) string {
	name := path.Base(uri)
	if name == "." || name == "/" || len(name) > 256 || !utf8.ValidString(name) {
		return ""
	}
	return name
}

// containsJSON reports whether a text part is the same JSON as b.
func containsJSON(parts []string, b []byte) bool {
	var want bytes.Buffer
	if json.Compact(&want, b) != nil {
		return false
	}
	for _, p := range parts {
		var got bytes.Buffer
		if json.Compact(&got, []byte(p)) == nil && bytes.Equal(got.Bytes(), want.Bytes()) {
			return true
		}
	}
	return false
}
