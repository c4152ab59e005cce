//! What the signer benchmarks share.

use std::time::{Duration, Instant};

/// One measuring window.
pub const RUN: Duration = Duration::from_secs(3);

/// Runs `op` for 300 ms untimed.
fn warm_up(op: &mut impl FnMut()) {
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(300) {
        op();
    }
}

/// Operations per second of `op` in one [`RUN`]-long window, `batch` calls between clock reads.
fn window(batch: u64, op: &mut impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < RUN {
        for _ in 0..batch {
            op();
        }
        n += batch;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn median(mut rates: [f64; 3]) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[1]
}

/// Operations per second of `a` and of `b`, each the median of three [`RUN`]-long windows, the
/// windows alternating (a, b, a, b, a, b) so that a change in the machine's load (other builds)
/// between windows weighs on both sides of the ratio alike.
pub fn paired_rates(batch: u64, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    warm_up(&mut a);
    warm_up(&mut b);
    let mut rates_a = [0.0; 3];
    let mut rates_b = [0.0; 3];
    for i in 0..3 {
        rates_a[i] = window(batch, &mut a);
        rates_b[i] = window(batch, &mut b);
    }
    (median(rates_a), median(rates_b))
}
