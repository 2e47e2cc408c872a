//! tollgate-grpc: not written yet.
#![forbid(unsafe_code)]
