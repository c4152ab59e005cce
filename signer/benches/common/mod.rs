//! What the signer benchmarks share.

use std::time::{Duration, Instant};

/// One measuring window.
pub const RUN: Duration = Duration::from_secs(3);

/// Operations per second of `op`: warm up, then count in [`RUN`]-long windows, `batch` calls
/// between clock reads, and take the median of three windows.
pub fn rate(batch: u64, mut op: impl FnMut()) -> f64 {
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(300) {
        op();
    }
    let mut rates: Vec<f64> = (0..3)
        .map(|_| {
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < RUN {
                for _ in 0..batch {
                    op();
                }
                n += batch;
            }
            n as f64 / start.elapsed().as_secs_f64()
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[1]
}
