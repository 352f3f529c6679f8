# Builds a static turnstile binary and runs it on a minimal, non-root base.
# With no config file it serves the embedded simulator; mount a config and
# pass --config (or set TURNSTILE_CONFIG) to serve real providers.
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
# Listen on all interfaces inside the container; the default is loopback.
ENTRYPOINT ["/usr/local/bin/turnstile", "serve", "--listen", "0.0.0.0:7700"]
