{{/* The name every resource of this release starts with. */}}
{{- define "ledgerlm.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ledgerlm.secretName" -}}
{{- .Values.existingSecret | default (printf "%s-secrets" (include "ledgerlm.fullname" .)) -}}
{{- end -}}

{{- define "ledgerlm.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
The environment of every process: the same names infra/compose.yaml gives its services
(tests/unit/test_deploy_manifests.py holds the two to each other). Plain settings first,
in name order, where values and then `extra` (a worker revision's env) may override them;
then the credentials, from the Secret.
*/}}
{{- define "ledgerlm.env" -}}
{{- $v := .root.Values -}}
{{- $plain := dict
    "LEDGERLM_HOME" $v.home.path
    "LEDGERLM_EVENT_LOG_URL" (required "kafka.url is required (kafka://host:port)" $v.kafka.url)
    "LEDGERLM_OBJECT_STORE_URL" (required "s3.url is required (s3://bucket)" $v.s3.url)
    "LEDGERLM_API_HOST" "0.0.0.0"
    "LEDGERLM_API_PORT" (toString $v.api.port)
    "LEDGERLM_METRICS_HOST" "0.0.0.0"
    "LEDGERLM_METRICS_PORT" (toString $v.metricsPort) -}}
{{- with $v.s3.endpointUrl }}{{ $_ := set $plain "LEDGERLM_S3_ENDPOINT_URL" . }}{{ end -}}
{{- with $v.model }}{{ $_ := set $plain "LEDGERLM_MODEL" . }}{{ end -}}
{{- with $v.kafka.namespace }}{{ $_ := set $plain "LEDGERLM_EVENT_LOG_NAMESPACE" . }}{{ end -}}
{{- with $v.kafka.replicationFactor }}{{ $_ := set $plain "LEDGERLM_KAFKA_REPLICATION_FACTOR" (toString .) }}{{ end -}}
{{- with $v.kafka.securityProtocol }}{{ $_ := set $plain "LEDGERLM_KAFKA_SECURITY_PROTOCOL" . }}{{ end -}}
{{- with $v.kafka.saslMechanism }}{{ $_ := set $plain "LEDGERLM_KAFKA_SASL_MECHANISM" . }}{{ end -}}
{{- with $v.kafka.saslUsername }}{{ $_ := set $plain "LEDGERLM_KAFKA_SASL_USERNAME" . }}{{ end -}}
{{- range $name, $value := $v.env }}{{ $_ := set $plain $name (toString $value) }}{{ end -}}
{{- range $name, $value := (.extra | default dict) }}{{ $_ := set $plain $name (toString $value) }}{{ end -}}
{{- range $name := keys $plain | sortAlpha }}
- name: {{ $name }}
  value: {{ get $plain $name | quote }}
{{- end }}
{{- $secret := include "ledgerlm.secretName" .root -}}
{{- range $name, $key := dict "LEDGERLM_DATABASE_URL" "database-url" "LEDGERLM_CELERY_BROKER_URL" "celery-broker-url" "LEDGERLM_S3_KEY" "s3-key" "LEDGERLM_S3_SECRET" "s3-secret" "LEDGERLM_AUDIT_SIGNING_KEY" "audit-signing-key" }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef: {name: {{ $secret }}, key: {{ $key }}}
{{- end }}
- name: LEDGERLM_BOOTSTRAP_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ $secret }}, key: bootstrap-token, optional: true}
{{- if $v.kafka.saslUsername }}
- name: LEDGERLM_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $secret }}, key: kafka-sasl-password}
{{- end }}
{{- end -}}

{{/*
One process as a Deployment. Takes a dict: root (the chart's context), name (of the
Deployment, after the release's), process (`ledgerlm serve PROCESS`), flags, replicas,
resources, gpus (nvidia.com/gpu; 0 for none), extra (env), startupSeconds (how long it
may take before its health endpoint answers; 0: no startup probe).
*/}}
{{- define "ledgerlm.deployment" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $name := printf "%s-%s" (include "ledgerlm.fullname" $root) .name | trunc 63 | trimSuffix "-" -}}
{{- $port := ternary (int $v.api.port) (int $v.metricsPort) (eq .process "api") -}}
{{- $resources := deepCopy (.resources | default dict) -}}
{{- if .gpus -}}
{{- $limits := get $resources "limits" | default dict -}}
{{- $_ := set $limits "nvidia.com/gpu" (int .gpus) -}}
{{- $_ := set $resources "limits" $limits -}}
{{- end -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  labels:
    {{- include "ledgerlm.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .process }}
    ledgerlm.io/deployment: {{ .name }}
spec:
  replicas: {{ .replicas }}
  selector:
    matchLabels:
      app.kubernetes.io/instance: {{ $root.Release.Name }}
      ledgerlm.io/deployment: {{ .name }}
  template:
    metadata:
      labels:
        # component: the process, as Prometheus labels its targets (docs/autoscaling.md).
        {{- include "ledgerlm.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ .process }}
        ledgerlm.io/deployment: {{ .name }}
      annotations:
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ $port | quote }}
        prometheus.io/path: /metrics
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      # Past the platform's own drain (LEDGERLM_GRACE_S, 30 s by default) before SIGKILL.
      terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if $v.migrate }}
      initContainers:
        - name: migrate
          image: "{{ $v.image.repository }}:{{ $v.image.tag }}"
          imagePullPolicy: {{ $v.image.pullPolicy }}
          command: ["ledgerlm"]
          args: ["db", "upgrade"]
          env:
            {{- include "ledgerlm.env" (dict "root" $root "extra" .extra) | trim | nindent 12 }}
          volumeMounts:
            - {name: home, mountPath: {{ $v.home.path }}}
      {{- end }}
      containers:
        - name: {{ .process }}
          image: "{{ $v.image.repository }}:{{ $v.image.tag }}"
          imagePullPolicy: {{ $v.image.pullPolicy }}
          command: ["ledgerlm"]
          args: {{ concat (list "serve" .process) (.flags | default list) | toJson }}
          env:
            {{- include "ledgerlm.env" (dict "root" $root "extra" .extra) | trim | nindent 12 }}
          ports:
            - name: {{ ternary "http" "metrics" (eq .process "api") }}
              containerPort: {{ $port }}
          {{- if .startupSeconds }}
          startupProbe:
            httpGet: {path: /healthz, port: {{ $port }}}
            periodSeconds: 10
            failureThreshold: {{ div (int .startupSeconds) 10 | max 1 }}
          {{- end }}
          livenessProbe:
            httpGet: {path: /healthz, port: {{ $port }}}
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 6
          readinessProbe:
            httpGet: {path: /readyz, port: {{ $port }}}
            periodSeconds: 5
            timeoutSeconds: 5
            failureThreshold: 3
          {{- with $resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - {name: home, mountPath: {{ $v.home.path }}}
            {{- if $v.models.volume }}
            - {name: models, mountPath: {{ $v.models.mountPath }}, readOnly: true}
            {{- end }}
            {{- if .gpus }}
            - {name: dshm, mountPath: /dev/shm}
            {{- end }}
      volumes:
        - name: home
          {{- toYaml $v.home.volume | nindent 10 }}
        {{- if $v.models.volume }}
        - name: models
          {{- toYaml $v.models.volume | nindent 10 }}
        {{- end }}
        {{- if .gpus }}
        # vLLM's worker processes share tensors through /dev/shm (compose: ipc: host).
        - name: dshm
          emptyDir: {medium: Memory}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}
