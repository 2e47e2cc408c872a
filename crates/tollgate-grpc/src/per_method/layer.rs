use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::MethodLimit;
use super::service::Routes;

/// Routes each call to the rate limit of its method or service: see the [module docs](super).
#[must_use]
pub struct MethodLimitLayer<L> {
    limits: Vec<L>,
    methods: HashMap<Box<str>, usize>,
    services: HashMap<Box<str>, usize>,
    default: Option<usize>,
}

impl<L> MethodLimitLayer<L> {
    /// No rules yet: every call passes unlimited until rules or a default are added.
    pub fn new() -> Self {
        Self {
            limits: Vec::new(),
            methods: HashMap::new(),
            services: HashMap::new(),
            default: None,
        }
    }

    /// Limits calls to `path` (`/package.Service/Method`, as on the wire) with `limit`.
    pub fn method(mut self, path: &str, limit: L) -> Result<Self, InvalidMethod> {
        let valid = path
            .strip_prefix('/')
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(service, method)| valid_name(service) && valid_name(method));
        if !valid {
            return Err(InvalidMethod::new(
                path,
                "a method path has the form /package.Service/Method",
            ));
        }
        if self.methods.contains_key(path) {
            return Err(InvalidMethod::new(path, "the method already has a policy"));
        }
        self.methods.insert(path.into(), self.limits.len());
        self.limits.push(limit);
        Ok(self)
    }

    /// Limits calls to every method of `service` (`package.Service`) without a policy of its own with `limit`.
    /// The methods share one bucket per key.
    pub fn service(mut self, service: &str, limit: L) -> Result<Self, InvalidMethod> {
        if !valid_name(service) {
            return Err(InvalidMethod::new(
                service,
                "a service name has the form package.Service, without slashes",
            ));
        }
        if self.services.contains_key(service) {
            return Err(InvalidMethod::new(
                service,
                "the service already has a policy",
            ));
        }
        self.services.insert(service.into(), self.limits.len());
        self.limits.push(limit);
        Ok(self)
    }

    /// Limits every call that no method or service rule matches with `limit` (replacing an earlier default).
    pub fn default_limit(mut self, limit: L) -> Self {
        self.default = Some(self.limits.len());
        self.limits.push(limit);
        self
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && name.chars().all(|c| c.is_ascii_graphic())
}

impl<L> Default for MethodLimitLayer<L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<L: Clone> Clone for MethodLimitLayer<L> {
    fn clone(&self) -> Self {
        Self {
            limits: self.limits.clone(),
            methods: self.methods.clone(),
            services: self.services.clone(),
            default: self.default,
        }
    }
}

impl<L: fmt::Debug> fmt::Debug for MethodLimitLayer<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = |i: &usize| &self.limits[*i];
        f.debug_struct("MethodLimitLayer")
            .field(
                "methods",
                &self
                    .methods
                    .iter()
                    .map(|(k, i)| (k, limit(i)))
                    .collect::<Vec<_>>(),
            )
            .field(
                "services",
                &self
                    .services
                    .iter()
                    .map(|(k, i)| (k, limit(i)))
                    .collect::<Vec<_>>(),
            )
            .field("default", &self.default.as_ref().map(limit))
            .finish()
    }
}

impl<S: Clone, L: Layer<S>> Layer<S> for MethodLimitLayer<L> {
    type Service = MethodLimit<S, L::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        let limited: Arc<[L::Service]> =
            self.limits.iter().map(|l| l.layer(inner.clone())).collect();
        let routes = Routes {
            methods: self.methods.clone(),
            services: self.services.clone(),
            default: self.default,
        };
        MethodLimit::new(inner, limited, Arc::new(routes))
    }
}

/// A method path or service name that no gRPC call can have, or a second rule for the same one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidMethod {
    given: String,
    reason: &'static str,
}

impl InvalidMethod {
    fn new(given: &str, reason: &'static str) -> Self {
        Self {
            given: given.to_owned(),
            reason,
        }
    }
}

impl fmt::Display for InvalidMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid per-method rule {:?}: {}",
            self.given, self.reason
        )
    }
}

impl std::error::Error for InvalidMethod {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_paths_and_service_names_are_validated() {
        let layer = || MethodLimitLayer::<()>::new();
        assert!(layer().method("/helloworld.Greeter/SayHello", ()).is_ok());
        for bad in [
            "helloworld.Greeter/SayHello",
            "/helloworld.Greeter",
            "/helloworld.Greeter/",
            "//SayHello",
            "/a/b/c",
        ] {
            let err = layer().method(bad, ()).expect_err(bad);
            assert!(err.to_string().contains(bad), "{err}");
        }
        assert!(layer().service("helloworld.Greeter", ()).is_ok());
        for bad in [
            "",
            "/helloworld.Greeter",
            "helloworld.Greeter/SayHello",
            "hello world",
        ] {
            assert!(layer().service(bad, ()).is_err(), "{bad:?}");
        }
        let twice = layer().method("/a.B/C", ()).unwrap().method("/a.B/C", ());
        assert_eq!(
            twice.unwrap_err().to_string(),
            "invalid per-method rule \"/a.B/C\": the method already has a policy"
        );
        assert!(
            layer()
                .service("a.B", ())
                .unwrap()
                .service("a.B", ())
                .is_err()
        );
    }
}
