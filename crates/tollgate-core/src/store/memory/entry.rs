//! A shard's entries, one type per algorithm, and the two slabs that hold them under one hand.

use super::lockouts::Lockouts;
use crate::Policy;
use crate::Timestamp;
use crate::algorithm::Step;
use crate::algorithm::lockout::Locked;
use crate::algorithm::sliding_window::{self, SlidingWindowState};
use crate::algorithm::token_bucket::{self, TokenBucketState};
use crate::store::table::{Arena, Expiry, SECOND, Slab};

/// A stored algorithm state, which knows when it has decayed back to "fresh" (its lockout aside, which the
/// shard's lockout table keeps).
pub(super) trait Entry: Copy + Expiry {
    type State: Copy;
    /// What the entry needs besides the state to be written and read back: a window's period.
    type Ctx: Copy;
    /// Tells this algorithm's links from the other's under the shard's one hand.
    const TAG: u32;
    fn slab(slabs: &mut Slabs) -> &mut Slab<Self>;
    fn slab_ref(slabs: &Slabs) -> &Slab<Self>;
    /// A request's decision, without a lockout.
    fn check(
        state: Option<Self::State>,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Step<Self::State>;
    fn new(state: Self::State, ctx: Self::Ctx) -> Self;
    fn state(&self, ctx: Self::Ctx) -> Self::State;
    /// The entry of `state` as a shard's hot entry ([`HotEntry`](super::hot::HotEntry)) keeps it: the state in the
    /// first three words (decided on as they are, with no conversion), then what else the entry holds.
    fn to_words(state: Self::State, ctx: Self::Ctx) -> [u64; 4];
    /// The state in a hot entry's first three words.
    fn state_of(words: [u64; 3]) -> Self::State;
    /// The entry back from a hot entry's words.
    fn from_words(words: [u64; 4]) -> Self;
}

/// A token bucket's entry: its state alone, 16 bytes (a lockout, if any, is in the shard's lockout table).
#[derive(Clone, Copy)]
pub(super) struct BucketEntry(TokenBucketState);

/// A bucket lives until it is full again.
impl Expiry for BucketEntry {
    fn expires_at(&self) -> u64 {
        self.0.full_at
    }
}

impl Entry for BucketEntry {
    type State = TokenBucketState;
    type Ctx = ();
    const TAG: u32 = 0;
    #[inline]
    fn slab(slabs: &mut Slabs) -> &mut Slab<Self> {
        &mut slabs.buckets
    }
    fn slab_ref(slabs: &Slabs) -> &Slab<Self> {
        &slabs.buckets
    }
    #[inline(always)]
    fn check(
        state: Option<TokenBucketState>,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Step<TokenBucketState> {
        token_bucket::decide(state, policy.quota_ref(), cost, now)
    }
    #[inline(always)]
    fn new(state: TokenBucketState, (): ()) -> Self {
        Self(state)
    }
    #[inline(always)]
    fn state(&self, (): ()) -> TokenBucketState {
        self.0
    }
    #[inline(always)]
    fn to_words(state: TokenBucketState, (): ()) -> [u64; 4] {
        [state.full_at, state.remainder, 0, 0]
    }
    #[inline(always)]
    fn state_of([full_at, remainder, _]: [u64; 3]) -> TokenBucketState {
        TokenBucketState { full_at, remainder }
    }
    #[inline(always)]
    fn from_words([full_at, remainder, ..]: [u64; 4]) -> Self {
        Self(TokenBucketState { full_at, remainder })
    }
}

// A node is its key word and its state, nothing more: the visited mark rides in the key's word.
const _: () = assert!(size_of::<crate::store::table::Node<BucketEntry>>() == 24);
const _: () = assert!(size_of::<crate::store::table::Node<WindowEntry>>() == 32);

/// A window's entry, 24 bytes: its counts and the instant it expires, from which (with the period) its window's
/// start is read back; the window's start is a multiple of the period, and the entry expires a whole number of
/// periods after it ([`Window::periods`]), so nothing is lost.
#[derive(Clone, Copy)]
pub(super) struct WindowEntry {
    /// The state's reset: the window's start plus [`Window::periods`] periods.
    expires_at: u64,
    previous: u64,
    current: u64,
}

/// How a window's entry is written and read back: its policy's period, and whether the state is a fixed window's
/// (kept in the sliding window's slab, `previous` unused).
#[derive(Clone, Copy)]
pub(super) struct Window {
    period: u64,
    fixed: bool,
}

impl Window {
    /// A sliding window counter's entries under `policy`.
    #[inline(always)]
    pub(super) fn sliding(policy: &Policy) -> Self {
        Self {
            period: policy.quota_ref().period_micros(),
            fixed: false,
        }
    }

    /// A fixed window's entries under `policy`.
    pub(super) fn fixed(policy: &Policy) -> Self {
        Self {
            period: policy.quota_ref().period_micros(),
            fixed: true,
        }
    }

    /// How many periods after its window's start a state stops mattering (its reset): two while the current
    /// window holds requests (its count still weighs in the next one), one while only the previous does or a fixed
    /// window's does, none when nothing is counted (it is as good as fresh then).
    #[inline(always)]
    fn periods(self, previous: u64, current: u64) -> u64 {
        match (current > 0, previous > 0) {
            (true, _) if !self.fixed => 2,
            (true, _) | (false, true) => 1,
            (false, false) => 0,
        }
    }
}

impl Entry for WindowEntry {
    type State = SlidingWindowState;
    type Ctx = Window;
    const TAG: u32 = WINDOW;
    #[inline]
    fn slab(slabs: &mut Slabs) -> &mut Slab<Self> {
        &mut slabs.windows
    }
    fn slab_ref(slabs: &Slabs) -> &Slab<Self> {
        &slabs.windows
    }
    #[inline(always)]
    fn check(
        state: Option<SlidingWindowState>,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Step<SlidingWindowState> {
        sliding_window::decide(state, policy, cost, now)
    }
    #[inline(always)]
    fn new(state: SlidingWindowState, window: Window) -> Self {
        let periods = window.periods(state.previous, state.current);
        Self {
            expires_at: state.window_start + periods * window.period,
            previous: state.previous,
            current: state.current,
        }
    }
    #[inline(always)]
    fn state(&self, window: Window) -> SlidingWindowState {
        let periods = window.periods(self.previous, self.current);
        SlidingWindowState {
            window_start: self.expires_at - periods * window.period,
            previous: self.previous,
            current: self.current,
        }
    }
    #[inline(always)]
    fn to_words(state: SlidingWindowState, window: Window) -> [u64; 4] {
        [
            state.window_start,
            state.previous,
            state.current,
            Self::new(state, window).expires_at,
        ]
    }
    #[inline(always)]
    fn state_of([window_start, previous, current]: [u64; 3]) -> SlidingWindowState {
        SlidingWindowState {
            window_start,
            previous,
            current,
        }
    }
    #[inline(always)]
    fn from_words([_, previous, current, expires_at]: [u64; 4]) -> Self {
        Self {
            expires_at,
            previous,
            current,
        }
    }
}

impl Expiry for WindowEntry {
    fn expires_at(&self) -> u64 {
        self.expires_at
    }
}

/// The top bit of a link under a shard's hand: the sliding-window slab (clear: the token-bucket slab).
pub(super) const WINDOW: u32 = SECOND;

/// A shard's two slabs, one per algorithm, which its one hand walks, and their keys' lockout ends.
#[derive(Default)]
pub(super) struct Slabs {
    pub(super) buckets: Slab<BucketEntry>,
    pub(super) windows: Slab<WindowEntry>,
    pub(super) lockouts: Lockouts,
}

impl Slabs {
    /// Puts a hot entry taken out of the shard's [`HotEntry`](super::hot::HotEntry) back into its key's node (which
    /// a key in the copy keeps: only the lock's holder removes nodes, and taking the lock puts the copy back first).
    pub(super) fn put_back<E: Entry>(&mut self, key: u64, words: [u64; 4]) {
        let slab = E::slab(self);
        if let Some(slot) = slab.find(key) {
            slab.node_mut(slot).value = E::from_words(words);
        }
    }

    /// The key's state with its lockout end, read only; the end is read only for a policy with a lockout
    /// (`lockout_us > 0`: one without ignores it).
    pub(super) fn locked<E: Entry>(
        &self,
        key: u64,
        lockout_us: u64,
        ctx: E::Ctx,
    ) -> Option<Locked<E::State>> {
        let state = E::slab_ref(self).get(key)?.state(ctx);
        let locked_until = if lockout_us == 0 {
            0
        } else {
            self.lockouts.get(E::TAG, key)
        };
        Some(Locked {
            state,
            locked_until,
        })
    }
}

impl Arena for Slabs {
    fn lens(&self) -> [u32; 2] {
        [self.buckets.len() as u32, self.windows.len() as u32]
    }

    fn pass(&mut self, link: u32) -> bool {
        if link & WINDOW == 0 {
            self.buckets.node_mut(link).pass()
        } else {
            self.windows.node_mut(link & !WINDOW).pass()
        }
    }

    /// The entry's own expiry, or its lockout's end if later: a locked key is neither swept nor evicted as
    /// decayed (the table is read only while some key of this algorithm in the shard has a lockout end).
    fn expires_at(&self, link: u32) -> u64 {
        let (tag, slot) = (link & WINDOW, link & !WINDOW);
        let (own, key) = if tag == 0 {
            let node = self.buckets.node(slot);
            (node.value.expires_at(), node.key())
        } else {
            let node = self.windows.node(slot);
            (node.value.expires_at(), node.key())
        };
        own.max(self.lockouts.get(tag, key))
    }
}
