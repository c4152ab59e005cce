//! The resources the emulator serves, and their served versions.

use serde_json::{Value, json};

/// Which certificates.k8s.io versions an emulator instance serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApiMode {
    /// 1.37: certificates.k8s.io/v1 only (PCR stub required, no pkix/PoP fields).
    V1Only,
    /// 1.36: v1beta1 only, with `stubPKCS10Request` (the recorded server).
    #[default]
    V1Beta1,
    /// 1.35: v1beta1 only, without `stubPKCS10Request` (pkix + PoP only).
    V1Beta1Legacy,
    /// v1 and v1beta1 together (legacy PCRs read through v1 show an empty stub).
    V1AndV1Beta1,
}

impl ApiMode {
    /// Served certificates.k8s.io versions, preferred first.
    pub fn cert_versions(self) -> &'static [&'static str] {
        match self {
            Self::V1Only => &["v1"],
            Self::V1Beta1 | Self::V1Beta1Legacy => &["v1beta1"],
            Self::V1AndV1Beta1 => &["v1", "v1beta1"],
        }
    }
}

/// A served resource type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Res {
    Pcr,
    Ctb,
    Lease,
    Event,
    CoreEvent,
    Pod,
    ServiceAccount,
    Node,
    Namespace,
    Secret,
    ConfigMap,
    Service,
}

impl Res {
    pub const ALL: [Res; 12] = [
        Res::Pcr,
        Res::Ctb,
        Res::Lease,
        Res::Event,
        Res::CoreEvent,
        Res::Pod,
        Res::ServiceAccount,
        Res::Node,
        Res::Namespace,
        Res::Secret,
        Res::ConfigMap,
        Res::Service,
    ];

    pub fn group(self) -> &'static str {
        match self {
            Res::Pcr | Res::Ctb => "certificates.k8s.io",
            Res::Lease => "coordination.k8s.io",
            Res::Event => "events.k8s.io",
            _ => "",
        }
    }
    pub fn plural(self) -> &'static str {
        match self {
            Res::Pcr => "podcertificaterequests",
            Res::Ctb => "clustertrustbundles",
            Res::Lease => "leases",
            Res::Event | Res::CoreEvent => "events",
            Res::Pod => "pods",
            Res::ServiceAccount => "serviceaccounts",
            Res::Node => "nodes",
            Res::Namespace => "namespaces",
            Res::Secret => "secrets",
            Res::ConfigMap => "configmaps",
            Res::Service => "services",
        }
    }
    pub fn kind(self) -> &'static str {
        match self {
            Res::Pcr => "PodCertificateRequest",
            Res::Ctb => "ClusterTrustBundle",
            Res::Lease => "Lease",
            Res::Event | Res::CoreEvent => "Event",
            Res::Pod => "Pod",
            Res::ServiceAccount => "ServiceAccount",
            Res::Node => "Node",
            Res::Namespace => "Namespace",
            Res::Secret => "Secret",
            Res::ConfigMap => "ConfigMap",
            Res::Service => "Service",
        }
    }
    pub fn singular(self) -> String {
        self.kind().to_lowercase()
    }
    pub fn namespaced(self) -> bool {
        !matches!(self, Res::Ctb | Res::Node | Res::Namespace)
    }
    pub fn has_status(self) -> bool {
        matches!(self, Res::Pcr | Res::Pod | Res::Node | Res::Namespace)
    }
    /// Served versions of this resource's group.
    pub fn versions(self, mode: ApiMode) -> &'static [&'static str] {
        match self {
            Res::Pcr | Res::Ctb => mode.cert_versions(),
            Res::Lease | Res::Event => &["v1"],
            _ => &["v1"],
        }
    }
    pub fn api_version(self, version: &str) -> String {
        if self.group().is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group())
        }
    }
    /// Look a resource up by group and plural.
    pub fn lookup(group: &str, plural: &str) -> Option<Res> {
        Res::ALL
            .into_iter()
            .find(|r| r.group() == group && r.plural() == plural)
    }
    /// Supported field-selector labels.
    pub fn field_labels(self) -> &'static [&'static str] {
        match self {
            Res::Pcr => &[
                "metadata.name",
                "metadata.namespace",
                "spec.signerName",
                "spec.podName",
                "spec.nodeName",
            ],
            Res::Ctb => &["metadata.name", "spec.signerName"],
            Res::Pod => &[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "spec.serviceAccountName",
                "status.phase",
            ],
            Res::Secret => &["metadata.name", "metadata.namespace", "type"],
            Res::CoreEvent => &[
                "metadata.name",
                "metadata.namespace",
                "involvedObject.kind",
                "involvedObject.name",
                "involvedObject.namespace",
                "involvedObject.uid",
                "reason",
                "type",
            ],
            Res::Event => &[
                "metadata.name",
                "metadata.namespace",
                "regarding.kind",
                "regarding.name",
                "regarding.namespace",
                "regarding.uid",
                "reason",
                "type",
            ],
            _ => &["metadata.name", "metadata.namespace"],
        }
    }
}

/// Convert a stored (hub) object to the JSON a client of `version` sees.
pub fn to_version(res: Res, hub: &Value, version: &str, mode: ApiMode) -> Value {
    let mut v = hub.clone();
    if let Value::Object(m) = &mut v {
        m.insert("apiVersion".into(), json!(res.api_version(version)));
        m.insert("kind".into(), json!(res.kind()));
        if res == Res::Pcr
            && let Some(Value::Object(spec)) = m.get_mut("spec")
        {
            if version == "v1" {
                spec.remove("pkixPublicKey");
                spec.remove("proofOfPossession");
            } else if mode == ApiMode::V1Beta1Legacy {
                spec.remove("stubPKCS10Request");
            }
        }
    }
    v
}

/// Strip the fields a version does not have from an incoming PCR body, and
/// carry the hidden ones over from the stored object.
pub fn pcr_spec_from_version(
    spec: &mut Value,
    version: &str,
    mode: ApiMode,
    old_spec: Option<&Value>,
) {
    let Value::Object(m) = spec else {
        return;
    };
    let hidden: &[&str] = if version == "v1" {
        &["pkixPublicKey", "proofOfPossession"]
    } else if mode == ApiMode::V1Beta1Legacy {
        &["stubPKCS10Request"]
    } else {
        &[]
    };
    for k in hidden {
        m.remove(*k);
        if let Some(old) = old_spec.and_then(|o| o.get(*k)) {
            m.insert((*k).to_string(), old.clone());
        }
    }
}
