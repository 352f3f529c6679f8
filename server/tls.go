package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// TLSFiles names the PEM files of the server's TLS set-up. The yaml names
// are the configuration file's keys (its server.tls block).
type TLSFiles struct {
	// CertFile holds the server's certificate chain.
	CertFile string `yaml:"cert_file"`
	// KeyFile holds the certificate's private key.
	KeyFile string `yaml:"key_file"`
	// ClientCAFile, when set, holds the certificates of the authorities
	// that sign client certificates: every client must then present a
	// certificate one of them signed (mutual TLS).
	ClientCAFile string `yaml:"client_ca_file"`
}

// Problems lists what is missing; none when f is complete.
func (f TLSFiles) Problems() []llm.Problem {
	var out []llm.Problem
	if f.CertFile == "" {
		out = append(out, llm.Problem{Field: "cert_file", Message: "required: the PEM file of the server's certificate chain"})
	}
	if f.KeyFile == "" {
		out = append(out, llm.Problem{Field: "key_file", Message: "required: the PEM file of the certificate's private key"})
	}
	return out
}

// tlsRecheck is how often, at most, the files are looked at again.
const tlsRecheck = time.Second

// LoadTLS reads files and returns the server's TLS configuration: TLS 1.2
// or later, the certificate, and with ClientCAFile, client certificates
// required and verified. New connections see the files as they are: when
// one changes (its modification time or size; looked at no more than once
// a second), they are read again, so certificates rotate without a
// restart. A change that does not load (a key that does not match its
// certificate yet, a file half written) is logged and the previous
// certificates stay in use until the files load again.
func LoadTLS(files TLSFiles, logger *slog.Logger) (*tls.Config, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &tlsReloader{files: files, logger: logger}
	stamp := r.stamp()
	cfg, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cfg, r.stamped, r.checked = cfg, stamp, time.Now()
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: r.configForClient}, nil
}

// tlsReloader keeps the configuration of the files as they last loaded.
type tlsReloader struct {
	files  TLSFiles
	logger *slog.Logger

	mu      sync.Mutex
	cfg     *tls.Config
	stamped string // the files' stamp when cfg loaded, or last failed
	checked time.Time
}

func (r *tlsReloader) configForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) < tlsRecheck {
		return r.cfg, nil
	}
	r.checked = time.Now()
	if s := r.stamp(); s != r.stamped {
		r.stamped = s
		if cfg, err := r.load(); err != nil {
			r.logger.Error("TLS files changed but do not load; the previous certificate stays in use", "error", err)
		} else {
			r.cfg = cfg
			r.logger.Info("TLS files reloaded", "cert_file", r.files.CertFile)
		}
	}
	return r.cfg, nil
}

// stamp sums up the files' modification times and sizes.
func (r *tlsReloader) stamp() string {
	var s string
	for _, name := range []string{r.files.CertFile, r.files.KeyFile, r.files.ClientCAFile} {
		if name == "" {
			continue
		}
		if fi, err := os.Stat(name); err == nil {
			s += fmt.Sprintf("%d/%d;", fi.ModTime().UnixNano(), fi.Size())
		} else {
			s += "missing;"
		}
	}
	return s
}

// load reads the files into a configuration for one handshake.
func (r *tlsReloader) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(r.files.CertFile, r.files.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("server.tls: %w", err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		// gRPC runs over HTTP/2, negotiated with ALPN.
		NextProtos: []string{"h2"},
	}
	if r.files.ClientCAFile != "" {
		pem, err := os.ReadFile(r.files.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("server.tls.client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("server.tls.client_ca_file: no PEM certificate in it")
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
