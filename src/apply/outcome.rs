//! What an apply pass did ([`DrainOutcome`]), for one shard or several.

/// What an apply pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainOutcome {
    /// This caller applied entries until none were pending.
    Drained {
        /// Entries applied (or moved aside as dead).
        applied: usize,
    },
    /// Another applier holds the shard; it re-checks for pending entries before it stops.
    Busy,
    /// This caller applied entries and stopped with entries still pending: at its time
    /// budget, or at a replace or delete whose barrier had not passed by then.
    Partial {
        /// Entries applied (or moved aside as dead).
        applied: usize,
    },
}

impl DrainOutcome {
    /// Entries applied.
    pub fn applied(self) -> usize {
        match self {
            DrainOutcome::Drained { applied } | DrainOutcome::Partial { applied } => applied,
            DrainOutcome::Busy => 0,
        }
    }

    /// The outcome of applying several shards: `Partial` if any stopped early, `Busy` if all
    /// were busy, `Drained` otherwise.
    pub fn combine(outcomes: impl IntoIterator<Item = DrainOutcome>) -> DrainOutcome {
        let (mut applied, mut partial, mut all_busy) = (0, false, true);
        for o in outcomes {
            applied += o.applied();
            partial |= matches!(o, DrainOutcome::Partial { .. });
            all_busy &= o == DrainOutcome::Busy;
        }
        if partial {
            DrainOutcome::Partial { applied }
        } else if all_busy {
            DrainOutcome::Busy
        } else {
            DrainOutcome::Drained { applied }
        }
    }
}
