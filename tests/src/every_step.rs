//! Every step fails once (issue 25, item 2): a case is run once on host devices that
//! count their operations, then again once for every device, every kind of operation and
//! every `n` up to that count (up to [`EVERY_STEP_UP_TO`]; a spread of them for stress
//! cases that make more), with the `n`-th operation of that kind on that device failing as
//! a driver's would (`RuntimeBuilder::inject_faults`). Synchronous and queued.
//!
//! After each run, [`every_step_fails_once`] checks:
//! - every construct that failed left its device as docs/SEMANTICS.md's R9 says
//!   ([`offload::FailedConstruct::check`]: the table, every count, the pool's live blocks
//!   and the pinned ranges as before it, or for a region's end only entries that left);
//! - a construct that failed on the injected fault says so with its name (an
//!   [`offload::Error::Construct`] or [`offload::Error::Queued`]);
//! - the case failed, or succeeded only where the failure may be survived (a pin, which
//!   is an optimisation) or surfaced at the next synchronisation;
//! - once the mappings the aborted case left are deleted, nothing more is allocated than
//!   the case's own `target_alloc` blocks, and every device maps, computes and copies back
//!   right.
//!
//! The conformance suite (and the other suites that use [`crate::on_every_device`] and
//! [`crate::on_every_backend`]) run this way with `OFFLOAD_TEST_FAULTS=1`.

use offload::backend::{FaultKind, FaultPlan};
use offload::{Error, MapItem, MapType, Result, Runtime, RuntimeBuilder};

/// Whether the suites run every case with each step failing once: `OFFLOAD_TEST_FAULTS=1`.
pub fn faults_mode() -> bool {
    match std::env::var("OFFLOAD_TEST_FAULTS").as_deref() {
        Err(_) | Ok("0") => false,
        Ok("1") => true,
        Ok(other) => panic!("OFFLOAD_TEST_FAULTS={other:?} is not valid: expected 1 or 0"),
    }
}

/// What a sweep did, for the figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Runs with one operation failing.
    pub runs: u64,
    /// Of those, runs whose case failed with the fault.
    pub failed: u64,
    /// Runs that succeeded because the failed operation was a pin, or an allocation the
    /// pool made again after giving back its cached blocks.
    pub survived: u64,
    /// Constructs that failed, each checked against what it must leave.
    pub constructs: u64,
    /// Operations failed, by kind ([`FaultKind::ALL`]'s order).
    pub by_kind: [u64; 7],
}

impl Sweep {
    fn add(&mut self, o: &Sweep) {
        self.runs += o.runs;
        self.failed += o.failed;
        self.survived += o.survived;
        self.constructs += o.constructs;
        for k in 0..7 {
            self.by_kind[k] += o.by_kind[k];
        }
    }
}

fn fail(what: String) -> Error {
    Error::InvalidArgument { routine: "every_step_fails_once", what }
}

/// Whether `e` reports an injected failure: the failure (or a construct wrapping it), or
/// the refusal of a construct after it (another thread's queued work failed).
fn injected(e: &Error) -> bool {
    let text = e.to_string();
    // A case's own check may quote the refusal it got.
    text.contains("(injected)")
        || text.contains("failed after it returned")
        || matches!(e.cause(), Error::OutOfMemory { .. } | Error::EarlierFailure { .. })
}

/// What the failed constructs of a run were.
#[derive(Clone, Copy, Debug, Default)]
struct Audit {
    /// Failed constructs whose state was checked.
    checked: u64,
    /// Failed constructs, checked or not.
    failed: u64,
    /// Whether one reported an injected fault.
    injected: bool,
}

/// Checks the failed constructs every device recorded.
fn audit(rt: &Runtime, what: &str) -> Result<Audit> {
    let mut a = Audit::default();
    for d in 0..rt.num_devices() {
        for f in rt.failed_constructs(d)? {
            a.failed += 1;
            // Of one that ran beside another, or reported earlier work's failure, only its
            // error says anything.
            a.checked +=
                u64::from(!matches!(f.rule, offload::AuditRule::Concurrent | offload::AuditRule::Reported));
            a.injected |= injected(&f.error);
            f.check().map_err(|e| fail(format!("{what}: {e}")))?;
            let names_itself = matches!(
                f.error,
                Error::Construct { .. } | Error::Queued { .. } | Error::EarlierFailure { .. }
            );
            if injected(&f.error) && !names_itself {
                return Err(fail(format!(
                    "{what}: {} failed on an injected fault without naming itself: {}",
                    f.construct, f.error
                )));
            }
        }
    }
    Ok(a)
}

/// Deletes every mapping the aborted case left, then checks that each device maps,
/// launches and copies back right, and that this frees what it allocated.
fn still_works(rt: &Runtime, what: &str) -> Result<()> {
    crate::unmap_everything(rt)?;
    for dev in 0..rt.num_devices() {
        let live = rt.pool_usage(dev)?.live_allocations;
        let mut x: Vec<i32> = (0..3000).collect();
        let item = [MapItem::slice_mut(&mut x, MapType::TOFROM)];
        let args =
            [offload::LaunchArg::Value(offload::Scalar::I32(7)), offload::LaunchArg::mapped(x.as_ptr())];
        // SAFETY: `x` outlives the call; the kernel writes 1000 of its 3000 elements.
        unsafe { rt.target_launch(dev, &offload_kernels::FILL_I32, 1000, &item, &args) }
            .map_err(|e| fail(format!("{what}: device {dev} failed the next construct: {e}")))?;
        rt.synchronize(dev)?;
        let right = x.iter().enumerate().all(|(i, &v)| v == if i < 1000 { 7 } else { i as i32 });
        if !right || rt.pool_usage(dev)?.live_allocations != live {
            return Err(fail(format!("{what}: device {dev} computed wrong or leaked after the failure")));
        }
    }
    Ok(())
}

/// Operations of one kind a sweep fails, one per run: every one up to [`EVERY_STEP_UP_TO`];
/// of a case that makes more (a stress case: threads, hundreds of allocations), the first
/// and last 4 and 8 spread evenly between.
fn steps(seen: u64) -> Vec<u64> {
    if seen <= EVERY_STEP_UP_TO {
        return (1..=seen).collect();
    }
    let mut v: Vec<u64> = (1..=4).chain(seen - 3..=seen).collect();
    v.extend((1..=8).map(|i| 4 + i * (seen - 8) / 9));
    v.sort_unstable();
    v.dedup();
    v
}

/// Most operations of one kind a sweep fails each of.
pub const EVERY_STEP_UP_TO: u64 = 48;

/// Runs `case` with each of its device operations failing once, in turn, on runtimes of
/// [`crate::HOST_DEVICES`] host devices from `configure`; the checks are the module's.
pub fn every_step_fails_once(
    what: &str,
    configure: impl Fn(RuntimeBuilder) -> RuntimeBuilder,
    case: impl Fn(&Runtime) -> Result<()>,
) -> Result<Sweep> {
    let mut total = Sweep::default();
    for synchronous in [true, false] {
        let build = |plan: FaultPlan| {
            // The case's own settings (a case that needs constructs to wait) come last.
            configure(crate::host_builder().synchronous(synchronous)).inject_faults(plan).build()
        };
        let mode = if synchronous { "synchronous" } else { "queued" };
        let rt = build(FaultPlan::default())?;
        case(&rt).map_err(|e| fail(format!("{what} ({mode}): fails without a fault: {e}")))?;
        for d in 0..rt.num_devices() {
            rt.synchronize(d)?;
        }
        let baseline = audit(&rt, what)?;
        let mut sweep = Sweep { constructs: baseline.checked, ..Sweep::default() };
        let seen: Vec<[u64; 7]> = (0..rt.num_devices())
            .map(|d| rt.fault_counts(d).map(|c| c.map(|c| c.seen).unwrap_or_default()))
            .collect::<Result<_>>()?;
        drop(rt);
        for (dev, seen) in seen.iter().enumerate() {
            for (k, kind) in FaultKind::ALL.into_iter().enumerate() {
                for n in steps(seen[k]) {
                    let at = format!("{what} ({mode}, device {dev}: {kind:?} operation {n} fails)");
                    let rt = build(FaultPlan::default().fail_nth(kind, n).on_device(dev))?;
                    let r = case(&rt);
                    let synced: Vec<Result<()>> = (0..rt.num_devices()).map(|d| rt.synchronize(d)).collect();
                    let fired = rt.fault_counts(dev)?.map_or(0, |c| c.injected[k]);
                    let run = audit(&rt, &at)?;
                    sweep.constructs += run.checked;
                    if fired == 0 {
                        // This run made fewer operations of the kind (a case whose work
                        // depends on timing): nothing failed, nothing to check.
                        r.map_err(|e| fail(format!("{at}: failed though nothing was injected: {e}")))?;
                        continue;
                    }
                    sweep.runs += 1;
                    sweep.by_kind[k] += 1;
                    match &r {
                        // The case stopped at the failure, or a check of its own failed
                        // after a construct reported it (a case that expects an error of
                        // another kind): either way the fault was reported.
                        Err(e) if injected(e) || run.injected => sweep.failed += 1,
                        // A survived allocation changed what the pool caches, and a survived
                        // pin what is pinned, which a case may check.
                        Err(_) if matches!(kind, FaultKind::Pin | FaultKind::Alloc) => sweep.survived += 1,
                        Err(e) => {
                            return Err(fail(format!(
                                "{at}: the case failed, but no construct reported the fault: {e}"
                            )))
                        }
                        // A pin is an optimisation; a failed allocation is made again once the
                        // pool has given back its cached blocks.
                        Ok(()) if matches!(kind, FaultKind::Pin | FaultKind::Alloc) => sweep.survived += 1,
                        Ok(()) if synced.iter().any(|s| s.as_ref().is_err_and(injected)) => sweep.failed += 1,
                        // A construct reported it, and the case, which expects errors, took it
                        // for one; or a case whose constructs fail on purpose (its first error
                        // is the one it expects, and a later copy's failure is not returned).
                        Ok(()) if run.injected || baseline.failed > 0 => sweep.failed += 1,
                        Ok(()) => {
                            return Err(fail(format!("{at}: the case succeeded and nothing reported it")))
                        }
                    }
                    still_works(&rt, &at)?;
                }
            }
        }
        total.add(&sweep);
    }
    if total.runs == 0 {
        println!("{what}: no device operation to fail");
    } else {
        println!(
            "{what}: {} runs with one operation failing ({} failed, {} survived a failed pin or allocation), {} failed \
             constructs checked; by kind {:?} (alloc, copy in, copy out, fill, launch, pin, event wait)",
            total.runs, total.failed, total.survived, total.constructs, total.by_kind
        );
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_cases_fail_every_step_and_large_ones_a_spread() {
        assert_eq!(steps(3), vec![1, 2, 3]);
        assert_eq!(steps(EVERY_STEP_UP_TO).len() as u64, EVERY_STEP_UP_TO);
        let s = steps(4000);
        assert_eq!(s.len(), 16);
        assert_eq!((s[0], s[3], s[12], s[15]), (1, 4, 3997, 4000));
        assert!(s.windows(2).all(|w| w[0] < w[1]), "{s:?}");
    }
}
