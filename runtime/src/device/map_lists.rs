//! Processing a construct's map list against one device's present table.
//!
//! The table's lock is held only to read and change the table, never across a copy, so
//! that copy-in, kernels and copy-out from different threads overlap (pipelines depend on
//! it). Entries are published only once their data has arrived: a construct plans under
//! the lock, copies without it, then publishes the entries it created; an exit removes
//! released entries under the lock, then copies back and frees. A failure undoes the
//! construct's own changes (counts by the amounts it moved them, entries it created or
//! removed), so nothing is leaked and other threads' changes are kept.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashSet;

use super::in_flight::SLOT_BYTES;
use super::{CopyPath, DeviceState};
use crate::backend::Queue;
use crate::data_env::plan::{
    increment, present_parts, resolve_exit, undo_counts, EnterPlan, ExitPlan, Planned, PlannedCopy, Short,
    SmallSet,
};
use crate::data_env::{next_mark, Construct, Entry, Lookup, MapItem, PresentTable, UpdateDirection};
use crate::error::{Error, Result};
use crate::info::{EntryLine, InfoFields, InfoFlags};
use crate::origin::Origin;
use crate::range::{ArrayName, HostRange, RangeName};
use crate::services::memory_pool::Owner;

/// Device blocks of entries that a launch or copy made without the table's lock is using;
/// on drop each is unpinned, and freed when its entry left the table meanwhile (another
/// thread's exit: with one reference count, safe code can end a mapping that another
/// thread's kernel uses, and the block must outlive the kernel).
pub(crate) struct BlocksInUse<'a> {
    device: &'a DeviceState,
    blocks: Short<u64>,
}

impl<'a> BlocksInUse<'a> {
    pub(crate) fn new(device: &'a DeviceState) -> Self {
        Self { device, blocks: Short::new() }
    }

    /// A guard over blocks pinned elsewhere (a recording's), unpinned when it drops.
    pub(crate) fn adopt(device: &'a DeviceState, blocks: Short<u64>) -> Self {
        Self { device, blocks }
    }

    /// The pinned blocks, handed to the caller, who unpins them when the work using them
    /// is done ([`DeviceState::queued`]).
    pub(crate) fn take_blocks(&mut self) -> Short<u64> {
        std::mem::take(&mut self.blocks)
    }

    /// Pins the block of `e` (found in `table`, whose lock the caller holds).
    pub(crate) fn pin(&mut self, table: &mut PresentTable, e_device_addr: u64) {
        table.pin(e_device_addr);
        self.blocks.push(e_device_addr);
    }
}

impl Drop for BlocksInUse<'_> {
    fn drop(&mut self) {
        if self.blocks.is_empty() {
            return;
        }
        let done: Short<Entry> = {
            let mut table = self.device.table.lock();
            self.blocks.iter().filter_map(|&a| table.unpin(a)).collect()
        };
        for e in &done {
            let _ = self.device.release_entry(e);
        }
    }
}

/// The host ranges a construct put in transit ([`PresentTable::in_transit`]): taken out,
/// and the constructs waiting on them woken, by [`Transit::end`] or, on a failure or an
/// unwind, when dropped. Declared before any guard of the table in the same scope, so that
/// its drop, which locks the table, comes after theirs.
struct Transit<'a> {
    device: &'a DeviceState,
    ranges: Short<HostRange>,
}

impl<'a> Transit<'a> {
    fn new(device: &'a DeviceState) -> Self {
        Self { device, ranges: Short::new() }
    }

    /// Puts `r` in transit in `table` (whose lock the caller holds).
    fn add(&mut self, table: &mut PresentTable, r: HostRange) {
        table.begin_transit(r);
        self.ranges.push(r);
    }

    /// Takes the ranges out of transit in `table` (whose lock the caller holds).
    fn end(&mut self, table: &mut PresentTable) {
        if self.ranges.is_empty() {
            return;
        }
        for r in self.ranges.drain(..) {
            table.end_transit(r);
        }
        self.device.transit_done.notify_all();
    }
}

impl Drop for Transit<'_> {
    fn drop(&mut self) {
        if !self.ranges.is_empty() {
            let device = self.device;
            self.end(&mut device.table.lock());
        }
    }
}

/// Bounce slots whose copies a construct queued and has not yet handed to its
/// [`DeviceState::queued`] record: given back when dropped (on a failure or an unwind),
/// after the queue has passed the copies.
struct QueuedSlots<'a>(&'a DeviceState, Short<usize>);

impl QueuedSlots<'_> {
    /// For a construct that succeeds without handing the slots on: waits for the queue to
    /// pass their copies and gives them back. The construct's entries are published, so a
    /// failure of the wait is kept for the next synchronising call to report.
    fn finish(mut self, origin: Origin) {
        let slots = std::mem::take(&mut self.1);
        if !slots.is_empty() {
            if let Err(e) = self.0.backend.sync_queue(crate::backend::Queue::Compute) {
                self.0.keep_failure(origin, e);
            }
            self.0.give_back_slots(&slots);
        }
    }
}

impl Drop for QueuedSlots<'_> {
    fn drop(&mut self) {
        if !self.1.is_empty() {
            let _ = self.0.backend.sync_queue(crate::backend::Queue::Compute);
            self.0.give_back_slots(&self.1);
        }
    }
}

/// Waits for the device's compute queue when dropped armed (`.1`): an unwinding construct
/// whose queued copies still write into its caller's host memory waits for them first.
struct WaitOnUnwind<'a>(&'a DeviceState, bool);

impl Drop for WaitOnUnwind<'_> {
    fn drop(&mut self) {
        if self.1 {
            let _ = self.0.backend.sync_queue(crate::backend::Queue::Compute);
        }
    }
}

/// Device blocks a construct allocated for the entries it creates: each is freed when the
/// guard drops unless it was handed to the present table ([`NewBlocks::keep`]), so a
/// construct that fails, returns early or unwinds leaks none.
struct NewBlocks<'a> {
    device: &'a DeviceState,
    blocks: Short<u64>,
    /// Blocks handed to the table (a subset of `blocks`, each once).
    kept: Short<u64>,
}

impl<'a> NewBlocks<'a> {
    fn new(device: &'a DeviceState) -> Self {
        Self { device, blocks: Short::new(), kept: Short::new() }
    }

    /// Allocates `bytes` for a new entry, owned by the guard.
    fn alloc(&mut self, bytes: usize) -> Result<u64> {
        let d = self.device;
        let addr = d.pool.alloc(&*d.backend, bytes, Owner::Mapping)?;
        self.blocks.push(addr);
        Ok(addr)
    }

    /// Hands block `addr` (one of this guard's, once) to the present table: the guard no
    /// longer frees it. Constant time: a map list of 100 000 new entries keeps 100 000.
    fn keep(&mut self, addr: u64) {
        self.kept.push(addr);
    }

    /// Whether `addr` is not a block of this guard's that it will free (linear: for the
    /// few copies a queued construct makes).
    fn is_kept(&self, addr: u64) -> bool {
        self.kept.len() == self.blocks.len() || !self.blocks.contains(&addr) || self.kept.contains(&addr)
    }
}

impl Drop for NewBlocks<'_> {
    fn drop(&mut self) {
        // Usually every block was kept; otherwise those not kept are freed.
        if self.kept.len() == self.blocks.len() {
            return;
        }
        let kept: HashSet<u64> = self.kept.iter().copied().collect();
        let d = self.device;
        for addr in self.blocks.iter().filter(|a| !kept.contains(a)) {
            let _ = d.pool.free(&*d.backend, d.number, *addr, Owner::Mapping);
        }
    }
}

thread_local! {
    /// The named array of the copy a construct is making on this thread, for the copy's
    /// trace line ([`DeviceState::trace_copy`]); set only while copies are traced.
    static COPY_NAME: Cell<Option<ArrayName>> = const { Cell::new(None) };
}

/// `host`, the range of a copy being made on this thread, as the program named it, if the
/// construct making it knows a name ([`COPY_NAME`]).
pub(super) fn copy_name(host: HostRange) -> Option<RangeName> {
    COPY_NAME.get().map(|a| RangeName::new(host, Some(a)))
}

/// Names the copy made while it lives ([`COPY_NAME`]), unnamed again when dropped.
struct CopyName;

impl CopyName {
    fn set(name: Option<ArrayName>) -> Option<Self> {
        name.map(|n| {
            COPY_NAME.set(Some(n));
            CopyName
        })
    }
}

impl Drop for CopyName {
    fn drop(&mut self) {
        COPY_NAME.set(None);
    }
}

/// Why a map of an associated range copied nothing.
const ASSOCIATED: &str = "an associated range copies only with always, or by update";

/// A count as a "why not copied" line gives it: `ref count 2 -> 1`, or `ref count 1`
/// when it did not move (`inf` for an associated entry's reference count).
fn count_change(what: &str, before: u64, after: u64, infinite: bool) -> String {
    match () {
        _ if infinite => format!("{what} inf"),
        _ if before == after => format!("{what} {after}"),
        _ => format!("{what} {before} -> {after}"),
    }
}

/// A named entry's name and (reference, hold) counts, for the timeline's strips
/// ([`crate::info::Trace::counts`]); `None` for an unnamed one.
fn named_counts(e: &Entry) -> Option<(RangeName, (u64, u64))> {
    e.array().map(|a| (RangeName::new(e.range, Some(a)), (e.ref_count, e.hold_count)))
}

/// An exit's count changes as its lines give them: `ref count 2 -> 1`, with the hold
/// count's when it is or was above 0 (`ref count 1, hold count 1 -> 0`).
fn exit_counts(before: (u64, u64), after: (u64, u64), associated: bool) -> String {
    let mut s = count_change("ref count", before.0, after.0, associated);
    if before.1 > 0 || after.1 > 0 {
        s += &format!(", {}", count_change("hold count", before.1, after.1, false));
    }
    s
}

/// A copy back a device made, for the race warning ([`DeviceState::warn_races`]).
pub(crate) struct CopyBack {
    range: HostRange,
    /// When, on [`next_mark`]'s count.
    at: u64,
    name: RangeName,
    /// The devices it was already warned against (their `from` mappings): their own copy
    /// back is the same race, not warned of twice.
    warned: Short<usize>,
}

/// Copies back a device keeps for the race warning: the latest, enough for the halos of
/// one exit of many arrays.
const COPY_BACK_LOG: usize = 64;

impl DeviceState {
    /// The named arrays of `copies` (by their entries' keys, through `array`), when copies
    /// or races are traced; else nothing.
    fn copy_names(
        &self,
        copies: &[PlannedCopy],
        array: impl Fn(usize) -> Option<ArrayName>,
    ) -> Short<Option<ArrayName>> {
        if copies.is_empty()
            || !(self.trace.wants(InfoFlags::TRANSFERS)
                || self.trace.wants_warning(InfoFlags::RACE)
                || self.trace.timeline())
        {
            return Short::new();
        }
        copies.iter().map(|c| array(c.2)).collect()
    }

    /// When the entries of `copies` (by their keys, through `entry`) were made, for the
    /// race warning when it is wanted; else nothing.
    fn mapped_at<'t>(
        &self,
        copies: &[PlannedCopy],
        entry: impl Fn(usize) -> Option<&'t Entry>,
    ) -> Short<u64> {
        if copies.is_empty() || !self.trace.wants_warning(InfoFlags::RACE) {
            return Short::new();
        }
        copies.iter().map(|c| entry(c.2).map_or(0, |e| e.mapped_at)).collect()
    }

    /// Why `it`, a `to` on entry `e` that was present, copied nothing (`MAPPING_EXISTS`):
    /// `e`'s counts include the construct's increment, which `moved` says it made.
    fn not_copied_in(&self, e: &Entry, it: &MapItem, moved: bool) {
        let hold = it.map_type.hold;
        let after = if hold { e.hold_count } else { e.ref_count };
        let before = after - u64::from(moved && after > 0);
        let what = if hold { "hold count" } else { "ref count" };
        let infinite = e.associated && !hold;
        let counts = count_change(what, before, after, infinite);
        let when = if infinite { ASSOCIATED } else { "copies only on creation, or with always" };
        self.not_copied(it, e.name_of(it.range), || format!("already present, {counts} ({when})"));
    }

    /// Why each `from` of `items` whose entry stays copied nothing, what each `release`
    /// that leaves its entry mapped moved, and what each zero-length item did
    /// (`MAPPING_EXISTS`), in the exit's (reverse) list order: the counts before and after
    /// the exit `plan`. `zero`: the zero-length items' entries (item index, entry key), as
    /// found before the exit.
    fn not_copied_out(
        &self,
        table: &PresentTable,
        items: &[MapItem],
        plan: &ExitPlan,
        zero: &[(usize, usize)],
    ) {
        use crate::data_env::{MapKind, MapType};
        let said = |t: &MapType| (t.copies_out() && !t.always) || t.kind == MapKind::Release;
        for (n, it) in items.iter().enumerate().rev() {
            if it.range.bytes == 0 {
                if let Some(&(_, k)) = zero.iter().find(|z| z.0 == n) {
                    self.zero_length_exit(table, it, k, plan);
                }
                continue;
            }
            if !said(&it.map_type) {
                continue;
            }
            let Lookup::Inside(k) = table.lookup(it.range) else { continue };
            let Some(e) = table.get(k) else { continue };
            let (r, h) = plan.taken_from(k, e.device_addr);
            let hold = e.hold_count;
            let now = (e.ref_count, hold);
            let counts = exit_counts((now.0 + r, now.1 + h), now, e.associated);
            if it.map_type.kind == MapKind::Release {
                // A `release` that leaves its entry mapped moves only a count: say so.
                self.range_line(InfoFlags::MAPPING_EXISTS, "released", it.range, || {
                    let name = e.name_of(it.range);
                    format!(
                        "device {}: {}({name}): {counts}; the entry stays until it reaches 0",
                        self.number, it.map_type
                    )
                });
                continue;
            }
            let when = match (e.associated, hold) {
                (true, _) => ASSOCIATED,
                (false, 0) => "copies when it reaches 0, or with always",
                (false, _) => "copies when both counts reach 0, or with always",
            };
            self.not_copied(it, e.name_of(it.range), || format!("{counts} ({when})"));
        }
    }

    /// What zero-length exit item `it` did to entry `key` (`MAPPING_EXISTS`): it copies
    /// nothing, and moves the count of the entry its address lies in, as libomptarget does
    /// (the entry may leave: that is then said here too, the only line a learner would
    /// otherwise see being the removal's).
    fn zero_length_exit(&self, table: &PresentTable, it: &MapItem, key: usize, plan: &ExitPlan) {
        let (e, before, after) = match table.get(key) {
            Some(e) => {
                let (r, h) = plan.taken_from(key, e.device_addr);
                (e, (e.ref_count + r, e.hold_count + h), Some((e.ref_count, e.hold_count)))
            }
            None => match plan.removed.iter().find(|(e, _)| e.range.begin == key) {
                Some((e, before)) => (e, *before, None),
                None => return,
            },
        };
        let counts = exit_counts(before, after.unwrap_or((0, 0)), e.associated);
        let then = match after {
            None => "the entry is removed",
            Some(_) if e.associated => "the entry stays (associated: disassociate_ptr ends it)",
            Some((_, hold)) if hold > 0 => "the entry stays until both counts reach 0",
            Some(_) => "the entry stays until it reaches 0",
        };
        self.range_line(InfoFlags::MAPPING_EXISTS, "zero length", it.range, || {
            format!(
                "device {}: {}({}): a zero-length section copies nothing; {counts}; {then}",
                self.number,
                it.map_type,
                e.name_of(it.range)
            )
        });
    }

    /// A "not copied" line for `it`, named `name`, saying `why`.
    fn not_copied(&self, it: &MapItem, name: RangeName, why: impl FnOnce() -> String) {
        self.range_line(InfoFlags::MAPPING_EXISTS, "not copied", it.range, || {
            format!("device {}: {}({name}) not copied: {}", self.number, it.map_type, why())
        });
    }

    /// A trace line of bit `flag` and kind `kind` about host range `host` on this device.
    fn range_line(
        &self,
        flag: InfoFlags,
        kind: &'static str,
        host: HostRange,
        line: impl FnOnce() -> String,
    ) {
        let fields =
            || InfoFields { kind, device: Some(self.number), host: Some(host), ..InfoFields::default() };
        self.trace.event(flag, fields, line);
    }

    /// Traces `range`, which `construct` skips unless it lies inside one entry
    /// (`ABSENT`): absent, or not wholly inside the mapped range it overlaps.
    fn trace_skip(&self, table: &PresentTable, construct: &str, range: HostRange, own: Option<ArrayName>) {
        match table.lookup(range) {
            Lookup::Inside(_) => {}
            Lookup::Absent => {
                let name = match own {
                    Some(a) => RangeName::new(range, Some(a)),
                    None => table.name_of(range),
                };
                self.trace.skipped(self.number, construct, name)
            }
            Lookup::Extends(existing) => {
                let Some(e) = table.get(existing.begin) else { return };
                self.range_line(InfoFlags::ABSENT, "skipped", range, || {
                    format!(
                        "device {}: {construct}: {} is not wholly inside mapped {}; skipped",
                        self.number,
                        e.name_of(range),
                        e.name_of(e.range)
                    )
                });
            }
        }
    }

    /// Warns (`RACE`, at `WARN`) of each copy back of `copies` (named `names`, from entries
    /// made at `since`, [`next_mark`]) into host memory that another of `devices` has
    /// mapped with `from` (it will or may copy back over it) or has copied back since this
    /// device mapped it (the halo pattern: both map `to` and exit `from`): which lands last
    /// is a race. Reads the other devices' tables and logs one at a time, without this
    /// device's lock held, and only when someone wants the warning; then logs these copies.
    fn warn_races(
        &self,
        copies: &[PlannedCopy],
        names: &[Option<ArrayName>],
        since: &[u64],
        devices: &[DeviceState],
    ) {
        if copies.is_empty() || devices.len() < 2 || !self.trace.wants_warning(InfoFlags::RACE) {
            return;
        }
        let warn = |range: HostRange, line: String| {
            let fields = InfoFields {
                kind: "race",
                device: Some(self.number),
                host: Some(range),
                ..InfoFields::default()
            };
            self.trace.warn(InfoFlags::RACE, fields, line);
        };
        let mut warned: Vec<Short<usize>> = Vec::with_capacity(copies.len());
        for (i, &(range, _, _)) in copies.iter().enumerate() {
            let ours = RangeName::new(range, names.get(i).copied().flatten());
            let mapped_at = since.get(i).copied().unwrap_or(0);
            let mut against = Short::new();
            for q in devices.iter().filter(|q| q.number != self.number) {
                let theirs: Short<RangeName> = {
                    let t = q.table.lock();
                    t.overlapping(range).filter(|e| e.maps_from).map(|e| e.name_of(e.range)).collect()
                };
                for name in &theirs {
                    warn(
                        range,
                        format!(
                            "device {}: race: the copy back of {ours} writes host memory that device {} has \
                             mapped with from as {name}: whichever copies back last wins; copy back only \
                             the part each device owns",
                            self.number, q.number
                        ),
                    );
                }
                if !theirs.is_empty() {
                    against.push(q.number);
                    continue;
                }
                let done: Short<RangeName> = q
                    .copied_back
                    .lock()
                    .iter()
                    .filter(|c| !c.warned.contains(&self.number))
                    .filter(|c| {
                        c.at > mapped_at && c.range.begin < range.end() && range.begin < c.range.end()
                    })
                    .map(|c| c.name)
                    .collect();
                for name in &done {
                    warn(
                        range,
                        format!(
                            "device {}: race: the copy back of {ours} writes host memory that device {} \
                             copied back as {name} while device {} had it mapped: whichever copies back last \
                             wins; copy back only the part each device owns",
                            self.number, q.number, self.number
                        ),
                    );
                }
            }
            warned.push(against);
        }
        let mut log = self.copied_back.lock();
        for ((i, &(range, _, _)), warned) in copies.iter().enumerate().zip(warned) {
            if log.len() == COPY_BACK_LOG {
                log.pop_front();
            }
            let name = RangeName::new(range, names.get(i).copied().flatten());
            log.push_back(CopyBack { range, at: next_mark(), name, warned });
        }
    }

    /// Traces entry `e` under `flag` as `what` ("entry created", "mapping exists", ...).
    fn entry_event(&self, flag: InfoFlags, what: &'static str, e: &Entry) {
        let line = EntryLine {
            device: self.number,
            range: e.range,
            array: e.array(),
            device_addr: e.device_addr,
            counts: (e.ref_count, e.hold_count),
            associated: e.associated,
        };
        self.trace.entry(flag, what, line);
    }

    /// Whether the table is printed after each construct (`DUMP_TABLE`, or `EVERY_TABLE`,
    /// which prints every device's).
    fn dumps_tables(&self) -> bool {
        self.trace.on(InfoFlags::DUMP_TABLE) || self.trace.on(InfoFlags::EVERY_TABLE)
    }

    /// The table after a construct, or after a region's `half` (`entry` or `exit`).
    fn dump_after(&self, table: &PresentTable, c: Construct, half: &str) {
        if self.dumps_tables() {
            let label =
                if c.is_region() { format!("{} ({half} half)", c.name()) } else { c.name().to_string() };
            self.trace.table(self.number, &label, || table.dump(self.number));
        }
    }

    /// Enters a map list: `target data` / target launch begin, or `enter data`.
    ///
    /// # Safety
    /// Every item's host range must be valid for reads for the duration of the call.
    pub(crate) unsafe fn map_enter(&self, items: &[MapItem], c: Construct, origin: Origin) -> Result<()> {
        // SAFETY: forwarded from the caller.
        self.dump_on_error(c.name(), unsafe { self.enter_list(items, c, origin, None) })
    }

    /// [`DeviceState::map_enter`] for a target region whose list may hold implicit maps
    /// ([`crate::MapType::implicit`]): `resolved` receives the list as the table read it
    /// under the construct's lock (each implicit item narrowed to the part present), for
    /// the launch's pointers and the region's end to use, rather than a later lookup that
    /// another thread's maps could change meanwhile. Left empty when no item is implicit.
    ///
    /// # Safety
    /// As [`DeviceState::map_enter`].
    pub(crate) unsafe fn map_enter_resolved(
        &self,
        items: &[MapItem],
        c: Construct,
        origin: Origin,
        resolved: &mut Vec<MapItem>,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        self.dump_on_error(c.name(), unsafe { self.enter_list(items, c, origin, Some(resolved)) })
    }

    /// Shows the present table with a failed construct's error when table dumps are on
    /// (`OFFLOAD_INFO` 0x04), as libomptarget prints its mapping table on failure.
    #[inline]
    fn dump_on_error(&self, construct: &str, r: Result<()>) -> Result<()> {
        if let Err(e) = &r {
            self.dump_failure(construct, e);
        }
        r
    }

    #[cold]
    fn dump_failure(&self, construct: &str, e: &Error) {
        if self.trace.on(InfoFlags::DUMP_TABLE) {
            let table = self.table.lock().dump(self.number);
            let fields = || InfoFields { kind: "failed", device: Some(self.number), ..InfoFields::default() };
            self.trace.event(InfoFlags::DUMP_TABLE, fields, || format!("{construct} failed: {e}; {table}"));
        }
    }

    /// # Safety
    /// As [`DeviceState::map_enter`].
    unsafe fn enter_list(
        &self,
        items: &[MapItem],
        c: Construct,
        origin: Origin,
        resolved: Option<&mut Vec<MapItem>>,
    ) -> Result<()> {
        let mut plan = EnterPlan::default();
        // Existing entries the copies write (`always`): their memory may be in use by
        // queued work, which a copy not queued behind it must wait for.
        let mut existing: SmallSet<usize> = SmallSet::new();
        // Declared before `in_use`, so dropped after it: blocks in use outlive their pins.
        let mut transit = Transit::new(self);
        let mut blocks = NewBlocks::new(self);
        let mut in_use = BlocksInUse::new(self);
        let names = {
            let mut table = self.table.lock();
            self.wait_for_transit(&mut table, items);
            // Implicit items read once, here, under the lock that plans them.
            let read = present_parts(&table, items);
            if let (Cow::Owned(list), Some(out)) = (&read, resolved) {
                out.clone_from(list);
            }
            let items = &*read;
            let alloc = |bytes| blocks.alloc(bytes);
            let exists = |e: &Entry, it: &MapItem, moved: bool| {
                self.entry_event(InfoFlags::MAPPING_EXISTS, "mapping exists", e);
                if it.map_type.copies_in() && !it.map_type.always && it.range.bytes > 0 {
                    self.not_copied_in(e, it, moved);
                }
            };
            if let Err(e) = plan.build(&mut table, items, self.number, alloc, exists) {
                return Err(self.undo_enter(table, &plan, e, false));
            }
            // A construct that copies or creates can still fail and be undone: until it is
            // published, the existing entries whose counts it moved are in transit too, so
            // that another thread's exit does not decide on a count this undo would take
            // back (an exit that skips its copy back at a count of 2, then an undo that
            // takes the entry to 0, would lose that copy).
            if !(plan.copies.is_empty() && plan.planned.is_empty()) {
                for &(key, _, _) in &plan.counted {
                    if let Some(range) = table.get(key).map(|e| e.range) {
                        transit.add(&mut table, range);
                    }
                }
            }
            // Traced now, before their copies: the entries exist from here on (published
            // with their data below, or undone with a failed construct, which says so).
            // Until then they are in transit: another construct entering them waits.
            for p in plan.planned.iter() {
                transit.add(&mut table, p.range);
                let line = EntryLine {
                    device: self.number,
                    range: p.range,
                    array: p.array(),
                    device_addr: p.device_addr,
                    counts: (u64::from(p.counts_ref), u64::from(p.counts_hold)),
                    associated: false,
                };
                self.trace.entry(InfoFlags::ENTRIES, "entry created", line);
            }
            let names = self.copy_names(&plan.copies, |k| {
                table.get(k).and_then(Entry::array).or_else(|| plan.planned.get(k).and_then(Planned::array))
            });
            // New entries the copies fill are not published yet; existing ones (`always`)
            // stay allocated while pinned.
            for &(_, _, key) in &plan.copies {
                if let Some(addr) = table.get(key).map(|e| e.device_addr) {
                    in_use.pin(&mut table, addr);
                    existing.insert(key);
                }
            }
            names
        };
        // Copies without the lock.
        let mut done = SmallSet::new();
        let mut slots = QueuedSlots(self, Short::new());
        let mut copies = plan.copies.iter().enumerate().filter(|(_, c)| done.insert(c.0));
        let copied = copies.try_for_each(|(i, &(range, addr, key))| {
            let _name = CopyName::set(names.get(i).copied().flatten());
            // SAFETY: the caller guarantees the host range; `addr` lies in the entry.
            unsafe { self.copy_in(addr, range, existing.contains(&key), &mut slots.1) }
        });
        if let Err(e) = copied {
            // Queued copies into the blocks the undo frees must be done first.
            drop(slots);
            return Err(self.undo_enter(self.table.lock(), &plan, e, true));
        }
        if plan.copies.is_empty() && plan.planned.is_empty() && !self.dumps_tables() {
            // Only counts moved (all present, no `always`): done under the first lock.
            return Ok(());
        }
        let mut table = self.table.lock();
        if let Err(e) = self.publish(&mut table, &plan, &mut blocks) {
            drop(table);
            drop(slots);
            return Err(self.undo_enter(self.table.lock(), &plan, e, true));
        }
        transit.end(&mut table);
        for &(range, _, key) in &plan.copies {
            self.note_copy(&mut table, key, range);
        }
        self.dump_after(&table, c, "entry");
        if slots.1.is_empty() {
            return Ok(());
        }
        // Copies are queued: the blocks they write stay allocated until they are done,
        // including a block of ours that another thread's publication made spare.
        for &(_, _, key) in &plan.copies {
            if let Some(block) = table.get(key).map(|e| e.device_addr) {
                in_use.pin(&mut table, block);
            }
        }
        if plan.planned.iter().any(|p| !blocks.is_kept(p.device_addr)) {
            drop(table);
            slots.finish(origin);
            return Ok(());
        }
        drop(table);
        self.queued(origin, in_use, std::mem::take(&mut slots.1))
    }

    /// Waits (the table's lock released meanwhile) until no byte that `items` name is in
    /// transit: another construct's new entries not yet published, entries whose counts an
    /// unpublished construct moved, removed entries whose copies back have not landed, or
    /// ranges an `update from` is writing. Entering and exiting constructs wait, before
    /// they put anything in transit themselves; a construct in transit never waits for
    /// another, so the waits form no cycle.
    fn wait_for_transit(&self, table: &mut parking_lot::MutexGuard<'_, PresentTable>, items: &[MapItem]) {
        while items.iter().any(|it| table.in_transit(it.range)) {
            self.transit_done.wait(table);
        }
    }

    /// Copies `host` to `dst` for a construct: queued from a bounce slot (added to
    /// `slots`) when the construct may return before it, else waited for, after the work
    /// queued before it when `existing` (the entry's memory may be in use).
    ///
    /// # Safety
    /// `host` valid for reads; `dst` device memory of its size.
    unsafe fn copy_in(
        &self,
        dst: u64,
        host: HostRange,
        existing: bool,
        slots: &mut Short<usize>,
    ) -> Result<()> {
        if self.ordered() {
            // SAFETY: forwarded from the caller.
            if let Some(slot) = unsafe { self.queue_to_device(dst, host)? } {
                slots.push(slot);
                return Ok(());
            }
            if existing {
                self.settle()?;
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.copy_to_device(dst, host) }
    }

    /// Undoes a failed entry: the counts it moved go back (entries it alone kept alive
    /// leave; its new entries' blocks are freed by their guard); returns `err`.
    fn undo_enter(
        &self,
        mut table: parking_lot::MutexGuard<'_, PresentTable>,
        plan: &EnterPlan,
        err: Error,
        announced: bool,
    ) -> Error {
        for p in plan.planned.iter().filter(|_| announced) {
            // An "entry removed" event, so that the trace file's count of live entries (and
            // a named entry's own count) drops.
            let name = p.array().map(|a| RangeName::new(p.range, Some(a)));
            let fields = || InfoFields {
                kind: "entry removed",
                device: Some(self.number),
                host: Some(p.range),
                device_addr: Some(p.device_addr),
                counts: Some((0, 0)),
                name,
                ..InfoFields::default()
            };
            self.trace.event(InfoFlags::ENTRIES, fields, || {
                let shown = name.unwrap_or(RangeName::new(p.range, None));
                format!("device {}: entry removed {shown} (the construct failed: {err})", self.number)
            });
        }
        let gone = undo_counts(&mut table, &plan.counted);
        // The entries that stay have their counts back: the timeline's strips say so.
        let restored: Short<(RangeName, (u64, u64))> = if self.trace.timeline() {
            plan.counted.iter().filter_map(|&(k, _, _)| table.get(k)).filter_map(named_counts).collect()
        } else {
            Short::new()
        };
        drop(table);
        for &(name, counts) in &restored {
            self.trace.counts(self.number, name, counts);
        }
        let _ = self.release_removed(gone);
        err
    }

    /// Inserts the construct's new entries, each count moved once. Another thread may have
    /// published the same range meanwhile: then that entry is counted instead (once per
    /// construct, however many of our new entries it covers, and not again if the plan
    /// counted it already) and ours is left to `blocks` to free (its copy came from the
    /// same host data). Partial overlaps are extension errors.
    fn publish(&self, table: &mut PresentTable, plan: &EnterPlan, blocks: &mut NewBlocks<'_>) -> Result<()> {
        let planned = &plan.planned;
        // Counted by the plan, if still the entry the plan counted (not one put at its key
        // by another thread since).
        let mut counted: SmallSet<(usize, bool)> = plan
            .counted
            .iter()
            .filter(|&&(k, _, addr)| table.get(k).is_some_and(|e| e.device_addr == addr))
            .map(|&(k, h, _)| (k, h))
            .collect();
        for p in planned.iter() {
            if let Lookup::Extends(existing) = table.lookup(p.range) {
                return Err(Error::Extension { device: self.number, requested: p.range, existing });
            }
        }
        for p in planned.iter() {
            let key = match table.lookup(p.range) {
                Lookup::Inside(k) => k,
                _ => {
                    table.insert(p.entry());
                    blocks.keep(p.device_addr);
                    p.range.begin
                }
            };
            if let Some(e) = table.get_mut(key) {
                e.maps_from |= p.maps_from;
                for (moves, hold) in [(p.counts_ref, false), (p.counts_hold, true)] {
                    if moves && counted.insert((key, hold)) {
                        increment(e, hold);
                    }
                }
                if e.device_addr != p.device_addr {
                    let e = &*e;
                    self.entry_event(
                        InfoFlags::ENTRIES,
                        "entry published meanwhile by another thread, counted instead:",
                        e,
                    );
                }
            }
        }
        Ok(())
    }

    /// Counts a copy of `range` for entry `key`, and page-locks a large, often copied
    /// entry's host range in place (the register-in-place policy of [`StagingConfig`]).
    ///
    /// [`StagingConfig`]: crate::StagingConfig
    fn note_copy(&self, table: &mut PresentTable, key: usize, range: HostRange) {
        let cfg = &self.staging_config;
        if range.bytes < cfg.min_bytes || !self.backend.wants_staging() {
            return;
        }
        let Some(e) = table.get_mut(key) else { return };
        e.large_copies += 1;
        if e.registered
            || e.associated
            || e.large_copies < cfg.register_after
            || e.range.bytes < cfg.register_min_bytes
        {
            return;
        }
        // SAFETY: a mapped range stays valid until it is unmapped (the mapping's contract),
        // and `release_entry` / `release_removed` unlock it at removal.
        if unsafe { self.lock_host(e.range.begin as *mut u8, e.range.bytes) } {
            e.registered = true;
            self.trace.emit(InfoFlags::TRANSFERS, || {
                format!(
                    "device {}: {} registered in place after {} large copies",
                    self.number, e.range, e.large_copies
                )
            });
        }
    }

    /// Undoes what the runtime did to a removed entry's host range, and frees its device
    /// memory.
    pub(crate) fn release_entry(&self, e: &Entry) -> Result<()> {
        if e.registered {
            // SAFETY: locked by `note_copy`; the entry's copies have all completed.
            unsafe { self.unlock_host(e.range.begin as *mut u8) };
        }
        if e.associated {
            return Ok(());
        }
        self.pool.free(&*self.backend, self.number, e.device_addr, Owner::Mapping).map(drop)
    }

    /// Exits a map list: `target data` / target launch end, or `exit data`. `devices` are
    /// the runtime's devices, whose tables the race warning reads (`OFFLOAD_INFO` 0x80).
    ///
    /// # Safety
    /// Every item with a `from` kind must name host memory valid for writes and not
    /// otherwise accessed during the call.
    pub(crate) unsafe fn map_exit(
        &self,
        items: &[MapItem],
        c: Construct,
        devices: &[DeviceState],
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        self.dump_on_error(c.name(), unsafe { self.exit_list(items, c, devices) })
    }

    /// Copies device data back into host ranges, as an exit or `update from` does: each
    /// waited for before this returns, after the work queued before it. Small copies are
    /// queued behind that work and waited for together (one wait); large ones, staged, wait
    /// for it first. Stops at the first failure when `stop` (else copies what it can).
    /// Gives the copies' first failure, and apart from it the failure of earlier queued
    /// work that its waits reported (the copies were made: the construct goes on, and
    /// returns that report at its end).
    ///
    /// # Safety
    /// Every host range valid for exclusive writes during the call; each device address
    /// inside its entry.
    unsafe fn copy_out(
        &self,
        copies: &[PlannedCopy],
        names: &[Option<ArrayName>],
        stop: bool,
    ) -> (Result<()>, Option<Error>) {
        if copies.is_empty() {
            return (Ok(()), None);
        }
        let ordered = self.ordered();
        let (mut first_err, mut reported) = (None, None);
        // Until the wait below, queued copies write into the caller's ranges: an unwind
        // must not hand them back before the queue has passed them.
        let mut pending = WaitOnUnwind(self, false);
        let mut report = |r: Result<()>| match r {
            Err(e @ (Error::Queued { .. } | Error::EarlierFailure { .. })) => {
                reported.get_or_insert(e);
                Ok(())
            }
            other => other,
        };
        for (i, &(range, addr, _)) in copies.iter().enumerate() {
            let _name = CopyName::set(names.get(i).copied().flatten());
            let r = if ordered && range.bytes <= SLOT_BYTES {
                pending.1 = true;
                // SAFETY: forwarded from the caller; waited for below.
                unsafe { self.queue_from_device(range, addr) }
            } else {
                let waited = if ordered { report(self.settle()) } else { Ok(()) };
                // SAFETY: forwarded from the caller.
                waited.and_then(|()| unsafe { self.copy_from_device(range, addr) })
            };
            if let Err(e) = r {
                first_err.get_or_insert(e);
                if stop {
                    break;
                }
            }
        }
        if pending.1 {
            // The host reads the ranges next: the queue must have passed the copies, even
            // after a failure.
            if let Err(e) = report(self.settle_queue(true)) {
                first_err.get_or_insert(e);
            }
            pending.1 = false;
        }
        (first_err.map_or(Ok(()), Err), reported)
    }

    /// # Safety
    /// As [`DeviceState::map_exit`].
    unsafe fn exit_list(&self, items: &[MapItem], c: Construct, devices: &[DeviceState]) -> Result<()> {
        // Under the lock: move the counts, list the copies, take released entries out.
        let mut transit = Transit::new(self);
        let mut in_use = BlocksInUse::new(self);
        let mut plan = ExitPlan::default();
        let (names, since, kept) = {
            let mut table = self.table.lock();
            if self.trace.wants(InfoFlags::ABSENT) {
                for i in items.iter().filter(|i| !i.map_type.present) {
                    self.trace_skip(&table, c.name(), i.range, i.array());
                }
            }
            self.wait_for_transit(&mut table, items);
            // The entries zero-length items name, found before the exit may remove them.
            let zero: Short<(usize, usize)> = if self.trace.wants(InfoFlags::MAPPING_EXISTS) {
                let key = |i: &MapItem| match table.lookup(i.range) {
                    Lookup::Inside(k) => Some(k),
                    _ => None,
                };
                items
                    .iter()
                    .enumerate()
                    .filter(|(_, i)| i.range.bytes == 0)
                    .filter_map(|(n, i)| Some((n, key(i)?)))
                    .collect()
            } else {
                Short::new()
            };
            plan.fill(&mut table, items, c, self.number)?;
            // A removed entry stays in transit until its copy back has landed: a construct
            // mapping it anew before then would copy in the host's old value.
            if !plan.removed.is_empty() {
                let copied: HashSet<usize> = plan.copies.iter().map(|&(_, _, key)| key).collect();
                for (e, _) in plan.removed.iter().filter(|(e, _)| copied.contains(&e.range.begin)) {
                    transit.add(&mut table, e.range);
                }
            }
            if self.trace.wants(InfoFlags::MAPPING_EXISTS) {
                self.not_copied_out(&table, items, &plan, &zero);
            }
            // The named entries that stay, with their counts now, for the timeline's strips
            // (told once the exit can no longer be undone, and outside the lock).
            let kept: Short<(RangeName, (u64, u64))> = if self.trace.timeline() {
                plan.taken.iter().filter_map(|t| table.get(t.0)).filter_map(named_counts).collect()
            } else {
                Short::new()
            };
            let removed = |k| plan.removed.iter().map(|(e, _)| e).find(|e| e.range.begin == k);
            let names =
                self.copy_names(&plan.copies, |k| table.get(k).or_else(|| removed(k)).and_then(Entry::array));
            // Entries that stay (`always` copies) stay allocated while pinned; removed
            // ones are this exit's until it releases them.
            for &(_, _, key) in &plan.copies {
                if let Some(addr) = table.get(key).map(|e| e.device_addr) {
                    in_use.pin(&mut table, addr);
                }
            }
            let since = self.mapped_at(&plan.copies, |k| table.get(k).or_else(|| removed(k)));
            (names, since, kept)
        };
        self.warn_races(&plan.copies, &names, &since, devices);
        // Without the lock: copies back, then frees.
        let mut first_err = None;
        // SAFETY: forwarded from the caller; each address lies in its entry.
        let (copied, reported) = unsafe { self.copy_out(&plan.copies, &names, !c.is_region()) };
        if let Some(e) = reported {
            first_err.get_or_insert(e);
        }
        if let Err(err) = copied {
            if !c.is_region() {
                // `exit data` is all or nothing: the entries and counts come back.
                drop(in_use);
                let lost = plan.undo(&mut self.table.lock());
                let _ = self.release_removed(lost);
                // A failure of earlier queued work that the wait reported comes first (on
                // a GPU it is the likely cause of the copy's).
                return Err(first_err.unwrap_or(err));
            }
            // A region's end cannot be retried (nothing would end it again): it copies
            // what it can, its entries leave, and the first failure is its error.
            first_err.get_or_insert(err);
        }
        drop(in_use);
        for &(name, counts) in &kept {
            self.trace.counts(self.number, name, counts);
        }
        for (e, _) in &plan.removed {
            self.entry_event(InfoFlags::ENTRIES, "entry removed", e);
        }
        let released = self.release_removed(plan.removed.iter().map(|(e, _)| e.clone()));
        if let Err(err) = released {
            first_err.get_or_insert(err);
        }
        if plan.copies.is_empty() && !self.dumps_tables() {
            return first_err.map_or(Ok(()), Err);
        }
        let mut table = self.table.lock();
        transit.end(&mut table);
        for &(range, _, key) in &plan.copies {
            self.note_copy(&mut table, key, range);
        }
        self.dump_after(&table, c, "exit");
        first_err.map_or(Ok(()), Err)
    }

    /// Frees entries that have left the table, or leaves each to the last launch or copy
    /// still using its block ([`BlocksInUse`]).
    pub(crate) fn release_removed(&self, entries: impl IntoIterator<Item = Entry>) -> Result<()> {
        let mut entries = entries.into_iter().peekable();
        if entries.peek().is_none() {
            return Ok(());
        }
        // The host side ends now: no queued work touches a mapping's host memory, and
        // the program may free it as soon as the construct returns. Only the device block
        // may have to outlive queued work.
        let entries = entries.map(|mut e| {
            if e.registered {
                // SAFETY: locked by `note_copy`; every copy from or into the range was
                // waited for by its construct.
                unsafe { self.unlock_host(e.range.begin as *mut u8) };
                e.registered = false;
            }
            e
        });
        let now: Short<Entry> = {
            let mut table = self.table.lock();
            entries.filter_map(|e| table.retire(e)).collect()
        };
        let mut first_err = None;
        for e in &now {
            if let Err(err) = self.release_entry(e) {
                first_err.get_or_insert(err);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// `target update to/from`: copies present ranges, changes no count.
    ///
    /// # Safety
    /// Host ranges valid for reads (`To`) or for exclusive writes (`From`).
    /// `devices` as for [`DeviceState::map_exit`].
    pub(crate) unsafe fn update(
        &self,
        items: &[(HostRange, bool)],
        dir: UpdateDirection,
        origin: Origin,
        devices: &[DeviceState],
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        self.dump_on_error("target update", unsafe { self.update_list(items, dir, origin, devices) })
    }

    /// # Safety
    /// As [`DeviceState::update`].
    unsafe fn update_list(
        &self,
        items: &[(HostRange, bool)],
        dir: UpdateDirection,
        origin: Origin,
        devices: &[DeviceState],
    ) -> Result<()> {
        // A copy from the device is in transit until it has landed: a construct mapping the
        // range anew meanwhile would read the host memory it is about to overwrite.
        let mut transit = Transit::new(self);
        // The entries copied stay allocated until the copies are done.
        let mut in_use = BlocksInUse::new(self);
        let mut found: Vec<PlannedCopy> = Vec::with_capacity(items.len());
        let (names, since) = {
            let mut table = self.table.lock();
            for &(range, present) in items {
                let key = resolve_exit(
                    &table,
                    range,
                    present,
                    self.number,
                    "`target update` with `present`",
                    None,
                )?;
                if key.is_none() {
                    self.trace_skip(&table, "target update", range, None);
                }
                if let Some(e) = key.filter(|_| range.bytes > 0).and_then(|k| table.get(k)) {
                    let (copy, block) = ((range, e.translate(range.begin), e.range.begin), e.device_addr);
                    found.push(copy);
                    in_use.pin(&mut table, block);
                    if dir == UpdateDirection::From {
                        transit.add(&mut table, range);
                    }
                }
            }
            let since = self.mapped_at(&found, |k| table.get(k));
            (self.copy_names(&found, |k| table.get(k).and_then(Entry::array)), since)
        };
        if dir == UpdateDirection::From {
            self.warn_races(&found, &names, &since, devices);
        }
        let mut slots = QueuedSlots(self, Short::new());
        // SAFETY: forwarded from the caller; the device ranges lie in their entries, which
        // the program keeps mapped while it updates them.
        let copied = unsafe {
            match dir {
                UpdateDirection::To => found.iter().enumerate().try_for_each(|(i, &(range, addr, _))| {
                    let _name = CopyName::set(names.get(i).copied().flatten());
                    self.copy_in(addr, range, true, &mut slots.1)
                }),
                // A failure of earlier queued work that the wait took is reported first,
                // as an exit does (on a GPU it is the likely cause of the copy's).
                UpdateDirection::From => match self.copy_out(&found, &names, true) {
                    (_, Some(reported)) => Err(reported),
                    (copied, None) => copied,
                },
            }
        };
        if let Err(e) = copied {
            drop(slots);
            return Err(e);
        }
        let mut table = self.table.lock();
        transit.end(&mut table);
        for &(range, _, key) in &found {
            self.note_copy(&mut table, key, range);
        }
        drop(table);
        if slots.1.is_empty() {
            return Ok(());
        }
        self.queued(origin, in_use, std::mem::take(&mut slots.1))
    }

    /// Copies `host` to device address `dst`, counting and tracing it.
    ///
    /// # Safety
    /// `host` valid for reads.
    pub(crate) unsafe fn copy_to_device(&self, dst: u64, host: HostRange) -> Result<()> {
        let waited = self.wait_before_traced_copy(Queue::CopyIn)?;
        let start = std::time::Instant::now();
        // SAFETY: forwarded from the caller.
        let staged = unsafe { self.write_host(dst, host)? };
        self.trace_copy("host->device", host, dst, CopyPath::of(staged), (start.elapsed(), waited));
        self.stats.record_to_device(host.bytes);
        Ok(())
    }

    /// Copies device address `src` into `host`, counting and tracing it.
    ///
    /// # Safety
    /// `host` valid for exclusive writes.
    pub(crate) unsafe fn copy_from_device(&self, host: HostRange, src: u64) -> Result<()> {
        let waited = self.wait_before_traced_copy(Queue::CopyOut)?;
        let start = std::time::Instant::now();
        // SAFETY: forwarded from the caller.
        let staged = unsafe { self.read_host(host, src)? };
        self.trace_copy("device->host", host, src, CopyPath::of(staged), (start.elapsed(), waited));
        self.stats.record_from_device(host.bytes);
        Ok(())
    }

    /// When copies are traced (`OFFLOAD_INFO` 0x20), waits for the work queued before a
    /// blocking copy on queue `q` (which the copy would wait for anyway), so that the copy's
    /// own time is told apart from the wait: how long it waited.
    fn wait_before_traced_copy(&self, q: Queue) -> Result<std::time::Duration> {
        if !self.trace.wants(InfoFlags::TRANSFERS) {
            return Ok(std::time::Duration::ZERO);
        }
        let start = std::time::Instant::now();
        self.backend.sync_queue(q)?;
        Ok(start.elapsed())
    }

    /// Traces a copy (`OFFLOAD_INFO` 0x20): direction, bytes, ranges, staged, direct or
    /// queued, and how long it took (a queued copy: to queue it), after how long a wait for
    /// the work queued before it.
    pub(crate) fn trace_copy(
        &self,
        direction: &'static str,
        host: HostRange,
        addr: u64,
        path: CopyPath,
        (took, waited): (std::time::Duration, std::time::Duration),
    ) {
        let staged = path == CopyPath::Staged;
        let how = match path {
            CopyPath::Staged => "staged",
            CopyPath::Direct => "direct",
            CopyPath::Queued => "queued",
        };
        let fields = || InfoFields {
            kind: "copy",
            device: Some(self.number),
            host: Some(host),
            device_addr: Some(addr),
            bytes: Some(host.bytes),
            direction: Some(direction),
            staged: Some(staged),
            micros: Some(took.as_secs_f64() * 1e6),
            queued: Some(path == CopyPath::Queued),
            construct: crate::info::current_construct(),
            name: copy_name(host),
            ..InfoFields::default()
        };
        self.trace.event(InfoFlags::TRANSFERS, fields, || {
            let shown = RangeName::new(host, COPY_NAME.get()).to_string();
            let (from, to) = if direction == "host->device" {
                (shown, format!("device {addr:#x}"))
            } else {
                (format!("device {addr:#x}"), shown)
            };
            // A wait under 10 us is the synchronisation itself, not worth a word.
            let wait = if waited.as_micros() >= 10 {
                format!(" after {:.1} us waiting for the work queued before", waited.as_secs_f64() * 1e6)
            } else {
                String::new()
            };
            format!(
                "device {}: copy {direction} {} bytes, {from} -> {to} ({how}, {:.1} us{wait})",
                self.number,
                host.bytes,
                took.as_secs_f64() * 1e6
            )
        });
    }
}
