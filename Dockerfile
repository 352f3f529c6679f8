# Builds a static turnstile binary and runs it on no base image at all:
# the binary, Debian's CA certificates and a non-root user, the same files
# deploy/image lays out without a container engine (CI builds and checks
# that image; this file is for Docker users).
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
# One base image, for the build only, pinned by its multi-platform index
# digest, so a rebuild gets the same toolchain. Verified: docker-library's
# repo-info lists this digest for golang:1.26-bookworm (repos/golang/remote/
# 1.26-bookworm.md, commit 21d295b5, Go 1.26.5, 2026-07-14), and its
# Debian layers install ca-certificates, whose bundle the final stage
# copies. To move it, look the tag up and replace both:
#   crane digest golang:1.26-bookworm
# The final stage is FROM scratch: no base whose digest needs trusting.
# cmd/turnstile's image_test.go holds this file to the build and the
# server, and deploy/image's test holds its final stage to that image.
FROM golang:1.26-bookworm@sha256:551752d3ad9de9923190bf5280500617ed8fee287ffb4b0220e770ef89346258 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=""
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags="-s -w -X main.version=${VERSION}" -o /out/turnstile ./cmd/turnstile
# The files beside the binary: the CA bundle, root and nonroot (65532)
# with a home of its own, /tmp.
RUN mkdir -p /out/rootfs/etc/ssl/certs /out/rootfs/etc/turnstile /out/rootfs/home /out/rootfs/root /out/rootfs/tmp /out/home/nonroot && \
    cp /etc/ssl/certs/ca-certificates.crt /out/rootfs/etc/ssl/certs/ca-certificates.crt && \
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >/out/rootfs/etc/passwd && \
    printf 'root:x:0:\nnonroot:x:65532:\n' >/out/rootfs/etc/group && \
    chmod 700 /out/home/nonroot /out/rootfs/root && chmod 1777 /out/rootfs/tmp

FROM scratch
COPY --from=build /out/rootfs/ /
COPY --from=build --chown=65532:65532 /out/home/nonroot /home/nonroot
COPY --from=build /out/turnstile /usr/local/bin/turnstile
ENV PATH=/usr/local/bin:/usr/bin:/bin
ENV TURNSTILE_CONFIG=/etc/turnstile/turnstile.yaml
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
# 7700: gRPC (listen). 9464: the ops listener (ops.listen: /healthz,
# /readyz, /metrics), plaintext, for probes and scrapes.
EXPOSE 7700 9464
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/turnstile"]
CMD ["serve"]
