//! Prometheus metrics (prefix `podca_`): one registry, seconds as the unit, low-cardinality labels.

use podca_signer::SignerPolicy;
use podca_signer::rules::{RuleCounts, RuleSet};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SettleLabels {
    pub signer: String,
    pub reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignerLabels {
    pub signer: String,
}

/// Declares a metric-label enum, its `ALL` list and its `as_str` from one table, so that a new
/// cause has exactly one label and the list of labels cannot miss it (as `podca_signer::reason`).
macro_rules! label_values {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$variant_meta])* $variant, )+
        }

        impl $name {
            /// Every cause, in declaration order.
            pub const ALL: &'static [$name] = &[$( $name::$variant, )+];

            /// The `cause` label value (dashboards and alerts match on it, so it never changes).
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl EncodeLabelValue for $name {
            fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
                EncodeLabelValue::encode(&self.as_str(), encoder)
            }
        }
    };
}

label_values! {
    /// Why the PCR controller tried a request again (`podca_retries_total{cause}`).
    pub enum RetryCause {
        /// Reading the PodCertificateRequest failed.
        Read => "read",
        /// The `/status` write failed.
        Write => "write",
        /// The `/status` write conflicted (409) and the request is still ours to settle.
        Conflict => "conflict",
        /// The signer's policy is not loaded yet.
        Policy => "policy",
        /// The signing task failed (panicked or was cancelled).
        Sign => "sign",
        /// The CA backend is unavailable.
        CaBackend => "ca_backend",
        /// The namespace labels the policy reads are not synced yet.
        NamespaceLabels => "namespace_labels",
        /// The pod facts the policy reads could not be read.
        PodFacts => "pod_facts",
        /// The ledger could not record the decision.
        Ledger => "ledger",
        /// The pod or Services the `kubernetes.io/service-ca` vocabulary needs could not be read.
        ServiceCa => "service_ca",
    }
}

label_values! {
    /// Why a `/status` write came too late (`podca_late_writes_total{cause}`).
    pub enum LateCause {
        /// The PodCertificateRequest was deleted (404).
        Gone => "gone",
        /// Someone else settled the request first.
        SettledElsewhere => "settled_elsewhere",
        /// The write conflicted (409) with a copy someone else settled.
        Conflict => "conflict",
    }
}

/// `podca_retries_total`'s labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    pub cause: RetryCause,
}

/// `podca_late_writes_total`'s labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LateLabels {
    pub cause: LateCause,
}

/// Why something was refused: a CA history (`podca_ca_history_rejected_total`), a gRPC
/// request (`podca_grpc_refusals_total`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// A CA, by its name in the configuration (`default`: the `[ca]` table).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CaNameLabels {
    pub ca: String,
}

/// A Kubernetes API call, by podca's name for it (`podca_kube_request_timeouts_total`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub call: &'static str,
}

/// The kind of a ClusterTrustBundle write: `create`, `update` or `delete`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: &'static str,
}

/// A gRPC method and the status code it answered with.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GrpcCallLabels {
    /// `Service/Method`, e.g. `podca.v1.PodCA/IssueCertificate`.
    pub method: &'static str,
    /// The gRPC status code's name, e.g. `OK`, `UNAUTHENTICATED`.
    pub code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// The gRPC edge's metrics. Cloning shares the same series; a `GrpcMetrics::default()` that
/// was never registered counts into nothing anyone exports (tests, `podca dev` before wiring).
#[derive(Debug, Clone)]
pub struct GrpcMetrics {
    /// `podca_grpc_requests_total{method,code}`.
    pub requests: Family<GrpcCallLabels, Counter>,
    /// `podca_grpc_request_duration_seconds{method}`.
    pub request_seconds: Family<MethodLabels, Histogram, fn() -> Histogram>,
    /// `podca_grpc_refusals_total{reason}`: requests refused, by why.
    pub refusals: Family<ReasonLabels, Counter>,
    /// `podca_tokenreview_requests_total{result}` (authenticated|refused|error).
    pub token_reviews: Family<ResultLabels, Counter>,
    /// `podca_tokenreview_duration_seconds`.
    pub token_review_seconds: Histogram,
    /// `podca_tokenreview_cache_total{result}` (hit|miss|negative_hit).
    pub token_cache: Family<ResultLabels, Counter>,
    /// `podca_grpc_connections_open`: TCP connections of the gRPC listener open now
    /// (handshakes included).
    pub connections_open: Gauge,
    /// `podca_grpc_connections_refused_total{reason}`: TCP connections closed at accept by a
    /// cap (`per_peer`: `max_connections_per_peer`; `total`: `max_connections`).
    pub connections_refused: Family<ReasonLabels, Counter>,
    /// `podca_grpc_tls_handshake_failures_total{reason}`: TLS handshakes that failed
    /// (`error`: a protocol error or a refused client certificate; `timeout`: slower than 10 s).
    pub tls_handshake_failures: Family<ReasonLabels, Counter>,
}

fn fast_histogram() -> Histogram {
    // 0.5 ms … ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Default for GrpcMetrics {
    fn default() -> Self {
        GrpcMetrics {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(fast_histogram),
            refusals: Family::default(),
            token_reviews: Family::default(),
            token_review_seconds: fast_histogram(),
            token_cache: Family::default(),
            connections_open: Gauge::default(),
            connections_refused: Family::default(),
            tls_handshake_failures: Family::default(),
        }
    }
}

impl GrpcMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "grpc_requests",
            "gRPC requests answered, by method and status code",
            self.requests.clone(),
        );
        registry.register(
            "grpc_request_duration_seconds",
            "Seconds from a gRPC request to its answer (streams: to the first message), by method",
            self.request_seconds.clone(),
        );
        registry.register(
            "grpc_refusals",
            "gRPC requests refused, by reason",
            self.refusals.clone(),
        );
        registry.register(
            "tokenreview_requests",
            "TokenReviews sent to the Kubernetes API, by result (authenticated, refused, error)",
            self.token_reviews.clone(),
        );
        registry.register(
            "tokenreview_duration_seconds",
            "Seconds a TokenReview took",
            self.token_review_seconds.clone(),
        );
        registry.register(
            "tokenreview_cache",
            "Bearer-token lookups in the TokenReview caches (hit, miss, negative_hit)",
            self.token_cache.clone(),
        );
        registry.register(
            "grpc_connections_open",
            "TCP connections of the gRPC listener open now, TLS handshakes included",
            self.connections_open.clone(),
        );
        registry.register(
            "grpc_connections_refused",
            "gRPC TCP connections closed at accept by a connection cap, by reason (per_peer, total)",
            self.connections_refused.clone(),
        );
        registry.register(
            "grpc_tls_handshake_failures",
            "TLS handshakes on the gRPC listener that failed, by reason (error, timeout)",
            self.tls_handshake_failures.clone(),
        );
    }
}

/// An OIDC discovery request: `path` is `discovery`, `jwks` or `other` (never the raw path, so
/// a scanner cannot grow the series); `status` the HTTP status code.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OidcRequestLabels {
    pub path: &'static str,
    pub status: u16,
}

/// OIDC discovery ([`crate::oidc`]) and the JWKS ConfigMap. Cloning shares the series; a
/// default one that was never registered counts into nothing anyone exports.
#[derive(Debug, Clone, Default)]
pub struct OidcMetrics {
    /// `podca_oidc_requests_total{path,status}`.
    pub requests: Family<OidcRequestLabels, Counter>,
    /// `podca_oidc_connections_refused_total`: connections closed at accept (the cap).
    pub connections_refused: Counter,
    /// `podca_oidc_tls_handshake_failures_total`.
    pub tls_handshake_failures: Counter,
    /// `podca_jwks_configmap_writes_total{op}` (create, update).
    pub configmap_writes: Family<OpLabels, Counter>,
    /// `podca_jwks_configmap_errors_total`: failed reads and writes of the JWKS ConfigMap, and
    /// a ConfigMap of that name podca does not own.
    pub configmap_errors: Counter,
}

impl OidcMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "oidc_requests",
            "OIDC discovery requests answered, by path (discovery, jwks, other) and status",
            self.requests.clone(),
        );
        registry.register(
            "oidc_connections_refused",
            "OIDC discovery connections closed at accept by the connection cap",
            self.connections_refused.clone(),
        );
        registry.register(
            "oidc_tls_handshake_failures",
            "TLS handshakes on the OIDC discovery listener that failed or timed out",
            self.tls_handshake_failures.clone(),
        );
        registry.register(
            "jwks_configmap_writes",
            "Writes of the JWKS ConfigMap, by op (create, update)",
            self.configmap_writes.clone(),
        );
        registry.register(
            "jwks_configmap_errors",
            "Failed reads or writes of the JWKS ConfigMap, and refusals to overwrite a foreign one",
            self.configmap_errors.clone(),
        );
    }
}

fn latency_histogram() -> Histogram {
    // 5 ms … ~20 min.
    Histogram::new(exponential_buckets(0.005, 2.0, 18))
}

/// Every metric the controller exports.
#[derive(Debug)]
pub struct Metrics {
    /// The one registry. Components that own their metrics register them in a sub-registry
    /// of their own ([`Metrics::register_component`]), also after the `Metrics` is shared.
    registry: std::sync::Mutex<Registry>,
    /// The signers' rule sets whose counters are exported ([`Metrics::export_policies`]).
    exported_rules: ExportedRules,
    pub issued: Family<SettleLabels, Counter>,
    pub denied: Family<SettleLabels, Counter>,
    pub failed: Family<SettleLabels, Counter>,
    pub settle_seconds: Family<SignerLabels, Histogram, fn() -> Histogram>,
    pub queue_depth: Gauge,
    pub in_flight: Gauge,
    /// notAfter of the CA that signs now, by CA name.
    pub ca_not_after: Family<CaNameLabels, Gauge>,
    pub leader: Gauge,
    /// Writes that found the PCR deleted (404) or already settled by someone else (409/422).
    pub late_writes: Family<LateLabels, Counter>,
    /// Transient failures that were retried, by cause.
    pub retries: Family<RetryLabels, Counter>,
    /// Writes the API server refused for a reason retrying cannot fix.
    pub writes_rejected: Counter,
    pub watch_errors: Counter,
    /// ClusterTrustBundle writes, by operation (create, update, delete).
    pub ctb_writes: Family<OpLabels, Counter>,
    /// Bundles restored after someone else changed or deleted them.
    pub ctb_drift_repairs: Counter,
    /// Failed ClusterTrustBundle reads or writes (retried).
    pub ctb_publish_errors: Counter,
    /// Publisher passes completed (each reconciles every bundle, then collects garbage).
    pub ctb_passes: Counter,
    /// The CA snapshot generation the last completed pass published from.
    pub ctb_pass_generation: Gauge,
    /// notAfter of each CA generation's issuing certificate, by generation and state.
    pub ca_generation_not_after: Family<crate::rotation::CaLabels, Gauge>,
    /// When the rotation schedule next has something to do (0: nothing planned), by CA.
    pub ca_next_rotation: Family<CaNameLabels, Gauge>,
    /// The `ca_generation_not_after` series each CA set last, so that a CA replaces its own
    /// series and leaves the other CAs' alone.
    ca_generation_series: std::sync::Mutex<BTreeMap<String, Vec<crate::rotation::CaLabels>>>,
    /// `not_after` of each active and retired JWT signing key, by kid and state (a prepared
    /// key has none yet: see `jwt_key_published`).
    pub jwt_key_not_after: Family<crate::jwt::JwtKeyLabels, Gauge>,
    /// When each published JWT signing key was first published, by kid and state.
    pub jwt_key_published: Family<crate::jwt::JwtKeyLabels, Gauge>,
    /// The JWT keys' propagation window (`[jwt] propagation_seconds`), for the expiry alert.
    pub jwt_key_propagation: Gauge,
    /// JWT key rotation checks that failed (the keys in force stay).
    pub jwt_key_rotation_errors: Counter,
    /// `podca_jwt_key_secret_writes_total{op}` (create, update): writes of the Secret backend's
    /// JWT key Secret (`podca_controller::jwt_secret`); only the leader writes.
    pub jwt_key_secret_writes: Family<OpLabels, Counter>,
    /// Rotation steps taken, by step.
    pub rotation_steps: Family<crate::rotation::StepLabels, Counter>,
    /// Rotation checks that failed (the CA in force stays).
    pub rotation_errors: Counter,
    /// Rotation checks made (failed ones included).
    pub rotation_checks: Counter,
    /// Signers each CA signs for (`podca_ca_signers{ca}`).
    pub ca_signers: Family<CaNameLabels, Gauge>,
    /// CA histories ignored (seal or values), by reason; once per ConfigMap resourceVersion.
    pub ca_history_rejected: Family<ReasonLabels, Counter>,
    /// Kubernetes API calls that did not answer within their bound, by call.
    pub kube_request_timeouts: Family<CallLabels, Counter>,
    /// 1 when the gRPC API serves plaintext on an address other than loopback
    /// (`[grpc] insecure_plaintext = true`).
    pub grpc_insecure_plaintext: Gauge,
    /// The gRPC edge: requests by method and code, refusals, TokenReviews.
    pub grpc: GrpcMetrics,
    /// OIDC discovery and the JWKS ConfigMap.
    pub oidc: OidcMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Replaces CA `ca`'s `podca_ca_generation_not_after_timestamp_seconds` series with
    /// `generations` (generation, state, notAfter), leaving other CAs' series alone.
    pub fn set_ca_generations(&self, ca: &str, generations: Vec<(String, String, i64)>) {
        let Ok(mut series) = self.ca_generation_series.lock() else {
            return;
        };
        let kept = series.entry(ca.to_owned()).or_default();
        for labels in kept.drain(..) {
            self.ca_generation_not_after.remove(&labels);
        }
        for (generation, state, not_after) in generations {
            let labels = crate::rotation::CaLabels {
                generation,
                state,
                ca: ca.to_owned(),
            };
            self.ca_generation_not_after
                .get_or_create(&labels)
                .set(not_after);
            kept.push(labels);
        }
    }

    /// `podca_ca_next_rotation_timestamp_seconds{ca}`.
    pub fn set_ca_next_rotation(&self, ca: &str, at: Option<time::OffsetDateTime>) {
        self.ca_next_rotation
            .get_or_create(&CaNameLabels { ca: ca.to_owned() })
            .set(at.map(|t| t.unix_timestamp()).unwrap_or(0));
    }

    /// `podca_ca_rotation_steps_total{step,ca}`.
    pub fn count_rotation_step(&self, ca: &str, step: &'static str) {
        self.rotation_steps
            .get_or_create(&crate::rotation::StepLabels {
                step,
                ca: ca.to_owned(),
            })
            .inc();
    }

    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("podca");
        let issued = Family::<SettleLabels, Counter>::default();
        let denied = Family::<SettleLabels, Counter>::default();
        let failed = Family::<SettleLabels, Counter>::default();
        let settle_seconds =
            Family::<SignerLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        let queue_depth = Gauge::default();
        let in_flight = Gauge::default();
        let ca_not_after = Family::<CaNameLabels, Gauge>::default();
        let leader = Gauge::default();
        let late_writes = Family::<LateLabels, Counter>::default();
        let retries = Family::<RetryLabels, Counter>::default();
        let writes_rejected = Counter::default();
        let watch_errors = Counter::default();
        let ctb_writes = Family::<OpLabels, Counter>::default();
        let ctb_drift_repairs = Counter::default();
        let ctb_publish_errors = Counter::default();
        let ctb_passes = Counter::default();
        let ctb_pass_generation = Gauge::default();
        let ca_generation_not_after = Family::<crate::rotation::CaLabels, Gauge>::default();
        let ca_next_rotation = Family::<CaNameLabels, Gauge>::default();
        let jwt_key_not_after = Family::<crate::jwt::JwtKeyLabels, Gauge>::default();
        let jwt_key_published = Family::<crate::jwt::JwtKeyLabels, Gauge>::default();
        let jwt_key_propagation = Gauge::default();
        let jwt_key_rotation_errors = Counter::default();
        let jwt_key_secret_writes = Family::<OpLabels, Counter>::default();
        registry.register(
            "jwt_key_secret_writes",
            "Writes of the JWT key Secret of the Secret CA backend, by op (create, update)",
            jwt_key_secret_writes.clone(),
        );
        registry.register(
            "jwt_key_not_after_timestamp_seconds",
            "When each active or retired JWT-SVID signing key stops being published (Unix \
             seconds): no token it signs expires later, by kid and state",
            jwt_key_not_after.clone(),
        );
        registry.register(
            "jwt_key_published_timestamp_seconds",
            "When each published JWT-SVID signing key was first published (Unix seconds), by kid \
             and state (prepared, active, retired)",
            jwt_key_published.clone(),
        );
        registry.register(
            "jwt_key_propagation_seconds",
            "How long a new JWT-SVID signing key is published before it signs ([jwt] \
             propagation_seconds)",
            jwt_key_propagation.clone(),
        );
        registry.register(
            "jwt_key_rotation_errors",
            "JWT-SVID signing key rotation checks that failed (the keys in force stay)",
            jwt_key_rotation_errors.clone(),
        );
        let rotation_steps = Family::<crate::rotation::StepLabels, Counter>::default();
        let rotation_errors = Counter::default();
        let rotation_checks = Counter::default();
        let ca_signers = Family::<CaNameLabels, Gauge>::default();
        let ca_history_rejected = Family::<ReasonLabels, Counter>::default();
        let kube_request_timeouts = Family::<CallLabels, Counter>::default();
        registry.register(
            "kube_request_timeouts",
            "Kubernetes API calls that did not answer within their bound (the work stays pending)",
            kube_request_timeouts.clone(),
        );
        registry.register(
            "ca_history_rejected",
            "CA history ConfigMaps ignored because their seal or values did not verify, by reason",
            ca_history_rejected.clone(),
        );
        let grpc_insecure_plaintext = Gauge::default();
        let grpc = GrpcMetrics::default();
        grpc.register(&mut registry);
        let oidc = OidcMetrics::default();
        oidc.register(&mut registry);
        registry.register(
            "grpc_insecure_plaintext",
            "1 when the gRPC API serves plaintext on a non-loopback address (insecure_plaintext)",
            grpc_insecure_plaintext.clone(),
        );
        registry.register(
            "ca_generation_not_after_timestamp_seconds",
            "notAfter of each CA generation's issuing certificate (Unix seconds), by state",
            ca_generation_not_after.clone(),
        );
        registry.register(
            "ca_next_rotation_timestamp_seconds",
            "When the CA rotation schedule next takes a step (Unix seconds; 0: none planned)",
            ca_next_rotation.clone(),
        );
        registry.register(
            "ca_rotation_steps",
            "CA rotation steps taken (prepare, activate, retire, drop)",
            rotation_steps.clone(),
        );
        registry.register(
            "ca_rotation_errors",
            "CA rotation checks that failed (the CA in force stays)",
            rotation_errors.clone(),
        );
        registry.register(
            "ca_rotation_checks",
            "CA rotation checks made, failed ones included: the rotation driver is alive while \
             this rises",
            rotation_checks.clone(),
        );
        registry.register(
            "ca_signers",
            "Signers a CA signs for; above 1, a certificate of one signer verifies under the \
             others' ClusterTrustBundles (give each signer its own CA)",
            ca_signers.clone(),
        );
        registry.register(
            "pcr_issued",
            "PodCertificateRequests issued",
            issued.clone(),
        );
        registry.register(
            "pcr_denied",
            "PodCertificateRequests denied",
            denied.clone(),
        );
        registry.register(
            "pcr_failed",
            "PodCertificateRequests failed",
            failed.clone(),
        );
        registry.register(
            "pcr_settle_seconds",
            "Seconds from PodCertificateRequest creation to a settled status",
            settle_seconds.clone(),
        );
        registry.register(
            "queue_depth",
            "PodCertificateRequests waiting for a worker",
            queue_depth.clone(),
        );
        registry.register(
            "in_flight",
            "PodCertificateRequests being worked on",
            in_flight.clone(),
        );
        registry.register(
            "ca_not_after_timestamp_seconds",
            "notAfter of the issuing CA certificate (Unix seconds)",
            ca_not_after.clone(),
        );
        registry.register(
            "leader",
            "1 when this process holds the leader Lease (or runs without election)",
            leader.clone(),
        );
        registry.register(
            "late_writes",
            "Status writes that found the PodCertificateRequest gone or settled by someone else",
            late_writes.clone(),
        );
        registry.register(
            "retries",
            "Transient failures that were retried",
            retries.clone(),
        );
        registry.register(
            "status_writes_rejected",
            "Status writes the API server refused permanently",
            writes_rejected.clone(),
        );
        registry.register(
            "watch_errors",
            "Errors on PodCertificateRequest watches",
            watch_errors.clone(),
        );
        registry.register(
            "ctb_writes",
            "ClusterTrustBundle writes, by op (create, update, delete)",
            ctb_writes.clone(),
        );
        registry.register(
            "ctb_drift_repairs",
            "ClusterTrustBundle writes that restored a bundle someone else edited or deleted",
            ctb_drift_repairs.clone(),
        );
        registry.register(
            "ctb_publish_errors",
            "Failed ClusterTrustBundle requests and trust anchors that could not be published",
            ctb_publish_errors.clone(),
        );
        registry.register(
            "ctb_passes",
            "ClusterTrustBundle publisher passes completed (every bundle reconciled, then \
             garbage collected); a publisher that stops passing stops repairing drift",
            ctb_passes.clone(),
        );
        registry.register(
            "ctb_pass_generation",
            "The CA snapshot the publisher's last completed pass published from: this process \
             counts one more each time it loads a changed CA (rotation, reload)",
            ctb_pass_generation.clone(),
        );
        let exported_rules = ExportedRules::default();
        registry.register_collector(Box::new(PolicyRuleCollector(exported_rules.clone())));
        Metrics {
            registry: std::sync::Mutex::new(registry),
            exported_rules,
            issued,
            denied,
            failed,
            settle_seconds,
            queue_depth,
            in_flight,
            ca_not_after,
            leader,
            late_writes,
            retries,
            writes_rejected,
            watch_errors,
            ctb_writes,
            ctb_drift_repairs,
            ctb_publish_errors,
            ctb_passes,
            ctb_pass_generation,
            ca_generation_not_after,
            jwt_key_not_after,
            jwt_key_published,
            jwt_key_propagation,
            jwt_key_rotation_errors,
            jwt_key_secret_writes,
            ca_next_rotation,
            ca_generation_series: std::sync::Mutex::default(),
            rotation_steps,
            rotation_errors,
            rotation_checks,
            ca_signers,
            ca_history_rejected,
            kube_request_timeouts,
            grpc_insecure_plaintext,
            grpc,
            oidc,
        }
    }

    /// Registers a component's own metrics in its sub-registry: `prefix` is the component's
    /// (`ledger`, `hsm`), so its metrics are `podca_<prefix>_<name>`.
    pub fn register_component<T>(
        &self,
        prefix: &str,
        register: impl FnOnce(&mut Registry) -> T,
    ) -> T {
        let mut registry = self.lock_registry();
        register(registry.sub_registry_with_prefix(prefix))
    }

    /// Exports the counters of the signers' compiled rules (`podca_policy_*`): the rule sets
    /// are shared with every clone of the policies, so what serving them counts shows here. A
    /// signer exported again replaces its earlier rule set.
    pub fn export_policies<'a>(
        &self,
        signers: impl IntoIterator<Item = (&'a String, &'a SignerPolicy)>,
    ) {
        for (signer, policy) in signers {
            if let Some(rules) = policy.compiled_rules() {
                self.export_rules(signer, rules);
            }
            // A tenant's requests run its own rule set (the signer's rules, then the tenant's):
            // counted under `<signer> (tenant <name>)`.
            for tenant in policy.tenants() {
                if let Some(rules) = policy.for_tenant(&tenant).compiled_rules() {
                    self.export_rules(&format!("{signer} (tenant {})", tenant.name), rules);
                }
            }
        }
    }

    /// Exports one rule set's counters under `signer`.
    pub fn export_rules(&self, signer: &str, rules: RuleSet) {
        self.exported_rules
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(signer.to_owned(), rules);
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.lock_registry());
        out
    }

    fn lock_registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        // Registration either happened whole or not at all: a poisoned registry is still sound.
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Labels of the policy rule counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    signer: String,
    rule: String,
}

/// Labels of the policy output counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutputLabels {
    signer: String,
    output: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PodReadLabels {
    signer: String,
    result: String,
}

/// The rule sets whose counters the metrics export, by signer.
type ExportedRules = std::sync::Arc<std::sync::Mutex<BTreeMap<String, RuleSet>>>;

/// `podca_policy_rule_denials_total` and `podca_policy_rule_errors_total`, by signer and rule,
/// `podca_policy_output_errors_total` by signer and output, and `podca_policy_pod_reads_total`
/// by signer and result: read at each scrape from the counters of the rule sets registered
/// with [`Metrics::export_policies`] (each rule set keeps its own; nothing is process-wide).
#[derive(Debug)]
struct PolicyRuleCollector(ExportedRules);

impl prometheus_client::collector::Collector for PolicyRuleCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::MetricType;
        use prometheus_client::metrics::counter::ConstCounter;
        let counts: Vec<(String, RuleCounts)> = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(signer, rules)| (signer.clone(), rules.counts()))
            .collect();
        // One family per metric, its rows from every signer; a family with no row is left out.
        let outputs: Vec<_> = counts
            .iter()
            .flat_map(|(signer, c)| c.outputs.iter().map(move |(o, n)| (signer, *o, *n)))
            .collect();
        if !outputs.is_empty() {
            let mut family = encoder.encode_descriptor(
                "policy_output_errors",
                "Policy output evaluations that failed or gave an invalid value (and denied: \
                 outputs fail closed), by signer and output",
                None,
                MetricType::Counter,
            )?;
            for (signer, output, count) in outputs {
                let labels = OutputLabels {
                    signer: signer.clone(),
                    output: output.to_owned(),
                };
                ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
            }
        }
        let reads: Vec<_> = counts
            .iter()
            .flat_map(|(signer, c)| c.pod_reads.iter().map(move |(r, n)| (signer, *r, *n)))
            .collect();
        if !reads.is_empty() {
            let mut family = encoder.encode_descriptor(
                "policy_pod_reads",
                "Reads of a request's pod for policy rules that read it (pod_facts), by signer \
                 and result (found, not_found, uid_mismatch, error): one API call each",
                None,
                MetricType::Counter,
            )?;
            for (signer, result, count) in reads {
                let labels = PodReadLabels {
                    signer: signer.clone(),
                    result: result.to_owned(),
                };
                ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
            }
        }
        let rules: Vec<_> = counts
            .iter()
            .flat_map(|(signer, c)| c.rules.iter().map(move |r| (signer, r)))
            .collect();
        if rules.is_empty() {
            return Ok(());
        }
        type Row<'a> = (&'a String, &'a (String, u64, u64));
        for (name, help, pick) in [
            (
                "policy_rule_denials",
                "Requests a policy rule denied, by signer and rule",
                (|r: &Row<'_>| r.1.1) as fn(&Row<'_>) -> u64,
            ),
            (
                "policy_rule_errors",
                "Policy rule evaluations that failed (and denied: rules fail closed), by signer \
                 and rule",
                |r| r.1.2,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for row in &rules {
                let labels = RuleLabels {
                    signer: row.0.clone(),
                    rule: row.1.0.clone(),
                };
                ConstCounter::new(pick(row)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The label values dashboards and alerts (deploy/monitoring, docs/monitoring.md) match
    /// on: renaming one is a breaking change, so the table is pinned here.
    #[test]
    fn cause_labels_are_pinned_and_exported() {
        let retry: Vec<_> = RetryCause::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            retry,
            [
                "read",
                "write",
                "conflict",
                "policy",
                "sign",
                "ca_backend",
                "namespace_labels",
                "pod_facts",
                "ledger",
                "service_ca"
            ]
        );
        let late: Vec<_> = LateCause::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(late, ["gone", "settled_elsewhere", "conflict"]);

        let metrics = Metrics::new();
        metrics
            .retries
            .get_or_create(&RetryLabels {
                cause: RetryCause::CaBackend,
            })
            .inc();
        metrics
            .late_writes
            .get_or_create(&LateLabels {
                cause: LateCause::SettledElsewhere,
            })
            .inc();
        let text = metrics.encode();
        assert!(
            text.contains("podca_retries_total{cause=\"ca_backend\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("podca_late_writes_total{cause=\"settled_elsewhere\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn policy_rule_counters_are_exported() {
        let rules = podca_signer::rules::RuleSet::compile(&[podca_signer::rules::RuleSpec {
            name: "always".into(),
            deny: Some("true".into()),
            require: None,
            reason: "Always".into(),
            message: None,
        }])
        .unwrap();
        let annotations = std::collections::BTreeMap::new();
        let facts = podca_signer::RuleFacts {
            source: podca_signer::RequestSource::Grpc,
            signer_name: "example.com/metrics",
            namespace: "a",
            service_account: "b",
            pod_name: None,
            pod_uid: None,
            node_name: None,
            key_type: None,
            requested_lifetime_seconds: None,
            annotations: &annotations,
            audiences: &[],
            namespace_labels: None,
            pod: None,
            now: 0,
        };
        assert!(rules.evaluate(&facts).is_err());
        let metrics = Metrics::new();
        assert!(!metrics.encode().contains("podca_policy_rule"));
        metrics.export_rules("example.com/metrics", rules);
        let text = metrics.encode();
        assert!(
            text.contains(
                "podca_policy_rule_denials_total{signer=\"example.com/metrics\",rule=\"always\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "podca_policy_rule_errors_total{signer=\"example.com/metrics\",rule=\"always\"} 0"
            ),
            "{text}"
        );
    }

    /// A tenant's requests count in its own rule set, exported under `<signer> (tenant <t>)`,
    /// and the counts of every clone of the policy land there.
    #[test]
    fn a_tenants_rule_counters_are_exported_under_the_tenant() {
        let config = crate::config::Config::parse(
            "[cas.team-a]\ndir = \"/tmp/a\"\n\
             [signers.\"example.com/m\"]\ntrust_domain = \"m.test\"\n\
             [signers.\"example.com/m\".tenants.team-a]\nnamespaces = [\"a1\"]\n\
             [[signers.\"example.com/m\".tenants.team-a.rules]]\nname = \"web_only\"\n\
             require = \"request.service_account == 'web'\"\nreason = \"WebOnly\"\n",
        )
        .unwrap();
        let metrics = Metrics::new();
        metrics.export_policies(&config.signers);
        // A request as a clone of the config (as the components hold) decides it.
        let signers = config.signers.clone();
        let (tenant, _) = signers["example.com/m"].resolve("a1").unwrap();
        let annotations = std::collections::BTreeMap::new();
        let denied = tenant.apply_rules(&podca_signer::RuleFacts {
            source: podca_signer::RequestSource::Pcr,
            signer_name: "example.com/m",
            namespace: "a1",
            service_account: "api",
            pod_name: None,
            pod_uid: None,
            node_name: None,
            key_type: None,
            requested_lifetime_seconds: None,
            annotations: &annotations,
            audiences: &[],
            namespace_labels: None,
            pod: None,
            now: 0,
        });
        assert!(denied.is_err());
        let text = metrics.encode();
        assert!(
            text.contains(
                "podca_policy_rule_denials_total{signer=\"example.com/m (tenant team-a)\",\
                 rule=\"web_only\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn policy_pod_reads_are_exported_by_signer_and_result() {
        use podca_signer::PodRead;
        let policy: SignerPolicy = toml::from_str(
            "trust_domain = \"a.test\"\npod_facts = true\n\
             [[rules]]\nname = \"canary\"\nrequire = \"pod.labels['track'] == 'canary'\"\n\
             reason = \"NotCanary\"",
        )
        .unwrap();
        policy.validate().unwrap();
        // A clone (as the controller and the gRPC API hold) counts into the same rule set.
        let serving = policy.clone();
        serving.count_pod_read(PodRead::Found);
        serving.count_pod_read(PodRead::Found);
        serving.count_pod_read(PodRead::UidMismatch);
        let metrics = Metrics::new();
        metrics.export_policies([(&"example.com/metrics-pods".to_string(), &policy)]);
        let text = metrics.encode();
        for line in [
            "podca_policy_pod_reads_total{signer=\"example.com/metrics-pods\",result=\"found\"} 2",
            "podca_policy_pod_reads_total{signer=\"example.com/metrics-pods\",result=\"uid_mismatch\"} 1",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(
            text.contains("# TYPE podca_policy_pod_reads counter"),
            "{text}"
        );
        assert!(!text.contains("result=\"not_found\""), "{text}");
    }

    #[test]
    fn policy_output_errors_are_exported() {
        let rules = podca_signer::rules::RuleSet::compile_with_outputs(
            &[],
            &podca_signer::rules::OutputSpec {
                dns_names: None,
                max_lifetime_seconds: Some("-1".into()),
            },
        )
        .unwrap();
        let annotations = std::collections::BTreeMap::new();
        let facts = podca_signer::RuleFacts {
            source: podca_signer::RequestSource::Grpc,
            signer_name: "example.com/metrics-outputs",
            namespace: "a",
            service_account: "b",
            pod_name: None,
            pod_uid: None,
            node_name: None,
            key_type: None,
            requested_lifetime_seconds: None,
            annotations: &annotations,
            audiences: &[],
            namespace_labels: None,
            pod: None,
            now: 0,
        };
        assert!(rules.evaluate(&facts).is_err());
        let metrics = Metrics::new();
        metrics.export_rules("example.com/metrics-outputs", rules);
        let text = metrics.encode();
        assert!(
            text.contains(
                "podca_policy_output_errors_total{signer=\"example.com/metrics-outputs\",\
                 output=\"max_lifetime_seconds\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn names_carry_the_prefix() {
        let m = Metrics::new();
        m.issued
            .get_or_create(&SettleLabels {
                signer: "example.com/s".into(),
                reason: "Issued".into(),
            })
            .inc();
        m.settle_seconds
            .get_or_create(&SignerLabels {
                signer: "example.com/s".into(),
            })
            .observe(0.2);
        m.ca_not_after
            .get_or_create(&CaNameLabels {
                ca: "payments".into(),
            })
            .set(1_900_000_000);
        m.set_ca_generations("payments", vec![("1".into(), "active".into(), 7)]);
        m.set_ca_generations("batch", vec![("1".into(), "active".into(), 8)]);
        // A CA replaces its own series and leaves the others' alone.
        m.set_ca_generations("payments", vec![("2".into(), "active".into(), 9)]);
        m.ctb_writes.get_or_create(&OpLabels { op: "create" }).inc();
        m.grpc
            .requests
            .get_or_create(&GrpcCallLabels {
                method: "podca.v1.PodCA/IssueCertificate",
                code: "OK",
            })
            .inc();
        m.grpc
            .request_seconds
            .get_or_create(&MethodLabels {
                method: "podca.v1.PodCA/IssueCertificate",
            })
            .observe(0.001);
        m.grpc
            .token_cache
            .get_or_create(&ResultLabels {
                result: "negative_hit",
            })
            .inc();
        let text = m.encode();
        for name in [
            "podca_pcr_issued_total{signer=\"example.com/s\",reason=\"Issued\"} 1",
            "podca_pcr_settle_seconds_bucket",
            "podca_queue_depth 0",
            "podca_ca_not_after_timestamp_seconds{ca=\"payments\"} 1900000000",
            "podca_ca_generation_not_after_timestamp_seconds{generation=\"2\",state=\"active\",ca=\"payments\"} 9",
            "podca_ca_generation_not_after_timestamp_seconds{generation=\"1\",state=\"active\",ca=\"batch\"} 8",
            "podca_ctb_writes_total{op=\"create\"} 1",
            "podca_ctb_drift_repairs_total 0",
            "podca_ctb_publish_errors_total 0",
            "podca_grpc_requests_total{method=\"podca.v1.PodCA/IssueCertificate\",code=\"OK\"} 1",
            "podca_tokenreview_cache_total{result=\"negative_hit\"} 1",
            "podca_tokenreview_duration_seconds_bucket",
            "podca_grpc_request_duration_seconds_count{method=\"podca.v1.PodCA/IssueCertificate\"} 1",
        ] {
            assert!(text.contains(name), "{name} missing in:\n{text}");
        }
        assert!(
            !text.contains("generation=\"1\",state=\"active\",ca=\"payments\""),
            "{text}"
        );
    }
}
