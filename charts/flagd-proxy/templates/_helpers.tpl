{{/*
Naming, labels and the parts shared by both tiers.
*/}}

{{- define "flagd-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Base name of the release's objects. */}}
{{- define "flagd-proxy.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "flagd-proxy.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "flagd-proxy.nodeName" -}}
{{- printf "%s-node" (include "flagd-proxy.fullname" . | trunc 58 | trimSuffix "-") -}}
{{- end -}}

{{- define "flagd-proxy.centralServiceName" -}}
{{- .Values.central.service.name | default "flagd-proxy-svc" -}}
{{- end -}}

{{- define "flagd-proxy.nodeServiceName" -}}
{{- .Values.node.service.name | default (include "flagd-proxy.nodeName" .) -}}
{{- end -}}

{{- define "flagd-proxy.metricsServiceName" -}}
{{- printf "%s-metrics" (include "flagd-proxy.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{- define "flagd-proxy.serviceAccountName" -}}
{{- .Values.central.serviceAccount.name | default (include "flagd-proxy.fullname" .) -}}
{{- end -}}

{{/* Cluster-scoped names carry the namespace, so that installs in two namespaces never clash. */}}
{{- define "flagd-proxy.clusterRoleName" -}}
{{- printf "%s-%s" .Release.Namespace (include "flagd-proxy.fullname" .) -}}
{{- end -}}

{{- define "flagd-proxy.tlsSecretName" -}}
{{- .Values.tls.secretName | default (printf "%s-tls" (include "flagd-proxy.fullname" .)) -}}
{{- end -}}

{{/* Which parts are rendered: each returns "true" or "". */}}
{{- define "flagd-proxy.central" -}}
{{- if has .Values.mode (list "central" "both") }}true{{ end -}}
{{- end -}}

{{- define "flagd-proxy.node" -}}
{{- if has .Values.mode (list "node" "both") }}true{{ end -}}
{{- end -}}

{{- define "flagd-proxy.centralTLS" -}}
{{- if and (include "flagd-proxy.central" .) .Values.tls.enabled }}true{{ end -}}
{{- end -}}

{{- define "flagd-proxy.nodeTLS" -}}
{{- if and (include "flagd-proxy.node" .) .Values.node.tls.enabled }}true{{ end -}}
{{- end -}}

{{- define "flagd-proxy.upstreamTLS" -}}
{{- if include "flagd-proxy.node" . -}}
{{- if or .Values.node.upstream.tls .Values.node.upstream.ca.secretName (and (eq .Values.mode "both") .Values.tls.enabled) }}true{{ end -}}
{{- end -}}
{{- end -}}

{{/* The Secret with the upstream CA bundle, or "" for the system roots. */}}
{{- define "flagd-proxy.upstreamCASecret" -}}
{{- if and (include "flagd-proxy.upstreamTLS" .) (not .Values.node.upstream.ca.systemRoots) -}}
{{- if .Values.node.upstream.ca.secretName -}}
{{- .Values.node.upstream.ca.secretName -}}
{{- else if eq .Values.mode "both" -}}
{{- include "flagd-proxy.tlsSecretName" . -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "flagd-proxy.upstreamAddress" -}}
{{- if .Values.node.upstream.address -}}
{{- .Values.node.upstream.address -}}
{{- else -}}
{{- printf "%s.%s.svc.%s:8015" (include "flagd-proxy.centralServiceName" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}
{{- end -}}

{{/* Checks across values that the schema cannot express with a clear message. */}}
{{- define "flagd-proxy.validate" -}}
{{- if and (eq .Values.mode "node") (not .Values.node.upstream.address) -}}
{{- fail "mode=node needs node.upstream.address: the host:port of the central flagd-proxy Service (e.g. flagd-proxy-svc.flagd-proxy.svc.cluster.local:8015)" -}}
{{- end -}}
{{- if and (eq .Values.mode "node") .Values.tls.enabled -}}
{{- fail "tls.enabled turns on TLS for the central tier, which mode=node does not run; use node.upstream.tls to reach a TLS upstream and node.tls.enabled to serve TLS on the node tier" -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not (or (include "flagd-proxy.centralTLS" .) (include "flagd-proxy.nodeTLS" .))) -}}
{{- fail "tls.certManager.enabled needs a tier that serves TLS: set tls.enabled (central tier) or node.tls.enabled (node tier)" -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.certManager.issuerRef.name) -}}
{{- fail "tls.certManager.enabled needs tls.certManager.issuerRef.name (and kind: Issuer or ClusterIssuer)" -}}
{{- end -}}
{{- if and .Values.node.upstream.ca.systemRoots .Values.node.upstream.ca.secretName -}}
{{- fail "node.upstream.ca.systemRoots and node.upstream.ca.secretName exclude each other" -}}
{{- end -}}
{{- if and (include "flagd-proxy.central" .) .Values.central.podDisruptionBudget.enabled -}}
{{- $pdb := .Values.central.podDisruptionBudget -}}
{{- if and (not (kindIs "invalid" $pdb.minAvailable)) (not (kindIs "invalid" $pdb.maxUnavailable)) -}}
{{- fail "central.podDisruptionBudget: set either minAvailable or maxUnavailable (the other to null), not both" -}}
{{- end -}}
{{- end -}}
{{- if and (include "flagd-proxy.node" .) (include "flagd-proxy.central" .) (eq (include "flagd-proxy.centralServiceName" .) (include "flagd-proxy.nodeServiceName" .)) -}}
{{- fail "central.service.name and node.service.name must differ in mode=both" -}}
{{- end -}}
{{- end -}}

{{- define "flagd-proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "flagd-proxy.labels" -}}
helm.sh/chart: {{ include "flagd-proxy.chart" . }}
app.kubernetes.io/name: {{ include "flagd-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: openfeature
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selects every pod of the release (both tiers). */}}
{{- define "flagd-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flagd-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Selector labels of one tier; call with (dict "root" $ "component" "central"). */}}
{{- define "flagd-proxy.componentSelectorLabels" -}}
{{ include "flagd-proxy.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "flagd-proxy.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}
{{- end -}}

{{/* Pod-level security context: the "restricted" Pod Security Standard. */}}
{{- define "flagd-proxy.podSecurityContext" -}}
runAsNonRoot: true
{{- with .Values.securityContext.runAsUser }}
runAsUser: {{ . }}
{{- end }}
{{- with .Values.securityContext.runAsGroup }}
runAsGroup: {{ . }}
{{- end }}
{{- with .Values.securityContext.fsGroup }}
fsGroup: {{ . }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "flagd-proxy.containerSecurityContext" -}}
runAsNonRoot: true
{{- with .Values.securityContext.runAsUser }}
runAsUser: {{ . }}
{{- end }}
{{- with .Values.securityContext.runAsGroup }}
runAsGroup: {{ . }}
{{- end }}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Arguments both tiers start with: the OpenFeature Operator's own (the sync port is 8015 by default). */}}
{{- define "flagd-proxy.commonArgs" -}}
- start
- --management-port
- "8016"
{{- if ne .Values.logFormat "console" }}
- --log-format
- {{ .Values.logFormat | quote }}
{{- end }}
{{- if .Values.debug }}
- --debug
{{- end }}
{{- end -}}

{{- define "flagd-proxy.ports" -}}
- name: grpc
  containerPort: 8015
  protocol: TCP
- name: management
  containerPort: 8016
  protocol: TCP
{{- end -}}

{{- define "flagd-proxy.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: management
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: management
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- end -}}

{{/* Mount path of the serving certificate and key. */}}
{{- define "flagd-proxy.tlsDir" -}}/etc/flagd-proxy/tls{{- end -}}
{{- define "flagd-proxy.upstreamCADir" -}}/etc/flagd-proxy/upstream-ca{{- end -}}

{{- define "flagd-proxy.tlsArgs" -}}
- --server-cert-path
- {{ include "flagd-proxy.tlsDir" . }}/tls.crt
- --server-key-path
- {{ include "flagd-proxy.tlsDir" . }}/tls.key
{{- end -}}

{{- define "flagd-proxy.tlsVolume" -}}
- name: tls
  secret:
    secretName: {{ include "flagd-proxy.tlsSecretName" . }}
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
    # 0440 (written in decimal, which every YAML reader takes the same way): readable by the
    # owner and the pod's group (fsGroup) only.
    defaultMode: 288
{{- end -}}

{{- define "flagd-proxy.tlsVolumeMount" -}}
- name: tls
  mountPath: {{ include "flagd-proxy.tlsDir" . }}
  readOnly: true
{{- end -}}
