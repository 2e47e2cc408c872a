//! Test support shared by every tollgate crate's tests: the decision vectors that keep the in-process and
//! Redis stores honest, (in [`redis`]) real Redis servers for tests, (in [`tls`]) their certificates, and (in [`examples`] and [`http`])
//! the example servers run as black boxes and asked over TCP, and (in [`callgrind`]) the benches' instruction counts.
#![forbid(unsafe_code)]

pub mod callgrind;
pub mod examples;
pub mod http;
pub mod proxy;
pub mod redis;
pub mod tls;
pub mod vectors;
