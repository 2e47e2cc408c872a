//! Test support shared by every tollgate crate's tests: the decision vectors that keep the in-process and
//! Redis stores honest, and (in [`redis`]) real Redis servers for tests.
#![forbid(unsafe_code)]

pub mod redis;
pub mod vectors;
