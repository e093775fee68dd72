{{/* Names: the release's fullname, capped at 63 characters as Kubernetes names are. */}}
{{- define "tritonforge.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tritonforge.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tritonforge.labels" -}}
{{ include "tritonforge.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The pods that serve (a single-node pod, or a multi-node group's leader): what the Service, the PodMonitor,
     the PDB and the InferencePool select. Workers of a multi-node group carry component=worker instead. */}}
{{- define "tritonforge.servingSelectorLabels" -}}
{{ include "tritonforge.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "tritonforge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tritonforge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tritonforge.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* GPUs of the whole model (tensor × pipeline) and of one pod. */}}
{{- define "tritonforge.worldSize" -}}
{{- mul (int .Values.parallelism.tensor) (int .Values.parallelism.pipeline) -}}
{{- end -}}

{{- define "tritonforge.gpusPerPod" -}}
{{- if .Values.multiNode.enabled -}}
{{- .Values.multiNode.gpusPerNode -}}
{{- else -}}
{{- include "tritonforge.worldSize" . -}}
{{- end -}}
{{- end -}}

{{/* Pods per multi-node group; refuses a world size the nodes cannot split evenly. */}}
{{- define "tritonforge.groupSize" -}}
{{- $world := int (include "tritonforge.worldSize" .) -}}
{{- $perNode := int .Values.multiNode.gpusPerNode -}}
{{- if ne (mod $world $perNode) 0 -}}
{{- fail (printf "multiNode: tensor × pipeline = %d is not a multiple of multiNode.gpusPerNode = %d" $world $perNode) -}}
{{- end -}}
{{- div $world $perNode -}}
{{- end -}}

{{- define "tritonforge.apiKeySecretName" -}}
{{- if .Values.apiKey.existingSecret -}}
{{- .Values.apiKey.existingSecret -}}
{{- else if .Values.apiKey.value -}}
{{- printf "%s-api-key" (include "tritonforge.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Checks that need several values at once (each value alone is checked by values.schema.json). */}}
{{- define "tritonforge.validate" -}}
{{- if and (eq .Values.repository.source "pvc") (not .Values.repository.pvc.claimName) -}}
{{- fail "repository.source=pvc needs repository.pvc.claimName: the claim that holds a built repository" -}}
{{- end -}}
{{- if and (eq .Values.repository.source "build") (not .Values.repository.build.checkpointClaimName) -}}
{{- fail "repository.source=build needs repository.build.checkpointClaimName: the claim that holds the checkpoint" -}}
{{- end -}}
{{- if and .Values.multiNode.enabled (ne .Values.repository.source "pvc") -}}
{{- fail "multiNode needs repository.source=pvc: every node of a group mounts the same built repository" -}}
{{- end -}}
{{- if and .Values.multiNode.enabled (lt (int (include "tritonforge.groupSize" .)) 2) -}}
{{- fail (printf "multiNode: tensor × pipeline = %s fits on one node of %v GPUs; leave multiNode.enabled false" (include "tritonforge.worldSize" .) .Values.multiNode.gpusPerNode) -}}
{{- end -}}
{{- if and .Values.lora.adapters (ne .Values.repository.source "build") -}}
{{- fail "lora.adapters needs repository.source=build: a built repository on a claim carries the adapters it was built with (tritonforge build --lora NAME=PATH)" -}}
{{- end -}}
{{- if and .Values.lora.adapters (not .Values.lora.claimName) -}}
{{- fail "lora.adapters needs lora.claimName: the claim that holds the adapters' folders" -}}
{{- end -}}
{{- if and .Values.apiKey.existingSecret .Values.apiKey.value -}}
{{- fail "apiKey: set existingSecret or value, not both" -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) -}}
{{- fail (printf "autoscaling.minReplicas (%v) is above autoscaling.maxReplicas (%v)" .Values.autoscaling.minReplicas .Values.autoscaling.maxReplicas) -}}
{{- end -}}
{{- if lt (int (include "tritonforge.exitTimeout" .)) 10 -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) leaves tritonforge serve %v s to stop after preStopSleepSeconds (%v) and a 5 s margin: give it at least 10" .Values.terminationGracePeriodSeconds (include "tritonforge.exitTimeout" .) .Values.preStopSleepSeconds) -}}
{{- end -}}
{{- end -}}

{{/* How long `tritonforge serve` takes to stop after SIGTERM (its --exit-timeout-s): the grace period less the
     preStop hook's sleep, which comes first, and a margin for serve's own exit once the server is gone. */}}
{{- define "tritonforge.exitTimeout" -}}
{{- sub (sub (int .Values.terminationGracePeriodSeconds) (int .Values.preStopSleepSeconds)) 5 -}}
{{- end -}}

{{/* The serving container's command: `tritonforge serve` with every port named, bound to the pod's address. */}}
{{- define "tritonforge.serveCommand" -}}
- tritonforge
- serve
- {{ .Values.repository.mountPath | quote }}
- --address=0.0.0.0
- --http-port={{ .Values.ports.http }}
- --grpc-port={{ .Values.ports.grpc }}
- --metrics-port={{ .Values.ports.metrics }}
- --openai-port={{ .Values.ports.openai }}
- --openai-model={{ .Values.serve.openaiModel }}
- --served-model-name={{ .Values.serve.servedModelName }}
- --wedged-after-s={{ .Values.serve.wedgedAfterS }}
- --exit-timeout-s={{ include "tritonforge.exitTimeout" . }}
- --log-verbose={{ .Values.serve.logVerbose }}
{{- range .Values.serve.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "tritonforge.serveEnv" -}}
- name: HOME
  value: /tmp
{{- if include "tritonforge.apiKeySecretName" . }}
- name: TRITONFORGE_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "tritonforge.apiKeySecretName" . }}
      key: {{ .Values.apiKey.secretKey }}
{{- end }}
{{- with .Values.serve.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "tritonforge.ports" -}}
- name: http
  containerPort: {{ .Values.ports.http }}
- name: grpc
  containerPort: {{ .Values.ports.grpc }}
- name: metrics
  containerPort: {{ .Values.ports.metrics }}
- name: openai
  containerPort: {{ .Values.ports.openai }}
{{- end -}}

{{/* The preStop hook: a sleep while the Service drops the terminating pod, which serves new requests until
     then; SIGTERM comes after it. */}}
{{- define "tritonforge.lifecycle" -}}
{{- if gt (int .Values.preStopSleepSeconds) 0 }}
lifecycle:
  preStop:
    exec:
      command: ["sleep", "{{ .Values.preStopSleepSeconds }}"]
{{- end }}
{{- end -}}

{{/* Probes: ready when the gateway's /health says Triton and the OpenAI model are ready; live while a one-token
     generation answers in time (`tritonforge probe`). */}}
{{- define "tritonforge.probes" -}}
startupProbe:
  httpGet:
    path: /health
    port: openai
  periodSeconds: {{ .Values.probes.startup.periodSeconds }}
  failureThreshold: {{ .Values.probes.startup.failureThreshold }}
readinessProbe:
  httpGet:
    path: /health
    port: openai
  periodSeconds: {{ .Values.probes.readiness.periodSeconds }}
  timeoutSeconds: {{ .Values.probes.readiness.timeoutSeconds }}
  failureThreshold: {{ .Values.probes.readiness.failureThreshold }}
{{- if .Values.probes.liveness.enabled }}
livenessProbe:
  exec:
    command:
      - tritonforge
      - probe
      - --url=127.0.0.1:{{ .Values.ports.grpc }}
      - --model={{ .Values.serve.openaiModel }}
      - --timeout-s={{ .Values.probes.liveness.timeoutS }}
  # The probe gives up after timeoutS and then up to 5 s to stop its request.
  timeoutSeconds: {{ add (int .Values.probes.liveness.timeoutS) 10 }}
  periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
  failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
{{- end }}
{{- end -}}

{{- define "tritonforge.gpuResources" -}}
{{- $gpus := include "tritonforge.gpusPerPod" . -}}
{{- $resources := deepCopy .Values.resources -}}
{{- $requests := default (dict) $resources.requests -}}
{{- $limits := default (dict) $resources.limits -}}
{{- $_ := set $requests .Values.gpuResource $gpus -}}
{{- $_ := set $limits .Values.gpuResource $gpus -}}
{{- if .Values.multiNode.enabled -}}
{{- range $name, $count := .Values.multiNode.extraResources -}}
{{- $_ := set $requests $name $count -}}
{{- $_ := set $limits $name $count -}}
{{- end -}}
{{- end -}}
{{- $_ := set $resources "requests" $requests -}}
{{- $_ := set $resources "limits" $limits -}}
{{- toYaml $resources -}}
{{- end -}}

{{/* Volumes every serving (and worker) pod mounts. */}}
{{- define "tritonforge.volumes" -}}
- name: repository
{{- if eq .Values.repository.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ .Values.repository.pvc.claimName }}
    readOnly: true
{{- else }}
  emptyDir:
    sizeLimit: {{ .Values.repository.build.sizeLimit }}
- name: checkpoint
  persistentVolumeClaim:
    claimName: {{ .Values.repository.build.checkpointClaimName }}
    readOnly: true
{{- if .Values.lora.adapters }}
- name: lora
  persistentVolumeClaim:
    claimName: {{ .Values.lora.claimName }}
    readOnly: true
{{- end }}
{{- end }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shm.sizeLimit }}
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "tritonforge.volumeMounts" -}}
- name: repository
  mountPath: {{ .Values.repository.mountPath }}
  readOnly: true
{{- if and (eq .Values.repository.source "pvc") .Values.repository.pvc.subPath }}
  subPath: {{ .Values.repository.pvc.subPath }}
{{- end }}
- name: dshm
  mountPath: /dev/shm
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* The init container that builds the repository from the checkpoint (repository.source=build). */}}
{{- define "tritonforge.buildInitContainer" -}}
- name: build
  image: {{ include "tritonforge.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - tritonforge
    - build
    - --model={{ .Values.repository.build.checkpointMountPath }}
    - --output={{ .Values.repository.mountPath }}
    - --repository-mount={{ .Values.repository.mountPath }}
    - --tp-size={{ .Values.parallelism.tensor }}
    - --pp-size={{ .Values.parallelism.pipeline }}
    # An emptyDir outlives a container restart: the build then replaces only the files it wrote before.
    - --force
    {{- range .Values.repository.build.args }}
    - {{ . | quote }}
    {{- end }}
    {{- range .Values.lora.adapters }}
    - {{ printf "--lora=%s=%s/%s" .name $.Values.lora.mountPath .path | quote }}
    {{- end }}
  env:
    - name: HOME
      value: /tmp
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  resources:
    {{- $build := deepCopy (default (dict) .Values.repository.build.resources) -}}
    {{- $requests := default (dict) $build.requests -}}
    {{- $limits := default (dict) $build.limits -}}
    {{- $_ := set $requests .Values.gpuResource (include "tritonforge.worldSize" .) -}}
    {{- $_ := set $limits .Values.gpuResource (include "tritonforge.worldSize" .) -}}
    {{- $_ := set $build "requests" $requests -}}
    {{- $_ := set $build "limits" $limits -}}
    {{- toYaml $build | nindent 4 }}
  volumeMounts:
    - name: repository
      mountPath: {{ .Values.repository.mountPath }}
    - name: checkpoint
      mountPath: {{ .Values.repository.build.checkpointMountPath }}
      readOnly: true
      {{- with .Values.repository.build.checkpointSubPath }}
      subPath: {{ . }}
      {{- end }}
    {{- if .Values.lora.adapters }}
    - name: lora
      mountPath: {{ .Values.lora.mountPath }}
      readOnly: true
      {{- with .Values.lora.subPath }}
      subPath: {{ . }}
      {{- end }}
    {{- end }}
    - name: dshm
      mountPath: /dev/shm
    - name: tmp
      mountPath: /tmp
{{- end -}}

{{- define "tritonforge.podSchedulingFields" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
{{- end -}}

{{/* mpirun's hostfile and rsh agent, for OpenMPI 4 (OMPI_MCA_*) and 5 (PRTE_MCA_*) alike. */}}
{{- define "tritonforge.mpiEnv" -}}
- name: TRITONFORGE_GPUS_PER_NODE
  value: {{ .Values.multiNode.gpusPerNode | quote }}
- name: TRITONFORGE_MPI_HOSTFILE
  value: /tmp/mpi/hostfile
- name: TRITONFORGE_KUBECTL
  value: /opt/kubectl/kubectl
- name: OMPI_MCA_orte_default_hostfile
  value: /tmp/mpi/hostfile
- name: OMPI_MCA_plm_rsh_agent
  value: /opt/tritonforge-mpi/kubexec.sh
- name: PRTE_MCA_prte_default_hostfile
  value: /tmp/mpi/hostfile
- name: PRTE_MCA_plm_rsh_agent
  value: /opt/tritonforge-mpi/kubexec.sh
{{- end -}}
