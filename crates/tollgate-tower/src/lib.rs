//! tollgate-tower: not written yet.
#![forbid(unsafe_code)]
