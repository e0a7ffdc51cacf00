//! How a host twin spreads a launch over the runtime's `rayon` pool: tasks of whole units
//! (rows, teams), their partials combined in order.

/// Work items one task of [`run_chunks`] runs at most when the kernel has a reduction
/// (unless one unit holds more, or that would leave fewer than [`MIN_TASKS`] tasks):
/// bounds how many values a float partial sums in sequence (its error grows with that
/// count).
pub const CHUNK_ITEMS: usize = 4096;

/// Tasks [`run_chunks`] makes at least for a reduction, where there are that many units.
pub const MIN_TASKS: usize = 64;

/// Tasks per pool thread [`run_chunks`] makes for a kernel without a reduction: enough to
/// balance uneven items, few enough that a task's start costs nothing beside its work.
pub const TASKS_PER_THREAD: usize = 4;

/// Runs a generated kernel's host twin over `units` units (a teams kernel's teams, else the
/// rows of the space's outer dimension) of `per_unit` work items each: consecutive units
/// in tasks, `chunk(first, end)` running units `first..end` in order and returning its
/// reduction partial; the partials are combined in order. The tasks run on the fork-join
/// team of the host device whose kernel this thread runs (joined by a thread waiting for
/// that device; `crate::fork_join`), else on the current `rayon` pool. With `reduces`, the
/// tasks depend only on `units` and `per_unit` (at most [`CHUNK_ITEMS`] items each), so a
/// float reduction's result does not depend on the number of threads; without, there are
/// [`TASKS_PER_THREAD`] per thread. A panic in a task (a failing item) is resumed here.
pub fn run_chunks<A: Send>(
    units: usize,
    per_unit: usize,
    reduces: bool,
    identity: A,
    chunk: impl Fn(usize, usize) -> A + Sync + Send,
    combine: impl Fn(A, A) -> A,
) -> A {
    crate::fork_join::with_current(|team| {
        let threads = team.map_or_else(rayon::current_num_threads, |t| t.size());
        let per = if reduces {
            CHUNK_ITEMS.div_ceil(per_unit.max(1)).min(units / MIN_TASKS)
        } else {
            units.div_ceil(TASKS_PER_THREAD * threads)
        }
        .max(1);
        let tasks = units.div_ceil(per);
        let task = |c: usize| chunk(c * per, ((c + 1) * per).min(units));
        if tasks == 1 {
            return combine(identity, task(0));
        }
        let Some(team) = team else {
            use rayon::prelude::*;
            let parts: Vec<A> = (0..tasks).into_par_iter().map(task).collect();
            return parts.into_iter().fold(identity, combine);
        };
        // Each task leaves its partial in its own slot, combined in task order after.
        let parts: Vec<parking_lot::Mutex<Option<A>>> =
            (0..tasks).map(|_| parking_lot::Mutex::new(None)).collect();
        team.fork(tasks, units.saturating_mul(per_unit), &|c| *parts[c].lock() = Some(task(c)));
        parts.into_iter().filter_map(parking_lot::Mutex::into_inner).fold(identity, combine)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units (teams, rows) go in order into tasks of whole units, whose partials combine in
    /// order; with a reduction the tasks depend only on the launch (at most `CHUNK_ITEMS`
    /// items each), without one there are a few per pool thread.
    #[test]
    #[cfg_attr(miri, ignore = "starts rayon's global pool, which Miri reports as leaked")]
    fn units_run_in_ordered_tasks_of_whole_units() {
        for reduces in [true, false] {
            for (units, per_unit) in
                [(0usize, 32usize), (1, 1024), (40, 64), (8192, 256), (100, 1), (1 << 20, 1)]
            {
                let seen = std::sync::Mutex::new(Vec::new());
                let order = run_chunks(
                    units,
                    per_unit,
                    reduces,
                    Vec::new(),
                    |a, b| {
                        seen.lock().unwrap().push((a, b));
                        vec![(a, b)]
                    },
                    |mut x: Vec<(usize, usize)>, y| {
                        x.extend(y);
                        x
                    },
                );
                let mut seen = seen.into_inner().unwrap();
                seen.sort_unstable();
                assert_eq!(order, seen, "partials combine in order");
                assert!(order.windows(2).all(|w| w[0].1 == w[1].0), "consecutive, whole: {order:?}");
                assert_eq!(order.first().map_or(0, |c| c.0), 0);
                assert_eq!(order.last().map_or(0, |c| c.1), units);
                if reduces {
                    assert!(order.len() >= units.min(MIN_TASKS), "{units} units in {} tasks", order.len());
                    let small = |c: &(usize, usize)| c.1 - c.0 == 1 || (c.1 - c.0) * per_unit <= CHUNK_ITEMS;
                    assert!(order.iter().all(small), "{order:?}");
                } else {
                    let most = TASKS_PER_THREAD * rayon::current_num_threads();
                    assert!(order.len() <= most.max(1), "{units} units in {} tasks", order.len());
                }
            }
        }
    }

    /// On a host device's fork-join team the units go into the same tasks as on a `rayon`
    /// pool of the team's size, and the partials combine in the same order.
    #[test]
    #[cfg_attr(miri, ignore = "starts rayon's global pool, which Miri reports as leaked")]
    fn a_team_runs_the_same_tasks_in_the_same_order() {
        let team = crate::fork_join::ForkJoinTeam::new(
            "tasks-test".into(),
            rayon::current_num_threads(),
            || {},
            None,
        );
        for reduces in [true, false] {
            for (units, per_unit) in [(0usize, 32usize), (1, 1024), (40, 64), (8192, 256), (1 << 20, 1)] {
                let run = || {
                    run_chunks(
                        units,
                        per_unit,
                        reduces,
                        Vec::new(),
                        |a, b| vec![(a, b)],
                        |mut x: Vec<(usize, usize)>, y| {
                            x.extend(y);
                            x
                        },
                    )
                };
                assert_eq!(team.driving(run), run(), "{units} units of {per_unit}, reduces {reduces}");
            }
        }
    }
}
