{{/* The image of the scheduler and workers: dl1's release unless a tag is given. */}}
{{- define "dl1.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "dl1.labels" -}}
app.kubernetes.io/part-of: dl1
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/* An environment variable read from the store's Secret. */}}
{{- define "dl1.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .key }}
      {{- if .optional }}
      optional: true
      {{- end }}
{{- end }}

{{/* The pod of a dl1 worker: dl1's worker settings (cluster/README.md, dl1.deploy.worker_settings),
     one thread, Dask's memory limit equal to the pod's, the store's credentials by reference. */}}
{{- define "dl1.workerPod" -}}
replicas: {{ .replicas }}
spec:
  securityContext:
    runAsNonRoot: true
    runAsUser: 1000
    runAsGroup: 1000
  containers:
    - name: worker
      image: {{ include "dl1.image" .root | quote }}
      imagePullPolicy: {{ .root.Values.image.pullPolicy }}
      args:
        - dask
        - worker
        - --name
        - $(DASK_WORKER_NAME)
        - --nthreads
        - "1"
        - --memory-limit
        - {{ printf "%sB" .root.Values.worker.memory }}
        - --local-directory
        - /scratch
        - --no-dashboard
        - --preload
        - dl1.runtime.worker
        - --preload
        - dl1.runtime.nohttp
      env:
        - name: MALLOC_MMAP_THRESHOLD_
          value: "65536"
        - name: DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED
          value: "False"
        - name: DASK_DISTRIBUTED__WORKER__HTTP__ROUTES
          value: "[]"
        - name: NUMBA_CACHE_DIR
          value: /scratch/numba-cache
        {{- $secret := .root.Values.store.secretName }}
        {{- include "dl1.secretEnv" (dict "name" "AWS_ACCESS_KEY_ID" "secret" $secret "key" "aws-access-key-id") | nindent 8 }}
        {{- include "dl1.secretEnv" (dict "name" "AWS_SECRET_ACCESS_KEY" "secret" $secret "key" "aws-secret-access-key") | nindent 8 }}
        {{- include "dl1.secretEnv" (dict "name" "AWS_DEFAULT_REGION" "secret" $secret "key" "aws-default-region" "optional" true) | nindent 8 }}
        {{- include "dl1.secretEnv" (dict "name" "AWS_ENDPOINT_URL" "secret" $secret "key" "aws-endpoint-url" "optional" true) | nindent 8 }}
      resources:
        requests:
          cpu: {{ .root.Values.worker.cpu | quote }}
          memory: {{ .root.Values.worker.memory }}
        limits:
          cpu: {{ .root.Values.worker.cpu | quote }}
          memory: {{ .root.Values.worker.memory }}
      securityContext:
        allowPrivilegeEscalation: false
        capabilities:
          drop: ["ALL"]
      volumeMounts:
        - name: scratch
          mountPath: /scratch
  volumes:
    - name: scratch
      emptyDir:
        sizeLimit: {{ .root.Values.worker.scratch }}
{{- end }}
