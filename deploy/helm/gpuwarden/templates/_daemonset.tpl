{{/*
The agent's DaemonSet, for one kind of node: a dict of root (the chart's
context), name (of the DaemonSet and its ConfigMap), component (its pods'
label), config (the agent's configuration) and nodeSelector.
*/}}
{{- define "gpuwarden.daemonset" -}}
{{- $c := .config }}
{{- $libDir := dir $c.devicePlugin.interposerPath }}
{{- $stateDir := dir $c.enforcement.stateFile }}
{{- $r := $c.remote }}
{{- /* A node whose pods may run on remote GPUs: the client library is installed, the relay dials. */}}
{{- $remoteClient := or (gt (len $r.servers) 0) $c.dra.remotePool }}
{{- $remoteCreds := and $.root.Values.remote.secretName (or $r.enabled $remoteClient) }}
{{- $dra := $c.dra.enabled }}
{{- if and $dra $c.devicePlugin.enabled }}
{{- fail "config.dra.enabled with config.devicePlugin.enabled: a GPU would be offered twice; set config.devicePlugin.enabled false" }}
{{- end }}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ $.name }}
  namespace: {{ $.root.Release.Namespace }}
  labels:
    {{- include "gpuwarden.componentLabels" . | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- include "gpuwarden.componentSelector" . | nindent 6 }}
  {{- with $.root.Values.updateStrategy }}
  updateStrategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  template:
    metadata:
      labels:
        {{- include "gpuwarden.componentSelector" . | nindent 8 }}
        {{- with $.root.Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        # A new configuration rolls the agents.
        checksum/config: {{ toYaml $c | sha256sum }}
        {{- with $.root.Values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "gpuwarden.serviceAccountName" $.root }}
      # Every process of the node is visible: eBPF attribution and the
      # interposer's pids, which are host pids to NVML.
      hostPID: true
      priorityClassName: {{ $.root.Values.priorityClassName | quote }}
      {{- with $.root.Values.runtimeClassName }}
      runtimeClassName: {{ . }}
      {{- end }}
      {{- with $.root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $.root.Values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $.root.Values.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if $.root.Values.interposer.install }}
      initContainers:
        # Put the interposer where the device plugin mounts it from: written
        # aside and renamed, so containers that run keep the file they mapped.
        - name: install-interposer
          image: "{{ $.root.Values.image.repository }}:{{ $.root.Values.image.tag | default $.root.Chart.AppVersion }}"
          imagePullPolicy: {{ $.root.Values.image.pullPolicy }}
          command: ["/bin/sh", "-c"]
          args:
            - >-
              set -e;
              cp "$SRC" /host-lib/.libgpuwarden.so.new;
              chmod 0755 /host-lib/.libgpuwarden.so.new;
              mv -f /host-lib/.libgpuwarden.so.new "/host-lib/$(basename "$DST")"
              {{- if $remoteClient }};
              rm -rf /host-remote/.new; mkdir /host-remote/.new;
              cp -P "$REMOTE_SRC"/* /host-remote/.new/;
              for f in /host-remote/.new/*; do mv -f "$f" /host-remote/; done;
              rmdir /host-remote/.new
              {{- end }}
          env:
            - name: SRC
              value: {{ $.root.Values.interposer.imagePath | quote }}
            - name: DST
              value: {{ $c.devicePlugin.interposerPath | quote }}
            {{- if $remoteClient }}
            - name: REMOTE_SRC
              value: {{ $.root.Values.remote.libraryImagePath | quote }}
            {{- end }}
          volumeMounts:
            - name: interposer
              mountPath: /host-lib
            {{- if $remoteClient }}
            - name: remote-library
              mountPath: /host-remote
            {{- end }}
          resources:
            {{- toYaml $.root.Values.resources | nindent 12 }}
      {{- end }}
      containers:
        - name: agent
          image: "{{ $.root.Values.image.repository }}:{{ $.root.Values.image.tag | default $.root.Chart.AppVersion }}"
          imagePullPolicy: {{ $.root.Values.image.pullPolicy }}
          args: ["agent", "--config", "/etc/gpuwarden/config.yaml"]
          env:
            # nodeName in the configuration is empty: the agent uses $NODE_NAME.
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            {{- if and $remoteCreds $.root.Values.remote.perNodeCertificates }}
            # Each node's own certificate from the Secret.
            - name: GPUWARDEN_REMOTE_CERT
              value: "{{ dir $r.cert }}/$(NODE_NAME).crt"
            - name: GPUWARDEN_REMOTE_KEY
              value: "{{ dir $r.key }}/$(NODE_NAME).key"
            {{- end }}
            {{- with $.root.Values.env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          securityContext:
            # eBPF (uprobes, maps), freezing cgroups, device nodes: privileged.
            privileged: true
          {{- $remotePort := and $r.enabled $.root.Values.remote.hostPort }}
          {{- if or $c.http.enabled $remotePort }}
          ports:
            {{- if $c.http.enabled }}
            - name: metrics
              containerPort: {{ regexReplaceAll "^.*:" $c.http.listen "" }}
              protocol: TCP
            {{- end }}
            {{- if $remotePort }}
            # Remote GPU sessions: clients dial the node's address.
            - name: remote
              containerPort: {{ regexReplaceAll "^.*:" $r.listen "" }}
              hostPort: {{ regexReplaceAll "^.*:" $r.listen "" }}
              protocol: TCP
            {{- end }}
          {{- end }}
          {{- if $c.http.enabled }}
          livenessProbe:
            httpGet:
              path: /healthz
              port: metrics
            initialDelaySeconds: 10
            periodSeconds: 20
          readinessProbe:
            httpGet:
              path: /readyz
              port: metrics
            periodSeconds: 10
          {{- end }}
          resources:
            {{- toYaml $.root.Values.resources | nindent 12 }}
          volumeMounts:
            # The file alone, so the remote Secret can be mounted beside it.
            - name: config
              mountPath: /etc/gpuwarden/config.yaml
              subPath: config.yaml
              readOnly: true
            {{- if $remoteCreds }}
            - name: remote-credentials
              mountPath: {{ dir $r.ca }}
              readOnly: true
            {{- end }}
            {{- if $remoteClient }}
            - name: remote-library
              mountPath: {{ $r.libraryDir }}
              readOnly: true
            {{- end }}
            - name: bpffs
              mountPath: /sys/fs/bpf
            {{- if $.root.Values.tracefs }}
            - name: tracefs
              mountPath: /sys/kernel/tracing
            {{- end }}
            - name: host-proc
              mountPath: {{ $c.paths.proc }}
              readOnly: true
            - name: cgroup
              mountPath: {{ $c.paths.cgroup }}
            - name: control
              mountPath: {{ $c.controlDir }}
            - name: device-plugins
              mountPath: {{ $c.devicePlugin.kubeletDir }}
            - name: pod-resources
              mountPath: {{ dir $c.kubelet.podResourcesSocket }}
            {{- if $dra }}
            - name: dra-registrar
              mountPath: {{ $c.dra.registrarDir }}
            - name: dra-plugin
              mountPath: {{ $c.dra.pluginDir }}
            - name: cdi
              mountPath: {{ $c.dra.cdiDir }}
            {{- end }}
            - name: interposer
              mountPath: {{ $libDir }}
              readOnly: true
            - name: state
              mountPath: {{ $stateDir }}
      volumes:
        - name: config
          configMap:
            name: {{ $.name }}
        {{- if $remoteCreds }}
        - name: remote-credentials
          secret:
            secretName: {{ $.root.Values.remote.secretName }}
            defaultMode: 0400
        {{- end }}
        {{- if $remoteClient }}
        # The remote client library: the kubelet mounts it into pods from here.
        - name: remote-library
          hostPath:
            path: {{ $r.libraryDir }}
            type: DirectoryOrCreate
        {{- end }}
        - name: bpffs
          hostPath:
            path: /sys/fs/bpf
            type: Directory
        {{- if $.root.Values.tracefs }}
        - name: tracefs
          hostPath:
            path: /sys/kernel/tracing
            type: ""
        {{- end }}
        - name: host-proc
          hostPath:
            path: /proc
            type: Directory
        - name: cgroup
          hostPath:
            path: /sys/fs/cgroup
            type: Directory
        # Control blocks: the kubelet mounts files from here into containers,
        # so the agent uses the host's path.
        - name: control
          hostPath:
            path: {{ $c.controlDir }}
            type: DirectoryOrCreate
        - name: device-plugins
          hostPath:
            path: {{ $c.devicePlugin.kubeletDir }}
            type: Directory
        - name: pod-resources
          hostPath:
            path: {{ dir $c.kubelet.podResourcesSocket }}
            type: DirectoryOrCreate
        {{- if $dra }}
        - name: dra-registrar
          hostPath:
            path: {{ $c.dra.registrarDir }}
            type: DirectoryOrCreate
        - name: dra-plugin
          hostPath:
            path: {{ $c.dra.pluginDir }}
            type: DirectoryOrCreate
        # CDI specs of prepared claims: the runtime reads them from here.
        - name: cdi
          hostPath:
            path: {{ $c.dra.cdiDir }}
            type: DirectoryOrCreate
        {{- end }}
        - name: interposer
          hostPath:
            path: {{ $libDir }}
            type: DirectoryOrCreate
        # Settings made with `gpuwarden ctl`: on the host, so a new agent pod
        # reads what the one before it saved.
        - name: state
          hostPath:
            path: {{ $stateDir }}
            type: DirectoryOrCreate
{{- end }}
