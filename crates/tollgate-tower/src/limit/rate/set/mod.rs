//! A set of rate limiters that can be replaced while the service runs: what a policy file builds.
//!
//! A [`RateLimitSetLayer`] holds an ordered list of entries — a [`RateLimitLayer`]'s decision state and what it
//! [`Applies`] to (routes, gRPC methods) — and decides every entry that applies to a request on the same
//! core as a [`RateLimit`](super::RateLimit) (overrides, exemptions, shadow mode, the failure policy and the
//! metrics alike). [`RateLimitSetLayer::replace`] (on the layer or any clone of it) swaps in a new list at once: a request already past its
//! decision is not touched, the next one sees the new list, and none fails or waits for a lock (the list is read
//! through `arc-swap`). An entry carried over from the old list keeps everything it had (its deny cache, its
//! counters); a new entry on the same store with the same bucket names (same limiter name and policy) finds its
//! keys' state where the old one left it.
//!
//! The limiters that apply to a request decide it as one: it is admitted only if every one admits, and a
//! refusal spends nothing anywhere (what the admitting limiters spent is given back; the refusal's retry is the
//! latest of the refusing limiters', and it lists every limit with what it has left). See
//! `docs/design/several-limits.md`.
//!
//! The service answers as the default responder `()` does (verdicts in the response, rejections as
//! errors): wrap it in `tollgate-http`'s `HttpLimitLayer` or `tollgate-grpc`'s `GrpcLimitLayer`. Or it answers
//! through a [`Respond`]er of its own ([`LayerWith`]): `tollgate-http`'s
//! `HttpLimitLayer` has the set answer in place, as it does one limiter. A limiter of the set
//! that charges after the response ([`RateLimitLayer::cost_after`]) is charged once the response states its real
//! cost, through either.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_tower::limit::rate::RateLimitSetLayer;
//! use tollgate_tower::{BoxError, RateLimitLayer, Verdicts, VerdictSink};
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
//! let limiter = |n| RateLimitLayer::new("all", Policy::token_bucket(Quota::per_minute(n).unwrap()), store.clone(), "all");
//! let set = RateLimitSetLayer::new([(limiter(1), true)]);
//! let mut svc = ServiceBuilder::new()
//!     .layer(set.clone())
//!     .service_fn(|_: ()| async { Ok::<_, BoxError>(Reply::default()) });
//!
//! assert!(svc.ready().await?.call(()).await.is_ok());
//! assert!(svc.ready().await?.call(()).await.is_err()); // 1 a minute
//! set.replace([]); // no limiter any more, at once
//! assert!(svc.ready().await?.call(()).await.is_ok());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use tollgate_core::Store;
use tower_layer::Layer;
use tower_service::Service;

mod grant;
mod joint;

use grant::{SetAnswer, SetGrant};

use super::RateLimitLayer;
use super::composed::{Composed, SpentKey};
use super::decide::{Conclusion, Shared};
use super::deny_cache::KeyDigests;
use crate::key::with_key_buffer;
use crate::limit::core;
use crate::limit::future::{Deciding, decide_later, refuse};
use crate::limit::{Machine, Machinery, ResponseFuture};
use crate::readiness::DeferredReadiness;
use crate::respond::LayerWith;
use crate::respond::Respond;
use crate::{BoxError, Cost, KeyError, KeyExtractor, Mode, VerdictSink};

/// Which requests a limiter of a [`RateLimitSetLayer`] decides (its routes, its gRPC methods).
pub trait Applies<Req>: Send + Sync + 'static {
    /// Whether the entry decides `req`.
    fn applies(&self, req: &Req) -> bool;
}

/// `true` for every request, `false` for none.
impl<Req> Applies<Req> for bool {
    #[inline]
    fn applies(&self, _: &Req) -> bool {
        *self
    }
}

/// The requests a closure takes.
impl<Req, F> Applies<Req> for F
where
    F: Fn(&Req) -> bool + Send + Sync + 'static,
{
    fn applies(&self, req: &Req) -> bool {
        self(req)
    }
}

/// One limiter of a set: a [`RateLimitLayer`]'s decision state (shared with every service the layer builds) and
/// what it applies to.
struct SetEntry<K, St, C, A> {
    shared: Arc<Shared<K, St, C>>,
    applies: A,
}

impl<K: Clone, St: Store, C: Clone, A> SetEntry<K, St, C, A> {
    fn new((layer, applies): (RateLimitLayer<K, St, C>, A)) -> Self {
        Self {
            shared: layer.shared(),
            applies,
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

/// A set's list of entries, as one request reads it.
type List<K, St, C, A> = Arc<Vec<SetEntry<K, St, C, A>>>;

/// What every service of a set reads per request: the entries, and the header families the layer was given.
struct Entries<K, St, C, A> {
    list: ArcSwap<Vec<SetEntry<K, St, C, A>>>,
    /// The header families given to the layer (as the adapter encodes them), or [`OWN_HEADERS`]: each
    /// responder's own.
    headers: AtomicU8,
}

/// No header families given: each responder writes those it was built with.
const OWN_HEADERS: u8 = u8::MAX;

impl<K, St, C, A> Entries<K, St, C, A> {
    fn load(&self) -> arc_swap::Guard<List<K, St, C, A>> {
        self.list.load()
    }

    /// `respond`, writing the header families the layer was given, if any.
    #[inline]
    fn responder<Req, T, R: Respond<Req, T> + Clone>(&self, respond: &R) -> R {
        // Relaxed: the families are one byte read on their own; a request that reads the old ones just before a
        // reload answers as the requests before it did.
        let bits = self.headers.load(Ordering::Relaxed);
        if bits != OWN_HEADERS {
            return reheadered(respond, bits);
        }
        respond.clone()
    }
}

/// `respond` writing the header families of `bits`: a set never given any (built in code, or a file never
/// reloaded with other families) pays one byte's load and compare per request.
fn reheadered<Req, T, R: Respond<Req, T> + Clone>(respond: &R, bits: u8) -> R {
    respond.clone().with_header_families(bits)
}

/// Applies a replaceable set of rate limiters to a service: see the [module docs](self).
///
/// Cheap to clone: the clones and every service they build share one list, which [`replace`](Self::replace)
/// swaps.
#[must_use]
pub struct RateLimitSetLayer<K, St, C, A> {
    current: Arc<Entries<K, St, C, A>>,
}

impl<K: Clone, St: Store, C: Clone, A> RateLimitSetLayer<K, St, C, A> {
    /// A set deciding `entries` in order: each a limiter (its state shared with every service the layer builds)
    /// and the requests it applies to.
    pub fn new(entries: impl IntoIterator<Item = (RateLimitLayer<K, St, C>, A)>) -> Self {
        Self {
            current: Arc::new(Entries {
                list: ArcSwap::from_pointee(entries.into_iter().map(SetEntry::new).collect()),
                headers: AtomicU8::new(OWN_HEADERS),
            }),
        }
    }

    /// Decides every request from now on with `entries`, in every service this layer or a clone of it built;
    /// requests already decided are not touched.
    pub fn replace(&self, entries: impl IntoIterator<Item = (RateLimitLayer<K, St, C>, A)>) {
        self.current
            .list
            .store(Arc::new(entries.into_iter().map(SetEntry::new).collect()));
    }
}

impl<K, St: Store, C, A> RateLimitSetLayer<K, St, C, A> {
    /// What the set would answer `req` now, spending nothing: each limiter that applies to it (in enforce or
    /// shadow mode; an exempt key's limiter left out), in the set's order, with the decision it would give (see
    /// [`RateLimitLayer::peek`]). The set admits the request if every enforcing limiter's decision is allowed; a
    /// refusal's retry is the latest of the refusing ones'.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate_core::{MemoryStore, Policy, Quota};
    /// use tollgate_tower::RateLimitLayer;
    /// use tollgate_tower::limit::rate::RateLimitSetLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate_tower::BoxError> {
    /// let store = Arc::new(MemoryStore::new());
    /// let limit = |name, n| RateLimitLayer::new(name, Policy::token_bucket(Quota::per_hour(n).unwrap()), store.clone(), "ann");
    /// let set = RateLimitSetLayer::new([(limit("hourly", 5), true), (limit("burst", 3), true)]);
    /// let answers = set.peek(&()).await?;
    /// assert_eq!(answers.len(), 2);
    /// assert!(answers.iter().all(|(_, d)| d.is_allowed()));
    /// assert_eq!(answers[1].1.remaining, 2); // "burst" would leave 2
    /// # Ok(())
    /// # }
    /// ```
    pub async fn peek<Req>(
        &self,
        req: &Req,
    ) -> Result<Vec<(crate::Name, tollgate_core::Decision)>, BoxError>
    where
        K: KeyExtractor<Req>,
        C: Cost<Req>,
        A: Applies<Req>,
    {
        let entries = self.current.list.load_full();
        let mut answers = Vec::with_capacity(entries.len());
        for entry in entries.iter() {
            if !entry.applies.applies(req) || entry.shared.judge.mode() == Mode::Off {
                continue;
            }
            let Some(shared) = Shared::plan_for(&entry.shared, req) else {
                continue; // exempt
            };
            let decision = shared.peek(req).await?;
            answers.push((shared.judge.name.clone(), decision));
        }
        Ok(answers)
    }
}

impl<K, St, C, A> RateLimitSetLayer<K, St, C, A> {
    /// Every service of the set answers from now on writing the response header families `headers`, in place of
    /// those its responder was built with (`tollgate-http`'s `HttpLimitLayer::headers`, a
    /// `tollgate_http::HeaderSet`): a policy file's reload changes them with the limiters. A responder that writes
    /// no headers (the default, `()`) ignores them.
    pub fn set_headers(&self, families: impl Into<u8>) {
        self.current
            .headers
            .store(families.into(), Ordering::Relaxed);
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

/// In place: the set itself answers through the responder.
impl<S, R, K, St, C, A> crate::respond::LayerWith<S, R> for RateLimitSetLayer<K, St, C, A> {
    type Service = RateLimitSet<S, K, St, C, A, R>;

    fn layer_with(&self, inner: S, respond: R) -> Self::Service {
        RateLimitSet {
            inner,
            current: self.current.clone(),
            respond,
            not_ready: DeferredReadiness::default(),
        }
    }
}

impl<S, K, St, C, A> Layer<S> for RateLimitSetLayer<K, St, C, A> {
    type Service = RateLimitSet<S, K, St, C, A>;

    fn layer(&self, inner: S) -> Self::Service {
        LayerWith::layer_with(self, inner, ())
    }
}

/// A service limited by a [`RateLimitSetLayer`], answering through the [`Respond`]er `R`. With the default
/// responder `()`, errors are the inner service's, boxed, plus [`Rejection`](crate::Rejection) and [`KeyError`], as a
/// [`RateLimit`](super::RateLimit)'s are.
pub struct RateLimitSet<S, K, St, C, A, R = ()> {
    inner: S,
    current: Arc<Entries<K, St, C, A>>,
    respond: R,
    not_ready: DeferredReadiness,
}

impl<S: Clone, K, St, C, A, R: Clone> Clone for RateLimitSet<S, K, St, C, A, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            current: self.current.clone(),
            respond: self.respond.clone(),
            not_ready: self.not_ready.clone(),
        }
    }
}

impl<S: fmt::Debug, K, St, C, A, R> fmt::Debug for RateLimitSet<S, K, St, C, A, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitSet")
            .field("inner", &self.inner)
            .field("entries", &**self.current.load())
            .finish_non_exhaustive()
    }
}

/// A limiter's answer before any waiting: decided, or the key and cost to ask the store with.
enum Now {
    /// Decided; what the admission spent, when the set decides as one ([`Composed`]) and the store was asked.
    Decided(Conclusion, Option<(SpentKey, u64)>),
    /// Left to the store: the key's text, its digests in the deny cache by its parts (`None`: by its text), the
    /// cost.
    Later(String, Option<KeyDigests>, u64),
}

/// A limiter the set waits for (its store cannot answer at once), asked once the others have decided; `settle`:
/// it charges after the response.
struct Waiting<K, St, C> {
    shared: Arc<Shared<K, St, C>>,
    key: String,
    deny: Option<KeyDigests>,
    cost: u64,
    mode: Mode,
    settle: bool,
}

impl<S, K, St, C, A, R, Req> Service<Req> for RateLimitSet<S, K, St, C, A, R>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    S::Response: VerdictSink,
    K: KeyExtractor<Req>,
    St: Store,
    C: Cost<Req>,
    A: Applies<Req>,
    R: Respond<Req, S::Response> + Clone,
    R::Ticket: Copy,
{
    type Response = R::Response;
    type Error = R::Error;
    type Future = ResponseFuture<Self, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.not_ready.poll_ready(&mut self.inner, cx).map(Ok)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture::new(self.decide(req))
    }
}

impl<S, K, St, C, A, R, Req> Machinery<Req> for RateLimitSet<S, K, St, C, A, R>
where
    S: Service<Req>,
    R: Respond<Req, S::Response>,
{
    type Machine = Machine<S::Future, S, Req, SetAnswer<R, R::Ticket>>;
}

impl<S, K, St, C, A, R> RateLimitSet<S, K, St, C, A, R> {
    /// Decides `req` on every entry that applies to it: the state machine of its response future.
    fn decide<Req>(&mut self, mut req: Req) -> Machine<S::Future, S, Req, SetAnswer<R, R::Ticket>>
    where
        S: Service<Req> + Clone,
        S::Response: VerdictSink,
        K: KeyExtractor<Req>,
        St: Store,
        C: Cost<Req>,
        A: Applies<Req>,
        R: Respond<Req, S::Response> + Clone,
        R::Ticket: Copy,
    {
        let respond = self.current.responder(&self.respond);
        let ticket = respond.prepare(&mut req);
        let keep = respond.wants_verdict(&ticket);
        let answer = SetAnswer { respond, ticket };
        if let Some(err) = self.not_ready.take() {
            return Machine::failed(err, answer);
        }
        let entries = self.current.load();
        let mut grant = SetGrant::default();
        // More than one limiter: decided as one, all or nothing (see `composed`).
        let mut composed = (entries.len() > 1).then(|| Composed::new(entries.len()));
        if composed.is_some()
            && let Some(refused) = cached_denial(&entries, &req, keep)
        {
            return refuse(&mut self.inner, refused, answer);
        }
        let kept = keep || composed.is_some();
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
            let settle = shared.after.is_some();
            let track = composed.is_some();
            let now = if settle {
                decide_settled(shared, &req, mode, &mut grant, kept)
            } else {
                decide_now(shared, &req, mode, kept, track)
            };
            match (now, &mut composed) {
                (Ok(Now::Decided(conclusion, spent)), Some(composed)) => {
                    composed.push(shared, conclusion, spent);
                }
                (Ok(Now::Decided(Conclusion::Admit(verdict), _)), None) => {
                    grant.push(verdict, keep)
                }
                (Ok(Now::Decided(Conclusion::Reject(refused), _)), None) => {
                    return refuse(&mut self.inner, grant.into_rejection(refused), answer);
                }
                (Ok(Now::Later(key, deny, cost)), _) => later.push(Waiting {
                    shared: shared.clone(),
                    key,
                    deny,
                    cost,
                    mode,
                    settle,
                }),
                (Err(err), composed) => {
                    // What the others spent is given back: the request is not served.
                    let err = match composed.take().map(Composed::conclude_now) {
                        Some(Err(refused)) => refused,
                        _ => err.into(),
                    };
                    return refuse(&mut self.inner, err, answer);
                }
            }
        }
        drop(entries);
        // A limiter refused at once: the ones left to the store are not asked (they would only be given back).
        let at_once = composed.as_ref().is_some_and(Composed::is_refused) || later.is_empty();
        if at_once {
            if let Some(composed) = composed {
                match composed.conclude_now() {
                    Ok(verdicts) => verdicts.into_iter().for_each(|v| grant.push(v, keep)),
                    Err(refused) => return refuse(&mut self.inner, refused, answer),
                }
            }
            return Machine::calling(self.inner.call(req), Some(grant), answer);
        }
        let decide: Deciding<SetGrant> = Box::pin(async move {
            // Decided as one: those the store can decide in one call are (a refusal there spends nothing).
            let mut joint = match &composed {
                Some(_) => joint::decide(&later, kept).await,
                None => None,
            };
            for (i, w) in later.into_iter().enumerate() {
                let keep_this = kept || w.settle;
                let key = if w.settle || composed.is_some() {
                    Some(w.key.clone())
                } else {
                    None
                };
                let (conclusion, spent_here) = match joint.as_mut().and_then(|j| j.take(i)) {
                    Some(conclusion) => (conclusion, joint.as_ref().is_some_and(|j| j.committed)),
                    None => {
                        let conclusion = w
                            .shared
                            .decide(w.key, w.deny, w.cost, w.mode, keep_this)
                            .await;
                        (conclusion, true)
                    }
                };
                if let (Conclusion::Admit(Some(v)), Some(key), true) = (&conclusion, &key, w.settle)
                    && spent_here
                {
                    grant.settle(&w.shared, key.clone(), w.cost, v);
                }
                if let Some(composed) = &mut composed {
                    let spent = key
                        .filter(|_| spent_here)
                        .map(|key| (SpentKey::Text(key, w.deny), w.cost));
                    composed.push(&w.shared, conclusion, spent);
                    continue;
                }
                match conclusion {
                    Conclusion::Admit(verdict) => grant.push(verdict, keep),
                    Conclusion::Reject(refused) => {
                        return core::Conclusion::Reject(grant.into_rejection(refused));
                    }
                }
            }
            if let Some(composed) = composed {
                match composed.conclude().await {
                    Ok(verdicts) => verdicts.into_iter().for_each(|v| grant.push(v, keep)),
                    Err(refused) => return core::Conclusion::Reject(refused),
                }
            }
            core::Conclusion::Admit(Some(grant))
        });
        decide_later(&mut self.inner, decide, req, answer)
    }
}

/// In a decision as one, a limiter's cached denial refuses the request before any limiter is asked: it spends
/// nothing anywhere. Only limiters whose cache looks by the key's parts, in enforce mode, are looked at here (the
/// others are looked at as they are decided).
fn cached_denial<K, St, C, A, Req>(
    entries: &[SetEntry<K, St, C, A>],
    req: &Req,
    keep: bool,
) -> Option<BoxError>
where
    K: KeyExtractor<Req>,
    St: Store,
    C: Cost<Req>,
    A: Applies<Req>,
{
    for entry in entries {
        if entry.shared.deny_table().is_none()
            || entry.shared.judge.mode() != Mode::Enforce
            || !entry.applies.applies(req)
        {
            continue;
        }
        let Some(shared) = Shared::plan_for(&entry.shared, req) else {
            continue;
        };
        let Ok(deny) = shared.deny_key(req) else {
            continue; // reported when the limiter is decided
        };
        let cost = shared.cost.cost(req);
        if let Some(Conclusion::Reject(refused)) =
            shared.decide_denied(deny, cost, Mode::Enforce, keep)
        {
            return Some(refused);
        }
    }
    None
}

/// Decides `req` on `shared` if its store can at once, as [`RateLimit`](super::RateLimit) does: by digest, or by
/// the key's text built in a reused buffer, or from the deny cache. `track`: the answer says what an admission
/// spent (a decision as one).
#[inline]
fn decide_now<K, St, C, Req>(
    shared: &Shared<K, St, C>,
    req: &Req,
    mode: Mode,
    keep: bool,
    track: bool,
) -> Result<Now, KeyError>
where
    K: KeyExtractor<Req>,
    St: Store,
    C: Cost<Req>,
{
    if let Some(decided) = shared.decide_digested_as(req, mode, keep) {
        let (conclusion, digest, cost) = decided?;
        let spent = track.then_some((SpentKey::Digest(digest), cost));
        return Ok(Now::Decided(conclusion, spent));
    }
    // A cached denial refuses by the digests of the key's parts, before any text is built.
    let deny = shared.deny_key(req)?;
    let cost = shared.cost.cost(req);
    if let Some(conclusion) = shared.decide_denied(deny, cost, mode, keep) {
        return Ok(Now::Decided(conclusion, None));
    }
    with_key_buffer(|key| {
        shared.write_key(req, key)?;
        Ok(match shared.decide_at_once(key, cost, mode, keep) {
            Some(conclusion) => {
                let spent = track.then(|| (SpentKey::Text(key.clone(), deny), cost));
                Now::Decided(conclusion, spent)
            }
            None => Now::Later(key.clone(), deny, cost),
        })
    })
}

/// Decides `req` on a limiter that charges after the response, as [`RateLimit`](super::RateLimit) does: by the
/// key's text, which the grant keeps for the charge, always with a verdict (its instant dates the charge).
fn decide_settled<K, St, C, Req>(
    shared: &Arc<Shared<K, St, C>>,
    req: &Req,
    mode: Mode,
    grant: &mut SetGrant,
    keep: bool,
) -> Result<Now, KeyError>
where
    K: KeyExtractor<Req>,
    St: Store,
    C: Cost<Req>,
{
    let mut key = String::new();
    shared.write_key(req, &mut key)?;
    let cost = shared.cost.cost(req);
    Ok(match shared.decide_at_once(&key, cost, mode, true) {
        Some(Conclusion::Admit(verdict)) => {
            if let Some(v) = &verdict {
                grant.settle(shared, key.clone(), cost, v);
            }
            let spent = Some((SpentKey::Text(key, None), cost));
            Now::Decided(Conclusion::Admit(verdict.filter(|_| keep)), spent)
        }
        Some(rejected) => Now::Decided(rejected, None),
        None => Now::Later(key, None, cost),
    })
}
