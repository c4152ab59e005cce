//! Helpers on the typed objects: the one Deployment, its pod and the podca container.

use std::net::SocketAddr;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec, Volume};

use crate::strict::Rendered;

pub fn the_deployment(r: &Rendered) -> &Deployment {
    assert_eq!(r.deployments.len(), 1, "exactly one Deployment");
    &r.deployments[0]
}

pub fn pod_spec(d: &Deployment) -> &PodSpec {
    d.spec
        .template
        .spec
        .as_ref()
        .expect("Deployment has a pod spec")
}

pub fn podca_container(d: &Deployment) -> &Container {
    let spec = pod_spec(d);
    assert_eq!(spec.containers.len(), 1, "one container");
    &spec.containers[0]
}

pub fn args(c: &Container) -> Vec<String> {
    c.args.clone().unwrap_or_default()
}

/// `--name=value` or `--name value`.
pub fn flag(args: &[String], name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix(&prefix)
            .map(str::to_string)
            .or_else(|| (a == name).then(|| args.get(i + 1).cloned().unwrap_or_default()))
    })
}

pub fn volume<'a>(d: &'a Deployment, name: &str) -> &'a Volume {
    pod_spec(d)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("no volume {name:?}"))
}

pub fn mount_path(c: &Container, volume: &str) -> String {
    c.volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume)
        .unwrap_or_else(|| panic!("volume {volume:?} is not mounted"))
        .mount_path
        .clone()
}

pub fn container_port(c: &Container, name: &str) -> i32 {
    c.ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no container port named {name:?}"))
        .container_port
}

pub fn port_of(addr: SocketAddr) -> i32 {
    assert!(
        !addr.ip().is_loopback(),
        "{addr} is loopback: the Service and the kubelet probes cannot reach it"
    );
    i32::from(addr.port())
}
