//! The labels of every namespace, for policy rules that read `namespaceObject.metadata.labels`: a
//! metadata-only watch (`PartialObjectMetadata`, no spec or status) that keeps only the labels
//! in a [`NamespaceLabels`] store, bounded as that type says. Runs on every replica, leader or
//! not: the gRPC API reads the same store.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use podca_authority::metrics::Metrics;
use podca_signer::rules::NamespaceLabels;
use tracing::{debug, info, warn};

use crate::bounded;

/// Watches namespaces until the returned future is dropped.
pub async fn watch(client: Client, store: NamespaceLabels, metrics: Arc<Metrics>) {
    // `PartialObjectMeta`: kube asks for metadata-only (PartialObjectMetadata) answers.
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
    let stream =
        watcher(api, bounded::watcher_config(watcher::Config::default())).default_backoff();
    let mut stream = std::pin::pin!(stream);
    // The namespaces a relist has shown so far; `None` outside a relist.
    let mut listing: Option<BTreeSet<String>> = None;
    let mut full_warned = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => {
                debug!("namespace watch (re)listing");
                listing = Some(BTreeSet::new());
            }
            Ok(watcher::Event::InitApply(ns) | watcher::Event::Apply(ns)) => {
                let Some(name) = ns.metadata.name else {
                    continue;
                };
                if !store.set(&name, ns.metadata.labels.unwrap_or_default()) && !full_warned {
                    full_warned = true;
                    warn!(
                        max = podca_signer::rules::MAX_NAMESPACES,
                        "namespace label store is full; requests from new namespaces see no labels"
                    );
                }
                if let Some(seen) = &mut listing {
                    seen.insert(name);
                }
            }
            Ok(watcher::Event::Delete(ns)) => {
                if let Some(name) = ns.metadata.name {
                    store.remove(&name);
                }
            }
            Ok(watcher::Event::InitDone) => {
                let seen = listing.take().unwrap_or_default();
                let gone: Vec<String> = store
                    .relisting()
                    .into_iter()
                    .filter(|ns| !seen.contains(ns))
                    .collect();
                store.relisted(gone);
                info!(namespaces = store.len(), "namespace watch synced");
            }
            Err(e) => {
                metrics.watch_errors.inc();
                warn!(error = %e, "namespace watch");
            }
        }
    }
}
