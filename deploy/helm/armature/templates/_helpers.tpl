{{/* Names ------------------------------------------------------------------------------ */}}

{{- define "armature.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "armature.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The worker Deployment of a role: (dict "root" $ "role" "decode") */}}
{{- define "armature.workerName" -}}
{{- printf "%s-%s" (include "armature.fullname" .root) .role -}}
{{- end -}}

{{- define "armature.secretName" -}}
{{- default (printf "%s-secrets" (include "armature.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* Labels ----------------------------------------------------------------------------- */}}

{{- define "armature.selectorLabels" -}}
app.kubernetes.io/name: {{ include "armature.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Standard labels, and the Armature namespace label Kubernetes discovery selects on. */}}
{{- define "armature.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "armature.selectorLabels" . }}
{{- end -}}

{{- define "armature.podLabels" -}}
{{ include "armature.selectorLabels" . }}
armature.dev/namespace: {{ include "armature.namespace" .root }}
{{- with .root.Values.podDefaults.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The Armature namespace the processes meet in (--namespace). */}}
{{- define "armature.namespace" -}}
{{- default "armature" .Values.runtime.namespace -}}
{{- end -}}

{{/* Images: (dict "root" $ "variant" "cpu") */}}
{{- define "armature.image" -}}
{{- $tag := default .root.Chart.AppVersion .root.Values.image.tag -}}
{{- if or (eq $tag "latest") (not (has .variant (list "cpu" "cuda"))) -}}
{{- fail (printf "image: tag %q and variant %q: give a version (not latest) and cpu or cuda" $tag .variant) -}}
{{- end -}}
{{- printf "%s:%s-%s" .root.Values.image.repository $tag .variant -}}
{{- end -}}

{{/* Flags ------------------------------------------------------------------------------ */}}

{{/* A scalar as a flag's text: whole numbers without an exponent (YAML numbers reach the
templates as floats: 1073741824 would print as 1.073741824e+09). */}}
{{- define "armature.scalar" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) -}}
{{- printf "%d" (int64 .) -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* Container args from a generated values block ({section: {flag: value}}): null passes
nothing, a switch its flag when true, a list one comma-joined value. */}}
{{- define "armature.flags" -}}
{{- range $section, $settings := . }}
{{- range $flag, $value := $settings }}
{{- if kindIs "bool" $value }}
{{- if $value }}
- {{ printf "--%s" $flag | quote }}
{{- end }}
{{- else if kindIs "slice" $value }}
- {{ printf "--%s" $flag | quote }}
- {{ join "," $value | quote }}
{{- else if not (kindIs "invalid" $value) }}
- {{ printf "--%s" $flag | quote }}
- {{ include "armature.scalar" $value | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* "true" where a plane is nats, else "". */}}
{{- define "armature.usesNats" -}}
{{- if has "nats" (list (toString (index .Values.runtime "request-plane")) (toString (index .Values.runtime "event-plane"))) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" where the processes of a nats plane take the NATS URL from the Secret
(secrets.natsUrl, or the `nats-url` of secrets.existingSecret), not the in-chart NATS, else "". */}}
{{- define "armature.natsUrlSecret" -}}
{{- if and (include "armature.usesNats" .) (not .Values.nats.enabled) (or .Values.secrets.existingSecret .Values.secrets.natsUrl) -}}
true
{{- end -}}
{{- end -}}

{{/* The runtime flags, with the in-chart etcd and NATS filled in where enabled and unset. A
NATS URL may hold credentials: it comes from the Secret (armature.env), never as a flag. */}}
{{- define "armature.runtimeFlags" -}}
{{- $runtime := deepCopy .Values.runtime -}}
{{- if and .Values.etcd.enabled (ne (index $runtime "discovery") "etcd") -}}
{{- fail "etcd.enabled runs an etcd no process would use: set runtime.discovery to etcd, or leave etcd.enabled false" -}}
{{- end -}}
{{- if and .Values.nats.enabled (ne (toString (index $runtime "request-plane")) "nats") (ne (toString (index $runtime "event-plane")) "nats") -}}
{{- fail "nats.enabled runs a NATS no process would use: set runtime.request-plane or runtime.event-plane to nats, or leave nats.enabled false" -}}
{{- end -}}
{{- if and .Values.etcd.enabled (not (index $runtime "etcd-endpoints")) -}}
{{- $_ := set $runtime "etcd-endpoints" (printf "http://%s-etcd:2379" (include "armature.fullname" .)) -}}
{{- end -}}
{{- if index $runtime "nats-url" -}}
{{- fail "runtime.nats-url: give the NATS URL as secrets.natsUrl (the chart passes it from its Secret, as ARMATURE_NATS_URL: credentials on a command line show to whoever can read the Pod)" -}}
{{- end -}}
{{- if and .Values.secrets.natsUrl (not .Values.secrets.existingSecret) -}}
{{- if not (include "armature.usesNats" .) -}}
{{- fail "secrets.natsUrl names a NATS no process would use: set runtime.request-plane or runtime.event-plane to nats, or leave it empty" -}}
{{- else if .Values.nats.enabled -}}
{{- fail "nats.enabled runs a NATS no process would use: secrets.natsUrl names the one they use; leave one of them out" -}}
{{- end -}}
{{- end -}}
{{- if .Values.nats.enabled -}}
{{- $_ := set $runtime "nats-url" (printf "nats://%s-nats:4222" (include "armature.fullname" .)) -}}
{{- end -}}
{{- if and (index $runtime "etcd-user") (not .Values.secrets.existingSecret) (not .Values.secrets.etcdPassword) -}}
{{- fail "runtime.etcd-user needs its password: set secrets.etcdPassword (ARMATURE_ETCD_PASSWORD)" -}}
{{- end -}}
{{- if and .Values.secrets.etcdPassword (not (index $runtime "etcd-user")) -}}
{{- fail "secrets.etcdPassword is runtime.etcd-user's password: set runtime.etcd-user too" -}}
{{- end -}}
{{- include "armature.flags" (dict "runtime" $runtime) -}}
{{- end -}}

{{/* Pods --------------------------------------------------------------------------------- */}}

{{/* A drain grace in whole seconds, from shutdown-grace-s (frontend.config.http,
workers.config.process): null passes no flag, and the process drains for armature's own
default, 30 s (HttpConfig and WorkerProcessConfig; a test holds them to it). */}}
{{- define "armature.graceS" -}}
{{- if kindIs "invalid" . -}}
30
{{- else -}}
{{- ceil . | int -}}
{{- end -}}
{{- end -}}

{{- define "armature.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podDefaults.runAsUser }}
runAsGroup: {{ .Values.podDefaults.runAsGroup }}
fsGroup: {{ .Values.podDefaults.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "armature.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The environment of every Armature container: the Secret's values, the Pod's own name
(Kubernetes discovery annotates it) and the writable cache. */}}
{{- define "armature.env" -}}
- name: ARMATURE_PLANE_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "armature.secretName" . }}
      key: plane-secret
{{- if index .Values.runtime "etcd-user" }}
- name: ARMATURE_ETCD_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "armature.secretName" . }}
      key: etcd-password
{{- end }}
{{- if include "armature.natsUrlSecret" . }}
- name: ARMATURE_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "armature.secretName" . }}
      key: nats-url
      {{- if .Values.secrets.existingSecret }}
      optional: true
      {{- end }}
{{- end }}
- name: ARMATURE_K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: XDG_CACHE_HOME
  value: /cache
- name: HF_HOME
  value: /cache/huggingface
{{- end -}}

{{/* Volumes of every Armature Pod: a writable /tmp and cache, and the model's source. */}}
{{- define "armature.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.podDefaults.tmpSizeLimit }}
- name: cache
  emptyDir:
    sizeLimit: {{ .Values.podDefaults.cacheSizeLimit }}
{{- if eq .Values.model.source "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.claimName is required with model.source pvc" .Values.model.pvc.claimName }}
    readOnly: true
{{- else if eq .Values.model.source "hostPath" }}
- name: model
  hostPath:
    path: {{ required "model.hostPath.path is required with model.source hostPath" .Values.model.hostPath.path }}
    type: Directory
{{- end }}
{{- end -}}

{{- define "armature.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: cache
  mountPath: /cache
{{- if has .Values.model.source (list "pvc" "hostPath") }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* --model for the model's source (none for the default model). */}}
{{- define "armature.modelFlag" -}}
{{- $model := .Values.model -}}
{{- if eq $model.source "pvc" }}
- "--model"
- {{ trimSuffix "/" (printf "%s/%s" $model.mountPath $model.pvc.subPath) | quote }}
{{- else if eq $model.source "hostPath" }}
- "--model"
- {{ $model.mountPath | quote }}
{{- else if eq $model.source "image" }}
- "--model"
- {{ required "model.image.path is required with model.source image" $model.image.path | quote }}
{{- else if ne $model.source "default" }}
{{- fail (printf "model.source %q: give default, pvc, hostPath or image" $model.source) }}
{{- end }}
{{- end -}}
