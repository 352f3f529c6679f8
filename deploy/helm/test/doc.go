// Package test checks deploy/helm/turnstile without a cluster: helm lint
// and helm template for each values shape (ci/*-values.yaml), every
// rendered object decoded strictly into the k8s.io/api types, the
// rendered probes, ports, grace period and configuration held to the
// server's, and the values passed to the NATS chart held to its keys.
//
// It is a module of its own so that the service's module gains no
// Kubernetes or Helm dependency; it pins helm too (go tool helm). Run it
// from this directory: go test ./... (HELM_BIN names a built helm; without
// it the test builds one).
package test
