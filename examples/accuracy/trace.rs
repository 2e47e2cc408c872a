//! The synthetic trace: a seeded PRNG and three kinds of clients.
//!
//! - **edge bursters** send a burst of ½ to 1 × limit in the last 1/60 of every window (the last second of a
//!   minute) and keep a steady stream of 0.3–0.8 × limit per window besides: the traffic the sliding window
//!   counter is known to undercount;
//! - **near-limit** clients send a Poisson stream at 0.8–1.2 × limit per window;
//! - **heavy-tailed** clients (all others) split the remaining requests by Pareto(α = 1.2) weights, so most send
//!   a handful and a few send far more than the limit; their requests are spread uniformly over the trace.
//!
//! Times are µs from the start of the trace, which starts at a window boundary.

/// Pareto shape of the heavy-tailed clients' weights: finite mean, infinite variance.
const PARETO_ALPHA: f64 = 1.2;
/// Share of the requests aimed at edge-bursting and at near-limit clients (sets how many clients each gets).
const EDGE_SHARE: f64 = 0.10;
const NEAR_SHARE: f64 = 0.15;

/// SplitMix64 (Steele, Lea and Flood, 2014): small, fast, fully determined by its seed.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) const fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 random bits.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n) by multiply-shift (n > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Exponentially distributed with the given mean.
    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// How a client behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    EdgeBurst,
    NearLimit,
    HeavyTailed,
}

impl Class {
    pub(crate) const ALL: [Self; 3] = [Self::EdgeBurst, Self::NearLimit, Self::HeavyTailed];

    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::EdgeBurst => "edge-burst",
            Self::NearLimit => "near-limit",
            Self::HeavyTailed => "heavy-tailed",
        }
    }
}

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TraceConfig {
    pub(crate) seed: u64,
    /// Requests wanted in total (the special classes are random, so the total is met exactly only when the
    /// heavy-tailed clients' share is at least one request each).
    pub(crate) requests: u64,
    pub(crate) clients: u32,
    pub(crate) limit: u64,
    pub(crate) period_us: u64,
    /// Length of the trace in periods.
    pub(crate) windows: u64,
}

/// One request: when, and from which client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) at: u64,
    pub(crate) client: u32,
}

/// A generated trace, sorted by time.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Trace {
    pub(crate) requests: Vec<Request>,
    /// Class of each client, indexed by client id.
    pub(crate) classes: Vec<Class>,
    /// Width of the window edge the bursters aim at.
    pub(crate) edge_us: u64,
}

impl Trace {
    pub(crate) fn clients_of(&self, class: Class) -> usize {
        self.classes.iter().filter(|&&c| c == class).count()
    }
}

/// Generates the trace `config` describes; the same config always gives the same trace.
pub(crate) fn generate(config: &TraceConfig) -> Trace {
    let mut rng = SplitMix64::new(config.seed);
    let (period, limit, windows) = (config.period_us, config.limit as f64, config.windows);
    let duration = period * windows;
    let edge_us = (period / 60).max(1);
    let clients = u64::from(config.clients);
    let wanted = |share: f64, per_client: f64| {
        let n = (share * config.requests as f64 / (per_client * windows as f64)).round() as u64;
        n.max(1).min(clients / 4)
    };
    let edge_clients = wanted(EDGE_SHARE, 1.3 * limit);
    let near_clients = wanted(NEAR_SHARE, limit);

    let mut classes = Vec::with_capacity(clients as usize);
    let mut requests = Vec::with_capacity(config.requests as usize + 1024);
    for client in 0..edge_clients {
        classes.push(Class::EdgeBurst);
        let low = config.limit.div_ceil(2);
        for w in 1..=windows {
            let burst = low + rng.below(config.limit - low + 1);
            for _ in 0..burst {
                requests.push(request(w * period - edge_us + rng.below(edge_us), client));
            }
        }
        let steady = rng.between(0.3, 0.8) * limit;
        poisson_stream(
            &mut rng,
            period as f64 / steady,
            duration,
            client,
            &mut requests,
        );
    }
    for client in edge_clients..edge_clients + near_clients {
        classes.push(Class::NearLimit);
        let rate = rng.between(0.8, 1.2) * limit;
        poisson_stream(
            &mut rng,
            period as f64 / rate,
            duration,
            client,
            &mut requests,
        );
    }

    // Every heavy-tailed client sends at least one request; the rest go by Pareto weight.
    let first = edge_clients + near_clients;
    let heavy = clients - first;
    let mut cumulative = Vec::with_capacity(heavy as usize);
    let mut total = 0.0;
    for _ in 0..heavy {
        total += (1.0 - rng.unit()).powf(-1.0 / PARETO_ALPHA);
        cumulative.push(total);
    }
    let mut counts = vec![1u64; heavy as usize];
    let special = requests.len() as u64;
    let extra = config
        .requests
        .saturating_sub(special)
        .saturating_sub(heavy);
    if heavy > 0 {
        for _ in 0..extra {
            let x = rng.unit() * total;
            let i = cumulative
                .partition_point(|&c| c <= x)
                .min(heavy as usize - 1);
            counts[i] += 1;
        }
    }
    for (i, &n) in counts.iter().enumerate() {
        classes.push(Class::HeavyTailed);
        for _ in 0..n {
            requests.push(request(rng.below(duration), first + i as u64));
        }
    }
    requests.sort_unstable_by_key(|r| (r.at, r.client));
    Trace {
        requests,
        classes,
        edge_us,
    }
}

const fn request(at: u64, client: u64) -> Request {
    Request {
        at,
        client: client as u32,
    }
}

/// Poisson arrivals with mean gap `mean_gap_us` over `[0, duration)`.
fn poisson_stream(
    rng: &mut SplitMix64,
    mean_gap_us: f64,
    duration: u64,
    client: u64,
    out: &mut Vec<Request>,
) {
    let mut t = rng.exponential(mean_gap_us);
    while t < duration as f64 {
        out.push(request(t as u64, client));
        t += rng.exponential(mean_gap_us);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(seed: u64) -> TraceConfig {
        TraceConfig {
            seed,
            requests: 20_000,
            clients: 400,
            limit: 20,
            period_us: 10_000_000,
            windows: 5,
        }
    }

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // Reference outputs of SplitMix64 seeded with 0 (as in the xoshiro authors' splitmix64.c).
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn draws_stay_in_range() {
        let mut rng = SplitMix64::new(7);
        for _ in 0..10_000 {
            assert!(rng.below(3) < 3);
            let u = rng.unit();
            assert!((0.0..1.0).contains(&u));
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_trace() {
        let a = generate(&small(42));
        assert_eq!(a, generate(&small(42)));
        assert_ne!(a.requests, generate(&small(43)).requests);
    }

    #[test]
    fn the_trace_has_the_requested_shape() {
        let config = small(1);
        let trace = generate(&config);
        assert_eq!(trace.requests.len() as u64, config.requests);
        assert_eq!(trace.classes.len(), config.clients as usize);
        assert!(trace.requests.windows(2).all(|w| w[0].at <= w[1].at));
        let duration = config.period_us * config.windows;
        assert!(trace.requests.iter().all(|r| r.at < duration));
        let mut per_client = vec![0u64; config.clients as usize];
        for r in &trace.requests {
            per_client[r.client as usize] += 1;
        }
        assert!(per_client.iter().all(|&n| n >= 1), "every client sends");
        for class in Class::ALL {
            assert!(
                trace.clients_of(class) >= 1,
                "{} clients exist",
                class.name()
            );
        }
    }

    #[test]
    fn edge_bursts_sit_at_the_end_of_a_window() {
        let config = small(3);
        let trace = generate(&config);
        assert_eq!(trace.edge_us, config.period_us / 60);
        let edge = |r: &Request| r.at % config.period_us >= config.period_us - trace.edge_us;
        let bursters = |r: &&Request| trace.classes[r.client as usize] == Class::EdgeBurst;
        let (at_edge, total) = trace
            .requests
            .iter()
            .filter(bursters)
            .fold((0, 0), |(e, t), r| (e + u64::from(edge(r)), t + 1));
        // Bursts of ≥ limit/2 per window at the edge against a steady stream of ≤ 0.8 × limit spread evenly.
        assert!(
            at_edge * 10 >= total * 4,
            "{at_edge} of {total} at the edge"
        );
    }
}
