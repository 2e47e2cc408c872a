use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tollgate_core::slot::SlotStore;
use tower_service::Service;

use super::SlotRule;
use super::decide::Shared;
use crate::limit::Machine;
use crate::limit::future::{Deciding, decide_later, pass, refuse};
use crate::permit::Hold;
use crate::{BoxError, HoldPermit, Mode, Permit};

/// A service whose requests hold a slot while in flight: the service under [`ConcurrencyLimit`](super::ConcurrencyLimit)
/// and [`FleetShed`](crate::limit::fleet::FleetShed), which differ in their rule.
pub(crate) struct SlotLimit<S, R, L> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared<R, L>>,
}

impl<S, R, L> SlotLimit<S, R, L> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<R, L>>) -> Self {
        Self { inner, shared }
    }
}

impl<S: Clone, R, L> Clone for SlotLimit<S, R, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, R, L> fmt::Debug for SlotLimit<S, R, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.judge.name)
            .field("mode", &self.shared.judge.mode())
            .finish_non_exhaustive()
    }
}

impl<S, R, L> SlotLimit<S, R, L> {
    pub(crate) fn poll_ready<Req>(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
    {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    pub(crate) fn call<Req>(&mut self, req: Req) -> Machine<S::Future, S, Req, Hold>
    where
        S: Service<Req> + Clone,
        S::Error: Into<BoxError>,
        S::Response: HoldPermit,
        R: SlotRule<Req>,
        L: SlotStore,
    {
        let judge = &self.shared.judge;
        let mode = judge.mode();
        if mode == Mode::Off {
            return pass(&mut self.inner, req, Hold);
        }
        let mut key = String::with_capacity(judge.name.len() + 48);
        key.push_str(&judge.name);
        let limit = match self.shared.rule.rule(&req, &mut key) {
            Ok(limit) => limit,
            Err(err) => return refuse(&mut self.inner, err.into(), Hold),
        };
        // An in-process store decides at once (the first poll, in `decide_later`): an admitted request then calls
        // the ready inner service directly.
        let decide: Deciding<Permit> = Box::pin(self.shared.clone().decide(key, limit, mode));
        decide_later(&mut self.inner, decide, req, Hold)
    }
}

/// The methods and the `Service` of a public service with one field `inner`, a [`SlotLimit`] with one rule (the
/// concurrency limiter's and the fleet shedder's), written once. `$param` is the rule's type parameter, bound by
/// `$bound` to decide a request.
macro_rules! slot_service {
    ($name:ident<S, $param:ident, L>, $bound:ident) => {
        impl<S, $param, L> $name<S, $param, L> {
            /// The inner service.
            pub fn get_ref(&self) -> &S {
                &self.inner.inner
            }

            /// The enforcement switch shared with the layer that built this service.
            #[must_use]
            pub fn enforcement(&self) -> $crate::EnforcementSwitch {
                self.inner.shared.judge.switch.clone()
            }
        }

        impl<S: Clone, $param, L> Clone for $name<S, $param, L> {
            fn clone(&self) -> Self {
                Self {
                    inner: self.inner.clone(),
                }
            }
        }

        impl<S: std::fmt::Debug, $param, L> std::fmt::Debug for $name<S, $param, L> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_tuple(stringify!($name)).field(&self.inner).finish()
            }
        }

        impl<S, $param, L, Req> tower_service::Service<Req> for $name<S, $param, L>
        where
            S: tower_service::Service<Req> + Clone,
            S::Error: Into<$crate::BoxError>,
            S::Response: $crate::HoldPermit,
            $param: $bound<Req>,
            L: tollgate_core::slot::SlotStore,
        {
            type Response = <S::Response as $crate::HoldPermit>::Held;
            type Error = $crate::BoxError;
            type Future = $crate::limit::ResponseFuture<Self, Req>;

            fn poll_ready(
                &mut self,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Self::Error>> {
                self.inner.poll_ready(cx)
            }

            fn call(&mut self, req: Req) -> Self::Future {
                $crate::limit::ResponseFuture::new(self.inner.call(req))
            }
        }

        impl<S, $param, L, Req> $crate::limit::Machinery<Req> for $name<S, $param, L>
        where
            S: tower_service::Service<Req>,
        {
            type Machine = $crate::limit::Machine<S::Future, S, Req, $crate::permit::Hold>;
        }
    };
}
pub(crate) use slot_service;
