//! [`PaceLayer`]: the settings, built once, and the scopes every service it makes shares.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{HeaderMap, Uri};
use tower_layer::Layer;

use crate::Pace;
use crate::budget::{Scope, Settings};

/// What a request does once it has waited [`PaceLayer::max_wait`] and the budget still has no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnMaxWait {
    /// Fail with [`WaitedTooLong`](crate::WaitedTooLong) (the default): the caller decides.
    Fail,
    /// Send it anyway (the server may refuse it).
    Send,
}

/// The user's scope function: which budget a request spends, from its URI and headers.
type ScopeFn = dyn Fn(&Uri, &HeaderMap) -> String + Send + Sync;

/// Paces outbound requests by what servers say of their quota (see the [crate docs](crate)).
///
/// Every service this layer makes (and each of their clones) shares one set of budgets: build the layer once per
/// client.
#[must_use]
#[derive(Clone)]
pub struct PaceLayer {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) settings: Settings,
    pub(crate) max_wait: Duration,
    pub(crate) on_max_wait: OnMaxWait,
    scope_fn: Option<Arc<ScopeFn>>,
    scopes: Mutex<HashMap<String, Arc<Scope>>>,
}

impl Clone for Shared {
    /// The same settings, with budgets of its own.
    fn clone(&self) -> Self {
        Self {
            settings: self.settings,
            max_wait: self.max_wait,
            on_max_wait: self.on_max_wait,
            scope_fn: self.scope_fn.clone(),
            scopes: Mutex::default(),
        }
    }
}

impl Default for PaceLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for PaceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaceLayer")
            .field("max_wait", &self.shared.max_wait)
            .field("on_max_wait", &self.shared.on_max_wait)
            .field("max_delay", &self.shared.settings.max_delay)
            .field("scope_fn", &self.shared.scope_fn.is_some())
            .finish_non_exhaustive()
    }
}

impl PaceLayer {
    /// Budgets per origin; a request waits at most 30 s, then fails; no server holds a scope longer than 5 min.
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                settings: Settings {
                    max_delay: Duration::from_secs(300),
                    default_retry: Duration::from_secs(1),
                    jitter_per_mille: 100,
                },
                max_wait: Duration::from_secs(30),
                on_max_wait: OnMaxWait::Fail,
                scope_fn: None,
                scopes: Mutex::default(),
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Shared)) -> Self {
        change(Arc::make_mut(&mut self.shared));
        self
    }

    /// The longest a request waits for room in its budget (default 30 s).
    pub fn max_wait(self, max_wait: Duration) -> Self {
        self.with(|s| s.max_wait = max_wait)
    }

    /// What a request does after [`max_wait`](Self::max_wait): fail (the default) or send anyway.
    pub fn on_max_wait(self, on_max_wait: OnMaxWait) -> Self {
        self.with(|s| s.on_max_wait = on_max_wait)
    }

    /// The longest any one answer can hold a scope — a `t`, a `Retry-After`, a `RetryInfo` (default 5 min): a
    /// server that says "come back in a year" is asked again after this.
    pub fn max_delay(self, max_delay: Duration) -> Self {
        self.with(|s| s.settings.max_delay = max_delay.max(Duration::from_millis(1)))
    }

    /// The wait after a refusal that names none (default 1 s).
    pub fn default_retry(self, retry: Duration) -> Self {
        self.with(|s| s.settings.default_retry = retry)
    }

    /// Groups requests into budgets by `scope` instead of by origin: requests with the same string share one.
    ///
    /// For instances behind one limit that the client reaches at several addresses, or a server whose policies
    /// are per user, where the client knows the user (the partitions inside a scope are still its policies' names
    /// and `pk`s).
    pub fn scope_by(
        self,
        scope: impl Fn(&Uri, &HeaderMap) -> String + Send + Sync + 'static,
    ) -> Self {
        self.with(|s| s.scope_fn = Some(Arc::new(scope)))
    }
}

impl<S> Layer<S> for PaceLayer {
    type Service = Pace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Pace::new(inner, self.shared.clone())
    }
}

impl Shared {
    /// The scope `uri` and `headers` belong to, made on first use; `cached` is the caller's last one.
    pub(crate) fn scope(
        &self,
        uri: &Uri,
        headers: &HeaderMap,
        cached: &mut Option<(String, Arc<Scope>)>,
    ) -> Arc<Scope> {
        if let Some(scope_fn) = &self.scope_fn {
            let key = scope_fn(uri, headers);
            return self.scope_of(key, cached);
        }
        if let Some((key, scope)) = cached
            && is_origin(key, uri)
        {
            return scope.clone();
        }
        let mut key = String::new();
        push_origin(&mut key, uri);
        self.scope_of(key, cached)
    }

    fn scope_of(&self, key: String, cached: &mut Option<(String, Arc<Scope>)>) -> Arc<Scope> {
        if let Some((cached_key, scope)) = cached
            && *cached_key == key
        {
            return scope.clone();
        }
        let scope = self
            .scopes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Scope::new(self.settings)))
            .clone();
        *cached = Some((key, scope.clone()));
        scope
    }
}

/// `scheme://authority` (empty parts for a URI without them: a tonic channel's requests carry only a path).
fn push_origin(out: &mut String, uri: &Uri) {
    out.push_str(uri.scheme_str().unwrap_or(""));
    out.push_str("://");
    out.push_str(uri.authority().map_or("", |a| a.as_str()));
}

fn is_origin(key: &str, uri: &Uri) -> bool {
    let scheme = uri.scheme_str().unwrap_or("");
    let authority = uri.authority().map_or("", |a| a.as_str());
    key.strip_prefix(scheme)
        .and_then(|rest| rest.strip_prefix("://"))
        .is_some_and(|rest| rest == authority)
}
