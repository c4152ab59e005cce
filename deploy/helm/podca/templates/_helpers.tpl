{{/*
The object name: the release name when it already says podca (`helm install podca ...` gives
the names of the kustomize manifests), else <release>-podca.
*/}}
{{- define "podca.fullname" -}}
{{- if contains "podca" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-podca" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "podca.selectorLabels" -}}
app.kubernetes.io/name: podca
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "podca.labels" -}}
{{ include "podca.selectorLabels" . }}
app.kubernetes.io/part-of: podca
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The ServiceAccount podca runs as (and the RBAC subjects). */}}
{{- define "podca.serviceAccount" -}}
{{- include "podca.fullname" . -}}
{{- end -}}

{{/* Fixed container ports: the Service, probes and NetworkPolicy follow them. */}}
{{- define "podca.grpcPort" -}}8443{{- end -}}
{{- define "podca.metricsPort" -}}9090{{- end -}}
{{- define "podca.oidcPort" -}}8444{{- end -}}

{{/* Where the federation ConfigMap (initial bundles, Web PKI roots) is mounted. */}}
{{- define "podca.federationDir" -}}/etc/podca/federation{{- end -}}
{{/* The emptyDir keeping each federated trust domain's last good bundle. */}}
{{- define "podca.federationStateDir" -}}/var/lib/podca/federation{{- end -}}
{{/* The https_web bundle endpoint's certificate and key (bundleEndpoint.tlsSecretName). */}}
{{- define "podca.bundleTlsDir" -}}/etc/podca/bundle-tls{{- end -}}

{{/* The federation entries' bundle endpoint ports other than 443 (which the API server rule
already opens), as a JSON array. */}}
{{- define "podca.federationPorts" -}}
{{- $ports := list -}}
{{- range .Values.federation -}}
{{- $host := (urlParse .bundleEndpointUrl).host -}}
{{- $port := 443 -}}
{{- if regexMatch ":[0-9]+$" $host -}}{{- $port = regexFind "[0-9]+$" $host | int -}}{{- end -}}
{{- if and (ne $port 443) (not (has $port $ports)) -}}{{- $ports = append $ports $port -}}{{- end -}}
{{- end -}}
{{- toJson $ports -}}
{{- end -}}

{{/* "true" unless config.jwt.enabled is false: JWT-SVIDs, OIDC discovery, the JWKS ConfigMap. */}}
{{- define "podca.jwtEnabled" -}}
{{- $jwt := .Values.config.jwt | default dict -}}
{{- if or (not (hasKey $jwt "enabled")) $jwt.enabled -}}true{{- end -}}
{{- end -}}

{{/* The JWKS ConfigMap's name: config.jwt.jwks_configmap, default <fullname>-jwks ("": none). */}}
{{- define "podca.jwksConfigMap" -}}
{{- $jwt := .Values.config.jwt | default dict -}}
{{- if hasKey $jwt "jwks_configmap" -}}{{ $jwt.jwks_configmap }}{{- else -}}{{ printf "%s-jwks" (include "podca.fullname" .) }}{{- end -}}
{{- end -}}

{{/*
The CAs. `ca` is the CA named `default` ([ca]); `cas.<name>` declares more ([cas.<name>], each a
kubernetes.io/tls Secret in the release namespace). A signer signs with the CA its `ca` key
names, else with `default`; a signer's tenant (config.signers.<signer>.tenants.<tenant>) with
the CA its own `ca` names, else with the CA named like the tenant, which must be under `cas`.
Only the CAs some signer or tenant uses are opened by podca, so only they are rendered ([ca]),
granted (RBAC) and mounted (the HSM's volumes).
*/}}

{{/* The CA a signer policy names: its `ca`, else "default". */}}
{{- define "podca.caOf" -}}
{{- if and (kindIs "map" .) (get . "ca") -}}{{ get . "ca" }}{{- else -}}default{{- end -}}
{{- end -}}

{{/*
The signers podca is configured with, as JSON: config.signers (entries set to null left out);
when it has none, the documented placeholder (placeholderSigner), so that a first install works
and a values file's own signers replace the placeholder instead of being merged with it.
*/}}
{{- define "podca.signers" -}}
{{- $out := dict -}}
{{- range $name, $policy := .Values.config.signers -}}
{{- if kindIs "map" $policy -}}{{- $_ := set $out $name $policy -}}{{- end -}}
{{- end -}}
{{- if not $out -}}
{{- $p := .Values.placeholderSigner -}}
{{- $_ := set $out $p.name $p.policy -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
Every tenant of every signer (config.signers.<signer>.tenants.<tenant>), in signer then tenant
order, as a JSON list of {signer, tenant, ca, spec}: `ca` is the CA that signs for the tenant,
its `ca` key, else the CA named like the tenant (as podca's Config::tenant_cas).
*/}}
{{- define "podca.tenants" -}}
{{- $out := list -}}
{{- range $signer, $policy := include "podca.signers" . | fromJson -}}
{{- if kindIs "map" $policy -}}
{{- range $tenant, $spec := (get $policy "tenants" | default dict) -}}
{{- if kindIs "map" $spec -}}
{{- $ca := get $spec "ca" | default $tenant -}}
{{- $out = append $out (dict "signer" $signer "tenant" $tenant "ca" $ca "spec" $spec) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
The names of the CAs podca opens, sorted (as podca's Config::cas_in_use), as JSON: the CA of
every signer, and the CA of every tenant.
*/}}
{{- define "podca.casInUse" -}}
{{- $names := list -}}
{{- range $signer, $policy := include "podca.signers" . | fromJson -}}
{{- $names = append $names (include "podca.caOf" $policy) -}}
{{- end -}}
{{- range include "podca.tenants" . | fromJsonArray -}}
{{- $names = append $names .ca -}}
{{- end -}}
{{- $names | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* "true" when some signer signs with the `ca` CA (named default). */}}
{{- define "podca.defaultCaInUse" -}}
{{- if has "default" (include "podca.casInUse" . | fromJsonArray) -}}true{{- end -}}
{{- end -}}

{{/* "true" when the CA key is in an HSM: ca.backend pkcs11, used by some signer. */}}
{{- define "podca.hsm" -}}
{{- if and (eq .Values.ca.backend "pkcs11") (include "podca.defaultCaInUse" .) -}}true{{- end -}}
{{- end -}}

{{/* The kubernetes.io/tls Secret of the CA `.name` ("" when it is not Secret-held, or unknown). */}}
{{- define "podca.caSecretName" -}}
{{- $v := .root.Values -}}
{{- if eq .name "default" -}}
{{- if eq $v.ca.backend "secret" -}}{{ $v.ca.secretName }}{{- end -}}
{{- else -}}
{{- (get ($v.cas | default dict) .name | default dict).secretName | default "" -}}
{{- end -}}
{{- end -}}

{{/* The Secrets of the Secret-held CAs some signer uses, in CA name order, as JSON. */}}
{{- define "podca.caSecrets" -}}
{{- $root := . -}}
{{- $secrets := list -}}
{{- range include "podca.casInUse" . | fromJsonArray -}}
{{- $secret := include "podca.caSecretName" (dict "root" $root "name" .) -}}
{{- if $secret -}}{{- $secrets = append $secrets $secret -}}{{- end -}}
{{- end -}}
{{- toJson $secrets -}}
{{- end -}}

{{/*
The primary CA, as podca's primary_ca: the CA of the gRPC signer (config.grpc.signer, else the
only signer, else the only entry of config.grpc.signers), else the first CA in use. The JWT-SVID
keys live with it only.
*/}}
{{- define "podca.primaryCa" -}}
{{- $signers := include "podca.signers" . | fromJson -}}
{{- $grpc := .Values.config.grpc | default dict -}}
{{- $signer := "" -}}
{{- if $grpc.signer -}}
{{- $signer = $grpc.signer -}}
{{- else if eq (len $signers) 1 -}}
{{- $signer = keys $signers | first -}}
{{- else if eq (len ($grpc.signers | default list)) 1 -}}
{{- $signer = first $grpc.signers -}}
{{- end -}}
{{- if and $signer (hasKey $signers $signer) -}}
{{- include "podca.caOf" (get $signers $signer) -}}
{{- else -}}
{{- include "podca.casInUse" . | fromJsonArray | first | default "default" -}}
{{- end -}}
{{- end -}}

{{/* The JWT key Secret beside the primary CA's Secret: config.jwt.keys_secret, default
<primary CA's secretName>-jwt; "" when the primary CA is not Secret-held. */}}
{{- define "podca.jwtKeysSecret" -}}
{{- $jwt := .Values.config.jwt | default dict -}}
{{- $primary := include "podca.caSecretName" (dict "root" . "name" (include "podca.primaryCa" .)) -}}
{{- if $primary -}}
{{- if hasKey $jwt "keys_secret" -}}{{ $jwt.keys_secret }}{{- else -}}{{ printf "%s-jwt" $primary }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* The ledger log's checkpoint key Secret (config.ledger.log on, primary CA in a Secret):
config.ledger.log.key_secret, else <primary CA Secret>-log; empty otherwise. */}}
{{- define "podca.logKeySecret" -}}
{{- $log := (.Values.config.ledger | default dict).log | default dict -}}
{{- $primary := include "podca.caSecretName" (dict "root" . "name" (include "podca.primaryCa" .)) -}}
{{- if and $log.enabled $primary -}}
{{- if $log.key_secret -}}{{ $log.key_secret }}{{- else -}}{{ printf "%s-log" $primary }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* Mount points. */}}
{{- define "podca.configDir" -}}/etc/podca{{- end -}}
{{- define "podca.caDir" -}}/var/run/podca/ca{{- end -}}
{{- define "podca.pinDir" -}}/var/run/podca/pkcs11-pin{{- end -}}
{{- define "podca.ledgerUrlDir" -}}/var/run/podca/ledger-url{{- end -}}
{{- define "podca.ledgerCaDir" -}}/var/run/podca/ledger-ca{{- end -}}

{{/* config.ledger.backend as podca reads it (redb when unset). */}}
{{- define "podca.ledgerBackend" -}}
{{- $ledger := .Values.config.ledger | default dict -}}
{{- $ledger.backend | default "redb" -}}
{{- end -}}

{{/* Checks across values that the schema cannot express. */}}
{{- define "podca.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicaCount > 1 needs leaderElection.enabled=true: without leader election every replica would write" -}}
{{- end -}}
{{- $ledger := .Values.config.ledger | default dict -}}
{{- $backend := include "podca.ledgerBackend" . -}}
{{- if eq $backend "redb" -}}
{{- fail "config.ledger.backend=redb needs a persistent volume, which the chart does not mount: use none (the audit log only) or postgres" -}}
{{- end -}}
{{- if eq $backend "postgres" -}}
{{- if not .Values.ledger.postgresUrlSecret.name -}}
{{- fail "config.ledger.backend=postgres needs ledger.postgresUrlSecret.name: the Secret holding the connection URL" -}}
{{- end -}}
{{- if hasKey $ledger "url_file" -}}
{{- fail "config.ledger.url_file is set by the chart from ledger.postgresUrlSecret; leave it out" -}}
{{- end -}}
{{- if and .Values.ledger.postgresCaSecret.name (hasKey $ledger "ca_file") -}}
{{- fail "config.ledger.ca_file and ledger.postgresCaSecret.name: set one (the chart sets ca_file from the Secret)" -}}
{{- end -}}
{{- if and (ne ($ledger.tls | default "verify-full") "disable") (not .Values.ledger.postgresCaSecret.name) (not (hasKey $ledger "ca_file")) -}}
{{- fail "config.ledger.tls=verify-full needs the CA that verifies the server: ledger.postgresCaSecret.name or config.ledger.ca_file" -}}
{{- end -}}
{{- end -}}
{{- if ($ledger.log | default dict).enabled -}}
{{- if ne $backend "postgres" -}}
{{- fail "config.ledger.log needs config.ledger.backend=postgres: the log is the ledger's" -}}
{{- end -}}
{{- if and (not (include "podca.logKeySecret" .)) (ne .Values.ca.backend "pkcs11") -}}
{{- fail "config.ledger.log needs the gRPC signer's CA in a Secret or a PKCS#11 token: the checkpoint key is kept beside it" -}}
{{- end -}}
{{- end -}}
{{- $signers := include "podca.signers" . | fromJson -}}
{{- $grpc := .Values.config.grpc | default dict -}}
{{- if and (gt (len $signers) 1) (not $grpc.signer) -}}
{{- fail "config.grpc.signer: with several signers, name the one gRPC requests get" -}}
{{- end -}}
{{- $cas := .Values.cas | default dict -}}
{{- range $signer, $policy := include "podca.signers" . | fromJson -}}
{{- $ca := include "podca.caOf" $policy -}}
{{- if and (ne $ca "default") (not (hasKey $cas $ca)) -}}
{{- fail (printf "config.signers.%s.ca = %s: no such CA; declare it under cas (cas.%s.secretName), or leave ca out to sign with `ca`" $signer $ca $ca) -}}
{{- end -}}
{{- end -}}
{{- /* A tenant's CA is a CA of its own (as podca's config check): declared under cas, the
CA of no signer and of no other tenant. */ -}}
{{- $signerCas := dict -}}
{{- range $signer, $policy := include "podca.signers" . | fromJson -}}
{{- $_ := set $signerCas (include "podca.caOf" $policy) $signer -}}
{{- end -}}
{{- $tenantCas := dict -}}
{{- range include "podca.tenants" . | fromJsonArray -}}
{{- $where := printf "config.signers.%s.tenants.%s" .signer .tenant -}}
{{- if not (hasKey $cas .ca) -}}
{{- fail (printf "%s signs with CA %s: no such CA; declare it under cas (cas.%s.secretName): each tenant's CA is a CA of its own" $where .ca .ca) -}}
{{- end -}}
{{- if hasKey $signerCas .ca -}}
{{- fail (printf "%s signs with CA %s, which is also the CA of signer %s: a tenant's CA signs for the tenant alone" $where .ca (get $signerCas .ca)) -}}
{{- end -}}
{{- if hasKey $tenantCas .ca -}}
{{- fail (printf "%s signs with CA %s, as %s does: each tenant needs its own CA" $where .ca (get $tenantCas .ca)) -}}
{{- end -}}
{{- $_ := set $tenantCas .ca $where -}}
{{- end -}}
{{- $seen := dict -}}
{{- range include "podca.casInUse" . | fromJsonArray -}}
{{- $secret := include "podca.caSecretName" (dict "root" $ "name" .) -}}
{{- if and $secret (hasKey $seen $secret) -}}
{{- fail (printf "CAs %s and %s are both the Secret %s: they would be one CA; give each its own secretName" (get $seen $secret) . $secret) -}}
{{- end -}}
{{- if $secret -}}{{- $_ := set $seen $secret . -}}{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The podca config file: .Values.config with [ca], [cas.<name>], [admin] and [grpc] listen filled
in from the chart's own settings, written as TOML (Helm's toToml writes every number as a float, which
podca's integer settings refuse).
*/}}
{{- define "podca.config" -}}
{{- $root := . -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $signers := include "podca.signers" . | fromJson -}}
{{- $_ := set $cfg "signers" $signers -}}
{{- if .Values.cas -}}
{{- $cas := dict -}}
{{- range $name, $ca := .Values.cas -}}
{{- $_ := set $cas $name (dict "backend" "secret" "secret" (printf "%s/%s" $root.Release.Namespace $ca.secretName)) -}}
{{- end -}}
{{- $_ := set $cfg "cas" $cas -}}
{{- end -}}
{{- $ca := dict "backend" .Values.ca.backend -}}
{{- if eq .Values.ca.backend "secret" -}}
{{- $_ := set $ca "secret" (printf "%s/%s" .Release.Namespace .Values.ca.secretName) -}}
{{- else -}}
{{- $p := .Values.ca.pkcs11 -}}
{{- $_ := set $ca "dir" (include "podca.caDir" .) -}}
{{- $_ := set $ca "pkcs11_uri" $p.uri -}}
{{- $_ := set $ca "pkcs11_module" $p.module -}}
{{- $_ := set $ca "pkcs11_pin_file" (printf "%s/pin" (include "podca.pinDir" .)) -}}
{{- $_ := set $ca "pkcs11_mode" $p.mode -}}
{{- if not (kindIs "invalid" $p.intermediateLifetimeSeconds) -}}
{{- $_ := set $ca "intermediate_lifetime_seconds" $p.intermediateLifetimeSeconds -}}
{{- end -}}
{{- end -}}
{{- /* [ca] only when some signer signs with it: podca opens no other. */ -}}
{{- if include "podca.defaultCaInUse" . -}}
{{- $_ := set $cfg "ca" $ca -}}
{{- end -}}
{{- if eq (include "podca.ledgerBackend" .) "postgres" -}}
{{- $ledger := $cfg.ledger -}}
{{- $_ := set $ledger "url_file" (printf "%s/url" (include "podca.ledgerUrlDir" .)) -}}
{{- if .Values.ledger.postgresCaSecret.name -}}
{{- $_ := set $ledger "ca_file" (printf "%s/ca.crt" (include "podca.ledgerCaDir" .)) -}}
{{- end -}}
{{- end -}}
{{- $grpc := $cfg.grpc | default dict -}}
{{- if and (not $grpc.signer) (eq (len $signers) 1) -}}
{{- $_ := set $grpc "signer" (keys $signers | first) -}}
{{- end -}}
{{- $_ := set $grpc "listen" (printf "0.0.0.0:%s" (include "podca.grpcPort" .)) -}}
{{- if and (eq ($grpc.tls | default "self-issued") "self-issued") (not (hasKey $grpc "tls_service")) (not (hasKey $grpc "tls_dns_names")) -}}
{{- $_ := set $grpc "tls_service" (include "podca.fullname" .) -}}
{{- end -}}
{{- $_ := set $cfg "grpc" $grpc -}}
{{- $admin := $cfg.admin | default dict -}}
{{- $_ := set $admin "listen" (printf "0.0.0.0:%s" (include "podca.metricsPort" .)) -}}
{{- $_ := set $cfg "admin" $admin -}}
{{- $jwt := $cfg.jwt | default dict -}}
{{- $_ := set $jwt "oidc_listen" (printf "0.0.0.0:%s" (include "podca.oidcPort" .)) -}}
{{- if not $jwt.issuer -}}
{{- $_ := set $jwt "issuer" (printf "https://%s.%s.svc" (include "podca.fullname" .) .Release.Namespace) -}}
{{- end -}}
{{- $_ := set $jwt "jwks_configmap" (include "podca.jwksConfigMap" .) -}}
{{- $_ := set $cfg "jwt" $jwt -}}
{{- with .Values.bundleEndpoint -}}
{{- if .enabled -}}
{{- $be := dict "listen" (printf "0.0.0.0:%d" (int .port)) "profile" .profile -}}
{{- if eq .profile "https_web" -}}
{{- if not .tlsSecretName -}}{{- fail "bundleEndpoint: profile https_web needs tlsSecretName (a kubernetes.io/tls Secret)" -}}{{- end -}}
{{- $_ := set $be "cert_file" (printf "%s/tls.crt" (include "podca.bundleTlsDir" $root)) -}}
{{- $_ := set $be "key_file" (printf "%s/tls.key" (include "podca.bundleTlsDir" $root)) -}}
{{- else -}}
{{- if not .spiffeId -}}{{- fail "bundleEndpoint: profile https_spiffe needs spiffeId" -}}{{- end -}}
{{- $_ := set $be "spiffe_id" .spiffeId -}}
{{- end -}}
{{- $_ := set $cfg "bundle_endpoint" $be -}}
{{- end -}}
{{- end -}}
{{- if .Values.federation -}}
{{- $entries := list -}}
{{- range .Values.federation -}}
{{- if and (eq .profile "https_web") .endpointSpiffeId -}}{{- fail (printf "federation %s: endpointSpiffeId is for profile https_spiffe; https_web checks the URL's host against Web PKI roots" .trustDomain) -}}{{- end -}}
{{- if and (eq .profile "https_spiffe") .caBundle -}}{{- fail (printf "federation %s: caBundle is for profile https_web; https_spiffe authenticates the endpoint with initialBundle" .trustDomain) -}}{{- end -}}
{{- $e := dict "trust_domain" .trustDomain "bundle_endpoint_url" .bundleEndpointUrl "profile" .profile -}}
{{- $_ := set $e "last_good_file" (printf "%s/%s.json" (include "podca.federationStateDir" $root) .trustDomain) -}}
{{- if .endpointSpiffeId -}}{{- $_ := set $e "endpoint_spiffe_id" .endpointSpiffeId -}}{{- end -}}
{{- if .initialBundle -}}{{- $_ := set $e "initial_bundle" (printf "%s/%s.json" (include "podca.federationDir" $root) .trustDomain) -}}{{- end -}}
{{- if .caBundle -}}{{- $_ := set $e "ca_file" (printf "%s/%s.roots.pem" (include "podca.federationDir" $root) .trustDomain) -}}{{- end -}}
{{- if hasKey . "minRefreshSeconds" -}}{{- $_ := set $e "min_refresh_seconds" .minRefreshSeconds -}}{{- end -}}
{{- if hasKey . "maxRefreshSeconds" -}}{{- $_ := set $e "max_refresh_seconds" .maxRefreshSeconds -}}{{- end -}}
{{- $entries = append $entries $e -}}
{{- end -}}
{{- $_ := set $cfg "federation" $entries -}}
{{- end -}}
# podca serve configuration, rendered by the podca Helm chart from its values (schema:
# authority/src/config.rs; unknown keys are errors).
{{ include "podca.toml.table" (dict "path" "" "table" $cfg) }}
{{- end -}}

{{/* The config file as mounted: podca.config without runs of blank lines. */}}
{{- define "podca.configFile" -}}
{{- regexReplaceAll "\n\n+" (include "podca.config" .) "\n\n" | trim -}}
{{- end -}}

{{/* A TOML key: bare when it can be, else a quoted string. */}}
{{- define "podca.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{/* A TOML value: string, boolean, integer (whole numbers), float, an array of those, or an
inline table (a signer's `rules` entries). */}}
{{- define "podca.toml.value" -}}
{{- $v := . -}}
{{- if kindIs "string" $v -}}
{{- toJson $v -}}
{{- else if kindIs "bool" $v -}}
{{- $v -}}
{{- else if or (kindIs "float64" $v) (kindIs "int64" $v) (kindIs "int" $v) -}}
{{- if eq (float64 (int64 $v)) (float64 $v) -}}{{ int64 $v }}{{- else -}}{{ $v }}{{- end -}}
{{- else if kindIs "slice" $v -}}
[{{ range $i, $e := $v }}{{ if $i }}, {{ end }}{{ include "podca.toml.value" $e }}{{ end }}]
{{- else if kindIs "map" $v -}}
{ {{- range $i, $k := keys $v | sortAlpha }}{{ if $i }},{{ end }} {{ include "podca.toml.key" $k }} = {{ include "podca.toml.value" (get $v $k) }}{{ end }} }
{{- else -}}
{{- fail (printf "config: %v (%s) cannot be written as TOML" $v (kindOf $v)) -}}
{{- end -}}
{{- end -}}

{{/*
A TOML table at `path` ("" for the top level): its keys and values, then each sub-table.
Null values are left out (Helm's way of deleting a default).
*/}}
{{- define "podca.toml.table" -}}
{{- $path := .path -}}
{{- $m := .table -}}
{{- $scalars := list -}}
{{- $tables := list -}}
{{- range $k, $v := $m -}}
{{- if kindIs "map" $v -}}
{{- $tables = append $tables $k -}}
{{- else if not (kindIs "invalid" $v) -}}
{{- $scalars = append $scalars $k -}}
{{- end -}}
{{- end -}}
{{- if and $path (or $scalars (not $tables)) }}
[{{ $path }}]
{{- end -}}
{{- range $scalars }}
{{ include "podca.toml.key" . }} = {{ include "podca.toml.value" (get $m .) }}
{{- end -}}
{{- range $tables -}}
{{- $key := include "podca.toml.key" . -}}
{{- $sub := $key -}}
{{- if $path -}}{{- $sub = printf "%s.%s" $path $key -}}{{- end }}
{{ include "podca.toml.table" (dict "path" $sub "table" (get $m .)) }}
{{- end -}}
{{- end -}}

{{/* The federation ConfigMap's data (YAML), empty when no entry has a file. */}}
{{- define "podca.federationFiles" -}}
{{- range .Values.federation -}}
{{- if .initialBundle }}
{{ printf "%s.json" .trustDomain }}: {{ .initialBundle | toJson }}
{{- end -}}
{{- if .caBundle }}
{{ printf "%s.roots.pem" .trustDomain }}: {{ .caBundle | toJson }}
{{- end -}}
{{- end -}}
{{- end -}}
