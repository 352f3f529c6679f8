# Builds a static turnstile binary and runs it on a minimal, non-root base.
#
# By default the image serves /etc/turnstile/turnstile.yaml, which the
# operator mounts: deploy/turnstile.yaml is one, with TLS and a client key
# (README, Security). Without it the container exits with an error rather
# than serve plaintext to everyone who reaches the port. To try the
# simulator without TLS, publish the port on the host's loopback only:
#
#   docker run --rm -p 127.0.0.1:7700:7700 turnstile serve --listen 0.0.0.0:7700
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/turnstile ./cmd/turnstile

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/turnstile /usr/local/bin/turnstile
EXPOSE 7700
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/turnstile"]
CMD ["serve", "--config", "/etc/turnstile/turnstile.yaml"]
