//! tollgate-redis: not written yet.
#![forbid(unsafe_code)]
