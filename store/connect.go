package store

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// connect connects to the cluster of mode nats. A cluster that nothing
// answers at yet (its servers start with this replica, as a new install
// does) is tried again, within the set-up's bound (see [setUpBound]);
// any other failure (credentials, TLS) is reported at once.
func connect(ctx context.Context, n NATS, t setUpTries) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("turnstile"), nats.MaxReconnects(-1),
		// A server that died is left for another at once: the cluster
		// elects new stream leaders meanwhile, and appends resume on the
		// first server that answers.
		nats.ReconnectWait(reconnectWait), nats.ReconnectJitter(reconnectJitter, reconnectJitter),
		nats.Timeout(connectTimeout),
	}
	if n.Credentials != "" {
		opts = append(opts, nats.UserCredentials(n.Credentials))
	}
	if n.CAFile != "" {
		opts = append(opts, nats.RootCAs(n.CAFile))
	}
	if n.CertFile != "" {
		opts = append(opts, nats.ClientCert(n.CertFile, n.KeyFile))
	}
	var nc *nats.Conn
	err := retrySetUp(ctx, t, "a NATS server of store.nats.url to answer", func(context.Context) (err error) {
		nc, err = nats.Connect(n.URL, opts...)
		return err
	})
	if err != nil {
		return nil, connectError(err, n)
	}
	return nc, nil
}

// The NATS client's timing in mode nats: how long a connection attempt
// waits, and the pause before the next server is tried once the one this
// replica was connected to went away.
const (
	connectTimeout  = 2 * time.Second
	reconnectWait   = 100 * time.Millisecond
	reconnectJitter = 100 * time.Millisecond
)

// connectError explains why connecting to NATS failed, naming the keys to
// check. The URL may hold credentials (a user and password, a token): it
// is never printed, and any of them the error repeats is redacted.
func connectError(err error, n NATS) error {
	var what string
	msg := strings.ToLower(err.Error())
	switch {
	case errors.Is(err, nats.ErrAuthorization) || strings.Contains(msg, "authorization violation"):
		what = "NATS refused this replica's credentials (the user and password or token of store.nats.url, or store.nats.credentials)"
	case strings.Contains(msg, "error loading"), errors.Is(err, os.ErrNotExist), errors.Is(err, os.ErrPermission):
		what = "a file of store.nats (ca_file, cert_file, key_file, credentials) cannot be read"
	case strings.Contains(msg, "tls"), strings.Contains(msg, "x509"), strings.Contains(msg, "certificate"):
		what = "TLS with NATS failed (store.nats.ca_file must hold the CA of the servers' certificates"
		if n.CertFile == "" {
			what += "; a server that asks for a client certificate needs store.nats.cert_file and key_file)"
		} else {
			what += ", and store.nats.cert_file and key_file a certificate the servers accept)"
		}
	case strings.Contains(msg, "credentials") || strings.Contains(msg, "nkey") || strings.Contains(msg, "jwt"):
		what = "the credentials file (store.nats.credentials) cannot be used"
	default:
		what = "cannot connect to NATS (store.nats.url)"
	}
	return &redactedError{msg: "store: " + what + ": " + redact(err.Error(), n.URL), err: err}
}

// redact returns msg with every credential the URLs of list hold replaced.
func redact(msg, list string) string {
	for _, u := range strings.Split(list, ",") {
		p, err := parseNATSURL(u)
		if err != nil || p.User == nil {
			continue
		}
		secrets := []string{p.User.Username()}
		if pw, ok := p.User.Password(); ok {
			secrets = append(secrets, pw)
		}
		for _, sec := range secrets {
			if sec != "" {
				msg = strings.ReplaceAll(msg, sec, "[redacted]")
			}
		}
	}
	return msg
}

// parseNATSURL parses one server of store.nats.url as the NATS client
// does: a URL, nats:// when it has no scheme.
func parseNATSURL(u string) (*url.URL, error) {
	u = strings.TrimSpace(u)
	if !strings.Contains(u, "://") {
		u = "nats://" + u
	}
	return url.Parse(u)
}

// redactedError is an error whose message had its secrets removed.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
