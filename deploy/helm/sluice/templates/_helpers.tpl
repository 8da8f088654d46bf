{{/*
Names, labels and the one sluice.yaml every service reads.
*/}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name; components append -<component> (at most 11
characters), so it is cut to 50. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end -}}

{{/* sluice.selectorLabels: dict "root" $ "component" name */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sluice.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The services, in data-flow order. */}}
{{- define "sluice.allComponents" -}}
ingest aggregator enforcer alerter reconciler gateway authz console
{{- end -}}

{{/* Where the chart mounts what it gives the binary. */}}
{{- define "sluice.configDir" -}}/etc/sluice/config{{- end -}}
{{- define "sluice.secretsDir" -}}/etc/sluice/secrets{{- end -}}
{{- define "sluice.configFile" -}}/etc/sluice/config/sluice.yaml{{- end -}}

{{/* The port a component's API listens on (none: empty). */}}
{{- define "sluice.apiPort" -}}
{{- $c := index .root.Values .component -}}
{{- if eq .component "enforcer" -}}
{{- if $c.admin.enabled }}{{ $c.admin.port }}{{ end -}}
{{- else if has .component (list "ingest" "gateway" "authz" "console") -}}
{{- $c.port -}}
{{- end -}}
{{- end -}}

{{/* The in-cluster URL of a component's Service on a port. */}}
{{- define "sluice.url" -}}
{{- printf "http://%s-%s.%s.svc:%v" (include "sluice.fullname" .root) .component .root.Release.Namespace .port -}}
{{- end -}}

{{/*
How long a component's own shutdown may take, in seconds: its
shutdown_timeout, and for the gateway and authz the usage flush that
follows it (and the gateway's deferred drain, which runs beside them).
*/}}
{{- define "sluice.shutdownBudget" -}}
{{- $c := index .root.Values .component -}}
{{- $b := int $c.shutdownTimeoutSeconds -}}
{{- if has .component (list "gateway" "authz") -}}
{{- $b = add $b (int $c.usage.flushTimeoutSeconds) -}}
{{- end -}}
{{- if and (eq .component "gateway") .root.Values.gateway.deferred.enabled -}}
{{- $b = max $b (int .root.Values.gateway.deferred.drainSeconds) -}}
{{- end -}}
{{- $b -}}
{{- end -}}

{{/* The process's shutdown_timeout for a component's pod: its budget plus
the process's own margin (stopping the ops endpoint, closing clients). */}}
{{- define "sluice.processShutdown" -}}
{{- add (include "sluice.shutdownBudget" . | int) (int .root.Values.shutdown.processMarginSeconds) -}}
{{- end -}}

{{- define "sluice.preStopSleep" -}}
{{- $c := index .root.Values .component -}}
{{- int (default 0 (index $c "preStopSleepSeconds")) -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: the preStop sleep, then the process's
whole shutdown_timeout, then a margin before the kubelet's SIGKILL. */}}
{{- define "sluice.terminationGrace" -}}
{{- add (include "sluice.preStopSleep" . | int) (include "sluice.processShutdown" . | int) (int .root.Values.shutdown.terminationMarginSeconds) -}}
{{- end -}}

{{/* Replicas (the HPA's minimum when it scales the component). */}}
{{- define "sluice.replicas" -}}
{{- $c := index .root.Values .component -}}
{{- if and (hasKey $c "autoscaling") $c.autoscaling.enabled -}}
{{- $c.autoscaling.minReplicas -}}
{{- else -}}
{{- $c.replicas -}}
{{- end -}}
{{- end -}}

{{/* A secret file the chart gives the binary: "value" from the chart's own
Secret, or an existing Secret's key. sluice.secretSource renders the
projected volume source; "path" is the file under the secrets folder. */}}
{{- define "sluice.secretSource" -}}
{{- include "sluice.secretSourceIn" (merge (dict "secret" (include "sluice.fullname" .root)) .) -}}
{{- end -}}

{{/* Whether a component runs and uses signal_auth (signs or verifies):
the pipeline's signers and verifiers, and a gateway, console or ingest
following the admin topic, whose records are signed. Takes {root, component}. */}}
{{- define "sluice.signs" -}}
{{- if has .component (list "aggregator" "enforcer" "alerter" "reconciler") }}true
{{- else if and (has .component (list "gateway" "console" "ingest")) (index .root.Values .component).followAdmin }}true{{ end -}}
{{- end -}}

{{/* Whether a front end (gateway, authz) sends usage to ingest over HTTP. */}}
{{- define "sluice.sendsToIngest" -}}
{{- if has .component (list "gateway" "authz") -}}
{{- $c := index .root.Values .component -}}
{{- if and $c.enabled (eq $c.usage.sink "ingest") }}true{{ end -}}
{{- end -}}
{{- end -}}

{{- define "sluice.usageKeyNeeded" -}}
{{- if or (include "sluice.sendsToIngest" (dict "root" . "component" "gateway")) (include "sluice.sendsToIngest" (dict "root" . "component" "authz")) }}true{{ end -}}
{{- end -}}

{{/* The SHA-256 of the key the chart's front ends send usage with. */}}
{{- define "sluice.usageKeySHA" -}}
{{- if .Values.usageKey.existingSecret.name -}}
{{- required "usageKey.sha256: with usageKey.existingSecret, the hex SHA-256 of that key (printf %s KEY | sha256sum), for ingest's keys file" .Values.usageKey.sha256 -}}
{{- else -}}
{{- required "usageKey.key: the key sluice gateway and authz send their usage events to ingest with (or usageKey.existingSecret and usageKey.sha256)" .Values.usageKey.key | sha256sum -}}
{{- end -}}
{{- end -}}

{{/* Settings the chart sets from its own values: given in .Values.config
they would disagree with the pods, the ports and the mounted files. */}}
{{- define "sluice.chartOwned" -}}
ops.listen shutdown_timeout migrate policy.file tenant_keys.file signal_auth.key_file signal_auth.keys signal_auth.sign_key embedded_kafka.enabled
kafka.brokers kafka.partitions kafka.replication_factor kafka.sasl.password kafka.sasl.password_file
clickhouse.addr clickhouse.addrs clickhouse.password clickhouse.password_file clickhouse.cluster clickhouse.sharded clickhouse.database
redis.addr redis.addrs redis.cluster redis.password redis.password_file redis.key_prefix redis.sentinel.master redis.sentinel.addrs redis.sentinel.password redis.sentinel.password_file
services.ingest.listen services.ingest.shutdown_timeout services.ingest.gateway_keys.file services.ingest.follow_admin
services.aggregator.shutdown_timeout
services.enforcer.shutdown_timeout services.enforcer.replica_id services.enforcer.admin.listen services.enforcer.admin.tokens
services.alerter.shutdown_timeout services.reconciler.shutdown_timeout
services.gateway.listen services.gateway.shutdown_timeout services.gateway.usage.sink services.gateway.usage.ingest_url services.gateway.usage.ingest_api_key_file services.gateway.usage.ingest_api_key_env services.gateway.usage.flush_timeout services.gateway.admission.gateways services.gateway.deferred.enabled services.gateway.deferred.drain services.gateway.follow_admin
services.authz.listen services.authz.shutdown_timeout services.authz.usage.sink services.authz.usage.ingest_url services.authz.usage.ingest_api_key_file services.authz.usage.ingest_api_key_env services.authz.usage.flush_timeout services.authz.admission.gateways
services.console.listen services.console.admin_url services.console.metrics_urls services.console.follow_admin
{{- end -}}

{{- define "sluice.checkConfig" -}}
{{- range $path := splitList " " (include "sluice.chartOwned" . | replace "\n" " ") -}}
{{- if $path -}}
{{- $node := $.Values.config -}}
{{- $found := true -}}
{{- range $part := splitList "." $path -}}
{{- if and $found (kindIs "map" $node) (hasKey $node $part) -}}
{{- $node = index $node $part -}}
{{- else -}}
{{- $found = false -}}
{{- end -}}
{{- end -}}
{{- if $found -}}
{{- fail (printf "config.%s: set by the chart from its own values (see the chart's README, \"Values\"); remove it from config" $path) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
sluice.yaml: the shared sections and every enabled service's section, in
the binary's own names (docs/configuration.md), with .Values.config merged
over them. What differs per pod (the enforcer's replica_id, the process's
shutdown_timeout, the signal_auth key file, the tenant keys) comes through
the pod's SLUICE_* environment instead.
*/}}
{{- define "sluice.config" -}}
{{- include "sluice.checkConfig" . -}}
{{- $v := .Values -}}
{{- $sec := include "sluice.secretsDir" . -}}
{{- $c := dict -}}
{{- $_ := set $c "ops" (dict "listen" (printf "0.0.0.0:%v" $v.ops.port)) -}}
{{- $_ := set $c "log" (dict "format" "json" "level" "info") -}}
{{- $_ := set $c "migrate" (eq $v.migrations.mode "service") -}}
{{- $_ := set $c "policy" (dict "file" (printf "%s/policy.yaml" (ternary $sec (include "sluice.configDir" .) $v.policy.secret))) -}}

{{- /* Kafka */ -}}
{{- $k := dict "partitions" (int $v.kafka.partitions) "replication_factor" (int $v.kafka.replicationFactor) -}}
{{- if include "sluice.needsKafka" . -}}
{{- $_ := set $k "brokers" (include "sluice.nonEmpty" (dict "v" $v.kafka.brokers "msg" "kafka.brokers: the Kafka seed brokers host:port the services use (this chart installs no Kafka)") | fromJsonArray) -}}
{{- else if $v.kafka.brokers -}}
{{- $_ := set $k "brokers" $v.kafka.brokers -}}
{{- end -}}
{{- if $v.kafka.sasl.mechanism -}}
{{- $s := dict "mechanism" $v.kafka.sasl.mechanism "username" (required "kafka.sasl.username: the SASL user (with kafka.sasl.mechanism)" $v.kafka.sasl.username) -}}
{{- $_ := set $s "password_file" (printf "%s/kafka-sasl-password" $sec) -}}
{{- $_ := set $k "sasl" $s -}}
{{- end -}}
{{- $_ := set $c "kafka" $k -}}

{{- /* ClickHouse */ -}}
{{- $ch := dict "database" $v.clickhouse.database "username" $v.clickhouse.username -}}
{{- if include "sluice.needsClickHouse" . -}}
{{- $_ := set $ch "addrs" (include "sluice.nonEmpty" (dict "v" $v.clickhouse.addrs "msg" "clickhouse.addrs: the ClickHouse servers' native-protocol host:port (this chart installs no ClickHouse)") | fromJsonArray) -}}
{{- else if $v.clickhouse.addrs -}}
{{- $_ := set $ch "addrs" $v.clickhouse.addrs -}}
{{- end -}}
{{- if include "sluice.clickhousePassword" . -}}
{{- $_ := set $ch "password_file" (printf "%s/clickhouse-password" $sec) -}}
{{- end -}}
{{- if $v.clickhouse.cluster -}}
{{- $_ := set $ch "cluster" $v.clickhouse.cluster -}}
{{- $_ := set $ch "sharded" $v.clickhouse.sharded -}}
{{- end -}}
{{- $_ := set $c "clickhouse" $ch -}}

{{- /* Redis */ -}}
{{- $r := dict "key_prefix" $v.redis.keyPrefix -}}
{{- if $v.redis.sentinel.master -}}
{{- $sn := dict "master" $v.redis.sentinel.master "addrs" (include "sluice.nonEmpty" (dict "v" $v.redis.sentinel.addrs "msg" "redis.sentinel.addrs: the Sentinels' host:port (with redis.sentinel.master)") | fromJsonArray) -}}
{{- if or $v.redis.sentinel.password $v.redis.sentinel.existingSecret.name -}}
{{- $_ := set $sn "password_file" (printf "%s/redis-sentinel-password" $sec) -}}
{{- end -}}
{{- $_ := set $r "sentinel" $sn -}}
{{- else -}}
{{- $addrs := include "sluice.nonEmpty" (dict "v" $v.redis.addrs "msg" "redis.addrs: the Redis address host:port (or a Redis Cluster's seed nodes with redis.cluster, or redis.sentinel); this chart installs no Redis") | fromJsonArray -}}
{{- if $v.redis.cluster -}}
{{- $_ := set $r "cluster" true -}}
{{- $_ := set $r "addrs" $addrs -}}
{{- else -}}
{{- if gt (len $addrs) 1 -}}
{{- fail "redis.addrs: several addresses are a Redis Cluster's seed nodes: set redis.cluster: true, or give the one Redis" -}}
{{- end -}}
{{- $_ := set $r "addr" (first $addrs) -}}
{{- end -}}
{{- end -}}
{{- if $v.redis.username -}}{{- $_ := set $r "username" $v.redis.username -}}{{- end -}}
{{- if or $v.redis.password $v.redis.existingSecret.name -}}
{{- $_ := set $r "password_file" (printf "%s/redis-password" $sec) -}}
{{- end -}}
{{- $_ := set $c "redis" $r -}}

{{- /* The services' sections */ -}}
{{- $svc := dict -}}
{{- if $v.ingest.enabled -}}
{{- $in := dict "listen" (printf "0.0.0.0:%v" $v.ingest.port) "shutdown_timeout" (printf "%ds" (int $v.ingest.shutdownTimeoutSeconds)) -}}
{{- if include "sluice.ingestKeysGiven" . -}}
{{- $_ := set $in "gateway_keys" (dict "file" (printf "%s/gateway-keys.yaml" $sec)) -}}
{{- end -}}
{{- if $v.ingest.followAdmin -}}{{- $_ := set $in "follow_admin" true -}}{{- end -}}
{{- $_ := set $svc "ingest" $in -}}
{{- end -}}
{{- range $name := list "aggregator" "alerter" "reconciler" -}}
{{- if (index $v $name).enabled -}}
{{- $_ := set $svc $name (dict "shutdown_timeout" (printf "%ds" (int (index $v $name).shutdownTimeoutSeconds))) -}}
{{- end -}}
{{- end -}}
{{- if and $v.alerter.enabled $v.alerter.alertmanagerURL -}}
{{- $_ := set (index $svc "alerter") "alertmanager" (dict "url" $v.alerter.alertmanagerURL) -}}
{{- end -}}
{{- if $v.enforcer.enabled -}}
{{- $adm := dict "listen" (ternary (printf "0.0.0.0:%v" $v.enforcer.admin.port) "" $v.enforcer.admin.enabled) -}}
{{- $tokens := list -}}
{{- range $i, $t := $v.adminTokens -}}
{{- $name := required (printf "adminTokens[%d].name: who uses the token (the audit actor)" $i) (index $t "name") -}}
{{- if index $t "token" -}}
{{- $tokens = append $tokens (dict "name" $name "sha256" (sha256sum (index $t "token"))) -}}
{{- else -}}
{{- $tokens = append $tokens (dict "name" $name "sha256" (required (printf "adminTokens[%d]: give token (kept in the chart's Secret, its SHA-256 in sluice.yaml) or sha256" $i) (index $t "sha256"))) -}}
{{- end -}}
{{- end -}}
{{- if $tokens -}}{{- $_ := set $adm "tokens" $tokens -}}{{- end -}}
{{- $_ := set $svc "enforcer" (dict "shutdown_timeout" (printf "%ds" (int $v.enforcer.shutdownTimeoutSeconds)) "admin" $adm) -}}
{{- end -}}
{{- range $name := list "gateway" "authz" -}}
{{- $fe := index $v $name -}}
{{- if $fe.enabled -}}
{{- $u := dict "sink" $fe.usage.sink "flush_timeout" (printf "%ds" (int $fe.usage.flushTimeoutSeconds)) -}}
{{- if eq $fe.usage.sink "ingest" -}}
{{- $url := $fe.usage.ingestURL -}}
{{- if not $url -}}
{{- if not $v.ingest.enabled -}}
{{- fail (printf "%s.usage.ingestURL: ingest is not enabled in this release; name the ingest %s sends usage to (or set %s.usage.sink to kafka or none)" $name $name $name) -}}
{{- end -}}
{{- $url = include "sluice.url" (dict "root" $ "component" "ingest" "port" $v.ingest.port) -}}
{{- end -}}
{{- $_ := set $u "ingest_url" $url -}}
{{- $_ := set $u "ingest_api_key_file" (printf "%s/usage-key" $sec) -}}
{{- end -}}
{{- $s := dict "listen" (printf "0.0.0.0:%v" $fe.port) "shutdown_timeout" (printf "%ds" (int $fe.shutdownTimeoutSeconds)) "usage" $u -}}
{{- $_ := set $s "admission" (dict "gateways" (int (include "sluice.replicas" (dict "root" $ "component" $name)))) -}}
{{- if eq $name "gateway" -}}
{{- $d := dict "enabled" $fe.deferred.enabled -}}
{{- if $fe.deferred.enabled -}}{{- $_ := set $d "drain" (printf "%ds" (int $fe.deferred.drainSeconds)) -}}{{- end -}}
{{- $_ := set $s "deferred" $d -}}
{{- if $fe.followAdmin -}}{{- $_ := set $s "follow_admin" true -}}{{- end -}}
{{- end -}}
{{- $_ := set $svc $name $s -}}
{{- end -}}
{{- end -}}
{{- if $v.console.enabled -}}
{{- $co := dict "listen" (printf "0.0.0.0:%v" $v.console.port) -}}
{{- if $v.console.followAdmin -}}{{- $_ := set $co "follow_admin" true -}}{{- end -}}
{{- if $v.console.adminURL -}}
{{- $_ := set $co "admin_url" $v.console.adminURL -}}
{{- else if and $v.enforcer.enabled $v.enforcer.admin.enabled -}}
{{- $_ := set $co "admin_url" (include "sluice.url" (dict "root" $ "component" "enforcer" "port" $v.enforcer.admin.port)) -}}
{{- else -}}
{{- fail "console.adminURL: the enforcer's admin API is not in this release (enforcer.enabled, enforcer.admin.enabled); name the one the console acts through" -}}
{{- end -}}
{{- $urls := list -}}
{{- range $name := list "ingest" "aggregator" "enforcer" -}}
{{- if (index $v $name).enabled -}}
{{- $urls = append $urls (printf "%s/metrics" (include "sluice.url" (dict "root" $ "component" $name "port" $v.ops.port))) -}}
{{- end -}}
{{- end -}}
{{- if $urls -}}{{- $_ := set $co "metrics_urls" $urls -}}{{- end -}}
{{- $_ := set $svc "console" $co -}}
{{- end -}}
{{- $_ := set $c "services" $svc -}}
{{- toYaml (mustMergeOverwrite $c (deepCopy $v.config)) -}}
{{- end -}}

{{- define "sluice.clickhousePassword" -}}
{{- if or .Values.clickhouse.password .Values.clickhouse.existingSecret.name }}true{{ end -}}
{{- end -}}

{{- define "sluice.ingestKeysGiven" -}}
{{- if or .Values.ingest.gatewayKeys .Values.ingest.gatewayKeysExistingSecret.name (include "sluice.usageKeyNeeded" .) }}true{{ end -}}
{{- end -}}

{{/* ingest's keys file: the gateways' keys from the values, and the key of
the chart's own gateway and authz, which may report any tenant. */}}
{{- define "sluice.ingestKeysFile" -}}
{{- $keys := list -}}
{{- range .Values.ingest.gatewayKeys -}}{{- $keys = append $keys . -}}{{- end -}}
{{- if include "sluice.usageKeyNeeded" . -}}
{{- $keys = append $keys (dict "id" (printf "%s-frontends" (include "sluice.fullname" .)) "sha256" (include "sluice.usageKeySHA" .) "tenants" (list "*")) -}}
{{- end -}}
{{- toYaml (dict "keys" $keys) -}}
{{- end -}}

{{/* The signal_auth key file: key_id:secret per line. */}}
{{- define "sluice.signalKeysFile" -}}
{{- range $i, $k := .Values.signalAuth.keys -}}
{{ required (printf "signalAuth.keys[%d].id" $i) $k.id }}:{{ required (printf "signalAuth.keys[%d].secret: at least 32 bytes, e.g. openssl rand -hex 32" $i) $k.secret }}
{{ end -}}
{{- end -}}

{{- define "sluice.signalKeysGiven" -}}
{{- if or .Values.signalAuth.keys .Values.signalAuth.existingSecret.name }}true{{ end -}}
{{- end -}}

{{- define "sluice.tenantKeysGiven" -}}
{{- if or .Values.tenantKeys.keys .Values.tenantKeys.existingSecret.name }}true{{ end -}}
{{- end -}}

{{/* Pod anti-affinity: replicas of a component on different nodes
(soft: preferred, hard: required, none). */}}
{{- define "sluice.affinity" -}}
{{- $c := index .root.Values .component -}}
{{- if (index $c "affinity") -}}
{{- toYaml (index $c "affinity") -}}
{{- else -}}
{{- $mode := default .root.Values.podDefaults.antiAffinity (index $c "antiAffinity") -}}
{{- $term := dict "labelSelector" (dict "matchLabels" (include "sluice.selectorLabels" . | fromYaml)) "topologyKey" .root.Values.podDefaults.antiAffinityTopologyKey -}}
{{- if eq $mode "hard" -}}
{{- toYaml (dict "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term))) -}}
{{- else if eq $mode "soft" -}}
{{- toYaml (dict "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term)))) -}}
{{- else if ne $mode "none" -}}
{{- fail (printf "%s.antiAffinity: %q is not soft, hard or none" .component $mode) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The engines' credentials, as Secret data (base64): every pod and the
migration Job mount them, since sluice.yaml names their files. */}}
{{- define "sluice.engineSecretData" -}}
{{- with .Values.clickhouse }}{{ if and .password (not .existingSecret.name) }}
clickhouse-password: {{ .password | b64enc }}
{{- end }}{{ end }}
{{- with .Values.kafka.sasl }}{{ if and .mechanism .password (not .existingSecret.name) }}
kafka-sasl-password: {{ .password | b64enc }}
{{- end }}{{ end }}
{{- with .Values.redis }}{{ if and .password (not .existingSecret.name) }}
redis-password: {{ .password | b64enc }}
{{- end }}{{ end }}
{{- with .Values.redis.sentinel }}{{ if and .master .password (not .existingSecret.name) }}
redis-sentinel-password: {{ .password | b64enc }}
{{- end }}{{ end }}
{{- if and .Values.policy.secret }}
policy.yaml: {{ required "policy.content: the quota policy (policy.file) every service follows" .Values.policy.content | b64enc }}
{{- end }}
{{- end -}}

{{/* The engines' credential files as projected volume sources; "secret"
names the chart Secret they come from (the release's or the migration's). */}}
{{- define "sluice.engineSources" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- if include "sluice.clickhousePassword" $root }}
{{ include "sluice.secretSourceIn" (dict "root" $root "secret" .secret "existing" $v.clickhouse.existingSecret "path" "clickhouse-password" "what" "clickhouse") }}
{{- end }}
{{- if and $v.kafka.sasl.mechanism (or $v.kafka.sasl.password $v.kafka.sasl.existingSecret.name) }}
{{ include "sluice.secretSourceIn" (dict "root" $root "secret" .secret "existing" $v.kafka.sasl.existingSecret "path" "kafka-sasl-password" "what" "kafka.sasl") }}
{{- end }}
{{- if or $v.redis.password $v.redis.existingSecret.name }}
{{ include "sluice.secretSourceIn" (dict "root" $root "secret" .secret "existing" $v.redis.existingSecret "path" "redis-password" "what" "redis") }}
{{- end }}
{{- if and $v.redis.sentinel.master (or $v.redis.sentinel.password $v.redis.sentinel.existingSecret.name) }}
{{ include "sluice.secretSourceIn" (dict "root" $root "secret" .secret "existing" $v.redis.sentinel.existingSecret "path" "redis-sentinel-password" "what" "redis.sentinel") }}
{{- end }}
{{- if $v.policy.secret }}
{{ include "sluice.secretSourceIn" (dict "root" $root "secret" .secret "existing" (dict) "path" "policy.yaml" "what" "policy") }}
{{- end }}
{{- end -}}

{{- define "sluice.secretSourceIn" -}}
{{- if and .existing .existing.name -}}
- secret:
    name: {{ .existing.name }}
    items:
      - key: {{ required (printf "%s.existingSecret.key: the key of Secret %s that holds it" .what .existing.name) .existing.key }}
        path: {{ .path }}
{{- else -}}
- secret:
    name: {{ .secret }}
    items:
      - key: {{ .path }}
        path: {{ .path }}
{{- end -}}
{{- end -}}

{{/* Whether a service of the release uses Kafka: the pipeline, a front end
that sends usage to Kafka, the gateway's deferred requests. */}}
{{- define "sluice.needsKafka" -}}
{{- $v := .Values -}}
{{- if or $v.ingest.enabled $v.aggregator.enabled $v.enforcer.enabled $v.alerter.enabled $v.reconciler.enabled -}}true
{{- else if and $v.gateway.enabled (or (eq $v.gateway.usage.sink "kafka") $v.gateway.deferred.enabled) -}}true
{{- else if and $v.authz.enabled (eq $v.authz.usage.sink "kafka") -}}true
{{- else if and $v.gateway.enabled $v.gateway.followAdmin -}}true
{{- else if and $v.console.enabled $v.console.followAdmin -}}true
{{- end -}}
{{- end -}}

{{/* Whether a service of the release (or the migration Job) uses ClickHouse. */}}
{{- define "sluice.needsClickHouse" -}}
{{- $v := .Values -}}
{{- if or $v.ingest.enabled $v.aggregator.enabled $v.enforcer.enabled $v.reconciler.enabled $v.console.enabled (ne $v.migrations.mode "none") -}}true{{- end -}}
{{- end -}}

{{/* A list value that must not be empty, as JSON (fromJsonArray), or a
failure naming it. */}}
{{- define "sluice.nonEmpty" -}}
{{- if not .v -}}{{- fail .msg -}}{{- end -}}
{{- toJson .v -}}
{{- end -}}
