//! The session pool of a [`Pkcs11Key`]: lending sessions, throwing the pool away after a
//! failure, and reconnecting.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cryptoki::object::ObjectHandle;
use cryptoki::slot::Slot;

use super::Pkcs11Key;
use super::connect::{Found, connect, login};
use super::fault::{ConnectError, ReconnectError, inner_message};
use super::module::{TaggedSession, lock};
use crate::backend::BackendError;

pub(super) struct Conn {
    pub(super) slot: Slot,
    pub(super) key: ObjectHandle,
}

pub(super) struct PoolState {
    pub(super) idle: Vec<TaggedSession>,
    /// Sessions of the current generation, idle or lent out.
    pub(super) open: usize,
    pub(super) conn: Option<Conn>,
    /// Bumped whenever the pool is thrown away; lent sessions of older generations are closed
    /// on return instead of being pooled.
    pub(super) generation: u64,
    pub(super) retry_at: Option<Instant>,
    pub(super) last_error: String,
    /// Set when recovery must stop (wrong PIN, different key): every sign returns it.
    pub(super) fatal: Option<BackendError>,
}

pub(super) struct Lease {
    pub(super) session: TaggedSession,
    pub(super) key: ObjectHandle,
    pub(super) generation: u64,
}

fn drop_pool(st: &mut PoolState, detail: &str, backoff: Duration) {
    st.conn = None;
    st.generation += 1;
    st.open = 0;
    st.idle.clear();
    st.last_error = detail.to_owned();
    st.retry_at = (!backoff.is_zero()).then(|| Instant::now() + backoff);
}

impl Pkcs11Key {
    /// Lends a session, reconnecting first when the pool was thrown away.
    pub(super) fn acquire(&self) -> Result<Lease, BackendError> {
        let mut st = lock(&self.state);
        loop {
            if let Some(fatal) = &st.fatal {
                return Err(fatal.clone());
            }
            if st.conn.is_none() {
                if let Some(at) = st.retry_at
                    && Instant::now() < at
                {
                    return Err(BackendError::Unavailable(format!(
                        "{} (reconnecting)",
                        st.last_error
                    )));
                }
                self.reconnect(&mut st)?;
            }
            let Some(conn) = st.conn.as_ref() else {
                continue;
            };
            let (key, slot) = (conn.key, conn.slot);
            if let Some(session) = st.idle.pop() {
                return Ok(Lease {
                    session,
                    key,
                    generation: st.generation,
                });
            }
            if st.open < self.pool_size {
                let epoch = self.module.epoch();
                let opened = {
                    let ctx = self.module.read();
                    ctx.open_ro_session(slot)
                        .map_err(|e| ConnectError::Ck("opening a session", e))
                        .and_then(|s| login(&s, &self.pin).map(|()| s))
                };
                match opened {
                    Ok(session) => {
                        st.open += 1;
                        return Ok(Lease {
                            session: TaggedSession {
                                session: Some(session),
                                epoch,
                                module: Arc::clone(&self.module),
                            },
                            key,
                            generation: st.generation,
                        });
                    }
                    Err(e) => {
                        let err = e.running(&self.uri);
                        drop_pool(&mut st, &inner_message(&err), self.retry_interval);
                        if !err.is_transient() {
                            st.fatal = Some(err.clone());
                        }
                        self.available.notify_all();
                        return Err(err);
                    }
                }
            }
            st = self.available.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub(super) fn release(&self, lease: Lease, healthy: bool) {
        let mut st = lock(&self.state);
        if lease.generation == st.generation {
            if healthy {
                st.idle.push(lease.session);
            } else {
                st.open = st.open.saturating_sub(1);
            }
        }
        // Otherwise (or when unhealthy) the session is dropped here: closed, or forgotten if
        // the module was re-initialised.
        drop(st);
        self.available.notify_one();
    }

    /// Throws the pool away after a failure in `generation` (unless that was done already).
    pub(super) fn invalidate(&self, generation: u64, detail: &str, backoff: bool) {
        let mut st = lock(&self.state);
        if st.generation == generation {
            tracing::warn!(key = %self.uri, error = detail, "PKCS#11 CA key failed; reconnecting");
            drop_pool(
                &mut st,
                detail,
                if backoff {
                    self.retry_interval
                } else {
                    Duration::ZERO
                },
            );
        }
        drop(st);
        self.available.notify_all();
    }

    /// Reconnects (called with the state locked and no connection). Re-initialises the module
    /// when the library state looks stale.
    fn reconnect(&self, st: &mut PoolState) -> Result<(), BackendError> {
        let mut result = self.try_connect();
        if let Err(e) = &result
            && e.suggests_reinit()
            && self.module.reinitialize(e.epoch)
        {
            result = self.try_connect();
        }
        match result {
            Ok((found, epoch)) => {
                st.generation += 1;
                st.idle = vec![TaggedSession {
                    session: Some(found.session),
                    epoch,
                    module: Arc::clone(&self.module),
                }];
                st.open = 1;
                st.conn = Some(Conn {
                    slot: found.slot,
                    key: found.key,
                });
                st.retry_at = None;
                self.recoveries.fetch_add(1, Ordering::Relaxed);
                tracing::info!(key = %self.uri, "PKCS#11 CA key reconnected");
                Ok(())
            }
            Err(e) => {
                let err = e.error.running(&self.uri);
                st.retry_at = Some(Instant::now() + self.retry_interval);
                st.last_error = inner_message(&err);
                if !err.is_transient() {
                    st.fatal = Some(err.clone());
                }
                Err(err)
            }
        }
    }

    fn try_connect(&self) -> Result<(Found, u64), ReconnectError> {
        let ctx = self.module.read();
        let epoch = self.module.epoch();
        let found = connect(&ctx, &self.uri, &self.pin, false)
            .map_err(|error| ReconnectError { error, epoch })?;
        if found.facts.public_raw != self.facts.public_raw {
            return Err(ReconnectError {
                error: ConnectError::Replaced,
                epoch,
            });
        }
        Ok((found, epoch))
    }
}
