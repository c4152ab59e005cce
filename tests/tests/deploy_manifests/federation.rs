//! The chart's `bundleEndpoint` and `federation` values (issue #43): rendered into the
//! `[bundle_endpoint]` and `[[federation]]` tables podca reads, with every file they name
//! mounted, the Service and container port, and the NetworkPolicy rules for both directions.

use std::path::Path;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use podca_authority::bundle_endpoint::{EndpointProfile, FederationProfile};

use crate::config::config;
use crate::helm::{check_helm_values, helm_with_values, parse_helm_yaml};
use crate::objects::{mount_path, podca_container, the_deployment, volume};

const VALUES: &str = r#"
config:
  signers:
    example.com/workload:
      trust_domain: cluster.local
      federates_with: [cluster-b.example, web.example]
bundleEndpoint:
  enabled: true
  spiffeId: spiffe://cluster.local/ns/podca-system/sa/podca-bundle
federation:
  - trustDomain: cluster-b.example
    bundleEndpointUrl: https://bundle.cluster-b.example:8443/
    profile: https_spiffe
    endpointSpiffeId: spiffe://cluster-b.example/ns/podca-system/sa/podca-bundle
    initialBundle: '{"keys":[]}'
  - trustDomain: web.example
    bundleEndpointUrl: https://bundle.web.example/spiffe
    profile: https_web
    caBundle: "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"
    maxRefreshSeconds: 600
networkPolicy:
  federationTo:
    - ipBlock:
        cidr: 203.0.113.0/24
"#;

#[test]
fn helm_renders_the_bundle_endpoint_and_federation_as_podca_reads_them() {
    let r = check_helm_values("helm federation", "file", VALUES);
    let cfg = config(&r);
    let d = the_deployment(&r);
    let c = podca_container(d);

    let endpoint = cfg.bundle_endpoint.as_ref().expect("[bundle_endpoint]");
    assert_eq!(endpoint.listen.port(), 8443);
    assert_eq!(
        endpoint.profile,
        EndpointProfile::HttpsSpiffe {
            spiffe_id: "spiffe://cluster.local/ns/podca-system/sa/podca-bundle".into()
        }
    );
    let port = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("spiffe-bundle"))
        .expect("the container port");
    assert_eq!(port.container_port, 8443);
    let service_port = r.services[0]
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|ports| {
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some("spiffe-bundle"))
        })
        .expect("the Service port");
    assert_eq!(
        service_port.target_port,
        Some(IntOrString::String("spiffe-bundle".into()))
    );

    // Every file a [[federation]] table names is in a mounted volume: the ConfigMap's keys
    // for the initial bundle and the roots, the emptyDir for the kept bundles.
    assert_eq!(cfg.federation.len(), 2);
    let files = Path::new(&mount_path(c, "federation")).to_owned();
    let state = Path::new(&mount_path(c, "federation-state")).to_owned();
    assert!(volume(d, "federation-state").empty_dir.is_some());
    let cm_name = volume(d, "federation")
        .config_map
        .as_ref()
        .expect("a ConfigMap volume")
        .name
        .clone();
    let cm = r
        .config_maps
        .iter()
        .find(|m| m.metadata.name.as_deref() == Some(cm_name.as_str()))
        .expect("the federation ConfigMap is rendered");
    let data = cm.data.clone().unwrap_or_default();
    let (b, web) = (&cfg.federation[0], &cfg.federation[1]);
    assert_eq!(b.trust_domain, "cluster-b.example");
    assert_eq!(
        b.profile,
        FederationProfile::HttpsSpiffe {
            endpoint_spiffe_id: "spiffe://cluster-b.example/ns/podca-system/sa/podca-bundle".into()
        }
    );
    assert_eq!(b.initial_bundle, Some(files.join("cluster-b.example.json")));
    assert_eq!(data["cluster-b.example.json"], r#"{"keys":[]}"#);
    assert_eq!(b.last_good_file, Some(state.join("cluster-b.example.json")));
    assert_eq!(
        web.profile,
        FederationProfile::HttpsWeb {
            ca_file: Some(files.join("web.example.roots.pem"))
        }
    );
    assert!(data["web.example.roots.pem"].starts_with("-----BEGIN CERTIFICATE-----\n"));
    assert_eq!(web.initial_bundle, None);
    assert_eq!(web.max_refresh_seconds, 600);
    assert_eq!(web.last_good_file, Some(state.join("web.example.json")));

    // Ingress to the endpoint from everyone (no `from`); egress to 8443 (the one port not
    // already open) only towards federationTo.
    let spec = r.network_policies[0].spec.as_ref().expect("a spec");
    let ingress = spec.ingress.as_ref().expect("ingress rules");
    let on = |ports: &Option<Vec<k8s_openapi::api::networking::v1::NetworkPolicyPort>>| {
        ports
            .iter()
            .flatten()
            .filter_map(|p| match p.port {
                Some(IntOrString::Int(n)) => Some(n),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let rule = ingress
        .iter()
        .find(|rule| on(&rule.ports) == [8443])
        .expect("an ingress rule for the bundle endpoint");
    assert!(rule.from.is_none(), "the bundle is public: {rule:?}");
    let egress = spec.egress.as_ref().expect("egress rules");
    let rule = egress
        .iter()
        .find(|rule| on(&rule.ports) == [8443])
        .expect("an egress rule for cluster-b's endpoint port");
    assert_eq!(
        serde_json::to_value(&rule.to).unwrap(),
        serde_json::json!([{"ipBlock": {"cidr": "203.0.113.0/24"}}])
    );
}

#[test]
fn the_chart_refuses_federation_values_podca_would_refuse() {
    for (values, expected) in [
        (
            "bundleEndpoint:\n  enabled: true\n",
            "profile https_spiffe needs spiffeId",
        ),
        (
            "bundleEndpoint:\n  enabled: true\n  profile: https_web\n",
            "profile https_web needs tlsSecretName",
        ),
        (
            "federation:\n  - trustDomain: b.test\n    bundleEndpointUrl: https://b.test/\n    \
             profile: https_spiffe\n",
            "endpointSpiffeId",
        ),
        (
            "federation:\n  - trustDomain: b.test\n    bundleEndpointUrl: http://b.test/\n    \
             profile: https_web\n",
            "bundleEndpointUrl",
        ),
        (
            "federation:\n  - trustDomain: b.test\n    bundleEndpointUrl: https://b.test/\n    \
             profile: https_web\n    endpointSpiffeId: spiffe://b.test/e\n",
            "federation b.test: endpointSpiffeId is for profile https_spiffe",
        ),
        (
            "federation:\n  - trustDomain: b.test\n    bundleEndpointUrl: https://b.test/\n    \
             profile: https_spiffe\n    endpointSpiffeId: spiffe://b.test/e\n    \
             initialBundle: '{}'\n    caBundle: x\n",
            "federation b.test: caBundle is for profile https_web",
        ),
    ] {
        let err = helm_with_values(values).expect_err(values);
        assert!(err.contains(expected), "{values}: {err}");
    }
    // A trust domain no signer lists reaches podca's own check.
    let yaml = helm_with_values(
        "federation:\n  - trustDomain: b.test\n    bundleEndpointUrl: https://b.test/\n    \
         profile: https_web\n",
    )
    .expect("the schema accepts it");
    let r = parse_helm_yaml("helm unlisted federation", &yaml);
    let err = podca_authority::config::Config::parse(&crate::config::config_text(&r))
        .expect_err("no signer federates with b.test");
    assert!(
        err.to_string()
            .contains("no signer lists it in federates_with"),
        "{err}"
    );
}
