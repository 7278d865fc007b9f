{{/* Names, labels and the pieces both roles share. */}}

{{- define "flower.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "flower.fullname" -}}
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

{{- define "flower.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "flower.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: flower
{{- end }}

{{/* Selector labels of one role: (dict "root" $ "role" "coordinator") */}}
{{- define "flower.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flower.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end }}

{{- define "flower.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "flower.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "flower.secretName" -}}
{{- default (printf "%s-secrets" (include "flower.fullname" .)) .Values.secrets.existingSecret }}
{{- end }}

{{- define "flower.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "flower.workerImage" -}}
{{- if .Values.image.workerDigest }}
{{- printf "%s@%s" .Values.image.workerRepository .Values.image.workerDigest }}
{{- else }}
{{- printf "%s:%s" .Values.image.workerRepository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The JetStream names the binaries derive from the prefix (bus/src/nats.rs):
stream <PREFIX>_TASKS with `.`/`-` → `_`, upper-cased; consumer <prefix>-workers. */}}
{{- define "flower.taskStream" -}}
{{- printf "%s_TASKS" (.Values.nats.prefix | replace "." "_" | replace "-" "_" | upper) }}
{{- end }}
{{- define "flower.taskConsumer" -}}
{{- printf "%s-workers" .Values.nats.prefix }}
{{- end }}

{{/* Environment both roles share: backends, secrets by reference, the schema policy. */}}
{{- define "flower.env" -}}
- name: FLOWER_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "flower.secretName" . }}
      key: {{ .Values.secrets.keys.databaseUrl }}
- name: FLOWER_SCHEMA
  value: require-current
- name: FLOWER_DATABASE_POOL
  value: {{ .Values.runtime.databasePool | quote }}
{{- with .Values.runtime.toolEgressAllow }}
- name: FLOWER_TOOL_EGRESS_ALLOW
  value: {{ join "," . | quote }}
{{- end }}
- name: FLOWER_NATS_URL
  value: {{ .Values.nats.url | quote }}
- name: FLOWER_NATS_PREFIX
  value: {{ .Values.nats.prefix | quote }}
- name: FLOWER_OBJECT_STORE
  value: {{ .Values.objectStore.url | quote }}
{{- with .Values.objectStore.endpoint }}
- name: FLOWER_S3_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with .Values.objectStore.region }}
- name: AWS_REGION
  value: {{ . | quote }}
{{- end }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ include "flower.secretName" . }}
      key: {{ .Values.secrets.keys.s3AccessKeyId }}
      optional: true
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "flower.secretName" . }}
      key: {{ .Values.secrets.keys.s3SecretAccessKey }}
      optional: true
- name: FLOWER_PROVIDERS
  value: {{ join "," .Values.providers | quote }}
{{- range $env, $key := .Values.secrets.providerKeys }}
- name: {{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ include "flower.secretName" $ }}
      key: {{ $key }}
      optional: true
{{- end }}
- name: FLOWER_PROVIDER_CONCURRENCY
  value: {{ .Values.runtime.providerConcurrency | quote }}
- name: FLOWER_MAX_ATTEMPTS
  value: {{ .Values.runtime.maxAttempts | quote }}
- name: FLOWER_ACK_WAIT
  value: {{ .Values.runtime.ackWait | quote }}
- name: RUST_LOG
  value: {{ .Values.runtime.logLevel | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Spread over nodes and zones unless the values say otherwise. */}}
{{- define "flower.topologySpread" -}}
{{- $role := .role }}
{{- if .constraints }}
{{- tpl (toYaml .constraints) .root }}
{{- else }}
- maxSkew: 1
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "flower.selectorLabels" (dict "root" .root "role" $role) | nindent 6 }}
- maxSkew: 1
  topologyKey: topology.kubernetes.io/zone
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "flower.selectorLabels" (dict "root" .root "role" $role) | nindent 6 }}
{{- end }}
{{- end }}

{{/* Pod-level settings shared by the Deployments and the migration Job. */}}
{{- define "flower.podCommon" -}}
serviceAccountName: {{ include "flower.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
enableServiceLinks: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* One egress rule of networkPolicy.egress: ports, and peers when given. */}}
{{- define "flower.egressRule" -}}
- ports:
  {{- range .ports }}
  - {port: {{ . }}, protocol: TCP}
  {{- end }}
  {{- with .to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
