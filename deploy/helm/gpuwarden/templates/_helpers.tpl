{{/* Names and labels shared by every object. */}}

{{- define "gpuwarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuwarden.fullname" -}}
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

{{- define "gpuwarden.selectorLabels" -}}
{{ include "gpuwarden.componentSelector" (dict "root" . "component" "agent") }}
{{- end }}

{{- define "gpuwarden.labels" -}}
{{ include "gpuwarden.componentLabels" (dict "root" . "component" "agent") }}
{{- end }}

{{/* Selector and labels of a component: a dict of root and component. */}}
{{- define "gpuwarden.componentSelector" -}}
app.kubernetes.io/name: {{ include "gpuwarden.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpuwarden.componentLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpuwarden.componentSelector" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{/* The agents on nodes without GPUs (remoteClients): their name, and
their configuration, remoteClients.config merged over config. */}}
{{- define "gpuwarden.remoteClientsName" -}}
{{- printf "%s-remote-client" (include "gpuwarden.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuwarden.remoteClientsConfig" -}}
{{- $c := mergeOverwrite (deepCopy .Values.config) (deepCopy .Values.remoteClients.config) }}
{{- if $c.dra.remotePool }}
{{- /* A DRA remote pool: nodes without GPUs take the pool's GPUs through their DRA driver. */}}
{{- $_ := set $c.devicePlugin "enabled" false }}
{{- $_ := set $c.dra "enabled" true }}
{{- else }}
{{- /* Otherwise the device plugin offers them the servers' GPUs. */}}
{{- $_ := set $c.dra "enabled" false }}
{{- if not $c.remote.servers }}
{{- fail "remoteClients.enabled needs the GPU nodes that serve them: remoteClients.config.remote.servers, or config.dra.remotePool" }}
{{- end }}
{{- end }}
{{- toYaml $c }}
{{- end }}

{{- define "gpuwarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpuwarden.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The port of config.http.listen (":9477", "0.0.0.0:9477"). */}}
{{- define "gpuwarden.port" -}}
{{- regexReplaceAll "^.*:" .Values.config.http.listen "" }}
{{- end }}
