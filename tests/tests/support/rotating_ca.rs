//! A file CA that podca's rotation driver turns over on a simulated clock: the set-up of every
//! "… under continuous mTLS" test, which then steps the clock one second at a time, calls
//! `rotator.tick()` and handshakes. Included with `#[path]` by the tests that use it (the
//! rotation driver is in podca-authority, a dev-dependency of the tests crate, not of its lib).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use podca_authority::CaHandle;
use podca_authority::metrics::Metrics;
use podca_authority::rotation::{Rotator, RotatorOptions, file_opener, load};
use podca_signer::rotation::Schedule;
use podca_signer::{FileStore, InitOptions};
use time::{Duration, OffsetDateTime};

/// How a test's CA turns over: each generation lives `ca_lifetime` seconds, the next one is
/// prepared at half of that, published at once, and activated one second after `propagation`
/// (so rounding never makes the schedule invalid); leaves live at most `leaf_lifetime`.
#[derive(Clone, Copy, Debug)]
pub struct Lifetimes {
    pub ca_lifetime: i64,
    pub propagation: i64,
    pub leaf_lifetime: i64,
}

impl Lifetimes {
    pub fn schedule(self) -> Schedule {
        Schedule {
            ca_lifetime_seconds: self.ca_lifetime,
            prepare_at: 0.5,
            activate_at: 0.5 + (self.propagation + 1) as f64 / self.ca_lifetime as f64,
            propagation_seconds: self.propagation,
        }
    }
}

/// A CA made at `t0` in `dir` (root and issuing certificate valid for one CA lifetime),
/// changed by `prepare` before it loads (`|_| {}` for none; the ML-DSA migration sets the next
/// generations' algorithm there), rotated automatically on `clock`: the store, the handle every
/// signing path reads, and the driver that rotates the store.
pub fn start(
    dir: &Path,
    lifetimes: Lifetimes,
    t0: OffsetDateTime,
    clock: Arc<dyn Fn() -> OffsetDateTime + Send + Sync>,
    metrics: Arc<Metrics>,
    prepare: impl FnOnce(&FileStore),
) -> (FileStore, CaHandle, Rotator) {
    let store = FileStore::new(dir);
    store
        .init(
            &InitOptions {
                root_validity: Duration::seconds(lifetimes.ca_lifetime),
                issuing_validity: Duration::seconds(lifetimes.ca_lifetime),
                ..InitOptions::default()
            },
            t0,
        )
        .expect("CA init");
    prepare(&store);
    let (ca, anchors) = load(&store, &file_opener()).expect("CA loads");
    let handle = CaHandle::new(ca, anchors);
    let rotator = rotator(
        "default",
        &store,
        &handle,
        lifetimes.schedule(),
        lifetimes.leaf_lifetime,
        clock,
        metrics,
    );
    (store, handle, rotator)
}

/// The rotation driver for `store` as `podca serve` runs it (automatic, polling every 30 s),
/// on a simulated `clock`, leaves living at most `leaf_lifetime` seconds.
pub fn rotator(
    name: &str,
    store: &FileStore,
    handle: &CaHandle,
    schedule: Schedule,
    leaf_lifetime: i64,
    clock: Arc<dyn Fn() -> OffsetDateTime + Send + Sync>,
    metrics: Arc<Metrics>,
) -> Rotator {
    Rotator::new(
        RotatorOptions {
            name: name.into(),
            store: store.clone(),
            schedule,
            automatic: true,
            max_leaf_lifetime: Duration::seconds(leaf_lifetime),
            poll: StdDuration::from_secs(30),
            open: file_opener(),
            refresh_when: None,
        },
        handle.clone(),
        clock,
        metrics,
    )
}
