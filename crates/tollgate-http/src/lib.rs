//! tollgate-http: not written yet.
#![forbid(unsafe_code)]
