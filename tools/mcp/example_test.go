package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
	"github.com/turnstile-dev/turnstile/tools/mcp"
)

func Example() {
	// An MCP server with one tool, served over streamable HTTP.
	s := sdk.NewServer(&sdk.Implementation{Name: "greeter", Version: "1"}, nil)
	s.AddTool(&sdk.Tool{
		Name:        "greet",
		Description: "Greets someone.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`),
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
	}, func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		var in struct{ Name string }
		_ = json.Unmarshal(req.Params.Arguments, &in)
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "Hello, " + in.Name}}}, nil
	})
	srv := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil))
	defer srv.Close()

	ctx := context.Background()
	ts, err := mcp.New(ctx, []mcp.ServerConfig{{Name: "greeter", URL: srv.URL}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ts.Close()

	tools, err := ts.Select([]string{"greet"}) // a model's tools list
	if err != nil {
		fmt.Println(err)
		return
	}
	greet, err := argcheck.Wrap(tools[0])
	if err != nil {
		fmt.Println(err)
		return
	}
	spec := greet.Spec()
	fmt.Println(spec.Name, spec.ReadOnly, spec.Idempotent)

	for _, args := range []string{`{"name":"Ada"}`, `{"name":42}`} {
		out, err := greet.Call(ctx, llm.ToolCall{ID: "1", Name: "greet", Arguments: args}, nil)
		fmt.Printf("%q %v %v\n", out.Content, out.IsError, err)
	}
	// Output:
	// greet true true
	// "Hello, Ada" false <nil>
	// "Invalid arguments for tool \"greet\"; they do not match its input schema:\n- property \"name\": got number, want string\nFix the arguments and call the tool again." true <nil>
}
