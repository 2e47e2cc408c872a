//! Enforcement modes and the runtime kill switch.
//!
//! A limit is dark-launched in [`Mode::Shadow`] (decided, counted and logged, never rejecting), then enforced;
//! an [`EnforcementSwitch`] flips a running limiter between the modes without a redeploy, the way Stripe and Envoy
//! roll limits out and back.
//!
//! ```
//! use tollgate_tower::{EnforcementSwitch, Mode};
//!
//! let switch = EnforcementSwitch::new(Mode::Shadow);
//! let handle = switch.clone(); // e.g. kept by an admin endpoint
//! handle.set(Mode::Enforce);
//! assert_eq!(switch.mode(), Mode::Enforce);
//! handle.set(Mode::Off); // the kill switch: no store call, no rejection, no headers
//! assert_eq!(switch.mode(), Mode::Off);
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// How a limiter treats its decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Decide and reject requests over the limit.
    #[default]
    Enforce,
    /// Decide, count and log, but admit every request (and show no headers): a dark launch.
    Shadow,
    /// Skip the limiter entirely: no store call, no rejection, no headers.
    Off,
}

impl Mode {
    /// A short stable name (`enforce`, `shadow`, `off`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Shadow => "shadow",
            Self::Off => "off",
        }
    }

    const fn to_u8(self) -> u8 {
        match self {
            Self::Enforce => 0,
            Self::Shadow => 1,
            Self::Off => 2,
        }
    }

    const fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Enforce,
            1 => Self::Shadow,
            _ => Self::Off,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A shared, cheaply cloned handle on a limiter's [`Mode`]; every clone sees every change at once.
///
/// One switch may be shared by several layers (e.g. to turn every limit of a service off together).
#[derive(Clone)]
pub struct EnforcementSwitch(Arc<AtomicU8>);

impl EnforcementSwitch {
    /// A switch starting in `mode`.
    #[must_use]
    pub fn new(mode: Mode) -> Self {
        Self(Arc::new(AtomicU8::new(mode.to_u8())))
    }

    /// The current mode.
    #[must_use]
    #[inline]
    pub fn mode(&self) -> Mode {
        // Relaxed: the mode guards no other memory; a request racing a flip may see either mode.
        Mode::from_u8(self.0.load(Ordering::Relaxed))
    }

    /// Sets the mode for every request from now on.
    pub fn set(&self, mode: Mode) {
        self.0.store(mode.to_u8(), Ordering::Relaxed);
    }
}

impl Default for EnforcementSwitch {
    fn default() -> Self {
        Self::new(Mode::Enforce)
    }
}

impl fmt::Debug for EnforcementSwitch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EnforcementSwitch")
            .field(&self.mode())
            .finish()
    }
}
