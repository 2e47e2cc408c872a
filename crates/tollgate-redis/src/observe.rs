//! The store's metric names: round-trip latency and the circuit's state. Degraded decisions are counted by the
//! limiter that applies the failure policy (`tollgate_decisions_total{outcome="store_error_*"}`), not here.

/// Histogram of Redis round-trip times in seconds (label `outcome`: `ok` or `error`).
pub const LATENCY_SECONDS: &str = "tollgate_store_latency_seconds";
/// Gauge: 1 while the circuit is open or half-open, 0 when closed.
pub const CIRCUIT_OPEN: &str = "tollgate_store_circuit_open";
