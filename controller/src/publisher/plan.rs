//! What the publisher wants, decided without I/O: the trust bundle built from the CA's anchors
//! (rules 24–27), what to do about each desired bundle given what the API server holds
//! ([`decide`]), and which owned bundles are garbage ([`garbage`]).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use podca_signer::CaCertificate;

use super::{
    INSTANCE_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE, MAX_TRUST_BUNDLE_SIZE, PublisherError,
};

/// One bundle the publisher keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredBundle {
    pub name: String,
    pub signer_name: String,
    /// A tenant's bundle (labelled [`super::TENANT_LABEL`]); `None`: the signer's own.
    pub tenant: Option<String>,
    /// A federated trust domain's bundle (labelled [`super::FEDERATED_LABEL`]), holding that
    /// trust domain's X.509 authorities instead of a CA's anchors.
    pub federated: Option<String>,
}

/// The `spec.trustBundle` of every desired bundle, built from the anchors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustBundle {
    /// PEM CERTIFICATE blocks, no headers, no duplicates, CA certificates only.
    pub pem: String,
    /// How many certificates `pem` holds.
    pub anchors: usize,
    /// Subjects of anchors left out because they are not CA certificates (rule 25.4).
    pub skipped: Vec<String>,
}

/// The fields of a ClusterTrustBundle the publisher judges by.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observed {
    pub name: String,
    pub uid: String,
    pub resource_version: Option<String>,
    pub signer_name: String,
    pub trust_bundle: String,
    pub labels: BTreeMap<String, String>,
}

/// What to do about one desired bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Content and labels are as desired: no request.
    Nothing,
    Create,
    /// Rewrite the trustBundle and/or restore the labels.
    Update,
    /// Someone else's bundle holds the name: never touched.
    Foreign(&'static str),
}

/// Decides one desired bundle. `adopted`: the observed object is one this process wrote, so
/// it is podca's even without its labels.
pub fn decide(
    desired: &DesiredBundle,
    trust_bundle: &str,
    labels: &BTreeMap<String, String>,
    observed: Option<&Observed>,
    adopted: bool,
) -> Action {
    let Some(observed) = observed else {
        return Action::Create;
    };
    let labelled = has_labels(&observed.labels, labels);
    if !labelled && !adopted {
        return Action::Foreign("it does not carry this instance's podca labels");
    }
    if observed.signer_name != desired.signer_name {
        // Cannot happen while rule 20 ties the name to the signer; never rewrite it anyway.
        return Action::Foreign("its spec.signerName differs (and is immutable)");
    }
    if labelled && observed.trust_bundle == trust_bundle {
        Action::Nothing
    } else {
        Action::Update
    }
}

/// The owned bundles (both labels) whose names are not desired any more.
pub fn garbage<'a>(
    owned: &'a [Observed],
    desired: &BTreeSet<&str>,
    labels: &BTreeMap<String, String>,
) -> Vec<&'a Observed> {
    owned
        .iter()
        // The list was label-selected; checking again keeps a selector bug from deleting
        // someone else's bundle.
        .filter(|o| has_labels(&o.labels, labels) && !desired.contains(o.name.as_str()))
        .collect()
}

fn has_labels(present: &BTreeMap<String, String>, wanted: &BTreeMap<String, String>) -> bool {
    wanted.iter().all(|(k, v)| present.get(k) == Some(v))
}

/// The labels on every bundle of `instance`.
pub fn owner_labels(instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
        (INSTANCE_LABEL.to_owned(), instance.to_owned()),
    ])
}

/// `labels` as a label selector (`key=value,key=value`).
pub fn label_selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The bundle of `anchors` that rules 24–27 accept: CA certificates only (others are left out
/// and reported), each DER once, in the snapshot's order, as header-less PEM.
pub fn trust_bundle(anchors: &[CaCertificate]) -> Result<TrustBundle, PublisherError> {
    let mut seen: HashSet<&[u8]> = HashSet::new();
    let mut pem = String::new();
    let mut count = 0;
    let mut skipped = Vec::new();
    for anchor in anchors {
        if !anchor.is_ca() {
            skipped.push(anchor.subject().to_owned());
            continue;
        }
        if seen.insert(anchor.der()) {
            pem.push_str(&anchor.pem());
            count += 1;
        }
    }
    if count == 0 {
        return Err(PublisherError::NoAnchors);
    }
    if pem.len() > MAX_TRUST_BUNDLE_SIZE {
        return Err(PublisherError::BundleTooLarge { size: pem.len() });
    }
    Ok(TrustBundle {
        pem,
        anchors: count,
        skipped,
    })
}

pub fn count_pem_blocks(pem: &str) -> usize {
    pem.matches("-----BEGIN CERTIFICATE-----").count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use podca_signer::{CaAlgorithm, IssuingCa, MemoryKey};
    use std::sync::Arc;

    fn root(name: &str) -> CaCertificate {
        let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("test key");
        IssuingCa::self_signed_root(
            Arc::new(key),
            name,
            time::OffsetDateTime::now_utc(),
            time::Duration::days(30),
        )
        .expect("test CA")
        .certificate()
        .clone()
    }

    #[test]
    fn bundle_content() {
        let (a, b) = (root("a"), root("b"));
        let bundle = trust_bundle(&[a.clone(), b.clone(), a.clone()]).expect("bundle");
        assert_eq!(bundle.anchors, 2);
        assert_eq!(count_pem_blocks(&bundle.pem), 2);
        assert_eq!(bundle.pem, format!("{}{}", a.pem(), b.pem()));
        assert!(!bundle.pem.contains(':'), "no PEM headers");
        assert_eq!(trust_bundle(&[]), Err(PublisherError::NoAnchors));
    }

    fn observed(name: &str, bundle: &str, labels: BTreeMap<String, String>) -> Observed {
        Observed {
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: Some("7".into()),
            signer_name: "example.com/s".into(),
            trust_bundle: bundle.into(),
            labels,
        }
    }

    #[test]
    fn decisions() {
        let desired = DesiredBundle {
            name: "example.com:s:podca".into(),
            signer_name: "example.com/s".into(),
            tenant: None,
            federated: None,
        };
        let ours = owner_labels("podca");
        let mut extra = ours.clone();
        extra.insert("team".into(), "x".into());
        let name = desired.name.as_str();
        let table: Vec<(Option<Observed>, bool, Action)> = vec![
            (None, false, Action::Create),
            (
                Some(observed(name, "PEM", ours.clone())),
                false,
                Action::Nothing,
            ),
            (Some(observed(name, "PEM", extra)), false, Action::Nothing),
            (
                Some(observed(name, "OLD", ours.clone())),
                false,
                Action::Update,
            ),
            // Labels stripped: ours only if this process wrote it.
            (
                Some(observed(name, "PEM", BTreeMap::new())),
                true,
                Action::Update,
            ),
            (
                Some(observed(name, "PEM", BTreeMap::new())),
                false,
                Action::Foreign("it does not carry this instance's podca labels"),
            ),
            (
                Some(observed(name, "PEM", owner_labels("other"))),
                false,
                Action::Foreign("it does not carry this instance's podca labels"),
            ),
        ];
        for (i, (obs, adopted, want)) in table.into_iter().enumerate() {
            assert_eq!(
                decide(&desired, "PEM", &ours, obs.as_ref(), adopted),
                want,
                "row {i}"
            );
        }
        let mut other_signer = observed(name, "PEM", ours.clone());
        other_signer.signer_name = "example.com/t".into();
        assert!(matches!(
            decide(&desired, "PEM", &ours, Some(&other_signer), true),
            Action::Foreign(_)
        ));
    }

    #[test]
    fn garbage_is_only_owned_and_undesired() {
        let ours = owner_labels("podca");
        let mut only_managed = ours.clone();
        only_managed.remove(INSTANCE_LABEL);
        let owned = vec![
            observed("example.com:s:podca", "", ours.clone()),
            observed("example.com:old:podca", "", ours.clone()),
            observed("example.com:s:other", "", owner_labels("blue")),
            observed("example.com:s:manual", "", only_managed),
            observed("example.com:s:foreign", "", BTreeMap::new()),
        ];
        let desired = BTreeSet::from(["example.com:s:podca"]);
        let names: Vec<&str> = garbage(&owned, &desired, &ours)
            .into_iter()
            .map(|o| o.name.as_str())
            .collect();
        assert_eq!(names, ["example.com:old:podca"]);
    }
}
