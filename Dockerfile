# Builds a static turnstile binary and runs it on a minimal, non-root base.
#
#   docker build --build-arg VERSION=v1.2.3 -t turnstile:v1.2.3 .
#
# VERSION is stamped into the binary (turnstile version prints it); without
# it the binary says "(devel)".
#
# The configuration: `serve` reads the file TURNSTILE_CONFIG names, and the
# image sets TURNSTILE_CONFIG=/etc/turnstile/turnstile.yaml. The CMD passes
# no --config, so setting TURNSTILE_CONFIG (compose's environment, a
# Kubernetes env var) moves the file; an explicit --config in a command
# still wins over the variable. deploy/turnstile.yaml is such a file, with
# TLS and a client key (docs/security.md). Without a file the container
# exits with an error rather than serve plaintext to everyone who reaches
# the port. To try the simulator without TLS, publish the port on the
# host's loopback only and unset the variable:
#
#   docker run --rm -e TURNSTILE_CONFIG= -p 127.0.0.1:7700:7700 turnstile serve --listen 0.0.0.0:7700
#
# Base images are pinned by digest (multi-platform index digests), so a
# rebuild gets the same bases. To move them, look the tags up and replace
# both the tag and the digest:
#   crane digest golang:1.26-bookworm
#   crane digest gcr.io/distroless/static-debian12:nonroot
# golang: docker-library/repo-info, repos/golang/remote/1.26-bookworm.md
# (Go 1.26.5, 2026-07-14). distroless: no registry could be reached where
# this was written; the digest is the one several public Dockerfiles pinned
# for that tag in 2026-08 (not checked against gcr.io here): check it with
# crane before relying on it. deploy/deploy_test.go holds both to "tag@sha256".
FROM golang:1.26-bookworm@sha256:551752d3ad9de9923190bf5280500617ed8fee287ffb4b0220e770ef89346258 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=""
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags="-s -w -X main.version=${VERSION}" \
      -o /out/turnstile ./cmd/turnstile

FROM gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab
COPY --from=build /out/turnstile /usr/local/bin/turnstile
ENV TURNSTILE_CONFIG=/etc/turnstile/turnstile.yaml
# 7700: gRPC (server.listen). 9464: the ops listener (ops.listen: /healthz,
# /readyz, /metrics), plaintext, for probes and scrapes.
EXPOSE 7700 9464
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/turnstile"]
CMD ["serve"]
