//! The token leases the decision consults when the `leases` feature is off: a table that cannot exist, so a
//! limiter's leases are always `None` and the decision reads the same with the feature and without.

use std::convert::Infallible;
use std::marker::PhantomData;

use tollgate_core::{Decision, StoreError};

/// No lease table: it has no value.
pub(crate) struct LeaseTable<St> {
    never: Infallible,
    store: PhantomData<St>,
}

/// What the look-up of a request on a leasing limiter found (never made without the feature).
#[allow(dead_code)]
pub(crate) enum Leased {
    Decided(Decision),
    Wait,
    Plain,
}

/// What a request that waited for its key's fetch got (never made without the feature).
#[allow(dead_code)]
pub(crate) enum Waited {
    Decided(Decision),
    Failed(StoreError),
    Plain,
}

impl<St> LeaseTable<St> {
    pub(crate) fn take(&self, _: &str, _: u64) -> Leased {
        let _ = &self.store;
        match self.never {}
    }

    pub(crate) async fn wait(&self, _: &str, _: u64) -> Waited {
        match self.never {}
    }

    pub(crate) fn show_plain(&self, _: &str, _: u64, _: &mut Decision) {
        match self.never {}
    }
}
