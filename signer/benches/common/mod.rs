//! What the signer benchmarks share.

use std::time::{Duration, Instant};

/// Rounds of a paired measurement; each round runs each side for [`SIDE_PER_ROUND`].
pub const ROUNDS: usize = 9;
/// How long each side runs in one round, in [`SLICE`]s alternating with the other side.
pub const SIDE_PER_ROUND: Duration = Duration::from_secs(1);
/// How long one side runs before the other takes over.
///
/// Short, so that a burst of other load on the machine (a noisy neighbour of the VM, a build)
/// falls on both sides alike: with 3 s windows taken in turn, the ratios of one binary ranged
/// from 74 to 92 % on the 2-core machine (issue #18), which hid changes of 2–3 points.
pub const SLICE: Duration = Duration::from_millis(20);

/// Runs `op` for 300 ms untimed.
fn warm_up(op: &mut impl FnMut()) {
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(300) {
        op();
    }
}

/// Runs `op` for one [`SLICE`], `batch` calls between clock reads: (calls, time taken).
fn slice(batch: u64, op: &mut impl FnMut()) -> (u64, Duration) {
    let start = Instant::now();
    let mut n = 0u64;
    loop {
        for _ in 0..batch {
            op();
        }
        n += batch;
        let elapsed = start.elapsed();
        if elapsed >= SLICE {
            return (n, elapsed);
        }
    }
}

/// The result of [`paired_rates`].
pub struct Paired {
    /// Calls per second of `a` over all rounds.
    pub a: f64,
    /// Calls per second of `b` over all rounds.
    pub b: f64,
    /// Each round's rate of `b` over its rate of `a`, sorted.
    ratios: Vec<f64>,
}

impl Paired {
    /// The median of the rounds' ratios `b / a`.
    pub fn ratio(&self) -> f64 {
        self.ratios[self.ratios.len() / 2]
    }

    /// The lowest and the highest of the rounds' ratios.
    pub fn range(&self) -> (f64, f64) {
        (self.ratios[0], self.ratios[self.ratios.len() - 1])
    }
}

/// Calls per second of `a` and of `b`, measured in [`ROUNDS`] rounds in which the two take
/// turns every [`SLICE`], so that a change in the machine's load weighs on both sides of the
/// ratio alike; the ratio is taken per round, and its median reported.
pub fn paired_rates(batch: u64, mut a: impl FnMut(), mut b: impl FnMut()) -> Paired {
    warm_up(&mut a);
    warm_up(&mut b);
    let (mut total_a, mut total_b) = (Tally::default(), Tally::default());
    let mut ratios = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let (mut round_a, mut round_b) = (Tally::default(), Tally::default());
        while round_a.time < SIDE_PER_ROUND || round_b.time < SIDE_PER_ROUND {
            round_a.add(slice(batch, &mut a));
            round_b.add(slice(batch, &mut b));
        }
        ratios.push(round_b.rate() / round_a.rate());
        total_a.add((round_a.calls, round_a.time));
        total_b.add((round_b.calls, round_b.time));
    }
    ratios.sort_by(f64::total_cmp);
    Paired {
        a: total_a.rate(),
        b: total_b.rate(),
        ratios,
    }
}

/// Calls made and the time they took.
#[derive(Default)]
struct Tally {
    calls: u64,
    time: Duration,
}

impl Tally {
    fn add(&mut self, (calls, time): (u64, Duration)) {
        self.calls += calls;
        self.time += time;
    }

    fn rate(&self) -> f64 {
        self.calls as f64 / self.time.as_secs_f64()
    }
}

/// How the figures were measured, for the benchmarks' reports.
pub fn method() -> String {
    format!(
        "one core, release build; {ROUNDS} rounds of {} s per side, the sides taking turns every \
         {} ms; ratios are the median of the rounds' (lowest–highest in brackets)",
        SIDE_PER_ROUND.as_secs(),
        SLICE.as_millis()
    )
}
