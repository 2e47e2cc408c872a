//! A set of rate limiters that can be replaced while the service runs: what a policy file builds.
//!
//! A [`RateLimitSetLayer`] holds an ordered list of [`SetEntry`]s — a [`RateLimitLayer`]'s decision state and
//! what it [`Applies`] to (routes, gRPC methods) — and decides every entry that applies to a request on the same
//! core as a [`RateLimit`](super::RateLimit) (overrides, exemptions, shadow mode, the failure policy and the
//! metrics alike). [`RateLimitSetHandle::replace`] swaps in a new list at once: a request already past its
//! decision is not touched, the next one sees the new list, and none fails or waits for a lock (the list is read
//! through `arc-swap`). An entry carried over from the old list keeps everything it had (its deny cache, its
//! counters); a new entry on the same store with the same bucket names (same limiter name and policy) finds its
//! keys' state where the old one left it.
//!
//! The service answers as [`Forward`](crate::respond::Forward) does (verdicts in the response, rejections as
//! errors): wrap it in `tollgate-http`'s `HttpLimitLayer` or `tollgate-grpc`'s `GrpcLimitLayer`.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_tower::limit::rate::{Everywhere, RateLimitSetLayer, SetEntry};
//! use tollgate_tower::{BoxError, ConstKey, RateLimitLayer, Verdicts, VerdictSink};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! #[derive(Debug, Default)]
//! struct Reply(Verdicts);
//! impl VerdictSink for Reply {
//!     fn verdicts_mut(&mut self) -> &mut Verdicts { &mut self.0 }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let store = Arc::new(MemoryStore::new());
//! let limiter = |n| RateLimitLayer::new("all", Policy::token_bucket(Quota::per_minute(n).unwrap()), store.clone(), ConstKey::new("all"));
//! let set = RateLimitSetLayer::new([SetEntry::new(&limiter(1), Everywhere)]);
//! let handle = set.handle();
//! let mut svc = ServiceBuilder::new()
//!     .layer(set)
//!     .service_fn(|_: ()| async { Ok::<_, BoxError>(Reply::default()) });
//!
//! assert!(svc.ready().await?.call(()).await.is_ok());
//! assert!(svc.ready().await?.call(()).await.is_err()); // 1 a minute
//! handle.replace([]); // no limiter any more, at once
//! assert!(svc.ready().await?.call(()).await.is_ok());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use tollgate_core::Store;
use tower_layer::Layer;
use tower_service::Service;

use super::RateLimitLayer;
use super::decide::{Conclusion, Shared};
use crate::key::with_key_buffer;
use crate::limit::core;
use crate::limit::future::{Answer, Deciding, Grants, ResponseFuture, decide_later, refuse};
use crate::readiness::DeferredReadiness;
use crate::{BoxError, Cost, KeyError, KeyExtractor, Mode, Rejection, VerdictSink, Verdicts};

/// Which requests a [`SetEntry`] decides (its routes, its gRPC methods).
pub trait Applies<Req>: Send + Sync + 'static {
    /// Whether the entry decides `req`.
    fn applies(&self, req: &Req) -> bool;
}

/// Every request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Everywhere;

impl<Req> Applies<Req> for Everywhere {
    #[inline(always)]
    fn applies(&self, _: &Req) -> bool {
        true
    }
}

/// One limiter of a set: a [`RateLimitLayer`]'s decision state and what it applies to. Cheap to clone (a clone
/// shares the state, as the layer's clones do).
pub struct SetEntry<K, St, C, A> {
    shared: Arc<Shared<K, St, C>>,
    applies: Arc<A>,
}

impl<K: Clone, St: Store, C: Clone, A> SetEntry<K, St, C, A> {
    /// The limiter `layer` (its state shared with every service the layer builds) on the requests `applies` takes.
    pub fn new(layer: &RateLimitLayer<K, St, C>, applies: A) -> Self {
        Self {
            shared: layer.shared(),
            applies: Arc::new(applies),
        }
    }
}

impl<K, St, C, A> SetEntry<K, St, C, A> {
    /// The limiter's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.shared.judge.name
    }

    /// What the entry applies to.
    #[must_use]
    pub fn applies_to(&self) -> &A {
        &self.applies
    }
}

impl<K, St, C, A> Clone for SetEntry<K, St, C, A> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            applies: self.applies.clone(),
        }
    }
}

impl<K, St, C, A> fmt::Debug for SetEntry<K, St, C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetEntry")
            .field("limiter", &self.shared.judge.name)
            .field("policy", &self.shared.policy)
            .field("mode", &self.shared.judge.mode())
            .finish_non_exhaustive()
    }
}

type Entries<K, St, C, A> = ArcSwap<Vec<SetEntry<K, St, C, A>>>;

/// Applies a replaceable set of rate limiters to a service: see the [module docs](self).
#[must_use]
pub struct RateLimitSetLayer<K, St, C, A> {
    current: Arc<Entries<K, St, C, A>>,
}

impl<K, St, C, A> RateLimitSetLayer<K, St, C, A> {
    /// A set deciding `entries`, in order.
    pub fn new(entries: impl IntoIterator<Item = SetEntry<K, St, C, A>>) -> Self {
        Self {
            current: Arc::new(ArcSwap::from_pointee(entries.into_iter().collect())),
        }
    }

    /// A handle to replace the set while it runs.
    #[must_use]
    pub fn handle(&self) -> RateLimitSetHandle<K, St, C, A> {
        RateLimitSetHandle {
            current: self.current.clone(),
        }
    }
}

impl<K, St, C, A> Clone for RateLimitSetLayer<K, St, C, A> {
    fn clone(&self) -> Self {
        Self {
            current: self.current.clone(),
        }
    }
}

impl<K, St, C, A> fmt::Debug for RateLimitSetLayer<K, St, C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitSetLayer")
            .field("entries", &**self.current.load())
            .finish()
    }
}

impl<S, K, St, C, A> Layer<S> for RateLimitSetLayer<K, St, C, A> {
    type Service = RateLimitSet<S, K, St, C, A>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitSet {
            inner,
            current: self.current.clone(),
            not_ready: DeferredReadiness::default(),
        }
    }
}

/// Replaces the limiters of a [`RateLimitSetLayer`] (and of every service it built) while they run.
pub struct RateLimitSetHandle<K, St, C, A> {
    current: Arc<Entries<K, St, C, A>>,
}

impl<K, St, C, A> RateLimitSetHandle<K, St, C, A> {
    /// Decides every request from now on with `entries`; requests already decided are not touched.
    pub fn replace(&self, entries: impl IntoIterator<Item = SetEntry<K, St, C, A>>) {
        self.current.store(Arc::new(entries.into_iter().collect()));
    }

    /// The entries deciding requests now (to carry unchanged ones over into a replacement).
    #[must_use]
    pub fn entries(&self) -> Vec<SetEntry<K, St, C, A>> {
        self.current.load().as_ref().clone()
    }
}

impl<K, St, C, A> Clone for RateLimitSetHandle<K, St, C, A> {
    fn clone(&self) -> Self {
        Self {
            current: self.current.clone(),
        }
    }
}

impl<K, St, C, A> fmt::Debug for RateLimitSetHandle<K, St, C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitSetHandle")
            .field("entries", &**self.current.load())
            .finish()
    }
}

/// A service limited by a [`RateLimitSetLayer`]. Errors are the inner service's, boxed, plus [`Rejection`] and
/// [`KeyError`], as a [`RateLimit`](super::RateLimit)'s are.
pub struct RateLimitSet<S, K, St, C, A> {
    inner: S,
    current: Arc<Entries<K, St, C, A>>,
    not_ready: DeferredReadiness,
}

impl<S: Clone, K, St, C, A> Clone for RateLimitSet<S, K, St, C, A> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            current: self.current.clone(),
            not_ready: self.not_ready.clone(),
        }
    }
}

impl<S: fmt::Debug, K, St, C, A> fmt::Debug for RateLimitSet<S, K, St, C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitSet")
            .field("inner", &self.inner)
            .field("entries", &**self.current.load())
            .finish()
    }
}

/// The set's [`Answer`]: every admitting limiter's verdict into the response, as [`Forward`](crate::respond::Forward)
/// puts one. The set's first limiter counts as the outermost: [`Verdicts`] lists the innermost first, so the set's
/// verdicts go in last to first (and headers list the limiters in the set's order).
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAnswer;

impl Grants for SetAnswer {
    type Grant = Verdicts;
}

impl<Req, T: VerdictSink> Answer<Req, T> for SetAnswer {
    type Output = Result<T, BoxError>;

    #[inline(always)]
    fn amend_ok(&self, response: &mut T, grant: Option<Verdicts>) -> Option<Verdicts> {
        if let Some(verdicts) = grant {
            response.verdicts_mut().extend(verdicts.into_iter().rev());
        }
        None
    }

    #[inline(always)]
    fn finish_ok(&self, response: T, _: Option<Verdicts>) -> Self::Output {
        Ok(response)
    }

    fn respond(&self, result: Result<T, BoxError>, grant: Option<Verdicts>) -> Self::Output {
        match result {
            Ok(mut response) => {
                if let Some(verdicts) = grant {
                    response.verdicts_mut().extend(verdicts.into_iter().rev());
                }
                Ok(response)
            }
            Err(err) => Err(with_admitted(err, grant.unwrap_or_default())),
        }
    }
}

/// A rejection further in carries the verdicts of the limiters that admitted the request before it.
fn with_admitted(mut err: BoxError, admitted: Verdicts) -> BoxError {
    if let Some(rejection) = err.downcast_mut::<Rejection>() {
        admitted
            .into_iter()
            .rev()
            .for_each(|v| rejection.push_admitted(v));
    }
    err
}

/// A limiter's answer before any waiting: decided, or the key and cost to ask the store with.
enum Now {
    Decided(Conclusion),
    Later(String, u64),
}

impl<S, K, St, C, A, Req> Service<Req> for RateLimitSet<S, K, St, C, A>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    S::Response: VerdictSink,
    K: KeyExtractor<Req>,
    St: Store,
    C: Cost<Req>,
    A: Applies<Req>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S, Req, SetAnswer>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.not_ready.poll_ready(&mut self.inner, cx).map(Ok)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        if let Some(err) = self.not_ready.take() {
            return ResponseFuture::failed(err, SetAnswer);
        }
        let entries = self.current.load();
        let mut verdicts = Verdicts::default();
        // The limiters whose store must be waited for (Redis), asked in order once the others have decided.
        let mut later = Vec::new();
        for entry in entries.iter() {
            if !entry.applies.applies(&req) {
                continue;
            }
            let mode = entry.shared.judge.mode();
            if mode == Mode::Off {
                continue;
            }
            let Some(shared) = Shared::select(&entry.shared, &req) else {
                continue; // exempt (counted)
            };
            match decide_now(shared, &req, mode) {
                Ok(Now::Decided(Conclusion::Admit(verdict))) => {
                    verdicts.extend(verdict.map(|v| *v))
                }
                Ok(Now::Decided(Conclusion::Reject(refused))) => {
                    return refuse(&mut self.inner, with_admitted(refused, verdicts), SetAnswer);
                }
                Ok(Now::Later(key, cost)) => later.push((shared.clone(), key, cost, mode)),
                Err(err) => return refuse(&mut self.inner, err.into(), SetAnswer),
            }
        }
        if later.is_empty() {
            return ResponseFuture::calling(self.inner.call(req), Some(verdicts), SetAnswer);
        }
        let decide: Deciding<Verdicts> = Box::pin(async move {
            for (shared, key, cost, mode) in later {
                match shared.decide(key, cost, mode, true).await {
                    Conclusion::Admit(verdict) => verdicts.extend(verdict.map(|v| *v)),
                    Conclusion::Reject(refused) => {
                        return core::Conclusion::Reject(with_admitted(refused, verdicts));
                    }
                }
            }
            core::Conclusion::Admit(Some(verdicts))
        });
        decide_later(&mut self.inner, decide, req, SetAnswer)
    }
}

/// Decides `req` on `shared` if its store can at once, as [`RateLimit`](super::RateLimit) does: by digest, or by
/// the key's text built in a reused buffer, or from the deny cache.
#[inline(always)]
fn decide_now<K, St, C, Req>(
    shared: &Shared<K, St, C>,
    req: &Req,
    mode: Mode,
) -> Result<Now, KeyError>
where
    K: KeyExtractor<Req>,
    St: Store,
    C: Cost<Req>,
{
    if let Some(decided) = shared.decide_digested(req, mode, true) {
        return decided.map(Now::Decided);
    }
    with_key_buffer(|key| {
        shared.write_key(req, key)?;
        let cost = shared.cost.cost(req);
        Ok(match shared.decide_at_once(key, cost, mode, true) {
            Some(conclusion) => Now::Decided(conclusion),
            None => Now::Later(key.clone(), cost),
        })
    })
}
