//! An optional latency model for the emulator: per class of request, a service time and a number
//! of servers (requests served at once; the rest wait in a FIFO queue, as requests beyond
//! kube-apiserver's in-flight limit or priority-and-fairness seats do), and a delay on live watch
//! events. Off by default: the emulator then answers as fast as it can, and costs nothing more.
//!
//! The model is applied in the HTTP layer around a resource request's authorization and handler,
//! so what the emulator decides is untouched: only when the answer leaves changes. Classes:
//!
//! | class | requests |
//! | --- | --- |
//! | `create` | POST of a resource |
//! | `update` | PUT, PATCH (objects and `/status`) and DELETE: one write each |
//! | `get` | GET of one object |
//! | `list` | GET of a collection, per page |
//! | `watch` | the delay of each live event on an open watch (not the initial list) |
//!
//! Discovery, TokenReview, SubjectAccessReview and TokenRequest are not modelled. A class has
//! servers of its own, or shares the model's shared servers with the other classes that have
//! none (as the preset's do: one server process and etcd serve them all). The burst benchmark
//! files its PCRs into the store directly, not over HTTP, so its ceiling is the `update` class's
//! alone.
//!
//! A request holds a server for its handler's time or its drawn service time, whichever is
//! longer, so the ceiling of a saturated class is `servers / mean service time` as long as the
//! machine keeps up. Each server keeps the virtual instant it became free, and a queued request
//! starts at that instant rather than when the timer woke it: tokio's timer has millisecond
//! resolution, and without this a few-millisecond service time would lose up to a millisecond
//! a request and the ceiling with it.
//!
//! ## Configuration
//!
//! [`EmulatorConfig::latency`](super::EmulatorConfig::latency), parsed from a spec by
//! [`LatencyModel::from_str`]: `kube-emulator --latency SPEC`, and the environment variable
//! `PODCA_EMULATOR_LATENCY` (read by `kube-emulator` and by `controller_bench`; see
//! [`LatencyModel::from_env`]). A spec is a comma-separated list of
//!
//! * `off`: nothing modelled (the default);
//! * `real-apiserver`: the preset ([`LatencyModel::real_apiserver`]);
//! * `<class>=<base>[+<tail>][/<servers>]`: `class` serves each request in `base` plus an
//!   exponentially distributed time of mean `tail`, on `servers` of its own (if left out: on the
//!   shared servers, or unbounded if there are none); durations in `us`, `ms` or `s`, e.g.
//!   `update=3.75ms+2.22ms/3`;
//! * `servers=<n>`: the classes without servers of their own share `n`;
//! * `watch=<delay>`: each live watch event reaches its watchers `delay` after its write;
//! * `<class>=off`.
//!
//! Later items override earlier ones: `real-apiserver,watch=5ms` is the preset plus a watch delay.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::lock;

/// The environment variable the bench and `kube-emulator` read a spec from.
pub const LATENCY_ENV: &str = "PODCA_EMULATOR_LATENCY";

/// A class of request with its own service time and servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    Create,
    Update,
    Get,
    List,
}

impl RequestClass {
    const ALL: [RequestClass; 4] = [Self::Create, Self::Update, Self::Get, Self::List];

    fn name(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Update => "update",
            Self::Get => "get",
            Self::List => "list",
        }
    }
}

/// How long one request of a class holds a server, and how many servers there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceTime {
    /// The least time a request takes.
    pub base: Duration,
    /// The mean of an exponentially distributed time added to `base` (zero: always `base`).
    pub tail: Duration,
    /// Servers of the class's own: requests served at once; later ones queue. `None`: the
    /// model's shared servers, or unbounded (a pure delay) if it has none.
    pub servers: Option<usize>,
}

impl ServiceTime {
    /// The mean service time.
    pub fn mean(&self) -> Duration {
        self.base + self.tail
    }

    /// The service time at quantile `q` of the distribution (0 ≤ q < 1).
    pub fn quantile(&self, q: f64) -> Duration {
        self.base + self.tail.mul_f64(-(1.0 - q).ln())
    }
}

/// The latency model: a service time per class of request, a live watch event's delay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LatencyModel {
    /// Servers shared by the classes with none of their own (`None`: those are unbounded).
    pub shared_servers: Option<usize>,
    pub create: Option<ServiceTime>,
    pub update: Option<ServiceTime>,
    pub get: Option<ServiceTime>,
    pub list: Option<ServiceTime>,
    /// How long after its write a live watch event reaches a watcher.
    pub watch_event: Option<Duration>,
}

impl LatencyModel {
    /// The preset `real-apiserver`, calibrated from `../shared/real-apiserver.md` (kube-apiserver
    /// 1.36.3 and etcd 3.6.8 on a 2-core machine shared with the client). Every figure used is
    /// from one run, the per-request table:
    ///
    /// | | 1 in flight: p50 / p99 | 32 in flight: rate |
    /// | --- | --- | --- |
    /// | create | 3.8 / 11.1 ms | 672/s |
    /// | `/status` merge PATCH | 5.9 / 15.6 ms | 502/s |
    /// | LIST, `limit=500` | 39 ms | — |
    ///
    /// A service time is `base + Exp(mean tail)`: at one in flight nothing queues, so the two
    /// percentiles fix its shape: `p50 = base + tail·ln 2`, `p99 = base + tail·ln 100`, so
    /// `tail = (p99 − p50) / ln 50` and `base = p50 − tail·ln 2`. At 32 in flight the server is
    /// saturated, and Little's law gives the number served at once: `servers = rate × mean`.
    ///
    /// * PATCH (`update`): `tail = 9.7 / 3.912 = 2.480 ms`, `base = 5.9 − 1.719 = 4.181 ms`, mean
    ///   6.661 ms; `servers = 502/s × 6.661 ms = 3.34`, so 3. Three servers reach 502/s at a mean
    ///   of `3 / 502 = 5.976 ms`: both terms scaled by `5.976 / 6.661 = 0.897` give `base 3.75 ms`
    ///   and `tail 2.22 ms` (mean 5.97 ms, ceiling 502.5/s; at one in flight p50 5.29 ms and p99
    ///   13.97 ms, 10 % under the figures, which include the client's own time).
    /// * `create`: `tail = 7.3 / 3.912 = 1.866 ms`, `base = 3.8 − 1.293 = 2.507 ms`, mean
    ///   4.373 ms; `servers = 672/s × 4.373 ms = 2.94`, so 3; scaled by `(3 / 672) / 4.373 ms =
    ///   1.021`: `base 2.56 ms`, `tail 1.90 ms` (mean 4.46 ms, ceiling 672.6/s; p50 3.88 ms, p99
    ///   11.31 ms).
    /// * `list` (a page): 39 ms, one figure, so no tail.
    /// * `get` and `watch`: not measured, so not modelled rather than guessed.
    ///
    /// The two write paths, measured apart, agree on 3 servers: one server process and etcd on 2
    /// cores, which every request shares. So the classes share 3 servers (`servers=3`) rather
    /// than having 3 each: PCRs created over HTTP while their statuses are PATCHed slow each
    /// other, as on the real server (where podca settled at 0.88 of the rate PCRs were created).
    /// Across four runs that day the raw PATCH rate at 32 in flight was 490–740/s; 502/s is the
    /// run whose latencies the shape comes from.
    pub fn real_apiserver() -> Self {
        let ms = |us: u64| Duration::from_micros(us);
        LatencyModel {
            shared_servers: Some(3),
            create: Some(ServiceTime {
                base: ms(2_560),
                tail: ms(1_900),
                servers: None,
            }),
            update: Some(ServiceTime {
                base: ms(3_750),
                tail: ms(2_220),
                servers: None,
            }),
            get: None,
            list: Some(ServiceTime {
                base: ms(39_000),
                tail: Duration::ZERO,
                servers: None,
            }),
            watch_event: None,
        }
    }

    /// Whether nothing is modelled.
    pub fn is_off(&self) -> bool {
        *self == Self::default()
    }

    /// The model `PODCA_EMULATOR_LATENCY` names (off when unset or empty).
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(LATENCY_ENV) {
            Ok(spec) => spec.parse().map_err(|e| format!("{LATENCY_ENV}: {e}")),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(e) => Err(format!("{LATENCY_ENV}: {e}")),
        }
    }

    /// The service time of `class`.
    pub fn class(&self, class: RequestClass) -> Option<ServiceTime> {
        match class {
            RequestClass::Create => self.create,
            RequestClass::Update => self.update,
            RequestClass::Get => self.get,
            RequestClass::List => self.list,
        }
    }

    /// The most requests of `class` per second its servers can serve, were they its alone
    /// (`None` if unmodelled or unbounded).
    pub fn ceiling_per_second(&self, class: RequestClass) -> Option<f64> {
        let time = self.class(class)?;
        let servers = time.servers.or(self.shared_servers)?;
        Some(servers as f64 / time.mean().as_secs_f64())
    }

    fn class_mut(&mut self, class: RequestClass) -> &mut Option<ServiceTime> {
        match class {
            RequestClass::Create => &mut self.create,
            RequestClass::Update => &mut self.update,
            RequestClass::Get => &mut self.get,
            RequestClass::List => &mut self.list,
        }
    }
}

impl FromStr for LatencyModel {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, String> {
        let mut model = LatencyModel::default();
        for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item {
                "off" => model = LatencyModel::default(),
                "real-apiserver" => model = LatencyModel::real_apiserver(),
                _ => {
                    let (key, value) = item.split_once('=').ok_or_else(|| {
                        format!(
                            "{item:?}: expected off, real-apiserver, <class>=<base>[+<tail>][/<servers>] \
                             or watch=<delay>"
                        )
                    })?;
                    if key == "servers" {
                        model.shared_servers = match value {
                            "off" => None,
                            _ => Some(servers(value).map_err(|e| format!("{item:?}: {e}"))?),
                        };
                        continue;
                    }
                    if key == "watch" {
                        model.watch_event = match value {
                            "off" => None,
                            _ => Some(duration(value).map_err(|e| format!("{item:?}: {e}"))?),
                        };
                        continue;
                    }
                    let class = RequestClass::ALL
                        .into_iter()
                        .find(|c| c.name() == key)
                        .ok_or_else(|| {
                            format!(
                                "{item:?}: unknown class {key:?} (create, update, get, list, watch, \
                                 servers)"
                            )
                        })?;
                    *model.class_mut(class) = match value {
                        "off" => None,
                        _ => Some(service_time(value).map_err(|e| format!("{item:?}: {e}"))?),
                    };
                }
            }
        }
        Ok(model)
    }
}

/// `<base>[+<tail>][/<servers>]`.
fn service_time(value: &str) -> Result<ServiceTime, String> {
    let (times, servers) = match value.split_once('/') {
        Some((times, count)) => (times, Some(servers(count)?)),
        None => (value, None),
    };
    let (base, tail) = match times.split_once('+') {
        Some((base, tail)) => (duration(base)?, duration(tail)?),
        None => (duration(times)?, Duration::ZERO),
    };
    Ok(ServiceTime {
        base,
        tail,
        servers,
    })
}

/// A number of servers: a whole number above 0.
fn servers(text: &str) -> Result<usize, String> {
    text.parse()
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| format!("servers {text:?}: expected a whole number above 0"))
}

/// A duration such as `3.75ms`, `500us` or `1s`.
fn duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| c.is_ascii_alphabetic())
        .map(|i| text.split_at(i))
        .ok_or_else(|| format!("{text:?}: expected a duration with a unit (us, ms, s)"))?;
    let scale = match unit {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (us, ms, s)")),
    };
    let number: f64 = number
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0 && *n * scale < 3600.0)
        .ok_or_else(|| format!("{text:?}: expected a number of {unit} under an hour"))?;
    Ok(Duration::from_secs_f64(number * scale))
}

impl fmt::Display for LatencyModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_off() {
            return f.write_str("off");
        }
        let mut items = Vec::new();
        if let Some(s) = self.shared_servers {
            items.push(format!("servers={s}"));
        }
        for class in RequestClass::ALL {
            if let Some(t) = self.class(class) {
                let mut item = format!("{}={}", class.name(), show(t.base));
                if !t.tail.is_zero() {
                    item += &format!("+{}", show(t.tail));
                }
                if let Some(s) = t.servers {
                    item += &format!("/{s}");
                }
                items.push(item);
            }
        }
        if let Some(d) = self.watch_event {
            items.push(format!("watch={}", show(d)));
        }
        f.write_str(&items.join(","))
    }
}

/// A duration in the spec's own syntax, in microseconds' precision.
fn show(d: Duration) -> String {
    let us = d.as_micros();
    if us.is_multiple_of(1000) {
        format!("{}ms", us / 1000)
    } else {
        format!("{}ms", us as f64 / 1000.0)
    }
}

/// The model at work in one emulator: each class's service times and servers.
#[derive(Debug)]
pub(crate) struct Latency {
    create: Option<Class>,
    update: Option<Class>,
    get: Option<Class>,
    list: Option<Class>,
    pub(crate) watch_event: Option<Duration>,
}

impl Latency {
    /// `None` when the model is off, so a request checks one `Option` and nothing more.
    pub(crate) fn new(model: &LatencyModel) -> Option<Latency> {
        if model.is_off() {
            return None;
        }
        let shared = Arc::new(Servers::new(model.shared_servers));
        let class = |time: Option<ServiceTime>| {
            time.map(|time| {
                let servers = match time.servers {
                    Some(own) => Arc::new(Servers::new(Some(own))),
                    None => Arc::clone(&shared),
                };
                Class::new(time, servers)
            })
        };
        Some(Latency {
            create: class(model.create),
            update: class(model.update),
            get: class(model.get),
            list: class(model.list),
            watch_event: model.watch_event,
        })
    }

    /// Runs `handle` on one of `class`'s servers, and answers once its service time is over.
    pub(crate) async fn serve<T>(&self, class: RequestClass, handle: impl FnOnce() -> T) -> T {
        let class = match class {
            RequestClass::Create => &self.create,
            RequestClass::Update => &self.update,
            RequestClass::Get => &self.get,
            RequestClass::List => &self.list,
        };
        match class {
            Some(class) => class.servers.serve(class.draw(), handle).await,
            None => handle(),
        }
    }
}

/// One class at work: its service times, drawn in turn, and the servers it uses.
#[derive(Debug)]
pub(crate) struct Class {
    time: ServiceTime,
    /// Draws so far: the state of the service-time sequence.
    draws: AtomicU64,
    pub(crate) servers: Arc<Servers>,
}

impl Class {
    pub(crate) fn new(time: ServiceTime, servers: Arc<Servers>) -> Class {
        Class {
            time,
            draws: AtomicU64::new(0),
            servers,
        }
    }

    /// The next service time: `base + tail·(−ln U)`, U uniform in (0, 1] from a SplitMix64
    /// sequence (deterministic per emulator, no lock).
    fn draw(&self) -> Duration {
        if self.time.tail.is_zero() {
            return self.time.base;
        }
        let n = self.draws.fetch_add(1, Ordering::Relaxed);
        let mut z = n.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // 53 random bits, shifted into (0, 1].
        let u = ((z >> 11) + 1) as f64 / (1u64 << 53) as f64;
        self.time.base + self.time.tail.mul_f64(-u.ln())
    }
}

/// Servers, of one class or shared: a FIFO semaphore bounds them, and each server keeps the
/// virtual instant it became free.
#[derive(Debug)]
pub(crate) struct Servers {
    /// `None`: unbounded.
    permits: Option<Semaphore>,
    /// The instants the idle servers became free (as many as there are permits left).
    free_at: Mutex<Vec<Instant>>,
    waiting: AtomicUsize,
    serving: AtomicUsize,
}

impl Servers {
    /// `count` servers; `None`: unbounded.
    pub(crate) fn new(count: Option<usize>) -> Servers {
        Servers {
            permits: count.map(Semaphore::new),
            free_at: Mutex::new(vec![Instant::now(); count.unwrap_or(0)]),
            waiting: AtomicUsize::new(0),
            serving: AtomicUsize::new(0),
        }
    }

    /// Requests waiting for a server.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Requests holding a server.
    #[cfg(test)]
    pub(crate) fn serving(&self) -> usize {
        self.serving.load(Ordering::Relaxed)
    }

    /// Runs `handle` on a server, which it holds for `service` (or `handle`'s own time, if
    /// longer), counted from when the server became free if the request waited for it.
    pub(crate) async fn serve<T>(&self, service: Duration, handle: impl FnOnce() -> T) -> T {
        let arrived = Instant::now();
        let Some(permits) = &self.permits else {
            let out = handle();
            tokio::time::sleep_until(arrived + service).await;
            return out;
        };
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let permit = permits.acquire().await;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        // The semaphore is never closed, so acquiring fails never; were it to, serving without
        // a server is the harmless way out.
        let Ok(permit) = permit else {
            return handle();
        };
        // A permit held means a server is idle, so there is an instant to pop; `arrived` if not.
        let free_at = lock(&self.free_at).pop().unwrap_or(arrived);
        let finish = arrived.max(free_at) + service;
        self.serving.fetch_add(1, Ordering::Relaxed);
        let busy = Busy {
            servers: self,
            finish,
            _permit: permit,
        };
        let out = handle();
        tokio::time::sleep_until(finish).await;
        drop(busy);
        out
    }
}

/// A server held: given back with the instant it becomes free, also when the client went away
/// (its request then still occupies the server until `finish`, virtually).
struct Busy<'a> {
    servers: &'a Servers,
    finish: Instant,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        // Before the permit (a field, dropped after this body): the next request finds it.
        lock(&self.servers.free_at).push(self.finish);
        self.servers.serving.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: f64) -> Duration {
        Duration::from_secs_f64(ms / 1000.0)
    }

    #[test]
    fn specs_parse_into_the_model_and_print_back() {
        assert_eq!("off".parse::<LatencyModel>(), Ok(LatencyModel::default()));
        assert_eq!("".parse::<LatencyModel>(), Ok(LatencyModel::default()));
        assert_eq!(
            "real-apiserver".parse::<LatencyModel>(),
            Ok(LatencyModel::real_apiserver())
        );
        let model: LatencyModel =
            "real-apiserver, get=1ms/8, watch=5ms, list=off, create=250us+0.5ms"
                .parse()
                .expect("a valid spec");
        assert_eq!(
            model,
            LatencyModel {
                shared_servers: Some(3),
                create: Some(ServiceTime {
                    base: ms(0.25),
                    tail: ms(0.5),
                    servers: None
                }),
                update: LatencyModel::real_apiserver().update,
                get: Some(ServiceTime {
                    base: ms(1.0),
                    tail: Duration::ZERO,
                    servers: Some(8)
                }),
                list: None,
                watch_event: Some(ms(5.0)),
            }
        );
        assert_eq!(
            model.to_string(),
            "servers=3,create=0.25ms+0.5ms,update=3.75ms+2.22ms,get=1ms/8,watch=5ms"
        );
        assert_eq!(model.to_string().parse::<LatencyModel>(), Ok(model));
        assert_eq!(LatencyModel::default().to_string(), "off");
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (spec, error) in [
            ("fast", "\"fast\": expected off, real-apiserver"),
            ("patch=1ms", "unknown class \"patch\""),
            ("update=1", "expected a duration with a unit"),
            ("update=1h", "unknown unit \"h\""),
            ("update=-1ms", "expected a number of ms under an hour"),
            (
                "update=1ms/0",
                "servers \"0\": expected a whole number above 0",
            ),
            ("update=1ms+..5ms/3", "\"..5ms\": expected a number of ms"),
            ("watch=5", "expected a duration with a unit"),
        ] {
            let e = spec.parse::<LatencyModel>().expect_err(spec);
            assert!(e.contains(error), "{spec}: {e}");
        }
    }

    /// The preset's numbers against the figures they were derived from: the ceiling of each
    /// write path at 32 in flight, and the one-in-flight percentiles within the 10 % given up
    /// to fit the ceiling with a whole number of servers.
    #[test]
    fn the_preset_reproduces_the_real_servers_figures() {
        let preset = LatencyModel::real_apiserver();
        for (class, rate, p50, p99) in [
            (RequestClass::Update, 502.0, 5.9, 15.6),
            (RequestClass::Create, 672.0, 3.8, 11.1),
        ] {
            let ceiling = preset.ceiling_per_second(class).expect("bounded");
            assert!((ceiling / rate - 1.0).abs() < 0.01, "{ceiling} vs {rate}");
            let t = preset.class(class).expect("modelled");
            for (q, figure) in [(0.5, p50), (0.99, p99)] {
                let model = t.quantile(q).as_secs_f64() * 1000.0;
                assert!(
                    (model / figure - 1.0).abs() < 0.11,
                    "p{q}: {model} ms vs {figure} ms"
                );
            }
        }
        assert_eq!(preset.list.map(|l| l.mean()), Some(ms(39.0)));
        assert_eq!((preset.get, preset.watch_event), (None, None));
        assert_eq!(preset.shared_servers, Some(3));
    }

    /// A class of `base` on `servers` servers of its own.
    fn class(base: Duration, tail: Duration, servers: usize) -> Class {
        Class::new(
            ServiceTime {
                base,
                tail,
                servers: Some(servers),
            },
            Arc::new(Servers::new(Some(servers))),
        )
    }

    #[test]
    fn service_times_follow_the_distribution() {
        let class = class(ms(4.0), ms(2.0), 1);
        let mut draws: Vec<f64> = (0..20_000)
            .map(|_| class.draw().as_secs_f64() * 1000.0)
            .collect();
        draws.sort_by(f64::total_cmp);
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!(draws[0] >= 4.0, "below the base: {}", draws[0]);
        assert!((mean - 6.0).abs() < 0.1, "mean {mean}");
        // Exp(2 ms): median 2·ln 2 = 1.386 ms above the base, p99 2·ln 100 = 9.21 ms.
        assert!((draws[10_000] - 5.386).abs() < 0.1, "p50 {}", draws[10_000]);
        assert!((draws[19_800] - 13.21).abs() < 0.6, "p99 {}", draws[19_800]);
    }

    /// Six requests at once on two servers of 300 ms: two are served, four queue, and they
    /// finish in three waves. Lower bounds only (a timer never fires early), so a loaded machine
    /// cannot make it fail; an upper bound on the in-flight count, which no load can excuse.
    #[tokio::test]
    async fn at_most_servers_requests_are_served_at_once_and_the_rest_queue() {
        let service = ms(300.0);
        let servers = Arc::new(Servers::new(Some(2)));
        let most_in_service = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let requests: Vec<_> = (0..6)
            .map(|_| {
                let (servers, most) = (Arc::clone(&servers), Arc::clone(&most_in_service));
                tokio::spawn(async move {
                    servers
                        .serve(service, || {
                            most.fetch_max(servers.serving(), Ordering::Relaxed)
                        })
                        .await;
                    start.elapsed()
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while servers.waiting() + servers.serving() < 6 {
            assert!(Instant::now() < deadline, "the six requests never arrived");
            tokio::time::sleep(ms(1.0)).await;
        }
        let (waiting, serving) = (servers.waiting(), servers.serving());
        assert!(serving <= 2, "{serving} served at once");
        assert!(waiting >= 4, "only {waiting} queued");
        let mut finished = Vec::new();
        for r in requests {
            finished.push(r.await.expect("a request"));
        }
        finished.sort();
        for (i, took) in finished.iter().enumerate() {
            let wave = (i / 2 + 1) as u32;
            assert!(*took >= service * wave, "request {i} done after {took:?}");
        }
        assert_eq!(most_in_service.load(Ordering::Relaxed), 2);
        assert_eq!((servers.waiting(), servers.serving()), (0, 0));
    }

    /// `servers=1`: a create and an update without servers of their own queue for the one they
    /// share; a get with its own server does not wait for them.
    #[tokio::test]
    async fn classes_without_their_own_servers_share_the_models() {
        let latency = Latency::new(
            &"servers=1,create=200ms,update=200ms,get=10ms/1"
                .parse()
                .expect("a valid spec"),
        )
        .expect("a model");
        let start = Instant::now();
        let timed = |class| {
            let latency = &latency;
            async move {
                latency.serve(class, || ()).await;
                start.elapsed()
            }
        };
        let (create, update, get) = tokio::join!(
            timed(RequestClass::Create),
            timed(RequestClass::Update),
            timed(RequestClass::Get)
        );
        assert!(create.min(update) >= ms(200.0), "{create:?} {update:?}");
        assert!(create.max(update) >= ms(400.0), "{create:?} {update:?}");
        assert!(get < create.min(update), "the get waited: {get:?}");
        // A class not in the model is answered at once.
        let list = Instant::now();
        latency.serve(RequestClass::List, || ()).await;
        assert!(list.elapsed() < ms(100.0), "{:?}", list.elapsed());
    }

    /// A queued request starts when its server became free, not when the timer woke it: 400
    /// requests of 1 ms on one server take 400 ms, not up to twice that at tokio's 1 ms tick.
    /// A stall of the machine delays the requests after it, which then catch up.
    #[tokio::test]
    async fn timer_resolution_does_not_lower_the_ceiling() {
        let servers = Arc::new(Servers::new(Some(1)));
        let start = Instant::now();
        let requests: Vec<_> = (0..400)
            .map(|_| {
                let servers = Arc::clone(&servers);
                tokio::spawn(async move { servers.serve(ms(1.0), || ()).await })
            })
            .collect();
        for r in requests {
            r.await.expect("a request");
        }
        let took = start.elapsed();
        assert!(
            took >= ms(400.0),
            "{took:?}: faster than one server can serve"
        );
        assert!(
            took < ms(600.0),
            "{took:?}: the timer's rounding lowered the ceiling"
        );
    }
}
