//! Request classifiers for HTTP: which [`Priority`] a request has when load shedders must choose.
//!
//! - [`MethodPriority`], the default: writes (`POST`, `PUT`, `PATCH`, `DELETE`) are `High`, reads (`GET`, `HEAD`)
//!   and everything else `Normal`. Nothing is `Critical` or `Low` unless you say so.
//! - [`HeaderPriority`]: a priority named in a header (`x-priority: critical|high|normal|low` by default), else a
//!   fallback classifier. Clients can set any header: honour it only where the header comes from your own
//!   infrastructure (an API gateway that sets it, a header stripped at the edge), or every client becomes critical.
//!
//! ```
//! use http::{Method, Request};
//! use tollgate_http::priority::{HeaderPriority, MethodPriority};
//! use tollgate_tower::{Classify, Priority};
//!
//! let post = Request::post("/v1/charges").body(()).unwrap();
//! assert_eq!(MethodPriority::new().classify(&post), Priority::High);
//! let get = Request::get("/v1/charges").body(()).unwrap();
//! assert_eq!(MethodPriority::new().classify(&get), Priority::Normal);
//!
//! let by_header = HeaderPriority::new();
//! let batch = Request::get("/").header("x-priority", "low").body(()).unwrap();
//! assert_eq!(by_header.classify(&batch), Priority::Low);
//! assert_eq!(by_header.classify(&post), Priority::High); // no header: by method
//! ```

use http::{HeaderName, Method, Request};
use tollgate_tower::{Classify, Priority};

/// Classifies by method: `POST`, `PUT`, `PATCH`, `DELETE` → `High`; anything else (`GET`, `HEAD`, …) → `Normal`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MethodPriority;

impl MethodPriority {
    /// The method classifier.
    #[must_use]
    pub const fn new() -> Self {
        Self
    }
}

impl<B> Classify<Request<B>> for MethodPriority {
    fn classify(&self, req: &Request<B>) -> Priority {
        match *req.method() {
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE => Priority::High,
            _ => Priority::Normal,
        }
    }
}

/// Classifies by a header naming the priority (`critical`, `high`, `normal`, `low`, any case), falling back to
/// another classifier when the header is missing or unreadable.
///
/// Any client can send the header: honour it only where your own infrastructure sets it (a gateway that replaces
/// it, or strips it at the edge), or every client is critical. When it appears more than once (a gateway that
/// appends rather than replaces), the last value is read — the one nearest this service — never the client's
/// first.
#[derive(Debug, Clone)]
pub struct HeaderPriority<F = MethodPriority> {
    header: HeaderName,
    fallback: F,
}

/// The header [`HeaderPriority::new`] reads.
pub const X_PRIORITY: HeaderName = HeaderName::from_static("x-priority");

impl HeaderPriority {
    /// Reads `x-priority`, falling back to [`MethodPriority`].
    #[must_use]
    pub fn new() -> Self {
        Self {
            header: X_PRIORITY,
            fallback: MethodPriority,
        }
    }
}

impl Default for HeaderPriority {
    fn default() -> Self {
        Self::new()
    }
}

impl<F> HeaderPriority<F> {
    /// Reads `header` instead.
    #[must_use]
    pub fn header(mut self, header: HeaderName) -> Self {
        self.header = header;
        self
    }

    /// Falls back to `fallback` when the header is missing or names no priority.
    pub fn fallback<F2>(self, fallback: F2) -> HeaderPriority<F2> {
        HeaderPriority {
            header: self.header,
            fallback,
        }
    }
}

impl<B, F: Classify<Request<B>>> Classify<Request<B>> for HeaderPriority<F> {
    fn classify(&self, req: &Request<B>) -> Priority {
        req.headers()
            .get_all(&self.header)
            .iter()
            .next_back()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| self.fallback.classify(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, priority: Option<&str>) -> Request<()> {
        let mut builder = Request::builder().method(method).uri("/");
        if let Some(p) = priority {
            builder = builder.header("x-priority", p);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn methods_map_to_stripes_defaults() {
        let c = MethodPriority::new();
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert_eq!(c.classify(&req(m, None)), Priority::High);
        }
        for m in [Method::GET, Method::HEAD, Method::OPTIONS] {
            assert_eq!(c.classify(&req(m, None)), Priority::Normal);
        }
    }

    #[test]
    fn the_value_nearest_the_service_wins() {
        // A client sends `critical`; a gateway that appends (a second line, or after a comma) says `low`.
        let c = HeaderPriority::new();
        let two_lines = Request::get("/")
            .header("x-priority", "critical")
            .header("x-priority", "low")
            .body(())
            .unwrap();
        assert_eq!(c.classify(&two_lines), Priority::Low);
        let one_list = Request::get("/")
            .header("x-priority", "critical, low")
            .body(())
            .unwrap();
        assert_eq!(c.classify(&one_list), Priority::Low);
    }

    #[test]
    fn the_header_wins_and_bad_values_fall_back() {
        let c = HeaderPriority::new();
        assert_eq!(
            c.classify(&req(Method::GET, Some("CRITICAL"))),
            Priority::Critical
        );
        assert_eq!(c.classify(&req(Method::POST, Some("low"))), Priority::Low);
        assert_eq!(
            c.classify(&req(Method::POST, Some("urgent"))),
            Priority::High
        );
        let c = HeaderPriority::new().fallback(Priority::Low);
        assert_eq!(c.classify(&req(Method::GET, None)), Priority::Low);
    }
}
