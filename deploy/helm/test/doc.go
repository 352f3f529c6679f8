// Package test checks deploy/helm/turnstile without a cluster: helm lint
// and helm template for each values shape (ci/*-values.yaml) from a copy
// of the chart with no network, every rendered object decoded strictly
// into the k8s.io/api types, the rendered probes, ports, grace period and
// configuration held to the server's, the values for the NATS chart held
// to its keys, NOTES.txt rendered for each shape, and the helm test hook
// run against a real server serving the rendered configuration.
//
// It is a module of its own so that the service's module gains no
// Kubernetes or Helm dependency; it pins helm too (go tool helm). Run it
// from this directory: go test ./... (HELM_BIN names a built helm, and
// TURNSTILE_BIN a built turnstile; without them the test builds them).
//go:generate go run ./cmd/chartgen

package test
