//! Test support shared by every tollgate crate's tests: the decision vectors that keep the in-process and
//! Redis stores honest, (in [`redis`]) real Redis servers for tests, and (in [`tls`]) their certificates.
#![forbid(unsafe_code)]

pub mod examples;
pub mod redis;
pub mod tls;
pub mod vectors;
