{{- define "turnstile.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "turnstile.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "turnstile.selectorLabels" -}}
app.kubernetes.io/name: {{ include "turnstile.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "turnstile.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "turnstile.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "turnstile.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "turnstile.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "turnstile.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The NATS URL: store.nats.url, required with store.mode nats. */}}
{{- define "turnstile.natsURL" -}}
{{- required "store.mode nats needs store.nats.url: the NATS cluster's URL(s), e.g. nats://nats:4222 for the NATS chart's release \"nats\" in this namespace" .Values.store.nats.url }}
{{- end }}

{{/* "true" when the release serves the simulator (simulator, and config.models). */}}
{{- define "turnstile.servesSimulator" -}}
{{- or (eq .Values.simulator "on") (and (eq .Values.simulator "auto") (empty .Values.config.models)) }}
{{- end }}

{{/* The variable holding the test's client key token: helmTest.tokenEnv, or the token_env of auth.keys' first key that has one; empty without keys. */}}
{{- define "turnstile.testTokenEnv" -}}
{{- $env := .Values.helmTest.tokenEnv }}
{{- $keys := dig "auth" "keys" list .Values.config }}
{{- if not $env }}
{{- range $keys }}
{{- if and (not $env) (kindIs "map" .) .token_env }}
{{- $env = .token_env }}
{{- end }}
{{- end }}
{{- if and $keys (not $env) }}
{{- fail "helmTest.tokenEnv: the server asks for a client key and no key in config.auth.keys names its token_env: name the variable of secretEnv that holds a token, or set helmTest.enabled false" }}
{{- end }}
{{- end }}
{{- $env }}
{{- end }}

{{/* The envFrom entries of secretEnv. */}}
{{- define "turnstile.envFrom" -}}
{{- range .Values.secretEnv.existingSecrets }}
- secretRef: {name: {{ . }}}
{{- end }}
{{- if .Values.secretEnv.values }}
- secretRef: {name: {{ include "turnstile.fullname" . }}-env}
{{- end }}
{{- end }}

{{/* The gRPC port's appProtocol: tls when the server speaks TLS itself, grpc (plaintext HTTP/2) otherwise. */}}
{{- define "turnstile.grpcAppProtocol" -}}
{{- ternary "tls" "grpc" (not (empty .Values.tls.secretName)) }}
{{- end }}

{{/* terminationGracePeriodSeconds: drain, grace, the server's 5s bound on handing turns off, and a margin. */}}
{{- define "turnstile.terminationGrace" -}}
{{- add .Values.server.drainDelaySeconds .Values.server.shutdownGraceSeconds 5 .Values.server.terminationMarginSeconds }}
{{- end }}

{{/* The keys of config that the chart sets from its own values, and the value that sets each. */}}
{{- define "turnstile.chartKeys" -}}
listen: ports.grpc
ops.listen: ports.ops
server.drain_delay: server.drainDelaySeconds
server.shutdown_grace: server.shutdownGraceSeconds
server.tls: tls.secretName
store.mode: store.mode
store.dir: store.mode (embedded, on the store volume)
store.nats.url: store.nats.url
store.nats.credentials: store.nats.credentialsSecret
store.nats.ca_file: store.nats.tlsSecret
store.nats.cert_file: store.nats.tlsSecret.clientCert
store.nats.key_file: store.nats.tlsSecret.clientCert
{{- end }}

{{/* The server's configuration: config, the simulator when it is asked
for, and what the chart sets from its own values. config replaces the
chart's defaults rather than merging with an example: the chart's own
values.yaml names no provider and no model. */}}
{{- define "turnstile.config" -}}
{{- $problems := list }}
{{- range $path, $value := include "turnstile.chartKeys" . | fromYaml }}
{{- $v := $.Values.config }}
{{- $found := true }}
{{- range splitList "." $path }}
{{- if and $found (kindIs "map" $v) (hasKey $v .) }}
{{- $v = index $v . }}
{{- else }}
{{- $found = false }}
{{- end }}
{{- end }}
{{- if $found }}
{{- $problems = append $problems (printf "config.%s is the chart's: set %s" $path $value) }}
{{- end }}
{{- end }}
{{- $user := deepCopy .Values.config }}
{{- $sim := eq (include "turnstile.servesSimulator" .) "true" }}
{{- if $sim }}
{{- if or (hasKey (default dict $user.providers) "sim") (hasKey (default dict $user.models) "sim") }}
{{- $problems = append $problems "config.providers.sim or config.models.sim: the simulator's names; set simulator: off to use them for your own" }}
{{- end }}
{{- $_ := set $user "providers" (merge (default dict $user.providers) (dict "sim" (dict "type" "simulator"))) }}
{{- $_ := set $user "models" (merge (default dict $user.models) (dict "sim" (dict "provider" "sim" "model" "turnstile-sim-1" "context_window" 32000))) }}
{{- else if empty $user.models }}
{{- $problems = append $problems "config.models is empty and simulator is off: name your models (docs/configuration.md), or set simulator: on to serve the simulator" }}
{{- end }}
{{- if $problems }}
{{- fail (printf "\n%s" (join "\n" $problems)) }}
{{- end }}
{{- $c := dict
  "listen" (printf "0.0.0.0:%d" (int .Values.ports.grpc))
  "ops" (dict "listen" (printf "0.0.0.0:%d" (int .Values.ports.ops)))
  "server" (dict
    "drain_delay" (printf "%ds" (int .Values.server.drainDelaySeconds))
    "shutdown_grace" (printf "%ds" (int .Values.server.shutdownGraceSeconds)))
-}}
{{- if .Values.tls.secretName }}
{{- $tls := dict "cert_file" "/etc/turnstile/tls/tls.crt" "key_file" "/etc/turnstile/tls/tls.key" }}
{{- if .Values.tls.clientCASecret.name }}
{{- $_ := set $tls "client_ca_file" (printf "/etc/turnstile/client-ca/%s" .Values.tls.clientCASecret.key) }}
{{- end }}
{{- $_ := set $c.server "tls" $tls }}
{{- end }}
{{- if eq .Values.store.mode "embedded" }}
{{- $_ := set $c "store" (dict "mode" "embedded" "dir" "/var/lib/turnstile/jetstream") }}
{{- else if eq .Values.store.mode "nats" }}
{{- $n := dict "url" (include "turnstile.natsURL" .) }}
{{- if .Values.store.nats.credentialsSecret.name }}
{{- $_ := set $n "credentials" (printf "/etc/turnstile/nats-creds/%s" .Values.store.nats.credentialsSecret.key) }}
{{- end }}
{{- if .Values.store.nats.tlsSecret.name }}
{{- $_ := set $n "ca_file" "/etc/turnstile/nats-tls/ca.crt" }}
{{- if .Values.store.nats.tlsSecret.clientCert }}
{{- $_ := set $n "cert_file" "/etc/turnstile/nats-tls/tls.crt" }}
{{- $_ := set $n "key_file" "/etc/turnstile/nats-tls/tls.key" }}
{{- end }}
{{- end }}
{{- $_ := set $c "store" (dict "mode" "nats" "nats" $n) }}
{{- else }}
{{- fail (printf "store.mode %q: embedded or nats" .Values.store.mode) }}
{{- end }}
{{- toYaml (mustMergeOverwrite $user $c) }}
{{- end }}
