//! Services, and pods as a serving signer sees them (labels, `status.podIPs`, `spec.hostname`,
//! `spec.subdomain`): what the `kubernetes.io/service-ca` vocabulary reads. Services are served
//! like any other resource (get, list with label selectors, create, RBAC); these helpers seed
//! them as kube-apiserver would have stored them, with their ClusterIPs allocated.

use serde_json::{Value, json};

use super::resources::Res;
use super::{Emulator, PodFixture, lock};

/// A Service to seed: `cluster_ips` empty makes it headless (`clusterIP: None`).
#[derive(Debug, Clone, Default)]
pub struct ServiceFixture {
    pub namespace: String,
    pub name: String,
    /// `spec.selector`; empty: a Service without a selector.
    pub selector: Vec<(String, String)>,
    pub cluster_ips: Vec<String>,
}

/// What a serving pod adds to a [`PodFixture`].
#[derive(Debug, Clone, Default)]
pub struct Serving {
    pub labels: Vec<(String, String)>,
    /// `status.podIPs`, the first also `status.podIP`.
    pub pod_ips: Vec<String>,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
}

fn string_map(pairs: &[(String, String)]) -> Value {
    Value::Object(pairs.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
}

impl Emulator {
    /// Create a Service (and its namespace); returns its UID.
    pub fn add_service(&self, s: &ServiceFixture) -> String {
        self.add_namespace(&s.namespace);
        let mut spec = json!({"ports": [{"port": 443, "protocol": "TCP"}], "type": "ClusterIP"});
        if s.cluster_ips.is_empty() {
            spec["clusterIP"] = json!("None");
            spec["clusterIPs"] = json!(["None"]);
        } else {
            spec["clusterIP"] = json!(s.cluster_ips[0]);
            spec["clusterIPs"] = json!(s.cluster_ips);
        }
        if !s.selector.is_empty() {
            spec["selector"] = string_map(&s.selector);
        }
        let obj = self.seed_object(
            Res::Service,
            json!({"metadata": {"name": s.name, "namespace": s.namespace}, "spec": spec}),
        );
        super::store::meta_str(&obj, "uid").to_string()
    }

    /// Create a pod as [`Emulator::add_pod`] does, with labels, IPs, hostname and subdomain;
    /// returns its UID.
    pub fn add_serving_pod(&self, p: &PodFixture, serving: &Serving) -> String {
        let uid = self.add_pod(p);
        let Some(stored) = lock(&self.shared.store).get(Res::Pod, &p.namespace, &p.name) else {
            return uid;
        };
        let mut pod = (*stored).clone();
        pod["metadata"]["labels"] = string_map(&serving.labels);
        if let Some(h) = &serving.hostname {
            pod["spec"]["hostname"] = json!(h);
        }
        if let Some(s) = &serving.subdomain {
            pod["spec"]["subdomain"] = json!(s);
        }
        if let Some(first) = serving.pod_ips.first() {
            pod["status"]["podIP"] = json!(first);
            pod["status"]["podIPs"] =
                Value::Array(serving.pod_ips.iter().map(|ip| json!({"ip": ip})).collect());
        }
        lock(&self.shared.store).put(Res::Pod, &p.namespace, &p.name, pod);
        uid
    }
}
