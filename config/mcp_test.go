package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// base is a valid configuration the MCP cases add to.
const base = `
providers:
  sim: {type: simulator}
models:
  sim: {provider: sim, model: turnstile-sim-1}
`

func TestParseMCP(t *testing.T) {
	c, err := Parse("config.yaml", []byte(base+`
mcp_servers:
  files:
    command: /usr/bin/files-mcp
    args: [--root, /srv]
    env: {LOG_LEVEL: debug}
    env_from: [FILES_TOKEN]
    tools: [read_file, list_dir]
    tool_overrides:
      read_file: {read_only: true, idempotent: true, timeout: 5s}
    connect_timeout: 3s
  search:
    url: https://search.example.com/mcp
    headers: {X-Team: core}
    headers_from_env: {Authorization: SEARCH_AUTH}
    tool_prefix: search_
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	yes := true
	want := map[string]MCPServer{
		"files": {
			Command:        "/usr/bin/files-mcp",
			Args:           []string{"--root", "/srv"},
			Env:            map[string]string{"LOG_LEVEL": "debug"},
			EnvFrom:        []string{"FILES_TOKEN"},
			Tools:          []string{"read_file", "list_dir"},
			ToolOverrides:  map[string]MCPToolOverride{"read_file": {ReadOnly: &yes, Idempotent: &yes, Timeout: 5 * time.Second}},
			ConnectTimeout: 3 * time.Second,
		},
		"search": {
			URL:            "https://search.example.com/mcp",
			Headers:        map[string]string{"X-Team": "core"},
			HeadersFromEnv: map[string]string{"Authorization": "SEARCH_AUTH"},
			ToolPrefix:     "search_",
			ConnectTimeout: DefaultMCPConnectTimeout,
		},
	}
	if diff := cmp.Diff(want, c.MCPServers); diff != "" {
		t.Errorf("MCPServers mismatch (-want +got):\n%s", diff)
	}
}

func TestValidateMCP(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		// want lists fragments of the error; none means valid.
		want []string
		// secret must not appear in the error.
		secret string
	}{
		{name: "no servers", yaml: ``},
		{name: "stdio", yaml: `
mcp_servers:
  local: {command: ./server}`},
		{name: "http", yaml: `
mcp_servers:
  remote: {url: "http://127.0.0.1:9000/mcp"}`},
		{name: "neither command nor url", yaml: `
mcp_servers:
  empty: {tools: [a]}`, want: []string{"mcp_servers.empty.command: required"}},
		{name: "both command and url", yaml: `
mcp_servers:
  both: {command: ./s, url: "http://x/mcp"}`, want: []string{"mcp_servers.both: set either command or url"}},
		{name: "bad server name", yaml: `
mcp_servers:
  "a b": {command: ./s}`, want: []string{"mcp_servers.a b: the name"}},
		{name: "url scheme", yaml: `
mcp_servers:
  remote: {url: "ftp://user:hunter2@host/mcp"}`, want: []string{"mcp_servers.remote.url: must be an absolute http or https URL"}, secret: "hunter2"},
		{name: "relative url", yaml: `
mcp_servers:
  remote: {url: "/mcp"}`, want: []string{"mcp_servers.remote.url"}},
		{name: "stdio fields on url", yaml: `
mcp_servers:
  remote: {url: "http://x/mcp", args: [a], env: {A: b}}`, want: []string{"mcp_servers.remote: args, env and env_from apply only to command servers"}},
		{name: "http fields on command", yaml: `
mcp_servers:
  local: {command: ./s, headers: {X-A: b}}`, want: []string{"mcp_servers.local: headers and headers_from_env apply only to url servers"}},
		{name: "env name", yaml: `
mcp_servers:
  local: {command: ./s, env: {"BAD=NAME": topsecret}}`, want: []string{`mcp_servers.local.env: "BAD=NAME"`}, secret: "topsecret"},
		{name: "tool rules", yaml: `
mcp_servers:
  local: {command: ./s, require_approval: ["*"], ends_turn: [finish]}`},
		{name: "tool rules out of the allowlist", yaml: `
mcp_servers:
  local: {command: ./s, tools: [deploy], require_approval: [deploy, drop, drop], ends_turn: ["*", ""]}`, want: []string{
			`mcp_servers.local.require_approval[1]: "drop" is not in the tools allowlist`,
			`mcp_servers.local.require_approval[2]: "drop" appears twice`,
			`mcp_servers.local.ends_turn[0]: name the tools that end the turn`,
			`mcp_servers.local.ends_turn[1]: empty tool name`,
		}},
		{name: "star with names", yaml: `
mcp_servers:
  local: {command: ./s, require_approval: [deploy, "*"]}`, want: []string{`mcp_servers.local.require_approval[1]: "*" already names every tool`}},
		{name: "env_from name", yaml: `
mcp_servers:
  local: {command: ./s, env_from: [OK, "1BAD"]}`, want: []string{`mcp_servers.local.env_from[1]: "1BAD"`}},
		{name: "env_from twice", yaml: `
mcp_servers:
  local: {command: ./s, env_from: [A, A]}`, want: []string{`mcp_servers.local.env_from[1]: "A" appears twice`}},
		{name: "env_from and env", yaml: `
mcp_servers:
  local: {command: ./s, env: {A: topsecret}, env_from: [A]}`, want: []string{`mcp_servers.local.env_from[0]: "A" is also set in env`}, secret: "topsecret"},
		{name: "header name", yaml: `
mcp_servers:
  remote: {url: "http://x/mcp", headers: {"Bad Header": v}}`, want: []string{`mcp_servers.remote.headers: "Bad Header"`}},
		{name: "header value with newline", yaml: `
mcp_servers:
  remote: {url: "http://x/mcp", headers: {X-Key: "topsecret\nX-Evil: 1"}}`, want: []string{"mcp_servers.remote.headers.X-Key: the value must be one line"}, secret: "topsecret"},
		{name: "headers_from_env variable", yaml: `
mcp_servers:
  remote: {url: "http://x/mcp", headers_from_env: {Authorization: "not a name"}}`, want: []string{"mcp_servers.remote.headers_from_env.Authorization"}},
		{name: "header set twice", yaml: `
mcp_servers:
  remote: {url: "http://x/mcp", headers: {Authorization: topsecret}, headers_from_env: {Authorization: TOKEN}}`, want: []string{"mcp_servers.remote.headers_from_env.Authorization: also set in headers"}, secret: "topsecret"},
		{name: "empty tool", yaml: `
mcp_servers:
  local: {command: ./s, tools: [a, ""]}`, want: []string{"mcp_servers.local.tools[1]: empty"}},
		{name: "tool twice", yaml: `
mcp_servers:
  local: {command: ./s, tools: [a, a]}`, want: []string{`mcp_servers.local.tools[1]: "a" appears twice`}},
		{name: "tool prefix", yaml: `
mcp_servers:
  local: {command: ./s, tool_prefix: "a.b"}`, want: []string{"mcp_servers.local.tool_prefix"}},
		{name: "override outside allowlist", yaml: `
mcp_servers:
  local: {command: ./s, tools: [a], tool_overrides: {b: {read_only: true}}}`, want: []string{"mcp_servers.local.tool_overrides.b: not in the tools allowlist"}},
		{name: "negative override timeout", yaml: `
mcp_servers:
  local: {command: ./s, tool_overrides: {a: {timeout: -1s}}}`, want: []string{"mcp_servers.local.tool_overrides.a.timeout"}},
		{name: "negative connect timeout", yaml: `
mcp_servers:
  local: {command: ./s, connect_timeout: -1s}`, want: []string{"mcp_servers.local.connect_timeout"}},
		{name: "unknown key", yaml: `
mcp_servers:
  local: {command: ./s, cmd: x}`, want: []string{"cmd"}},
		{name: "unknown override key", yaml: `
mcp_servers:
  local: {command: ./s, tool_overrides: {a: {readonly: true}}}`, want: []string{"readonly"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("config.yaml", []byte(base+tt.yaml))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Parse = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse = nil, want an error containing %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Parse error = %q, want it to contain %q", err, w)
				}
			}
			if tt.secret != "" && strings.Contains(err.Error(), tt.secret) {
				t.Errorf("Parse error = %q, reveals a value", err)
			}
		})
	}
}

func TestValidateModelTools(t *testing.T) {
	const servers = `
mcp_servers:
  files: {command: ./files, tools: [read, write]}
  search: {url: "http://x/mcp", tools: [query], tool_prefix: s_}
`
	tests := []struct {
		name string
		yaml string
		want string // "" means valid
	}{
		{name: "all tools", yaml: servers + `
models:
  sim: {provider: sim, model: m}`},
		{name: "a subset", yaml: servers + `
models:
  sim: {provider: sim, model: m, tools: [read, s_query]}`},
		{name: "unprefixed name", yaml: servers + `
models:
  sim: {provider: sim, model: m, tools: [query]}`, want: `models.sim.tools[0]: "query" is not in any mcp_servers tools allowlist`},
		{name: "unknown tool, allowlists complete", yaml: servers + `
models:
  sim: {provider: sim, model: m, tools: [read, delete]}`, want: `models.sim.tools[1]: "delete"`},
		{name: "unknown tool, a server without allowlist", yaml: `
mcp_servers:
  files: {command: ./files}
models:
  sim: {provider: sim, model: m, tools: [anything]}`},
		{name: "twice", yaml: servers + `
models:
  sim: {provider: sim, model: m, tools: [read, read]}`, want: `models.sim.tools[1]: "read" appears twice`},
		{name: "empty", yaml: servers + `
models:
  sim: {provider: sim, model: m, tools: [""]}`, want: "models.sim.tools[0]: empty"},
		{name: "no servers", yaml: `
models:
  sim: {provider: sim, model: m, tools: [read]}`, want: "models.sim.tools: no mcp_servers are configured"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("config.yaml", []byte("providers:\n  sim: {type: simulator}\n"+tt.yaml))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Parse = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Parse = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
