{{/* Names and labels. */}}
{{- define "stratad.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "stratad.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "stratad.labels" -}}
{{ include "stratad.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "stratad.image" -}}
{{- printf "%s:%s" .Values.stratad.image.repository (.Values.stratad.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The address the agent dials. */}}
{{- define "stratad.address" -}}
{{- if .Values.stratad.socketDir -}}
unix:{{ .Values.stratad.socketDir }}/stratad.sock
{{- else -}}
127.0.0.1:{{ .Values.stratad.grpcPort }}
{{- end -}}
{{- end -}}

{{/* stratad.toml: the computed addresses, then the user's keys. */}}
{{- define "stratad.config" -}}
{{- $config := dict "listen" (printf "0.0.0.0:%d" (int .Values.stratad.grpcPort)) "data_dir" "/var/lib/stratad" -}}
{{- if .Values.tls.enabled -}}
{{- $_ := set $config "tls_cert_file" "/etc/stratad-tls/tls.crt" -}}
{{- $_ := set $config "tls_key_file" "/etc/stratad-tls/tls.key" -}}
{{- if .Values.tls.clientAuth -}}
{{- $_ := set $config "tls_client_ca_file" "/etc/stratad-tls/ca.crt" -}}
{{- end -}}
{{- else -}}
{{- /* Plaintext on the pod IP (kubelet's gRPC probes): the NetworkPolicy keeps other pods off it. */ -}}
{{- $_ := set $config "allow_insecure" true -}}
{{- end -}}
{{- if ne .Values.auth.mode "off" -}}
{{- $_ := set $config "auth" .Values.auth.mode -}}
{{- $_ := set $config "auth_tokens_file" (printf "/etc/stratad-auth/%s" .Values.auth.tokensKey) -}}
{{- end -}}
{{- if .Values.stratad.socketDir -}}
{{- $_ := set $config "listen_unix" (printf "%s/stratad.sock" .Values.stratad.socketDir) -}}
{{- end -}}
{{- if .Values.encryption.enabled -}}
{{- $_ := set $config "encryption" "on" -}}
{{- $_ := set $config "encryption_key_file" (printf "/etc/stratad-encryption/%s" .Values.encryption.keyKey) -}}
{{- if .Values.encryption.oldKeyKeys -}}
{{- $old := list -}}
{{- range .Values.encryption.oldKeyKeys -}}
{{- $old = append $old (printf "/etc/stratad-encryption/%s" .) -}}
{{- end -}}
{{- $_ := set $config "encryption_old_key_files" (join "," $old) -}}
{{- end -}}
{{- end -}}
{{- if .Values.stratad.metricsPort -}}
{{- $_ := set $config "metrics_listen" (printf "0.0.0.0:%d" (int .Values.stratad.metricsPort)) -}}
{{- else -}}
{{- $_ := set $config "metrics_listen" "off" -}}
{{- end -}}
{{- range $key, $value := .Values.stratad.config -}}
{{- if has $key (list "listen" "listen_unix" "data_dir" "metrics_listen") -}}
{{- fail (printf "stratad.config.%s is set from the chart's values (grpcPort, socketDir, metricsPort); remove it" $key) -}}
{{- end -}}
{{- if has $key (list "tls_cert_file" "tls_key_file" "tls_client_ca_file" "allow_insecure" "auth" "auth_tokens_file") -}}
{{- fail (printf "stratad.config.%s is set from the chart's tls and auth values; remove it" $key) -}}
{{- end -}}
{{- if has $key (list "encryption" "encryption_key_file" "encryption_old_key_files") -}}
{{- fail (printf "stratad.config.%s is set from the chart's encryption values; remove it" $key) -}}
{{- end -}}
{{- $_ := set $config $key $value -}}
{{- end -}}
{{- with .Values.replication -}}
{{- if ne .mode "off" -}}
{{- if not .remoteUrl -}}
{{- fail "replication.mode needs replication.remoteUrl (s3://bucket/prefix)" -}}
{{- end -}}
{{- $_ := set $config "replication" .mode -}}
{{- $_ := set $config "remote_url" .remoteUrl -}}
{{- $_ := set $config "replication_lag_ms" .lagMs -}}
{{- $_ := set $config "replication_lease_ms" .leaseMs -}}
{{- end -}}
{{- end -}}
{{- /* Not toToml: YAML numbers are floats, and stratad wants integers as integers. */ -}}
{{- range $key := keys $config | sortAlpha }}
{{- $value := get $config $key }}
{{- if kindIs "string" $value }}
{{ $key }} = {{ $value | toJson }}
{{- else if and (kindIs "float64" $value) (eq $value (float64 (int64 $value))) }}
{{ $key }} = {{ int64 $value }}
{{- else if or (kindIs "bool" $value) (kindIs "float64" $value) (kindIs "int" $value) (kindIs "int64" $value) }}
{{ $key }} = {{ $value }}
{{- else }}
{{- fail (printf "stratad.config.%s must be a string, number or boolean" $key) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Settings that only make sense together; fail early with the fix. */}}
{{- define "stratad.checkSecurity" -}}
{{- if not (has .Values.auth.mode (list "off" "token" "mtls" "token_or_mtls")) -}}
{{- fail (printf "auth.mode must be off, token, mtls or token_or_mtls, not %q" .Values.auth.mode) -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) -}}
{{- fail "tls.enabled needs tls.secretName (a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.stratad.socketDir) -}}
{{- fail "tls.enabled needs stratad.socketDir: kubelet's gRPC probes cannot speak TLS, so the probes use the unix socket" -}}
{{- end -}}
{{- if and .Values.encryption.enabled (not .Values.encryption.keySecret) -}}
{{- fail "encryption.enabled needs encryption.keySecret (a Secret holding the master key)" -}}
{{- end -}}
{{- if and .Values.tls.clientAuth (not .Values.tls.enabled) -}}
{{- fail "tls.clientAuth needs tls.enabled" -}}
{{- end -}}
{{- if and (ne .Values.auth.mode "off") (not .Values.auth.tokensSecret) -}}
{{- fail "auth.mode needs auth.tokensSecret (the identities file)" -}}
{{- end -}}
{{- if and (has .Values.auth.mode (list "mtls" "token_or_mtls")) (not .Values.tls.clientAuth) -}}
{{- fail (printf "auth.mode %s identifies clients by certificate: set tls.clientAuth" .Values.auth.mode) -}}
{{- end -}}
{{- if and .Values.networkPolicy.grpcFrom (or (not .Values.tls.enabled) (eq .Values.auth.mode "off")) -}}
{{- fail "networkPolicy.grpcFrom opens the gRPC port to other pods: set tls.enabled and an auth.mode first" -}}
{{- end -}}
{{- end -}}

{{/* A probe of stratad's health: gRPC on the port, or with TLS `stratad ctl health` on the socket. */}}
{{- define "stratad.probe" -}}
{{- $root := index . 0 -}}
{{- $settings := index . 1 -}}
{{- if $root.Values.tls.enabled }}
exec:
  command: ["stratad", "ctl", "--address", "unix:{{ $root.Values.stratad.socketDir }}/stratad.sock", "--timeout", "5", "health"]
{{- if not (hasKey $settings "timeoutSeconds") }}
# A Python process per probe: give it more than the default second.
timeoutSeconds: 5
{{- end }}
{{- else }}
grpc:
  port: {{ $root.Values.stratad.grpcPort }}
{{- end }}
{{- with $settings }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The pod template shared by the Deployment and the StatefulSet. */}}
{{- define "stratad.podTemplate" -}}
metadata:
  labels:
    {{- include "stratad.selectorLabels" . | nindent 4 }}
    stratad.io/sidecar: "true"
    {{- with .Values.workload.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    # Restart the pod when the configuration changes.
    checksum/config: {{ include "stratad.config" . | sha256sum }}
    {{- if and .Values.metrics.podAnnotations .Values.stratad.metricsPort }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ .Values.stratad.metricsPort | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- with .Values.workload.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  terminationGracePeriodSeconds: {{ .Values.workload.terminationGracePeriodSeconds }}
  automountServiceAccountToken: {{ .Values.workload.automountServiceAccountToken }}
  {{- with .Values.workload.serviceAccountName }}
  serviceAccountName: {{ . }}
  {{- end }}
  {{- with .Values.workload.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.workload.podSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.workload.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.workload.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.workload.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  initContainers:
    # Native sidecar: started (and startup-probed) before the agent, stopped after it.
    - name: stratad
      image: {{ include "stratad.image" . }}
      imagePullPolicy: {{ .Values.stratad.image.pullPolicy }}
      restartPolicy: Always
      # If stratad exits with an error (a bad stratad.toml), the end of its
      # log becomes the termination message: `kubectl describe pod` shows why.
      terminationMessagePolicy: FallbackToLogsOnError
      args: ["serve"]
      env:
        - name: STRATAD_CONFIG
          value: /etc/stratad/stratad.toml
        {{- if ne .Values.replication.mode "off" }}
        # Each pod owns the sessions it writes under its own name (leases).
        - name: STRATAD_NODE_ID
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- with .Values.replication.endpoint }}
        - name: AWS_ENDPOINT_URL
          value: {{ . | quote }}
        {{- end }}
        {{- with .Values.replication.region }}
        - name: AWS_REGION
          value: {{ . | quote }}
        {{- end }}
        {{- if .Values.replication.allowHttp }}
        - name: AWS_ALLOW_HTTP
          value: "true"
        {{- end }}
        {{- end }}
        {{- with .Values.stratad.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- if and (ne .Values.replication.mode "off") .Values.replication.credentialsSecret }}
      envFrom:
        - secretRef:
            name: {{ .Values.replication.credentialsSecret }}
      {{- end }}
      ports:
        - name: grpc
          containerPort: {{ .Values.stratad.grpcPort }}
          protocol: TCP
        {{- if .Values.stratad.metricsPort }}
        - name: metrics
          containerPort: {{ .Values.stratad.metricsPort }}
          protocol: TCP
        {{- end }}
      startupProbe:
        {{- include "stratad.probe" (list . .Values.stratad.startupProbe) | trim | nindent 8 }}
      readinessProbe:
        {{- include "stratad.probe" (list . .Values.stratad.readinessProbe) | trim | nindent 8 }}
      livenessProbe:
        {{- include "stratad.probe" (list . .Values.stratad.livenessProbe) | trim | nindent 8 }}
      resources:
        {{- toYaml .Values.stratad.resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.stratad.securityContext | nindent 8 }}
      volumeMounts:
        - name: stratad-data
          mountPath: /var/lib/stratad
        {{- if .Values.stratad.socketDir }}
        - name: stratad-socket
          mountPath: {{ .Values.stratad.socketDir }}
        {{- end }}
        - name: stratad-config
          mountPath: /etc/stratad
          readOnly: true
        {{- if .Values.tls.enabled }}
        # A whole Secret volume, never subPath: only then do updates reach the files.
        - name: stratad-tls
          mountPath: /etc/stratad-tls
          readOnly: true
        {{- end }}
        {{- if ne .Values.auth.mode "off" }}
        - name: stratad-auth
          mountPath: /etc/stratad-auth
          readOnly: true
        {{- end }}
        {{- if .Values.encryption.enabled }}
        - name: stratad-encryption
          mountPath: /etc/stratad-encryption
          readOnly: true
        {{- end }}
  containers:
    - name: {{ .Values.agent.name }}
      image: {{ printf "%s:%s" .Values.agent.image.repository .Values.agent.image.tag }}
      imagePullPolicy: {{ .Values.agent.image.pullPolicy }}
      {{- with .Values.agent.command }}
      command:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.agent.args }}
      args:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      env:
        - name: STRATAD_ADDRESS
          value: {{ include "stratad.address" . | quote }}
        {{- if .Values.auth.agentTokenSecret }}
        - name: STRATAD_TOKEN_FILE
          value: /etc/stratad-token/{{ .Values.auth.agentTokenKey }}
        {{- end }}
        {{- with .Values.agent.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with .Values.agent.ports }}
      ports:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      resources:
        {{- toYaml .Values.agent.resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.agent.securityContext | nindent 8 }}
      {{- if or .Values.stratad.socketDir .Values.agent.volumeMounts .Values.auth.agentTokenSecret }}
      volumeMounts:
        {{- if .Values.stratad.socketDir }}
        - name: stratad-socket
          mountPath: {{ .Values.stratad.socketDir }}
        {{- end }}
        {{- if .Values.auth.agentTokenSecret }}
        - name: stratad-token
          mountPath: /etc/stratad-token
          readOnly: true
        {{- end }}
        {{- with .Values.agent.volumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
  volumes:
    {{- if ne .Values.workload.kind "StatefulSet" }}
    - name: stratad-data
      {{- if eq .Values.persistence.type "pvc" }}
      persistentVolumeClaim:
        claimName: {{ .Values.persistence.existingClaim | default (printf "%s-data" (include "stratad.name" .)) }}
      {{- else }}
      emptyDir:
        {{- toYaml .Values.persistence.emptyDir | nindent 8 }}
      {{- end }}
    {{- end }}
    {{- if .Values.stratad.socketDir }}
    - name: stratad-socket
      emptyDir:
        medium: Memory
        sizeLimit: 1Mi
    {{- end }}
    - name: stratad-config
      configMap:
        name: {{ include "stratad.name" . }}-config
    {{- if .Values.tls.enabled }}
    - name: stratad-tls
      secret:
        secretName: {{ .Values.tls.secretName }}
        defaultMode: 0440
    {{- end }}
    {{- if ne .Values.auth.mode "off" }}
    - name: stratad-auth
      secret:
        secretName: {{ .Values.auth.tokensSecret }}
        defaultMode: 0440
    {{- end }}
    {{- if .Values.encryption.enabled }}
    - name: stratad-encryption
      secret:
        secretName: {{ .Values.encryption.keySecret }}
        defaultMode: 0440
    {{- end }}
    {{- if .Values.auth.agentTokenSecret }}
    - name: stratad-token
      secret:
        secretName: {{ .Values.auth.agentTokenSecret }}
        defaultMode: 0440
    {{- end }}
    {{- with .Values.agent.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
