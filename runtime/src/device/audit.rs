//! What a failed construct left behind, recorded for the fault tests (test-only: on for a
//! runtime built with `RuntimeBuilder::inject_faults`).
//!
//! Before each construct on an audited device the runtime takes a [`DeviceSnapshot`] (the
//! present table with every count, the memory pool's live blocks, the pinned host ranges);
//! when the construct fails with its own error it takes another, and keeps both as a
//! [`FailedConstruct`]. [`FailedConstruct::check`] then says whether the failure left the
//! device as docs/SEMANTICS.md's R9 says it must. The snapshots are of the whole device, so
//! of a construct that ran beside another (threads, a pipeline's lanes) only the error is
//! checked ([`AuditRule::Concurrent`]). Routines that are not constructs (queries,
//! `target_free`) are not counted: a case that runs them on other threads while a
//! construct fails may see its snapshot move.

use std::sync::Arc;

use parking_lot::Mutex;

use super::DeviceState;
use crate::data_env::Entry;
use crate::error::Error;
use crate::range::HostRange;
use crate::services::memory_pool::Owner;

/// One device's state as a construct sees it, for comparing before and after a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSnapshot {
    /// Every entry: host range, reference count (0 for associated ones), hold count,
    /// whether associated; in host-address order.
    pub entries: Vec<(HostRange, u64, u64, bool)>,
    /// Live blocks of the memory pool that hold mapped data and that no queued work still
    /// holds (a block whose entry has left the table while a queued kernel or copy uses it
    /// is freed when the work ends, not counted here). `target_alloc` blocks are not
    /// counted: other threads may make and free them meanwhile.
    pub live_blocks: usize,
    /// Host ranges the runtime has page-locked, in address order.
    pub pinned: Vec<HostRange>,
}

/// What a failed construct must leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuditRule {
    /// All or nothing (every construct that enters, `exit data`, `update`, a launch with
    /// its maps): the device exactly as before.
    Unchanged,
    /// A region's end, which cannot be undone: it ends its mappings anyway, so entries
    /// may leave and counts fall, but nothing is added, no count rises, and every block
    /// and pinned range that stays belongs to what stays.
    RegionEnd,
    /// None that the snapshots can show: the construct ran beside another on the device
    /// (threads, a pipeline's lanes), whose changes they show too. Recorded for its error.
    Concurrent,
    /// None: the error reports earlier queued work's failure ([`Error::Queued`]) or refuses
    /// the construct for it ([`Error::EarlierFailure`]); the construct itself ran, or did
    /// nothing. Recorded for its error.
    Reported,
}

/// A construct that failed on an audited device, with the device before and after it.
#[derive(Clone, Debug)]
pub struct FailedConstruct {
    /// Device number.
    pub device: usize,
    /// The construct ("target enter data", "target", ...), or "a synchronising call" for a
    /// report of queued work's failure.
    pub construct: &'static str,
    /// What it must have left.
    pub rule: AuditRule,
    /// Its error.
    pub error: Error,
    /// The device when it began.
    pub before: DeviceSnapshot,
    /// The device when it returned.
    pub after: DeviceSnapshot,
}

impl FailedConstruct {
    /// Whether the failure left the device as [`FailedConstruct::rule`] says: `Err` says
    /// what differs.
    pub fn check(&self) -> Result<(), String> {
        let (b, a) = (&self.before, &self.after);
        let fail = |what: String| {
            Err(format!(
                "device {}: {} failed ({}) and {what}\n  before: {b:?}\n  after:  {a:?}",
                self.device, self.construct, self.error
            ))
        };
        match self.rule {
            AuditRule::Unchanged if a != b => fail("did not leave the device as it was".into()),
            AuditRule::Unchanged | AuditRule::Concurrent | AuditRule::Reported => Ok(()),
            AuditRule::RegionEnd => {
                for e in &a.entries {
                    let Some(was) = b.entries.iter().find(|w| w.0 == e.0) else {
                        return fail(format!("added an entry for {}", e.0));
                    };
                    if e.1 > was.1 || e.2 > was.2 || e.3 != was.3 {
                        return fail(format!("raised the counts of {}", e.0));
                    }
                }
                // Each entry that left took its block with it; nothing else was allocated.
                let gone = b.entries.len() - a.entries.len();
                if a.live_blocks + gone != b.live_blocks {
                    return fail(format!(
                        "{} entries left but the pool went from {} to {} live blocks",
                        gone, b.live_blocks, a.live_blocks
                    ));
                }
                match a.pinned.iter().find(|p| !b.pinned.contains(p)) {
                    Some(p) => fail(format!("pinned {p}")),
                    None => Ok(()),
                }
            }
        }
    }
}

/// Constructs running now on any device of a runtime, and constructs begun so far: a
/// construct that ran beside another (threads, a pipeline's lanes, another device's, which
/// may pin host memory every device shares) is recorded as [`AuditRule::Concurrent`],
/// since the snapshots show the other's changes too.
///
/// One lock over both counts, so that a construct's start is one step: with two atomics, a
/// construct that found none running could take its ticket after one that started beside
/// it had taken its own, and so find no construct begun after it and take itself for
/// alone (a fault run once failed on the other's changes in its snapshots).
#[derive(Debug, Default)]
pub(crate) struct AuditActivity(Mutex<ActivityCounts>);

#[derive(Debug, Default)]
struct ActivityCounts {
    running: usize,
    begun: u64,
}

impl AuditActivity {
    /// A construct starts: whether none was running, and its ticket.
    fn start(&self) -> (bool, u64) {
        let mut c = self.0.lock();
        let alone = c.running == 0;
        c.running += 1;
        c.begun += 1;
        (alone, c.begun)
    }

    /// The construct with `ticket` ends: whether none began after it.
    fn end(&self, ticket: u64) -> bool {
        let mut c = self.0.lock();
        c.running -= 1;
        c.begun == ticket
    }
}

/// The failed constructs of one device.
#[derive(Debug)]
pub(crate) struct ConstructAudit {
    failed: Mutex<Vec<FailedConstruct>>,
    /// The runtime's, shared by its devices.
    activity: Arc<AuditActivity>,
}

impl ConstructAudit {
    /// An audit of one device of the runtime whose constructs `activity` counts.
    pub(crate) fn new(activity: Arc<AuditActivity>) -> Self {
        Self { failed: Mutex::new(Vec::new()), activity }
    }

    /// Every failed construct so far, taking them.
    pub(crate) fn take(&self) -> Vec<FailedConstruct> {
        std::mem::take(&mut self.failed.lock())
    }
}

impl DeviceState {
    /// The device as [`DeviceSnapshot`] describes it.
    pub(crate) fn snapshot(&self) -> DeviceSnapshot {
        let (entries, held) = {
            let t = self.table.lock();
            let entries = t
                .entries()
                .map(|e: &Entry| {
                    (e.range, if e.associated { 0 } else { e.ref_count }, e.hold_count, e.associated)
                })
                .collect();
            (entries, t.retired_count())
        };
        let live_blocks = self.pool.live_count_of(Owner::Mapping).saturating_sub(held);
        let pinned = self.pinned.ranges();
        DeviceSnapshot { entries, live_blocks, pinned }
    }

    /// On an audited device, records a failure of queued work that a synchronising call
    /// (a construct's wait, a reduction's, `synchronize`) reports, as [`AuditRule::Reported`]:
    /// the fault tests learn that the failure reached the program, whoever called.
    pub(crate) fn audit_report(&self, e: &Error) {
        if let Some(audit) = &self.audit {
            let now = self.snapshot();
            let record = FailedConstruct {
                device: self.number,
                construct: "a synchronising call",
                rule: AuditRule::Reported,
                error: e.clone(),
                before: now.clone(),
                after: now,
            };
            audit.failed.lock().push(record);
        }
    }

    /// Runs `construct`; on an audited device, its failure is recorded with the device
    /// before and after it.
    pub(crate) fn audited<R>(
        &self,
        name: &'static str,
        rule: AuditRule,
        construct: impl FnOnce() -> crate::error::Result<R>,
    ) -> crate::error::Result<R> {
        let Some(audit) = &self.audit else { return construct() };
        let activity = &audit.activity;
        let (alone, ticket) = activity.start();
        let before = self.snapshot();
        let r = construct();
        let after = r.as_ref().err().map(|_| self.snapshot());
        let alone = activity.end(ticket) && alone;
        if let (Err(e), Some(after)) = (&r, after) {
            let rule = match e {
                Error::Queued { .. } | Error::EarlierFailure { .. } => AuditRule::Reported,
                _ if !alone => AuditRule::Concurrent,
                _ => rule,
            };
            let record = FailedConstruct {
                device: self.number,
                construct: name,
                rule,
                error: e.clone(),
                before,
                after,
            };
            audit.failed.lock().push(record);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::AuditActivity;

    #[test]
    fn a_construct_is_alone_only_if_none_ran_beside_it() {
        let a = AuditActivity::default();
        let (alone, first) = a.start();
        assert!(alone, "nothing was running");
        let (beside, second) = a.start();
        assert!(!beside, "the first was still running");
        assert!(a.end(second), "none began after the second");
        assert!(!a.end(first), "the second began while the first ran");
        let (alone, third) = a.start();
        assert!(alone && a.end(third), "both earlier ones had ended");
    }
}
