// Package guard is the connection guard below gRPC: it admits each
// connection within a per-peer cap ([Guard.Listener]), keeps at most
// MaxHandshakes handshakes under way from every peer together (the oldest
// of the peer with the most is closed for a newer connection), counts a
// handshake that handshake_timeout cut, and watches the HTTP/2 frames
// both ways, their headers only ([Guard.Credentials]): a request header
// gRPC refused for its size is counted and logged, and a connection whose
// client only opens and resets streams gets GOAWAY. It also writes each
// RPC's log line ([Guard.LogRPC]): an RPC that did no work is counted by
// code and its line sampled per peer, so that no peer can flood the log.
//
// It knows connections, frames and log lines, never a turn, a key or the
// contract: it must not import the generated code, the runtime or any
// other package of the module.
package guard
