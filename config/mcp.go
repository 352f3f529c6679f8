package config

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

// MCPServer configures one MCP server whose tools the models may call. Set
// exactly one of Command (a stdio server, started as a child process) and
// URL (a streamable-HTTP server).
type MCPServer struct {
	// Command is the executable of a stdio server.
	Command string `yaml:"command"`
	// Args are the command's arguments.
	Args []string `yaml:"args"`
	// Env sets environment variables of the process. The process does not
	// inherit turnstile's environment: it gets PATH and HOME, the variables
	// named in EnvFrom, then Env. Values are never logged.
	Env map[string]string `yaml:"env"`
	// EnvFrom names variables of turnstile's environment passed on to the
	// process, for secrets that do not belong in the file.
	EnvFrom []string `yaml:"env_from"`

	// URL is the endpoint of a streamable-HTTP server (http or https).
	URL string `yaml:"url"`
	// Headers are sent with every request to URL. Values are never logged.
	Headers map[string]string `yaml:"headers"`
	// HeadersFromEnv maps a header name to the environment variable holding
	// its value (for example Authorization: MCP_TOKEN).
	HeadersFromEnv map[string]string `yaml:"headers_from_env"`

	// Tools, when not empty, lists the only tools of the server exposed to
	// models; each must be offered by the server.
	Tools []string `yaml:"tools"`
	// ToolPrefix is prepended to the server's tool names to form the names
	// models see; two servers offering the same name need one.
	ToolPrefix string `yaml:"tool_prefix"`
	// ToolOverrides adjusts tools, keyed by the server's tool name.
	ToolOverrides map[string]MCPToolOverride `yaml:"tool_overrides"`
	// ConnectTimeout bounds each connect to the server (0: 10s).
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
}

// MCPToolOverride replaces what an MCP server says about one tool.
type MCPToolOverride struct {
	// ReadOnly, when set, replaces the tool's readOnlyHint.
	ReadOnly *bool `yaml:"read_only"`
	// Idempotent, when set, replaces the tool's idempotentHint.
	Idempotent *bool `yaml:"idempotent"`
	// Timeout, when positive, bounds each call of the tool (0: turn.tool_timeout).
	Timeout time.Duration `yaml:"timeout"`
}

var (
	// mcpName is a server name or tool prefix: what providers accept in a
	// tool name.
	mcpName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	// envName is a portable environment variable name.
	envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// headerName is an HTTP header field name (RFC 9110 token).
	headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
)

// validateMCP checks mcp_servers and the models' tools lists. Messages name
// the field and never repeat environment or header values, nor the URL (it
// may carry a token).
func (c *Config) validateMCP() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, name := range sortedKeys(c.MCPServers) {
		s := c.MCPServers[name]
		field := "mcp_servers." + name
		if !mcpName.MatchString(name) {
			add("%s: the name may only hold letters, digits, _ and -", field)
		}
		switch {
		case s.Command == "" && s.URL == "":
			add("%s.command: required unless url is set", field)
		case s.Command != "" && s.URL != "":
			add("%s: set either command or url, not both", field)
		case s.URL != "":
			if len(s.Args) > 0 || len(s.Env) > 0 || len(s.EnvFrom) > 0 {
				add("%s: args, env and env_from apply only to command servers", field)
			}
			if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				add("%s.url: must be an absolute http or https URL", field)
			}
		default:
			if len(s.Headers) > 0 || len(s.HeadersFromEnv) > 0 {
				add("%s: headers and headers_from_env apply only to url servers", field)
			}
		}
		for _, k := range sortedKeys(s.Env) {
			if !envName.MatchString(k) {
				add("%s.env: %q is not an environment variable name", field, k)
			}
		}
		for i, k := range s.EnvFrom {
			switch {
			case !envName.MatchString(k):
				add("%s.env_from[%d]: %q is not an environment variable name", field, i, k)
			case slices.Contains(s.EnvFrom[:i], k):
				add("%s.env_from[%d]: %q appears twice", field, i, k)
			}
			if _, ok := s.Env[k]; ok {
				add("%s.env_from[%d]: %q is also set in env", field, i, k)
			}
		}
		for _, k := range sortedKeys(s.Headers) {
			if !headerName.MatchString(k) {
				add("%s.headers: %q is not a header name", field, k)
			}
			if strings.ContainsAny(s.Headers[k], "\r\n") {
				add("%s.headers.%s: the value must be one line", field, k)
			}
		}
		for _, k := range sortedKeys(s.HeadersFromEnv) {
			if !headerName.MatchString(k) {
				add("%s.headers_from_env: %q is not a header name", field, k)
			}
			if v := s.HeadersFromEnv[k]; !envName.MatchString(v) {
				add("%s.headers_from_env.%s: %q is not an environment variable name", field, k, v)
			}
			if _, ok := s.Headers[k]; ok {
				add("%s.headers_from_env.%s: also set in headers", field, k)
			}
		}
		for i, tool := range s.Tools {
			switch {
			case tool == "":
				add("%s.tools[%d]: empty tool name", field, i)
			case slices.Contains(s.Tools[:i], tool):
				add("%s.tools[%d]: %q appears twice", field, i, tool)
			}
		}
		if s.ToolPrefix != "" && !mcpName.MatchString(s.ToolPrefix) {
			add("%s.tool_prefix: may only hold letters, digits, _ and -", field)
		}
		for _, tool := range sortedKeys(s.ToolOverrides) {
			o := s.ToolOverrides[tool]
			if len(s.Tools) > 0 && !slices.Contains(s.Tools, tool) {
				add("%s.tool_overrides.%s: not in the tools allowlist", field, tool)
			}
			if o.Timeout < 0 {
				add("%s.tool_overrides.%s.timeout: must not be negative", field, tool)
			}
		}
		if s.ConnectTimeout < 0 {
			add("%s.connect_timeout: must not be negative", field)
		}
	}

	known, complete := c.mcpToolNames()
	for _, alias := range sortedKeys(c.Models) {
		m := c.Models[alias]
		field := "models." + alias + ".tools"
		if len(m.Tools) > 0 && len(c.MCPServers) == 0 {
			add("%s: no mcp_servers are configured", field)
			continue
		}
		for i, tool := range m.Tools {
			switch {
			case tool == "":
				add("%s[%d]: empty tool name", field, i)
			case slices.Contains(m.Tools[:i], tool):
				add("%s[%d]: %q appears twice", field, i, tool)
			case complete && !known[tool]:
				add("%s[%d]: %q is not in any mcp_servers tools allowlist", field, i, tool)
			}
		}
	}
	return errs
}

// mcpToolNames returns the tool names models may see, as far as the file
// tells: complete is false when a server has no allowlist, since its tools
// are known only once connected.
func (c *Config) mcpToolNames() (names map[string]bool, complete bool) {
	names = map[string]bool{}
	for _, s := range c.MCPServers {
		if len(s.Tools) == 0 {
			return nil, false
		}
		for _, t := range s.Tools {
			names[s.ToolPrefix+t] = true
		}
	}
	return names, true
}
