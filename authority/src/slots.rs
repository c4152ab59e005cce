//! Connection slots of a plain HTTP listener (admin, OIDC discovery): at most `total` open
//! connections, and at most `per_peer` from one source address, so that one peer (a pod
//! holding idle connections) cannot take every slot and starve the others (the kubelet's
//! probes, Prometheus, relying parties). A connection over either bound is closed at accept.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// The slots of one listener.
#[derive(Debug)]
pub struct Slots {
    total: usize,
    per_peer: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Every slot of the listener is taken.
    Listener,
    /// This peer holds its share already.
    Peer,
}

/// One open connection's slot; given back when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    peer: IpAddr,
}

impl Slots {
    /// `total` slots, `per_peer` of them at most for one source address (both at least 1).
    pub fn new(total: usize, per_peer: usize) -> Arc<Self> {
        Arc::new(Slots {
            total: total.max(1),
            per_peer: per_peer.max(1),
            open: Mutex::new(Open::default()),
        })
    }

    /// A slot for a connection from `peer`, or which bound it hit. O(1).
    pub fn try_acquire(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, Full> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.total >= self.total {
            return Err(Full::Listener);
        }
        let held = open.by_peer.entry(peer).or_default();
        if *held >= self.per_peer {
            return Err(Full::Peer);
        }
        *held += 1;
        open.total += 1;
        Ok(Slot {
            slots: Arc::clone(self),
            peer,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.total = open.total.saturating_sub(1);
        if let Some(held) = open.by_peer.get_mut(&self.peer) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                open.by_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_share_and_the_others_the_rest() {
        let slots = Slots::new(4, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let a1 = slots.try_acquire(a).unwrap();
        let _a2 = slots.try_acquire(a).unwrap();
        assert_eq!(slots.try_acquire(a).unwrap_err(), Full::Peer);
        let _b1 = slots.try_acquire(b).unwrap();
        let _b2 = slots.try_acquire(b).unwrap();
        assert_eq!(slots.try_acquire(c).unwrap_err(), Full::Listener);
        drop(a1);
        let _c1 = slots.try_acquire(c).unwrap();
        assert_eq!(slots.try_acquire(a).unwrap_err(), Full::Listener);
    }

    #[test]
    fn slots_come_back_and_peers_are_forgotten() {
        let slots = Slots::new(2, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let held: Vec<_> = (0..2).map(|_| slots.try_acquire(a).unwrap()).collect();
        drop(held);
        let open = slots.open.lock().unwrap();
        assert_eq!((open.total, open.by_peer.len()), (0, 0));
    }
}
