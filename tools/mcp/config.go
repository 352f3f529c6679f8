package mcp

import (
	"fmt"
	"time"
)

// DefaultConnectTimeout bounds connecting to a server (starting the process
// or reaching the URL, then the MCP handshake) when
// [ServerConfig.ConnectTimeout] is zero.
const DefaultConnectTimeout = 10 * time.Second

// ServerConfig describes one MCP server. Exactly one of Command and URL is
// set. The zero value is not usable.
type ServerConfig struct {
	// Name identifies the server in errors and logs.
	Name string

	// Command is the executable of a stdio server, started with Args.
	Command string
	// Args are the command's arguments.
	Args []string
	// Env sets environment variables of the process. The process does not
	// inherit turnstile's environment: it gets PATH and HOME, the variables
	// named in EnvFrom, then Env.
	Env map[string]string
	// EnvFrom names variables of turnstile's own environment passed on to the
	// process (for secrets that must not be written in the config file).
	EnvFrom []string

	// URL is the endpoint of a streamable-HTTP server.
	URL string
	// Headers are sent with every HTTP request.
	Headers map[string]string
	// HeadersFromEnv maps a header name to the environment variable holding
	// its value, read at each connect.
	HeadersFromEnv map[string]string

	// Tools, when not empty, lists the only server tools exposed; each must be
	// offered by the server.
	Tools []string
	// ToolPrefix is prepended to the server's tool names to form the names
	// the model sees, which avoids collisions between servers.
	ToolPrefix string
	// Overrides adjusts individual tools, keyed by the server's tool name.
	Overrides map[string]ToolOverride
	// ConnectTimeout bounds each connect (0: [DefaultConnectTimeout]).
	ConnectTimeout time.Duration
}

// ToolOverride replaces what a server says about one of its tools.
type ToolOverride struct {
	// ReadOnly, when set, replaces the tool's readOnlyHint.
	ReadOnly *bool
	// Idempotent, when set, replaces the tool's idempotentHint.
	Idempotent *bool
	// Timeout, when positive, bounds each call of the tool.
	Timeout time.Duration
}

func (c *ServerConfig) check() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("mcp: server without a name")
	case c.Command == "" && c.URL == "":
		return fmt.Errorf("mcp: server %q: command or url is required", c.Name)
	case c.Command != "" && c.URL != "":
		return fmt.Errorf("mcp: server %q: command and url are mutually exclusive", c.Name)
	case c.ConnectTimeout < 0:
		return fmt.Errorf("mcp: server %q: connect timeout must not be negative", c.Name)
	}
	return nil
}

func (c *ServerConfig) connectTimeout() time.Duration {
	if c.ConnectTimeout > 0 {
		return c.ConnectTimeout
	}
	return DefaultConnectTimeout
}
