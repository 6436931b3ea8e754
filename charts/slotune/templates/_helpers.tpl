{{- define "slotune.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "slotune.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "slotune.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "slotune.serviceAccountName" -}}
{{- default (include "slotune.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* What the operator does inside a namespace it serves (see clusterrole.yaml). */}}
{{- define "slotune.namespacedRules" -}}
# The resource itself: watch it, keep Kopf's bookkeeping annotations; never its spec.
- apiGroups: ["slotune.dev"]
  resources: ["llmdeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["slotune.dev"]
  resources: ["llmdeployments/status"]
  verbs: ["get", "patch", "update"]
# What an LLMDeployment becomes.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# spec.inferencePool: applied (a server-side apply that creates needs create), read to tell
# ours from another's, deleted when switched off.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "create", "patch", "delete"]
# Tuning: a trial's canary pod, the load Job that measures it (its result comes back as the
# Job pod's termination message, in the pod's status), the serving pods a promotion is
# checked on, and the ConfigMap that keeps a study's trial records.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The trial's NetworkPolicy: only its load Job reaches the trial engine.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
# Events on transitions, for on-call engineers.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* What it needs cluster-wide whatever it serves. */}}
{{- define "slotune.clusterRules" -}}
# Kopf watches CRDs to notice the resources it serves appearing or going away.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
# Serving some namespaces, Kopf lists and watches namespaces to learn which of them exist;
# without it, each start retries the listing for about 100 s before it serves. slotune reads
# a namespace's Pod Security label when a spec asks for privilege (names and labels only:
# nothing inside a namespace).
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
{{- end }}
