//! The JWT keys as the data of one Kubernetes Secret, without Kubernetes: what
//! `podca_controller::jwt_secret` reads from and writes to the Secret backend's JWT Secret
//! (the design is in that module's docs).
//!
//! ```text
//! state.json     the keys and their phases: the same JSON as the data directory's jwt/state.json
//! <kid>.key      each key's private key, PKCS#8 PEM
//! ```
//!
//! [`JwtSecretKeys::advance`] takes the schedule's steps with [`keyset::plan`] and
//! [`keyset::apply`], exactly as [`super::store::JwtStore::advance`] does: only where the keys
//! are kept differs. Nothing here touches the Secret: the caller writes [`JwtSecretKeys::data`]
//! in one update (so the state and the keys it names change together, atomically) and installs
//! the new [`JwtKeySet`] only after the write succeeded, so no key signs, and no key is
//! published, before the Secret holds it. Errors name the Secret and the data key, never key
//! material; [`std::fmt::Debug`] shows no private key.

use std::collections::BTreeMap;
use std::sync::Arc;

use time::OffsetDateTime;

use super::keyset::{self, JwtKeySchedule, JwtKeySet, JwtKeyStep, kid_of};
use super::store::{State, StoredJwtKey};
use super::{JwtAlgorithm, JwtError};
use crate::backend::{CaAlgorithm, CaKey, MemoryKey};
use crate::store::StoreError;

/// The data key of the state.
pub const STATE_KEY: &str = "state.json";

/// The data key of key `kid`'s private key.
pub fn key_data_key(kid: &str) -> String {
    format!("{kid}.key")
}

/// The JWT keys held in a Secret's data.
#[derive(Clone)]
pub struct JwtSecretKeys {
    /// `kubernetes-secret:<namespace>/<name>`, for errors and `podca ca show`.
    location: String,
    state: State,
    keys: BTreeMap<String, Arc<MemoryKey>>,
}

impl std::fmt::Debug for JwtSecretKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSecretKeys")
            .field("location", &self.location)
            .field("state", &self.state)
            .field("private_keys", &"<redacted>")
            .finish()
    }
}

impl JwtSecretKeys {
    /// No keys yet: a Secret that does not exist.
    pub fn empty(location: &str) -> Self {
        JwtSecretKeys {
            location: location.to_owned(),
            state: State::default(),
            keys: BTreeMap::new(),
        }
    }

    /// Reads a Secret's data. Every key the state names must be there, be a private key of a
    /// JWT-SVID algorithm and match its kid; entries the state does not name (what an edit left)
    /// are ignored, and gone after the next write.
    pub fn parse(location: &str, data: &BTreeMap<String, Vec<u8>>) -> Result<Self, StoreError> {
        let mut keys = Self::empty(location);
        let Some(state) = data.get(STATE_KEY) else {
            if data.is_empty() {
                return Ok(keys);
            }
            return Err(keys.error(format!("no {STATE_KEY} beside the key entries")));
        };
        keys.state = serde_json::from_slice(state)
            .map_err(|e| keys.error(format!("{STATE_KEY} is not valid: {e}")))?;
        if let Some(kid) = keys.state.locations.keys().next() {
            return Err(keys.error(format!(
                "{STATE_KEY} says key {kid} is held elsewhere; this Secret holds its keys itself"
            )));
        }
        for info in &keys.state.keys {
            let entry = key_data_key(&info.kid);
            let pem = data.get(&entry).ok_or_else(|| {
                keys.error(format!("{STATE_KEY} names {entry}, which is missing"))
            })?;
            let key = std::str::from_utf8(pem)
                .ok()
                .and_then(|pem| MemoryKey::from_pem(pem).ok())
                .ok_or_else(|| keys.error(format!("{entry} is not a PEM private key")))?;
            if kid_of(&key) != info.kid {
                return Err(
                    keys.error(format!("{entry} does not hold the key of kid {}", info.kid))
                );
            }
            if key.algorithm() != info.algorithm {
                return Err(keys.error(format!(
                    "{entry} is an {} key, {STATE_KEY} says {}",
                    key.algorithm(),
                    info.algorithm
                )));
            }
            keys.keys.insert(info.kid.clone(), Arc::new(key));
        }
        Ok(keys)
    }

    /// The Secret's data: the state and every key it names (handle with care: private keys).
    pub fn data(&self) -> Result<BTreeMap<String, Vec<u8>>, StoreError> {
        let state = serde_json::to_vec_pretty(&self.state)
            .map_err(|e| self.error(format!("serialising {STATE_KEY}: {e}")))?;
        let mut data = BTreeMap::from([(STATE_KEY.to_owned(), state)]);
        for info in &self.state.keys {
            let key = self
                .keys
                .get(&info.kid)
                .ok_or_else(|| self.error(format!("no private key for kid {}", info.kid)))?;
            let pem = key
                .pkcs8_pem()
                .map_err(|_| self.error(format!("key {} cannot be written", info.kid)))?;
            // The Secret's data is the caller's to handle (and the API client's to send).
            data.insert(key_data_key(&info.kid), pem.as_bytes().to_vec());
        }
        Ok(data)
    }

    /// The state's sequence: bumped on every change.
    pub fn sequence(&self) -> u64 {
        self.state.sequence
    }

    /// Brings the keys up to date at `now` (makes the first key; prepares, activates and drops
    /// per `schedule`) and returns the steps taken; none: nothing to write.
    pub fn advance(
        &mut self,
        now: OffsetDateTime,
        schedule: &JwtKeySchedule,
        algorithm: CaAlgorithm,
    ) -> Result<Vec<JwtKeyStep>, StoreError> {
        JwtAlgorithm::for_key(algorithm).map_err(|e| self.error(e.to_string()))?;
        schedule.check().map_err(|e| self.error(e.to_string()))?;
        let mut steps = Vec::new();
        while let Some(step) = keyset::plan(&self.state.keys, now, schedule) {
            let new_key = match &step {
                JwtKeyStep::Generate { .. } => {
                    let key = MemoryKey::generate(algorithm)
                        .map_err(|e| self.error(format!("making a key: {e}")))?;
                    let kid = kid_of(&key);
                    self.keys.insert(kid.clone(), Arc::new(key));
                    Some((kid, algorithm))
                }
                JwtKeyStep::Drop(kid) => {
                    self.keys.remove(kid);
                    None
                }
                JwtKeyStep::Activate(_) => None,
            };
            keyset::apply(&mut self.state.keys, &step, now, schedule, new_key);
            steps.push(step);
            // Each step changes one key; a handful settle any state.
            if steps.len() > 8 {
                return Err(self.error("the JWT key plan does not settle".into()));
            }
        }
        if !steps.is_empty() {
            self.state.sequence += 1;
        }
        Ok(steps)
    }

    /// The keys to sign with and publish.
    pub fn key_set(&self) -> Result<JwtKeySet, StoreError> {
        let mut keys = Vec::with_capacity(self.state.keys.len());
        for info in &self.state.keys {
            let key = self
                .keys
                .get(&info.kid)
                .ok_or_else(|| self.error(format!("no private key for kid {}", info.kid)))?;
            keys.push((info.clone(), Arc::clone(key) as Arc<dyn CaKey>));
        }
        JwtKeySet::new(keys, self.state.sequence).map_err(|e: JwtError| self.error(e.to_string()))
    }

    /// The keys and where each is held (`kubernetes-secret:<ns>/<name>#<kid>.key`), for
    /// `podca ca show`.
    pub fn stored(&self) -> (u64, Vec<StoredJwtKey>) {
        let keys = self
            .state
            .keys
            .iter()
            .map(|info| StoredJwtKey {
                info: info.clone(),
                location: format!("{}#{}", self.location, key_data_key(&info.kid)),
            })
            .collect();
        (self.state.sequence, keys)
    }

    fn error(&self, detail: String) -> StoreError {
        StoreError::JwtKey {
            location: self.location.clone(),
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use time::Duration;
    use time::macros::datetime;

    use super::*;
    use crate::jwt::JwtKeyPhase;

    const AT: &str = "kubernetes-secret:podca-system/podca-ca-jwt";

    fn schedule() -> JwtKeySchedule {
        JwtKeySchedule {
            rotation_period: Duration::hours(24),
            propagation: Duration::hours(1),
            max_lifetime: Duration::hours(1),
        }
    }

    fn advance(keys: &mut JwtSecretKeys, at: OffsetDateTime) -> Vec<JwtKeyStep> {
        keys.advance(at, &schedule(), CaAlgorithm::EcdsaP256)
            .expect("advance")
    }

    /// Writes and reads back, as the Secret round trip does.
    fn round_trip(keys: &JwtSecretKeys) -> JwtSecretKeys {
        JwtSecretKeys::parse(AT, &keys.data().expect("data")).expect("parse")
    }

    #[test]
    fn the_schedule_runs_through_the_secret_data() {
        let t0 = datetime!(2026-01-01 00:00 UTC);
        let mut keys = JwtSecretKeys::parse(AT, &BTreeMap::new()).expect("an empty Secret");
        assert_eq!(
            advance(&mut keys, t0),
            vec![JwtKeyStep::Generate { activate: true }]
        );
        let first = keys.key_set().expect("set");
        let kid = first.infos().next().expect("a key").kid.clone();
        let data = keys.data().expect("data");
        // As a set: the kid is random, so it sorts before or after "state.json".
        assert_eq!(
            data.keys()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>(),
            [key_data_key(&kid), STATE_KEY.to_owned()].into()
        );
        assert!(
            String::from_utf8_lossy(&data[&key_data_key(&kid)])
                .starts_with("-----BEGIN PRIVATE KEY-----")
        );
        // A replica reads the same key and signs with it; nothing is due.
        let mut read = round_trip(&keys);
        assert_eq!(read.sequence(), 1);
        assert!(advance(&mut read, t0 + Duration::minutes(1)).is_empty());
        let signing = |k: &JwtSecretKeys, at| {
            k.key_set()
                .expect("set")
                .signing(at)
                .map(|(info, _)| info.kid.clone())
        };
        assert_eq!(signing(&read, t0), Some(kid.clone()));
        // Prepared a propagation window before the rotation: published, not signing.
        let mut read = round_trip(&read);
        advance(&mut read, t0 + Duration::hours(23));
        let read = round_trip(&read);
        let phases: Vec<_> = read.stored().1.iter().map(|k| k.info.phase).collect();
        assert_eq!(phases, vec![JwtKeyPhase::Active, JwtKeyPhase::Prepared]);
        assert_eq!(signing(&read, t0 + Duration::hours(23)), Some(kid.clone()));
        // Activated; the old key stays (retired) until its last token expired, then goes.
        let mut read = read;
        advance(&mut read, t0 + Duration::hours(24));
        let mut read = round_trip(&read);
        let next = read.stored().1[1].info.kid.clone();
        assert_eq!(signing(&read, t0 + Duration::hours(24)), Some(next.clone()));
        assert_eq!(read.stored().1[0].info.phase, JwtKeyPhase::Retired);
        advance(&mut read, t0 + Duration::hours(25));
        let data = read.data().expect("data");
        assert!(!data.contains_key(&key_data_key(&kid)), "dropped key kept");
        assert_eq!(round_trip(&read).sequence(), 4);
        assert_eq!(
            read.stored().1[0].location,
            format!("{AT}#{}", key_data_key(&next))
        );
    }

    #[test]
    fn bad_secret_data_is_refused_by_entry_without_key_material() {
        let t0 = datetime!(2026-01-01 00:00 UTC);
        let mut keys = JwtSecretKeys::empty(AT);
        advance(&mut keys, t0);
        let good = keys.data().expect("data");
        let kid = keys.stored().1[0].info.kid.clone();
        let entry = key_data_key(&kid);
        let pem = String::from_utf8(good[&entry].clone()).expect("utf-8");
        let refused = |data: BTreeMap<String, Vec<u8>>| {
            let err = JwtSecretKeys::parse(AT, &data)
                .expect_err("refused")
                .to_string();
            assert!(!err.contains(pem.trim()), "{err}");
            err
        };
        let mut missing = good.clone();
        missing.remove(&entry);
        assert_eq!(
            refused(missing),
            format!("JWT signing keys in {AT}: state.json names {entry}, which is missing")
        );
        let mut garbled = good.clone();
        garbled.insert(entry.clone(), pem.as_bytes()[..pem.len() / 2].to_vec());
        assert_eq!(
            refused(garbled),
            format!("JWT signing keys in {AT}: {entry} is not a PEM private key")
        );
        let mut swapped = good.clone();
        let other = MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("key");
        swapped.insert(
            entry.clone(),
            other.pkcs8_pem().expect("pem").as_bytes().to_vec(),
        );
        assert_eq!(
            refused(swapped),
            format!("JWT signing keys in {AT}: {entry} does not hold the key of kid {kid}")
        );
        let mut no_state = good.clone();
        no_state.remove(STATE_KEY);
        assert_eq!(
            refused(no_state),
            format!("JWT signing keys in {AT}: no state.json beside the key entries")
        );
        let mut bad_state = good.clone();
        bad_state.insert(STATE_KEY.into(), b"{".to_vec());
        assert!(refused(bad_state).contains("state.json is not valid"));
        // An entry the state does not name is ignored and not written back.
        let mut extra = good.clone();
        extra.insert("left-over.key".into(), b"x".to_vec());
        let read = JwtSecretKeys::parse(AT, &extra).expect("parse");
        assert_eq!(read.data().expect("data"), good);
        // Debug shows no private key, in any encoding of its DER.
        let der = ::pem::parse(&good[&entry]).expect("PEM").into_contents();
        crate::backend::contract::assert_debug_hides(
            &format!("{read:?} {:?}", read.key_set().expect("key set")),
            crate::backend::contract::Secret::Pkcs8Der(&der),
        );
    }

    #[test]
    fn an_ed25519_jwt_key_is_refused_before_anything_changes() {
        let mut keys = JwtSecretKeys::empty(AT);
        let err = keys
            .advance(
                datetime!(2026-01-01 00:00 UTC),
                &schedule(),
                CaAlgorithm::Ed25519,
            )
            .expect_err("EdDSA");
        assert!(
            err.to_string()
                .contains("Ed25519 (EdDSA) is not a JWT-SVID algorithm"),
            "{err}"
        );
        assert_eq!(keys.stored().1.len(), 0);
    }
}
