//! Random bytes for the small public values every issuance draws: leaf serials.
//!
//! Each call into aws-lc's DRBG costs about 0.7 µs on the 2-core machine whatever the length
//! (its per-call locking, reseed and fork checks), which was 2 % of an issuance with an ML-DSA
//! subject key under a P-256 CA (issue #18). So each thread draws [`POOL`] bytes at once and
//! hands them out in slices; every byte handed out is erased from the pool, so it is neither
//! given twice nor kept in memory after its use.
//!
//! Only values that are published anyway take this path (serials appear in the certificate);
//! keys and nonces come from aws-lc directly. The pool is per thread, and podca never forks a
//! process that goes on issuing (`std::process::Command` children exec at once), so no two
//! processes can hold the same pool.

use std::cell::RefCell;

/// Bytes drawn from aws-lc at a time: one draw per 409 serials.
const POOL: usize = 4096;

struct Pool {
    bytes: Box<[u8; POOL]>,
    /// Bytes before this index have been handed out (and erased).
    used: usize,
}

thread_local! {
    static THREAD_POOL: RefCell<Pool> = RefCell::new(Pool {
        bytes: Box::new([0; POOL]),
        used: POOL,
    });
}

/// Fills `out` with bytes from the system DRBG (aws-lc-rs), through this thread's pool.
///
/// # Panics
/// If aws-lc's random number generator fails, which it does only when the OS offers no entropy
/// source at all.
pub(crate) fn fill(out: &mut [u8]) {
    if out.len() > POOL / 8 {
        aws_lc_rs::rand::fill(out).expect("the system random number generator failed");
        return;
    }
    THREAD_POOL.with_borrow_mut(|pool| {
        if POOL - pool.used < out.len() {
            aws_lc_rs::rand::fill(&mut pool.bytes[..])
                .expect("the system random number generator failed");
            pool.used = 0;
        }
        let taken = &mut pool.bytes[pool.used..pool.used + out.len()];
        out.copy_from_slice(taken);
        taken.fill(0);
        pool.used += out.len();
    });
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::{POOL, fill};

    #[test]
    fn slices_are_never_handed_out_twice_across_refills() {
        // Ten pools' worth of 10-byte slices: a repeat would mean a slice given twice (or a
        // refill that did not happen); 80 random bits make a chance repeat negligible.
        let mut seen = HashSet::new();
        for _ in 0..(10 * POOL / 10) {
            let mut b = [0u8; 10];
            fill(&mut b);
            assert!(seen.insert(b), "a slice was handed out twice: {b:02x?}");
        }
    }

    #[test]
    fn handed_out_bytes_are_erased_and_large_requests_bypass_the_pool() {
        let mut b = [0u8; 16];
        fill(&mut b);
        super::THREAD_POOL.with_borrow(|pool| {
            assert!(pool.bytes[..pool.used].iter().all(|&x| x == 0));
        });
        let mut large = vec![0u8; POOL];
        fill(&mut large);
        assert!(large.iter().any(|&x| x != 0));
        let used = super::THREAD_POOL.with_borrow(|pool| pool.used);
        assert_eq!(
            used, 16,
            "a request larger than the pool's slice limit drew directly"
        );
    }
}
