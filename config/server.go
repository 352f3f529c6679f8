package config

import (
	"time"

	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// Server tunes the gRPC server.
type Server struct {
	// ShutdownGrace is how long running turns may finish after SIGTERM
	// (and DrainDelay) before they are handed off or cancelled with a
	// retryable error (default 15s; positive).
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	// DrainDelay is how long health reports NOT_SERVING before the server
	// stops accepting turns, so load balancers notice (default 5s).
	DrainDelay time.Duration `yaml:"drain_delay"`
	// KeepaliveTime is the server's ping interval on idle connections
	// (default 30s; positive).
	KeepaliveTime time.Duration `yaml:"keepalive_time"`
	// MaxConcurrentStreams bounds the streams of one connection (default
	// 256; at least 1).
	MaxConcurrentStreams uint32 `yaml:"max_concurrent_streams"`

	// TLS, when set, serves over TLS from these files; without it the
	// server speaks plaintext.
	TLS *server.TLSFiles `yaml:"tls"`
	// Reflection serves the gRPC reflection service (default true). With
	// auth keys, reflection needs a key too.
	Reflection bool `yaml:"reflection"`

	// MaxConcurrentTurns bounds the turns running at once (default 512;
	// at least 1).
	MaxConcurrentTurns int `yaml:"max_concurrent_turns"`
	// MemoryLimit bounds the turns the server starts by its memory, in
	// bytes: past 60% of it, a new turn of a client key that runs at
	// least its share of the running turns (their number over the keys
	// that run any) is refused with a retryable RESOURCE_EXHAUSTED
	// (LIMIT_EXCEEDED, limit memory_limit); past 85%, every new turn is.
	// The memory counted is the live heap and what the Go runtime holds
	// beside it, and at least 1 MiB a running turn, with the turn store
	// on or off. A turn refused while the memory held is past 85% first
	// ends, with the store on, the turns nobody reads of the key that
	// runs the most (a stored retryable UNAVAILABLE). Past 85%, the
	// replica takes over no turn of a replica that went away either:
	// another replica does, or the turn's first watcher ends it with a
	// stored retryable UNAVAILABLE. Default: the Go
	// runtime's memory limit (GOMEMLIMIT, which serve sets to 90% of a
	// container's cgroup memory.max), none without one; 0: no bound.
	MemoryLimit *int64 `yaml:"memory_limit"`
	// MaxConnections bounds the connections open at once (default 1024;
	// at least 1).
	MaxConnections int `yaml:"max_connections"`
	// MaxConnectionsPerPeer bounds the connections open at once from one
	// IP address; more are closed at once (default 64, or
	// max_connections when that is smaller; at least 1, at most
	// max_connections).
	MaxConnectionsPerPeer int `yaml:"max_connections_per_peer"`
	// MaxHandshakes bounds the connections whose TLS and HTTP/2
	// handshakes are under way at once, from every address together; one
	// beyond it closes the oldest handshake of the address with the most
	// under way, so silent connections from many addresses cannot hold
	// the slots of max_connections (default 256, or a quarter of
	// max_connections when that is smaller; at least 1, at most
	// max_connections).
	MaxHandshakes int `yaml:"max_handshakes"`
	// MaxConnectionIdle closes a connection without RPCs for this long
	// (default 5m; positive).
	MaxConnectionIdle time.Duration `yaml:"max_connection_idle"`
	// MaxConnectionAge closes connections this old gracefully (default
	// 30m; 0: never).
	MaxConnectionAge time.Duration `yaml:"max_connection_age"`
	// MaxConnectionAgeGrace is how long RPCs may go on on a connection
	// closed for its age (default 0: until they end; else at least
	// turn.max_duration).
	MaxConnectionAgeGrace time.Duration `yaml:"max_connection_age_grace"`
	// HandshakeTimeout closes a connection that has not completed its TLS
	// and HTTP/2 handshake in this time (default 10s; positive).
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
	// MaxHeaderBytes bounds a request's header list (default 32 KiB; at
	// least 1 KiB, at most 16 MiB).
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxRequestBytes bounds a request (default 4 MiB; at least 1 KiB;
	// with the turn store on, at most 8323072, what one store record
	// holds of a request).
	MaxRequestBytes int `yaml:"max_request_bytes"`
	// MaxMediaBytes bounds one media part of a request, its data or URI
	// (default 5 MiB; at least 1 KiB, at most max_request_media_bytes).
	// Media travel in the request: max_request_bytes binds first.
	MaxMediaBytes int `yaml:"max_media_bytes"`
	// MaxRequestMediaBytes bounds the media of one request, all parts
	// together (default 16 MiB; at least 1 KiB).
	MaxRequestMediaBytes int `yaml:"max_request_media_bytes"`
	// RefusedMediaHosts lists the hosts and networks a request's media
	// URIs may not name: the provider fetches a URI, from its network or,
	// for a model server run by the operator, from the operator's, so a
	// client could make it reach what the client cannot. Each entry is
	// loopback (127.0.0.0/8, ::1, localhost and its subdomains), private
	// (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10,
	// fc00::/7), link_local (169.254.0.0/16, where clouds serve instance
	// metadata, and fe80::/10), unspecified (0.0.0.0/8, ::), a network
	// (10.1.0.0/16), an IP address, a host name (matched exactly) or
	// *.DOMAIN (its subdomains). Nothing is resolved: a host name is
	// matched by name, so list internal domains by name; an IP address in
	// any form a URL parser reads (127.1, 2130706433, an IPv4-mapped, NAT64
	// or 6to4 IPv6 address) by network. Default: loopback, private,
	// link_local and unspecified; [] refuses none.
	RefusedMediaHosts []string `yaml:"refused_media_hosts"`
	// MaxEventBytes bounds every event sent (default 2 MiB; at least
	// turn.max_tool_result_bytes + 64 KiB, so a step's tool results fit
	// one event; with the turn store on, at most 8323072, what one store
	// record holds of an event).
	MaxEventBytes int `yaml:"max_event_bytes"`
	// SendTimeout cancels a turn whose client accepted no event for this
	// long (default 30s; positive).
	SendTimeout time.Duration `yaml:"send_timeout"`
	// MaxRunningTurns bounds the turns the server runs at once with a
	// store, those whose clients left included (default 1024; at least 1).
	MaxRunningTurns int `yaml:"max_running_turns"`
}

// defaultServer returns the server block's defaults.
func defaultServer() Server {
	return Server{
		ShutdownGrace: DefaultShutdownGrace, DrainDelay: DefaultDrainDelay, MaxConnectionAge: DefaultMaxConnectionAge,
		KeepaliveTime: 30 * time.Second, MaxConcurrentStreams: 256,
		Reflection:            true,
		MaxConcurrentTurns:    server.DefaultMaxConcurrentTurns,
		MaxConnections:        server.DefaultMaxConnections,
		MaxConnectionsPerPeer: server.DefaultMaxConnsPerPeer,
		MaxHandshakes:         server.DefaultMaxHandshakes,
		MaxHeaderBytes:        server.DefaultMaxHeaderBytes,
		MaxConnectionIdle:     server.DefaultMaxConnectionIdle,
		HandshakeTimeout:      server.DefaultHandshakeTimeout,
		MaxRequestBytes:       server.DefaultMaxRequestBytes,
		MaxEventBytes:         server.DefaultMaxEventBytes,
		MaxMediaBytes:         server.DefaultMaxMediaBytes,
		MaxRequestMediaBytes:  server.DefaultMaxRequestMediaBytes,
		RefusedMediaHosts:     runtime.DefaultRefusedMediaHosts(),
		SendTimeout:           server.DefaultSendTimeout,
		MaxRunningTurns:       1024,
	}
}
