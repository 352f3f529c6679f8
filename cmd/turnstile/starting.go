package main

import (
	"crypto/tls"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// startingServer answers on the API's listener while the turn store opens
// (it waits for a NATS cluster that is still forming): health reports
// NOT_SERVING, and every other RPC fails UNAVAILABLE, which clients retry,
// instead of hanging on a port that accepts connections nobody serves.
// stop ends it and returns the listener the real server then serves on.
func startingServer(lis net.Listener, tlsCfg *tls.Config) (stop func() net.Listener) {
	h := newHandoff(lis)
	first := h.phase()
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	opts = append(opts, grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		return status.Error(codes.Unavailable, "the server is starting: its turn store is not ready yet")
	}))
	srv := grpc.NewServer(opts...)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus(turnstilev1.AgentService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(first)
	}()
	return func() net.Listener {
		srv.Stop()
		<-served
		next := h.phase()
		next.last = true
		return next
	}
}

// handoff accepts a listener's connections on one goroutine and hands
// them to one phase at a time: closing a phase (as a gRPC server's Stop
// does) leaves the listener open for the next.
type handoff struct {
	lis   net.Listener
	conns chan net.Conn
	quit  chan struct{} // closed by the last phase's Close
	err   error         // Accept's failure, once conns is closed
}

func newHandoff(lis net.Listener) *handoff {
	h := &handoff{lis: lis, conns: make(chan net.Conn), quit: make(chan struct{})}
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				h.err = err
				close(h.conns)
				return
			}
			select {
			case h.conns <- c:
			case <-h.quit:
				c.Close()
				return
			}
		}
	}()
	return h
}

// phase returns a listener of h's connections until it is closed; the
// last phase's Close closes the listener.
func (h *handoff) phase() *phase { return &phase{h: h, done: make(chan struct{})} }

type phase struct {
	h    *handoff
	done chan struct{}
	once sync.Once
	last bool // Close closes the listener too
}

func (p *phase) Accept() (net.Conn, error) {
	select {
	case c, ok := <-p.h.conns:
		if !ok {
			return nil, p.h.err
		}
		return c, nil
	case <-p.done:
		return nil, net.ErrClosed
	}
}

// Close ends this phase; the listener underneath stays open for the next
// one, unless this is the last.
func (p *phase) Close() error {
	var err error
	p.once.Do(func() {
		close(p.done)
		if p.last {
			close(p.h.quit)
			err = p.h.lis.Close()
		}
	})
	return err
}

func (p *phase) Addr() net.Addr { return p.h.lis.Addr() }
