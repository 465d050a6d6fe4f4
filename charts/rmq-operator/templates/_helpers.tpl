{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "rmq-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: release-chart unless the release name already contains the chart name. */}}
{{- define "rmq-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rmq-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rmq-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rmq-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rmq-operator.labels" -}}
helm.sh/chart: {{ include "rmq-operator.chart" . }}
{{ include "rmq-operator.selectorLabels" . }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: rmq-brokergroup
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "rmq-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rmq-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rmq-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Namespaces the operator watches in namespaced mode (default: the release namespace). */}}
{{- define "rmq-operator.watchNamespaces" -}}
{{- $nss := .Values.operator.watchNamespaces | default (list .Release.Namespace) -}}
{{- toJson (uniq $nss) -}}
{{- end -}}

{{/* Rules the operator needs inside every namespace it manages (least privilege, issue 4). */}}
{{- define "rmq-operator.namespacedRules" -}}
# Only merge patches, never PUT (kopf's finalizers and annotations, k8s.py's status): no "update".
- apiGroups: ["rmq.brokergroup.dev"]
  resources: ["brokergroups"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["rmq.brokergroup.dev"]
  resources: ["brokergroups/status"]
  verbs: ["get", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["create", "get", "patch", "delete"]
# Secrets: the group's admin token (created once, deleted with the group) and a read of the TLS and
# ACL Secrets the spec names; never list/watch, which would expose every Secret it may see.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "get", "delete"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["create", "get", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "get", "patch", "delete"]
# Pods are listed by label (status, verification reports) and deleted to restart; never watched.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "patch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "get", "list", "delete"]
{{- with .Values.rbac.extraRules }}
{{ toYaml . }}
{{- end }}
{{- end -}}
