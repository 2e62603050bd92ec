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

{{/* The checks of one tier's authz values (dict "name" "central.authz" "authz" VALUES). */}}
{{- define "flagd-proxy.validateAuthz" -}}
{{- $authz := .authz -}}
{{- if and (eq $authz.mode "none") (or $authz.podIP $authz.tokenAudiences $authz.allowNamespaces) -}}
{{- fail (printf "%s.podIP, tokenAudiences and allowNamespaces need %s.mode namespace or rbac" .name .name) -}}
{{- end -}}
{{- if and $authz.allowNamespaces (ne $authz.mode "namespace") -}}
{{- fail (printf "%s.allowNamespaces is for %s.mode=namespace" .name .name) -}}
{{- end -}}
{{- end -}}

{{/* The --authz arguments of one tier's authz values. */}}
{{- define "flagd-proxy.authzArgs" -}}
{{- if ne .mode "none" }}
- --authz
- {{ .mode }}
{{- with .allowNamespaces }}
- --authz-allow-namespaces
- {{ join "," . | quote }}
{{- end }}
{{- with .tokenAudiences }}
- --authz-token-audiences
- {{ join "," . | quote }}
{{- end }}
{{- if .podIP }}
- --authz-pod-ip
{{- end }}
{{- end }}
{{- end -}}

{{/* The ClusterRole rules one tier's authz values need. */}}
{{- define "flagd-proxy.authzRules" -}}
{{- if ne .mode "none" }}
# authz: check the tokens clients send (TokenReview) ...
- apiGroups:
    - authentication.k8s.io
  resources:
    - tokenreviews
  verbs:
    - create
{{- end }}
{{- if eq .mode "rbac" }}
# ... and ask the API server whether a client may get a FeatureFlag ...
- apiGroups:
    - authorization.k8s.io
  resources:
    - subjectaccessreviews
  verbs:
    - create
{{- end }}
{{- if .podIP }}
# ... and find the pod that owns a client's address.
- apiGroups:
    - ""
  resources:
    - pods
  verbs:
    - list
    - watch
{{- end }}
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
{{- with .Values.otlp -}}
{{- if and (not .endpoint) (or .interval .headersSecret.name .ca.secretName .resourceAttributes) -}}
{{- fail "otlp.interval, otlp.headersSecret, otlp.ca and otlp.resourceAttributes need otlp.endpoint" -}}
{{- end -}}
{{- if and .ca.secretName (not (hasPrefix "https://" .endpoint)) -}}
{{- fail "otlp.ca is for an https:// otlp.endpoint" -}}
{{- end -}}
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
{{- include "flagd-proxy.validateAuthz" (dict "name" "central.authz" "authz" .Values.central.authz) -}}
{{- include "flagd-proxy.validateAuthz" (dict "name" "node.authz" "authz" .Values.node.authz) -}}
{{- $authz := .Values.central.authz -}}
{{- if and (ne $authz.mode "none") (not (include "flagd-proxy.central" .)) -}}
{{- fail "central.authz is for the central tier (mode central or both); the node tier's is node.authz" -}}
{{- end -}}
{{- if and (ne .Values.node.authz.mode "none") (not (include "flagd-proxy.node" .)) -}}
{{- fail "node.authz is for the node tier (mode node or both)" -}}
{{- end -}}
{{- if and (eq .Values.mode "both") (ne $authz.mode "none") -}}
{{- if ne $authz.mode "rbac" -}}
{{- fail "mode=both with central.authz: use central.authz.mode=rbac (node proxies read FeatureFlags of every namespace for their pods; the chart grants them get on FeatureFlags, which namespace mode cannot express)" -}}
{{- end -}}
{{- if not $authz.podIP -}}
{{- fail "mode=both with central.authz needs central.authz.podIP: node proxies send no token and are identified at the central tier by their pod address" -}}
{{- end -}}
{{- if eq .Values.node.authz.mode "none" -}}
{{- fail "mode=both with central.authz needs node.authz too: the central tier serves the node tier every FeatureFlag, so each node proxy must authorize the pods of its node itself" -}}
{{- end -}}
{{- end -}}
{{- if and (include "flagd-proxy.flagdEnabled" .) (not .Values.flagd.featureFlags) -}}
{{- fail "flagd.deployment.enabled / flagd.daemonset.enabled need flagd.featureFlags: the FeatureFlags flagd serves, as namespace/name" -}}
{{- end -}}
{{- if and .Values.flagd.deployment.enabled .Values.flagd.daemonset.enabled (eq (include "flagd-proxy.flagdServiceName" (dict "root" . "shape" "deployment")) (include "flagd-proxy.flagdServiceName" (dict "root" . "shape" "daemonset"))) -}}
{{- fail "flagd.deployment.service.name and flagd.daemonset.service.name must differ" -}}
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
{{- with .Values.compression }}
{{- if ne .mode "auto" }}
- --compression
- {{ .mode | quote }}
{{- end }}
{{- if not (kindIs "invalid" .minBytes) }}
- --compression-min-bytes
- {{ .minBytes | int64 | quote }}
{{- end }}
{{- if not (kindIs "invalid" .level) }}
- --compression-level
- {{ .level | int64 | quote }}
{{- end }}
{{- end }}
{{- with .Values.stateDir }}
{{- if .enabled }}
- --state-dir
- {{ .path | quote }}
- --state-dir-max-bytes
- {{ .maxBytes | quote }}
{{- end }}
{{- end }}
{{- with .Values.otlp }}
{{- if .endpoint }}
- --otlp-endpoint
- {{ .endpoint | quote }}
{{- with .interval }}
- --otlp-interval
- {{ . | quote }}
{{- end }}
{{- if .ca.secretName }}
- --otlp-ca-file
- {{ include "flagd-proxy.otlpCADir" $ }}/ca.crt
{{- end }}
{{- range $key, $value := .resourceAttributes }}
- --otlp-resource-attribute
- {{ printf "%s=%s" $key $value | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The state directory (--state-dir): an emptyDir, in both tiers. */}}
{{- define "flagd-proxy.stateVolumeMount" -}}
- name: state
  mountPath: {{ .Values.stateDir.path }}
{{- end -}}

{{- define "flagd-proxy.stateVolume" -}}
# The last version of each resource served, kept across restarts of the container.
- name: state
  emptyDir:
    sizeLimit: {{ .Values.stateDir.sizeLimit }}
{{- end -}}

{{/* OpenTelemetry export: the headers' Secret as an environment variable, the CA's volume. */}}
{{- define "flagd-proxy.otlpCADir" -}}/etc/flagd-proxy/otlp-ca{{- end -}}

{{- define "flagd-proxy.otlpEnv" -}}
{{- if and .Values.otlp.endpoint .Values.otlp.headersSecret.name }}
# Headers of every OTLP export (KEY=VALUE,...), kept out of the pod spec.
- name: FLAGD_PROXY_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ .Values.otlp.headersSecret.name }}
      key: {{ .Values.otlp.headersSecret.key }}
{{- end }}
{{- end -}}

{{/* "true" when the collector's CA is mounted. */}}
{{- define "flagd-proxy.otlpCA" -}}
{{- if and .Values.otlp.endpoint .Values.otlp.ca.secretName -}}true{{- end -}}
{{- end -}}

{{- define "flagd-proxy.otlpCAVolume" -}}
- name: otlp-ca
  secret:
    secretName: {{ .Values.otlp.ca.secretName }}
    items:
      - key: {{ .Values.otlp.ca.key }}
        path: ca.crt
    defaultMode: 292 # 0444: a certificate, not a secret
{{- end -}}

{{- define "flagd-proxy.otlpCAVolumeMount" -}}
- name: otlp-ca
  mountPath: {{ include "flagd-proxy.otlpCADir" . }}
  readOnly: true
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

{{/*
flagd workloads (off by default): a flagd Deployment + Service and a flagd DaemonSet with a
node-local Service, both syncing their flags from the proxy and serving evaluations on 8013.
*/}}

{{/* Base name of one flagd shape; call with (dict "root" $ "shape" "deployment"|"daemonset"). */}}
{{- define "flagd-proxy.flagdName" -}}
{{- $base := include "flagd-proxy.fullname" .root | trunc 50 | trimSuffix "-" -}}
{{- if eq .shape "daemonset" -}}
{{- printf "%s-flagd-node" $base -}}
{{- else -}}
{{- printf "%s-flagd" $base -}}
{{- end -}}
{{- end -}}

{{- define "flagd-proxy.flagdServiceName" -}}
{{- index .root.Values.flagd .shape "service" "name" | default (include "flagd-proxy.flagdName" .) -}}
{{- end -}}

{{/* Which proxy tier of this release a flagd shape syncs from: "central" or "node". The
Deployment prefers the central tier, the DaemonSet the node tier (a node-local chain). */}}
{{- define "flagd-proxy.flagdTier" -}}
{{- $central := include "flagd-proxy.central" .root -}}
{{- $node := include "flagd-proxy.node" .root -}}
{{- if eq .shape "daemonset" -}}
{{- if $node }}node{{ else }}central{{ end -}}
{{- else -}}
{{- if $central }}central{{ else }}node{{ end -}}
{{- end -}}
{{- end -}}

{{/* host:port flagd dials: this release's Service of that tier. */}}
{{- define "flagd-proxy.flagdUpstream" -}}
{{- $root := .root -}}
{{- $service := include "flagd-proxy.centralServiceName" $root -}}
{{- if eq (include "flagd-proxy.flagdTier" .) "node" -}}
{{- $service = include "flagd-proxy.nodeServiceName" $root -}}
{{- end -}}
{{- printf "%s.%s.svc.%s:8015" $service $root.Release.Namespace $root.Values.clusterDomain -}}
{{- end -}}

{{/* "true" when the tier a flagd shape syncs from serves TLS. */}}
{{- define "flagd-proxy.flagdTLS" -}}
{{- if eq (include "flagd-proxy.flagdTier" .) "node" -}}
{{- include "flagd-proxy.nodeTLS" .root -}}
{{- else -}}
{{- include "flagd-proxy.centralTLS" .root -}}
{{- end -}}
{{- end -}}

{{- define "flagd-proxy.flagdCADir" -}}/etc/flagd/proxy-ca{{- end -}}

{{/* flagd's --sources: one gRPC source per FeatureFlag (namespace/name). */}}
{{- define "flagd-proxy.flagdSources" -}}
{{- $uri := include "flagd-proxy.flagdUpstream" . -}}
{{- $tls := include "flagd-proxy.flagdTLS" . -}}
{{- $sources := list -}}
{{- range .root.Values.flagd.featureFlags -}}
{{- $source := dict "uri" $uri "provider" "grpc" "selector" (printf "core.openfeature.dev/%s" .) -}}
{{- if $tls -}}
{{- $_ := set $source "tls" true -}}
{{- $_ := set $source "certPath" (printf "%s/ca.crt" (include "flagd-proxy.flagdCADir" $)) -}}
{{- end -}}
{{- $sources = append $sources $source -}}
{{- end -}}
{{- toJson $sources -}}
{{- end -}}

{{- define "flagd-proxy.flagdLabels" -}}
helm.sh/chart: {{ include "flagd-proxy.chart" .root }}
app.kubernetes.io/version: {{ .root.Values.flagd.image.tag | toString | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: openfeature
{{ include "flagd-proxy.flagdSelectorLabels" . }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Not the proxy's selector labels: the proxy's Services, PodDisruptionBudget and
NetworkPolicy never select flagd pods. */}}
{{- define "flagd-proxy.flagdSelectorLabels" -}}
app.kubernetes.io/name: flagd
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ printf "flagd-%s" .shape }}
{{- end -}}

{{- define "flagd-proxy.flagdEnabled" -}}
{{- if or .Values.flagd.deployment.enabled .Values.flagd.daemonset.enabled }}true{{ end -}}
{{- end -}}

{{/* The pod template of one flagd shape; call with (dict "root" $ "shape" ...). */}}
{{- define "flagd-proxy.flagdPodTemplate" -}}
{{- $root := .root -}}
{{- $values := index $root.Values.flagd .shape -}}
{{- $tls := include "flagd-proxy.flagdTLS" . -}}
metadata:
  labels:
    {{- include "flagd-proxy.flagdLabels" . | nindent 4 }}
    {{- with $root.Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $root.Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  # flagd never calls the Kubernetes API: no token in the pod.
  automountServiceAccountToken: false
  enableServiceLinks: false
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "flagd-proxy.podSecurityContext" $root | nindent 4 }}
  {{- with $values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: flagd
      image: {{ printf "%s:%s" $root.Values.flagd.image.repository ($root.Values.flagd.image.tag | toString) }}
      imagePullPolicy: {{ $root.Values.flagd.image.pullPolicy }}
      args:
        - start
        - --port
        - "8013"
        - --management-port
        - "8014"
        - --sources
        - {{ include "flagd-proxy.flagdSources" . | quote }}
        {{- with $root.Values.flagd.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: evaluation
          containerPort: 8013
          protocol: TCP
        - name: management
          containerPort: 8014
          protocol: TCP
      livenessProbe:
        httpGet:
          path: /healthz
          port: management
        {{- toYaml $root.Values.probes.liveness | nindent 8 }}
      readinessProbe:
        httpGet:
          path: /readyz
          port: management
        {{- toYaml $root.Values.probes.readiness | nindent 8 }}
      resources:
        {{- toYaml $values.resources | nindent 8 }}
      securityContext:
        {{- include "flagd-proxy.containerSecurityContext" $root | nindent 8 }}
      {{- if $tls }}
      volumeMounts:
        - name: proxy-ca
          mountPath: {{ include "flagd-proxy.flagdCADir" . }}
          readOnly: true
      {{- end }}
  {{- if $tls }}
  volumes:
    # The CA that signs the proxy's certificate: ca.crt of the TLS Secret (cert-manager fills
    # it for CA and self-signed issuers).
    - name: proxy-ca
      secret:
        secretName: {{ include "flagd-proxy.tlsSecretName" $root }}
        items:
          - key: ca.crt
            path: ca.crt
  {{- end }}
{{- end -}}

{{/*
The expression of FlagdProxyRequestsRefused from prometheusRule.requestsRefused: the rate of
refusals of each reason over `window` above `perSecond`, or above the reason's own threshold in
`perReason`. With the defaults it is the expression of files/alerts.yaml.
*/}}
{{- define "flagd-proxy.refusalsExpr" -}}
{{- $metric := "flagd_proxy_rejected_requests_total" -}}
{{- $reasons := keys .perReason | sortAlpha -}}
{{- if $reasons -}}
rate({{ $metric }}{reason!~"{{ join "|" $reasons }}"}[{{ .window }}]) > {{ .perSecond }}
{{- range $reasons }} or rate({{ $metric }}{reason="{{ . }}"}[{{ $.window }}]) > {{ index $.perReason . }}
{{- end }}
{{- else -}}
rate({{ $metric }}[{{ .window }}]) > {{ .perSecond }}
{{- end -}}
{{- end -}}
