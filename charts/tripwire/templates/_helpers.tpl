{{/*
Names and labels.
*/}}
{{- define "tripwire.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tripwire.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tripwire.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tripwire.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tripwire.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tripwire.labels" -}}
helm.sh/chart: {{ include "tripwire.chart" . }}
{{ include "tripwire.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tripwire.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Where things are.
*/}}
{{- define "tripwire.configMapName" -}}
{{- printf "%s-config" (include "tripwire.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tripwire.adminSecretName" -}}
{{- if .Values.admin.token.existingSecret }}
{{- .Values.admin.token.existingSecret }}
{{- else }}
{{- printf "%s-admin" (include "tripwire.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "tripwire.adminSecretKey" -}}
{{- if .Values.admin.token.existingSecret }}{{ .Values.admin.token.existingSecretKey }}{{ else }}token{{ end }}
{{- end }}

{{- define "tripwire.claimName" -}}
{{- default (printf "%s-data" (include "tripwire.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}

{{/*
The proxy listener's host: 127.0.0.1 as a sidecar (the agent shares the pod's network), the pod
network standalone. Call with (dict "root" $ "sidecar" true|false).
*/}}
{{- define "tripwire.proxyHost" -}}
{{- if .root.Values.proxy.bindHost }}{{ .root.Values.proxy.bindHost }}{{ else if .sidecar }}127.0.0.1{{ else }}0.0.0.0{{ end }}
{{- end }}

{{/*
The env var that carries an upstream's API key: TRIPWIRE_APIKEY_DEFAULT, TRIPWIRE_APIKEY_LLM_<NAME>,
TRIPWIRE_APIKEY_MCP_<NAME>. Call with (list "llm" "name").
*/}}
{{- define "tripwire.keyEnvName" -}}
{{- $kind := index . 0 }}{{- $name := index . 1 }}
{{- if eq $kind "default" }}TRIPWIRE_APIKEY_DEFAULT{{ else }}{{ printf "TRIPWIRE_APIKEY_%s_%s" $kind $name | upper | replace "-" "_" | replace "." "_" }}{{ end }}
{{- end }}

{{/*
The chart-created Secret of upstream keys given inline (an upstream's `apiKey`).
*/}}
{{- define "tripwire.upstreamKeysSecretName" -}}
{{- printf "%s-upstream-keys" (include "tripwire.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Where an upstream's key comes from, as JSON {"name", "key"} of a Secret, or {} for none: its
apiKeySecret (an existing Secret), else its inline apiKey (the chart's upstream-keys Secret, under
KIND-NAME). Call with (list root kind name spec).
*/}}
{{- define "tripwire.upstreamKeyRef" -}}
{{- $root := index . 0 }}{{- $kind := index . 1 }}{{- $name := index . 2 }}{{- $spec := index . 3 }}
{{- if and $spec.apiKeySecret $spec.apiKeySecret.name }}
{{- toJson (dict "name" $spec.apiKeySecret.name "key" (default "api-key" $spec.apiKeySecret.key)) }}
{{- else if and $spec.apiKey (ne $spec.apiKey "none") }}
{{- toJson (dict "name" (include "tripwire.upstreamKeysSecretName" $root) "key" (include "tripwire.upstreamKeyName" (list $kind $name))) }}
{{- else }}{}{{- end }}
{{- end }}

{{/*
The key of an inline upstream key in the chart's upstream-keys Secret. Call with (list kind name).
*/}}
{{- define "tripwire.upstreamKeyName" -}}
{{- if eq (index . 0) "default" }}default{{ else }}{{ printf "%s-%s" (index . 0) (index . 1) }}{{ end }}
{{- end }}

{{/*
One upstream as Tripwire's config shape (url, auth_header, api_key_env, api_key: none). Call with
(list root kind name spec).
*/}}
{{- define "tripwire.upstreamConfig" -}}
{{- $root := index . 0 }}{{- $kind := index . 1 }}{{- $name := index . 2 }}{{- $spec := index . 3 }}
{{- $out := dict "url" $spec.url }}
{{- if $spec.authHeader }}{{- $_ := set $out "auth_header" $spec.authHeader }}{{- end }}
{{- if (include "tripwire.upstreamKeyRef" (list $root $kind $name $spec) | fromJson) }}
{{- $_ := set $out "api_key_env" (include "tripwire.keyEnvName" (list $kind $name)) }}
{{- else if eq (default "" $spec.apiKey) "none" }}
{{- $_ := set $out "api_key" "none" }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The env entries that carry the upstreams' keys into the container. Call with the root context.
*/}}
{{- define "tripwire.upstreamKeyEnv" -}}
{{- $root := . }}
{{- $all := list }}
{{- if .Values.upstream.url }}{{- $all = append $all (list "default" "" .Values.upstream) }}{{- end }}
{{- range $kind := list "llm" "mcp" }}
{{- range $name, $spec := (index $root.Values $kind) }}{{- $all = append $all (list $kind $name $spec) }}{{- end }}
{{- end }}
{{- range $entry := $all }}
{{- $ref := include "tripwire.upstreamKeyRef" (list $root (index $entry 0) (index $entry 1) (index $entry 2)) | fromJson }}
{{- if $ref }}
- name: {{ include "tripwire.keyEnvName" (list (index $entry 0) (index $entry 1)) }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.name }}
      key: {{ $ref.key }}
{{- end }}
{{- end }}
{{- end }}

{{/*
config.yaml: the `config` value with the chart's upstream sections on top.
*/}}
{{- define "tripwire.configYaml" -}}
{{- $cfg := deepCopy (default dict .Values.config) }}
{{- if .Values.upstream.url }}
{{- $_ := set $cfg "upstream" (include "tripwire.upstreamConfig" (list $ "default" "" .Values.upstream) | fromJson) }}
{{- end }}
{{- range $kind := list "llm" "mcp" }}
{{- $section := index $.Values $kind }}
{{- if $section }}
{{- $named := dict }}
{{- range $name, $spec := $section }}
{{- $_ := set $named $name (include "tripwire.upstreamConfig" (list $ $kind $name $spec) | fromJson) }}
{{- end }}
{{- $_ := set $cfg $kind $named }}
{{- end }}
{{- end }}
{{- if include "tripwire.sharedState" . }}
{{- $state := dict "on_unavailable" .Values.state.onUnavailable }}
{{- if and .Values.state.url (not .Values.state.urlSecret.name) }}
{{- $_ := set $state "url" .Values.state.url }}
{{- end }}
{{- $_ := set $cfg "state" $state }}
{{- end }}
{{- if .Values.otlp.endpoint }}
{{- $_ := set $cfg "otlp" (dict "endpoint" .Values.otlp.endpoint) }}
{{- end }}
{{- if .Values.auth.requireAgentKey }}
{{- $_ := set $cfg "auth" (dict "require_agent_key" true) }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
"true" when guard state is shared through Redis (state.url or state.urlSecret), else empty.
*/}}
{{- define "tripwire.sharedState" -}}
{{- if or .Values.state.url .Values.state.urlSecret.name }}true{{ end }}
{{- end }}

{{/*
Values that cannot work together, refused at render time with the fix.
*/}}
{{- define "tripwire.validate" -}}
{{- if .Values.auth.requireAgentKey }}
{{- $root := . }}
{{- $missing := list }}
{{- if and .Values.upstream.url (not (include "tripwire.upstreamKeyRef" (list $root "default" "" .Values.upstream) | fromJson)) (ne (default "" .Values.upstream.apiKey) "none") }}
{{- $missing = append $missing "upstream" }}
{{- end }}
{{- range $kind := list "llm" "mcp" }}
{{- range $name, $spec := (index $root.Values $kind) }}
{{- if and (not (include "tripwire.upstreamKeyRef" (list $root $kind $name $spec) | fromJson)) (ne (default "" $spec.apiKey) "none") }}
{{- $missing = append $missing (printf "%s.%s" $kind $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $missing }}
{{- fail (printf "auth.requireAgentKey: the agent's key is never forwarded, so every upstream needs its own key (apiKeySecret, or apiKey) or apiKey: none; missing for %s (docs/gateway.md)" (join ", " $missing)) }}
{{- end }}
{{- end }}
{{- if and (eq .Values.mode "standalone") (gt (int .Values.replicas) 1) }}
{{- if not (include "tripwire.sharedState" .) }}
{{- fail (printf "replicas: %v replicas need shared guard state: set state.url or state.urlSecret (a Redis), or each replica guards only the calls it sees (docs/scaling.md)" .Values.replicas) }}
{{- end }}
{{- if .Values.persistence.enabled }}
{{- fail "replicas: each replica keeps its own data dir, and persistence gives them one volume: disable persistence with replicas > 1 and export traces with otlp.endpoint (docs/scaling.md)" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Pod annotations for a pod that runs Tripwire: Prometheus scrape hints and a config checksum (a config
change rolls the pods). Include it in your own Deployment's pod template in sidecar mode.
*/}}
{{- define "tripwire.podAnnotations" -}}
checksum/tripwire-config: {{ include "tripwire.configYaml" . | sha256sum }}
{{- if .Values.metrics.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.admin.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/*
The Tripwire container. Call with (dict "root" $ "sidecar" true|false).
*/}}
{{- define "tripwire.containerSpec" -}}
{{- $root := .root }}
{{- $v := $root.Values -}}
- name: tripwire
  image: {{ include "tripwire.image" $root | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if and .sidecar $v.sidecar.native }}
  restartPolicy: Always
  {{- end }}
  args:
    - serve
    - --listen
    - {{ printf "%s:%v" (include "tripwire.proxyHost" .) $v.proxy.port | quote }}
    - --admin-listen
    - {{ printf "%s:%v" $v.admin.bindHost $v.admin.port | quote }}
    - --config
    - /etc/tripwire/config.yaml
    {{- range $v.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - name: TRIPWIRE_DATA_DIR
      value: /data
    - name: TRIPWIRE_ADMIN_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ include "tripwire.adminSecretName" $root }}
          key: {{ include "tripwire.adminSecretKey" $root }}
    {{- include "tripwire.upstreamKeyEnv" $root | nindent 4 }}
    {{- if $v.state.urlSecret.name }}
    - name: TRIPWIRE_STATE_URL
      valueFrom:
        secretKeyRef:
          name: {{ $v.state.urlSecret.name }}
          key: {{ default "url" $v.state.urlSecret.key }}
    {{- end }}
    {{- if $v.otlp.endpoint }}
    # the OpenTelemetry SDK reads these: spans name the pod that served the call
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: OTEL_RESOURCE_ATTRIBUTES
      value: "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)"
    {{- if $v.otlp.headersSecret.name }}
    - name: OTEL_EXPORTER_OTLP_HEADERS
      valueFrom:
        secretKeyRef:
          name: {{ $v.otlp.headersSecret.name }}
          key: {{ default "headers" $v.otlp.headersSecret.key }}
    {{- end }}
    {{- end }}
    {{- with $v.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    {{- if not .sidecar }}
    - name: proxy
      containerPort: {{ $v.proxy.port }}
      protocol: TCP
    {{- end }}
    - name: admin
      containerPort: {{ $v.admin.port }}
      protocol: TCP
  livenessProbe:
    httpGet:
      path: /healthz
      port: admin
    {{- toYaml $v.livenessProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: admin
    {{- toYaml $v.readinessProbe | nindent 4 }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  resources:
    {{- toYaml $v.resources | nindent 4 }}
  volumeMounts:
    - name: tripwire-data
      mountPath: /data
    - name: tripwire-tmp
      mountPath: /tmp
    - name: tripwire-config
      mountPath: /etc/tripwire
      readOnly: true
    {{- with $v.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/*
Public: the Tripwire sidecar container, to put in your Deployment's `containers:` (or, with
sidecar.native, `initContainers:`). From a parent chart that depends on this one:
  containers:
    {{- include "tripwire.sidecarContainer" .Subcharts.tripwire | nindent 8 }}
*/}}
{{- define "tripwire.sidecarContainer" -}}
{{- include "tripwire.containerSpec" (dict "root" . "sidecar" true) }}
{{- end }}

{{/*
Public: the volumes the Tripwire container mounts, for your pod's `volumes:`.
*/}}
{{- define "tripwire.volumes" -}}
- name: tripwire-data
  {{- if .Values.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ include "tripwire.claimName" . }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ .Values.dataVolume.sizeLimit }}
  {{- end }}
- name: tripwire-tmp
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.tmpVolume.sizeLimit }}
- name: tripwire-config
  configMap:
    name: {{ include "tripwire.configMapName" . }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Public: env for the agent container in sidecar mode: the SDKs' base URL on the pod's localhost, and a
placeholder key when Tripwire injects the real one.
*/}}
{{- define "tripwire.agentEnv" -}}
{{- $base := printf "http://127.0.0.1:%v" .Values.proxy.port }}
{{- if .Values.sidecar.agentName }}
{{- $base = printf "%s/agents/%s" $base .Values.sidecar.agentName }}
{{- end -}}
- name: OPENAI_BASE_URL
  value: {{ printf "%s/v1" $base | quote }}
{{- if and (include "tripwire.upstreamKeyRef" (list . "default" "" .Values.upstream) | fromJson) (not .Values.auth.requireAgentKey) }}
- name: OPENAI_API_KEY
  value: "tripwire-injects-the-real-key"
{{- end }}
{{- end }}

{{/*
Labels of the pods the admin Service selects, or nothing (sidecar mode with no selector and no example).
*/}}
{{- define "tripwire.servicePodSelector" -}}
{{- if eq .Values.mode "standalone" }}
{{- include "tripwire.selectorLabels" . }}
{{- else if .Values.sidecar.podSelector }}
{{- toYaml .Values.sidecar.podSelector }}
{{- else if .Values.sidecar.example.enabled }}
{{- include "tripwire.selectorLabels" . }}
{{- end }}
{{- end }}
