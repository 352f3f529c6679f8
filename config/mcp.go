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
	// ConnectTimeout bounds each connect to the server (default 10s;
	// positive).
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// RequireApproval lists the server's tools, by the server's names, whose
	// calls wait for a person's decision (AgentService.ApproveToolCall)
	// before they run; "*" alone means every tool of the server. A call
	// nobody decides within turn.approval_timeout is denied.
	RequireApproval []string `yaml:"require_approval"`
	// EndsTurn lists the server's tools, by the server's names, that end
	// the turn when they succeed: their result is committed and the turn
	// completes (END_REASON_TOOL_ENDED_TURN) without another model call.
	EndsTurn []string `yaml:"ends_turn"`
}

// AllTools in require_approval stands for every tool of the server.
const AllTools = "*"

// checkToolRules checks the require_approval and ends_turn lists of the
// server s at path.
func (c *Config) checkToolRules(v *checker, path string, s MCPServer) {
	for _, list := range []struct {
		key   string
		names []string
	}{{"require_approval", s.RequireApproval}, {"ends_turn", s.EndsTurn}} {
		for i, tool := range list.names {
			at := fmt.Sprintf("%s.%s[%d]", path, list.key, i)
			switch {
			case tool == "":
				v.at(at, "empty tool name")
			case tool == AllTools && list.key == "ends_turn":
				v.at(at, "name the tools that end the turn; \"*\" is for require_approval only")
			case tool == AllTools && len(list.names) > 1:
				v.at(at, "\"*\" already names every tool of the server: list it alone")
			case slices.Contains(list.names[:i], tool):
				v.at(at, "%q appears twice", tool)
			case tool != AllTools && len(s.Tools) > 0 && !slices.Contains(s.Tools, tool):
				v.at(at, "%q is not in the tools allowlist", tool)
			}
		}
	}
}

// DefaultMCPConnectTimeout bounds each connect to an MCP server whose
// entry does not set connect_timeout.
const DefaultMCPConnectTimeout = 10 * time.Second

// newMCPServer returns the value an mcp_servers entry starts from.
func newMCPServer() MCPServer { return MCPServer{ConnectTimeout: DefaultMCPConnectTimeout} }

// MCPToolOverride replaces what an MCP server says about one tool.
type MCPToolOverride struct {
	// ReadOnly, when set, replaces the tool's readOnlyHint.
	ReadOnly *bool `yaml:"read_only"`
	// Idempotent, when set, replaces the tool's idempotentHint.
	Idempotent *bool `yaml:"idempotent"`
	// Timeout bounds each call of the tool; positive when set. Left out (0
	// in code), the tool gets turn.tool_timeout.
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

// checkMCP checks mcp_servers and the models' tools lists. Messages never
// repeat environment or header values, nor the URL (it may carry a token).
func (c *Config) checkMCP(v *checker) {
	for _, name := range sortedKeys(c.MCPServers) {
		s := c.MCPServers[name]
		path := "mcp_servers." + name
		if !mcpName.MatchString(name) {
			v.at(path, "the name may only hold letters, digits, _ and -")
		}
		switch {
		case s.Command == "" && s.URL == "":
			v.at(path+".command", "required unless url is set")
		case s.Command != "" && s.URL != "":
			v.at(path, "set either command or url, not both")
		case s.URL != "":
			if len(s.Args) > 0 || len(s.Env) > 0 || len(s.EnvFrom) > 0 {
				v.at(path, "args, env and env_from apply only to command servers")
			}
			if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				v.at(path+".url", "must be an absolute http or https URL")
			}
		default:
			if len(s.Headers) > 0 || len(s.HeadersFromEnv) > 0 {
				v.at(path, "headers and headers_from_env apply only to url servers")
			}
		}
		for _, k := range sortedKeys(s.Env) {
			if !envName.MatchString(k) {
				v.at(path+".env", "%q is not an environment variable name", k)
			}
		}
		for i, k := range s.EnvFrom {
			at := fmt.Sprintf("%s.env_from[%d]", path, i)
			switch {
			case !envName.MatchString(k):
				v.at(at, "%q is not an environment variable name", k)
			case slices.Contains(s.EnvFrom[:i], k):
				v.at(at, "%q appears twice", k)
			}
			if _, ok := s.Env[k]; ok {
				v.at(at, "%q is also set in env", k)
			}
		}
		for _, k := range sortedKeys(s.Headers) {
			if !headerName.MatchString(k) {
				v.at(path+".headers", "%q is not a header name", k)
			}
			if strings.ContainsAny(s.Headers[k], "\r\n") {
				v.at(path+".headers."+k, "the value must be one line")
			}
		}
		for _, k := range sortedKeys(s.HeadersFromEnv) {
			if !headerName.MatchString(k) {
				v.at(path+".headers_from_env", "%q is not a header name", k)
			}
			if name := s.HeadersFromEnv[k]; !envName.MatchString(name) {
				v.at(path+".headers_from_env."+k, "%q is not an environment variable name", name)
			}
			if _, ok := s.Headers[k]; ok {
				v.at(path+".headers_from_env."+k, "also set in headers")
			}
		}
		for i, tool := range s.Tools {
			at := fmt.Sprintf("%s.tools[%d]", path, i)
			switch {
			case tool == "":
				v.at(at, "empty tool name")
			case slices.Contains(s.Tools[:i], tool):
				v.at(at, "%q appears twice", tool)
			}
		}
		if s.ToolPrefix != "" && !mcpName.MatchString(s.ToolPrefix) {
			v.at(path+".tool_prefix", "may only hold letters, digits, _ and -")
		}
		for _, tool := range sortedKeys(s.ToolOverrides) {
			o := s.ToolOverrides[tool]
			at := path + ".tool_overrides." + tool
			if len(s.Tools) > 0 && !slices.Contains(s.Tools, tool) {
				v.at(at, "not in the tools allowlist")
			}
			_, set := c.lines[at+".timeout"]
			switch {
			case o.Timeout < 0:
				v.at(at+".timeout", "must not be negative")
			case o.Timeout == 0 && set:
				v.at(at+".timeout", "must be positive: leave it out for turn.tool_timeout")
			}
		}
		if s.ConnectTimeout <= 0 {
			v.at(path+".connect_timeout", "must be positive")
		}
		c.checkToolRules(v, path, s)
	}

	known, complete := c.mcpToolNames()
	for _, alias := range sortedKeys(c.Models) {
		m := c.Models[alias]
		path := "models." + alias + ".tools"
		if len(m.Tools) > 0 && len(c.MCPServers) == 0 {
			v.at(path, "no mcp_servers are configured")
			continue
		}
		for i, tool := range m.Tools {
			at := fmt.Sprintf("%s[%d]", path, i)
			switch {
			case tool == "":
				v.at(at, "empty tool name")
			case slices.Contains(m.Tools[:i], tool):
				v.at(at, "%q appears twice", tool)
			case complete && !known[tool]:
				v.at(at, "%q is not in any mcp_servers tools allowlist", tool)
			}
		}
	}
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
