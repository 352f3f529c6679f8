// Command testserver is a stdio MCP server for the tests of package mcp. Its
// tools:
//
//   - progress: reports 3 progress notifications, then answers "done".
//   - fail: answers an error result (isError).
//   - hang: reports "started pid=N" as progress, then blocks until cancelled.
//   - lookup: read-only and idempotent; answers text and structured content.
//   - append: not idempotent; appends its "line" argument to the file named
//     by $APPEND_FILE, so tests can count executions.
//   - slow_append: like append, then takes "ms" milliseconds to answer, so a
//     test can stop a server while it runs.
//   - slow_lookup: read-only and idempotent; appends "lookup" to
//     $APPEND_FILE, then takes "ms" milliseconds to answer.
//   - screenshot: read-only; answers text, a PNG image of "bytes" bytes
//     (default 68), WAV audio, an SVG image and an embedded PDF resource.
//
// Arguments are not validated here, on purpose: the tests check that
// validation happens before a call reaches the server.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	s := mcp.NewServer(&mcp.Implementation{Name: "testserver", Version: "1"}, nil)
	object := json.RawMessage(`{"type":"object"}`)

	s.AddTool(&mcp.Tool{Name: "progress", Description: "Reports progress three times.", InputSchema: object},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if token := req.Params.GetProgressToken(); token != nil {
				for i := 1; i <= 3; i++ {
					_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
						ProgressToken: token,
						Message:       fmt.Sprintf("step %d", i),
						Progress:      float64(i),
						Total:         3,
					})
				}
				// The client handles a server's messages in order, but
				// delivers a call's result apart from them: a ping answered
				// means the notifications before it were handled.
				_ = req.Session.Ping(ctx, nil)
			}
			return text("done"), nil
		})

	s.AddTool(&mcp.Tool{Name: "fail", Description: "Always fails.", InputSchema: object},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			r := text("the widget is broken")
			r.IsError = true
			return r, nil
		})

	s.AddTool(&mcp.Tool{Name: "hang", Description: "Blocks until cancelled.", InputSchema: object},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if token := req.Params.GetProgressToken(); token != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: token,
					Message:       fmt.Sprintf("started pid=%d", os.Getpid()),
				})
			}
			<-ctx.Done()
			return nil, ctx.Err()
		})

	s.AddTool(&mcp.Tool{
		Name:        "lookup",
		Description: "Looks a key up.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"key":{"type":"string"}},"required":["key"],"additionalProperties":false}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, Title: "Lookup"},
	}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in struct{ Key string }
		_ = json.Unmarshal(req.Params.Arguments, &in)
		r := text("found " + in.Key)
		r.StructuredContent = map[string]string{"key": in.Key, "value": "v-" + in.Key}
		return r, nil
	})

	s.AddTool(&mcp.Tool{
		Name:        "append",
		Description: "Appends a line to a file.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"line":{"type":"string"}},"required":["line"]}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: false, IdempotentHint: false},
	}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in struct{ Line any }
		_ = json.Unmarshal(req.Params.Arguments, &in)
		if err := appendLine(fmt.Sprint(in.Line)); err != nil {
			return nil, err
		}
		return text("appended"), nil
	})

	slow := func(ctx context.Context, req *mcp.CallToolRequest, line string) (*mcp.CallToolResult, error) {
		var in struct {
			Line any
			MS   int
		}
		_ = json.Unmarshal(req.Params.Arguments, &in)
		if line == "" {
			line = fmt.Sprint(in.Line)
		}
		if err := appendLine(line); err != nil {
			return nil, err
		}
		select {
		case <-time.After(time.Duration(in.MS) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return text("done"), nil
	}
	s.AddTool(&mcp.Tool{
		Name:        "slow_append",
		Description: "Appends a line to a file, slowly.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"line":{"type":"string"},"ms":{"type":"integer"}},"required":["line"]}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: false, IdempotentHint: false},
	}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return slow(ctx, req, "")
	})
	s.AddTool(&mcp.Tool{
		Name:        "slow_lookup",
		Description: "Looks something up, slowly.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"ms":{"type":"integer"}}}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true},
	}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return slow(ctx, req, "lookup")
	})

	s.AddTool(&mcp.Tool{
		Name:        "screenshot",
		Description: "Takes a screenshot.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"bytes":{"type":"integer"}}}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var args struct {
			Bytes int `json:"bytes"`
		}
		_ = json.Unmarshal(req.Params.Arguments, &args)
		png := []byte("\x89PNG\r\n\x1a\n")
		if args.Bytes > len(png) {
			png = append(png, make([]byte, args.Bytes-len(png))...)
		} else {
			png = append(png, make([]byte, 60)...)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: "the screen"},
			&mcp.ImageContent{MIMEType: "image/png", Data: png},
			&mcp.AudioContent{MIMEType: "audio/wav", Data: []byte("RIFF0000WAVE")},
			&mcp.ImageContent{MIMEType: "image/svg+xml", Data: []byte("<svg/>")},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///reports/q3.pdf", MIMEType: "application/pdf", Blob: []byte("%PDF-1.7")}},
		}}, nil
	})

	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		log.Fatal(err)
	}
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// appendLine appends line to the file named by $APPEND_FILE.
func appendLine(line string) error {
	f, err := os.OpenFile(os.Getenv("APPEND_FILE"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintln(f, line)
	return err
}
