//! Processing a construct's map list against one device's present table.
//!
//! The table's lock is held only to read and change the table, never across a copy, so
//! that copy-in, kernels and copy-out from different threads overlap (pipelines depend on
//! it). Entries are published only once their data has arrived: a construct plans under
//! the lock, copies without it, then publishes the entries it created; an exit removes
//! released entries under the lock, then copies back and frees. A failure undoes the
//! construct's own changes (counts by the amounts it moved them, entries it created or
//! removed), so nothing is leaked and other threads' changes are kept.

use std::collections::{BTreeMap, HashSet};

use super::{Construct, Entry, Lookup, MapItem, MapKind, PresentTable, UpdateDirection};
use crate::error::{Error, HostRange, Result};
use crate::info::InfoFlags;
use crate::runtime::DeviceState;

/// A new entry a construct has allocated and not yet published, with the counts its items
/// move (the reference count, the hold count, or both).
struct Planned {
    range: HostRange,
    device_addr: u64,
    counts_ref: bool,
    counts_hold: bool,
}

/// A construct's new entries by host begin address, found by containment like the table's
/// (map lists can be long: no linear scans).
#[derive(Default)]
struct PlannedEntries(BTreeMap<usize, Planned>, Vec<usize>);

impl PlannedEntries {
    /// The planned entry containing `r`, or `Err` with one it partly overlaps.
    fn find(&mut self, r: HostRange) -> std::result::Result<Option<&mut Planned>, HostRange> {
        let below = self.0.range(..=r.begin).next_back().map(|(&k, p)| (k, p.range));
        if let Some((k, range)) = below.filter(|(_, range)| r.begin < range.end()) {
            return if range.contains(&r) { Ok(self.0.get_mut(&k)) } else { Err(range) };
        }
        match self.0.range(r.begin + 1..r.end()).next() {
            Some((_, p)) => Err(p.range),
            None => Ok(None),
        }
    }

    /// Adds a planned entry (list order is kept for publishing and tracing).
    fn insert(&mut self, p: Planned) {
        self.1.push(p.range.begin);
        self.0.insert(p.range.begin, p);
    }

    /// The planned entries in list order.
    fn iter(&self) -> impl Iterator<Item = &Planned> {
        self.1.iter().filter_map(|k| self.0.get(k))
    }
}

/// A set that stays a short vector for the short map lists of real programs and becomes a
/// hash set for long ones (no quadratic scans, no allocation for one item).
enum SmallSet<T> {
    Few(Vec<T>),
    Many(HashSet<T>),
}

impl<T: Eq + std::hash::Hash + Copy> SmallSet<T> {
    const SPILL: usize = 16;

    fn new() -> Self {
        SmallSet::Few(Vec::new())
    }

    /// Adds `v`; `true` when it was not there.
    fn insert(&mut self, v: T) -> bool {
        match self {
            SmallSet::Few(few) if few.contains(&v) => false,
            SmallSet::Few(few) if few.len() < Self::SPILL => {
                few.push(v);
                true
            }
            SmallSet::Few(few) => {
                let mut many: HashSet<T> = few.drain(..).collect();
                many.insert(v);
                *self = SmallSet::Many(many);
                true
            }
            SmallSet::Many(many) => many.insert(v),
        }
    }

    fn contains(&self, v: &T) -> bool {
        match self {
            SmallSet::Few(few) => few.contains(v),
            SmallSet::Many(many) => many.contains(v),
        }
    }
}

impl<T: Eq + std::hash::Hash + Copy> FromIterator<T> for SmallSet<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut s = SmallSet::new();
        iter.into_iter().for_each(|v| {
            s.insert(v);
        });
        s
    }
}

/// A copy a construct will make: host range, device address, the entry's key.
type PlannedCopy = (HostRange, u64, usize);

/// What an exit does to one entry: the entry before the construct, and which counts the
/// construct's items move.
struct Touched {
    key: usize,
    before: Entry,
    counts_ref: bool,
    counts_hold: bool,
    delete: bool,
}

impl DeviceState {
    fn check_allowed(&self, items: &[MapItem], c: Construct) -> Result<()> {
        match items.iter().find(|i| !c.allows(i.map_type)) {
            Some(i) => Err(Error::InvalidArgument {
                routine: c.name(),
                what: format!("map type `{}` is not allowed on {} ({})", i.map_type, c.name(), i.range),
            }),
            None => Ok(()),
        }
    }

    fn entry_line(&self, what: &str, e: &Entry) -> String {
        format!(
            "device {}: {what} {} -> device {:#x}, ref count {} hold count {}",
            self.number,
            e.range,
            e.device_addr,
            e.ref_count_text(),
            e.hold_count
        )
    }

    fn dump_after(&self, table: &PresentTable, c: Construct) {
        if self.trace.on(InfoFlags::DUMP_TABLE) {
            self.trace.write(format!("after {}: {}", c.name(), table.dump(self.number)));
        }
    }

    /// Enters a map list: `target data` / target launch begin, or `enter data`.
    ///
    /// # Safety
    /// Every item's host range must be valid for reads for the duration of the call.
    pub(crate) unsafe fn map_enter(&self, items: &[MapItem], c: Construct) -> Result<()> {
        // SAFETY: forwarded from the caller.
        self.dump_on_error(c.name(), unsafe { self.enter_list(items, c) })
    }

    /// On entry: the entry a request for `range` refers to (`None` when absent), or the
    /// error for a partial overlap, or for an absent range asked for with `present` (`what`
    /// says which construct asked).
    fn resolve_entry(
        &self,
        table: &PresentTable,
        range: HostRange,
        present: bool,
        what: &'static str,
    ) -> Result<Option<usize>> {
        match table.lookup(range) {
            Lookup::Extends(existing) => {
                Err(Error::Extension { device: self.number, requested: range, existing })
            }
            Lookup::Absent if present => Err(Error::NotPresent { device: self.number, range, what }),
            Lookup::Absent => Ok(None),
            Lookup::Inside(k) => Ok(Some(k)),
        }
    }

    /// At exit and in `update`: the entry wholly containing `range`; a range that is not
    /// inside one mapped range is absent there (rule 4), an error only with `present`.
    fn resolve_exit(
        &self,
        table: &PresentTable,
        range: HostRange,
        present: bool,
        what: &'static str,
    ) -> Result<Option<usize>> {
        match table.lookup(range) {
            Lookup::Inside(k) => Ok(Some(k)),
            Lookup::Absent | Lookup::Extends(_) if present => {
                Err(Error::NotPresent { device: self.number, range, what })
            }
            Lookup::Absent | Lookup::Extends(_) => Ok(None),
        }
    }

    /// Shows the present table with a failed construct's error when table dumps are on
    /// (`OFFLOAD_INFO` 0x04), as libomptarget prints its mapping table on failure.
    fn dump_on_error(&self, construct: &str, r: Result<()>) -> Result<()> {
        if let Err(e) = &r {
            if self.trace.on(InfoFlags::DUMP_TABLE) {
                let table = self.table.lock().dump(self.number);
                self.trace.write(format!("{construct} failed: {e}; {table}"));
            }
        }
        r
    }

    /// # Safety
    /// As [`DeviceState::map_enter`].
    unsafe fn enter_list(&self, items: &[MapItem], c: Construct) -> Result<()> {
        self.check_allowed(items, c)?;
        let mut planned = PlannedEntries::default();
        let mut counted: Vec<(usize, bool)> = Vec::new();
        let mut copies: Vec<PlannedCopy> = Vec::new();
        {
            let mut table = self.table.lock();
            // Presence and extension are judged against the table as the construct found it.
            for it in items {
                self.resolve_entry(&table, it.range, it.map_type.present, "a `present` map on entry")?;
            }
            if let Err(e) = self.plan_enter(&mut table, items, &mut planned, &mut counted, &mut copies) {
                self.undo_counts(&mut table, &counted);
                drop(table);
                self.free_planned(&planned);
                return Err(e);
            }
        }
        // Copies without the lock; the entries they fill are not published yet.
        let mut done = SmallSet::new();
        for &(range, addr, _) in &copies {
            if done.insert(range) {
                // SAFETY: the caller guarantees the host range; `addr` lies in the entry.
                if let Err(e) = unsafe { self.copy_to_device(addr, range) } {
                    self.undo_counts(&mut self.table.lock(), &counted);
                    self.free_planned(&planned);
                    return Err(e);
                }
            }
        }
        let mut table = self.table.lock();
        if let Err(e) = self.publish(&mut table, &planned) {
            self.undo_counts(&mut table, &counted);
            drop(table);
            self.free_planned(&planned);
            return Err(e);
        }
        for &(range, _, key) in &copies {
            self.note_copy(&mut table, key, range);
        }
        self.dump_after(&table, c);
        Ok(())
    }

    /// Resolves each item to an existing entry (counted now, each of its counts once per
    /// construct) or to a new one (allocated, published later), and lists the copies the
    /// construct makes.
    fn plan_enter(
        &self,
        table: &mut PresentTable,
        items: &[MapItem],
        planned: &mut PlannedEntries,
        counted: &mut Vec<(usize, bool)>,
        copies: &mut Vec<PlannedCopy>,
    ) -> Result<()> {
        let mut seen = SmallSet::new();
        for it in items.iter().filter(|it| it.range.bytes > 0) {
            let hold = it.map_type.hold;
            // Inside an entry this construct creates: a `to` copies (created anywhere in it).
            match planned.find(it.range) {
                Ok(Some(p)) => {
                    p.counts_ref |= !hold;
                    p.counts_hold |= hold;
                    if it.map_type.copies_in() {
                        let addr = p.device_addr + (it.range.begin - p.range.begin) as u64;
                        copies.push((it.range, addr, p.range.begin));
                    }
                    continue;
                }
                Err(existing) => {
                    return Err(Error::Extension { device: self.number, requested: it.range, existing })
                }
                Ok(None) => {}
            }
            match table.lookup(it.range) {
                Lookup::Inside(k) => {
                    let Some(e) = table.get_mut(k) else { continue };
                    // Counts as the construct found them.
                    self.trace.emit(InfoFlags::MAPPING_EXISTS, || self.entry_line("mapping exists", e));
                    if seen.insert((k, hold)) {
                        counted.push((k, hold));
                        increment(e, hold);
                    }
                    if it.map_type.copies_in() && it.map_type.always {
                        copies.push((it.range, e.translate(it.range.begin), k));
                    }
                }
                Lookup::Extends(existing) => {
                    return Err(Error::Extension { device: self.number, requested: it.range, existing })
                }
                Lookup::Absent => {
                    let device_addr = self.pool.alloc(&*self.backend, it.range.bytes)?;
                    planned.insert(Planned {
                        range: it.range,
                        device_addr,
                        counts_ref: !hold,
                        counts_hold: hold,
                    });
                    if it.map_type.copies_in() {
                        copies.push((it.range, device_addr, it.range.begin));
                    }
                }
            }
        }
        Ok(())
    }

    /// Inserts the construct's new entries, each count moved once. Another thread may have
    /// published the same range meanwhile: then that entry is counted instead and ours is
    /// freed (its copy came from the same host data). Partial overlaps are extension errors.
    fn publish(&self, table: &mut PresentTable, planned: &PlannedEntries) -> Result<()> {
        for p in planned.iter() {
            if let Lookup::Extends(existing) = table.lookup(p.range) {
                return Err(Error::Extension { device: self.number, requested: p.range, existing });
            }
        }
        for p in planned.iter() {
            let key = match table.lookup(p.range) {
                Lookup::Inside(k) => {
                    let _ = self.pool.free(&*self.backend, self.number, p.device_addr);
                    k
                }
                _ => {
                    table.insert(Entry::new(p.range, p.device_addr, false));
                    p.range.begin
                }
            };
            if let Some(e) = table.get_mut(key) {
                if p.counts_ref {
                    increment(e, false);
                }
                if p.counts_hold {
                    increment(e, true);
                }
                if e.device_addr == p.device_addr {
                    let e = &*e;
                    self.trace.emit(InfoFlags::ENTRIES, || self.entry_line("entry created", e));
                }
            }
        }
        Ok(())
    }

    /// Takes back the counts a failed construct added to existing entries; an entry it
    /// alone kept alive leaves.
    fn undo_counts(&self, table: &mut PresentTable, counted: &[(usize, bool)]) {
        for &(k, hold) in counted {
            if let Some(e) = table.get_mut(k) {
                decrement(e, hold);
                if e.is_released() {
                    if let Some(e) = table.remove(k) {
                        let _ = self.release_entry(&e);
                    }
                }
            }
        }
    }

    fn free_planned(&self, planned: &PlannedEntries) {
        for p in planned.iter() {
            let _ = self.pool.free(&*self.backend, self.number, p.device_addr);
        }
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
        // and `release_entry` unregisters it at removal.
        if let Ok(true) = unsafe { self.backend.register_host(e.range.begin as *mut u8, e.range.bytes) } {
            e.registered = true;
            self.pinned.insert(e.range.begin, e.range.bytes);
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
            self.pinned.remove(e.range.begin);
            // SAFETY: registered by `note_copy`; the entry's copies have all completed.
            let _ = unsafe { self.backend.unregister_host(e.range.begin as *mut u8) };
        }
        if e.associated {
            return Ok(());
        }
        self.pool.free(&*self.backend, self.number, e.device_addr).map(drop)
    }

    /// Exits a map list: `target data` / target launch end, or `exit data`.
    ///
    /// # Safety
    /// Every item with a `from` kind must name host memory valid for writes and not
    /// otherwise accessed during the call.
    pub(crate) unsafe fn map_exit(&self, items: &[MapItem], c: Construct) -> Result<()> {
        // SAFETY: forwarded from the caller.
        self.dump_on_error(c.name(), unsafe { self.exit_list(items, c) })
    }

    /// # Safety
    /// As [`DeviceState::map_exit`].
    unsafe fn exit_list(&self, items: &[MapItem], c: Construct) -> Result<()> {
        self.check_allowed(items, c)?;
        // Under the lock: move the counts, list the copies, take released entries out.
        let mut table = self.table.lock();
        let mut keys = Vec::with_capacity(items.len());
        for it in items {
            // A region's end never checks `present` (rule 10).
            let present = it.map_type.present && !c.is_region();
            let key = self.resolve_exit(&table, it.range, present, "a `present` map on exit")?;
            // Zero-length items are only checked: they move no count.
            keys.push(key.filter(|_| it.range.bytes > 0));
        }
        // Each entry once, in reverse list order, with its counts before the construct and
        // the counts its items move (each at most once).
        let mut touched: Vec<Touched> = Vec::new();
        let mut index: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        for (it, key) in items.iter().zip(&keys).rev() {
            let Some(k) = *key else { continue };
            let i = match index.get(&k) {
                Some(&i) => i,
                None => {
                    let Some(e) = table.get(k) else { continue };
                    touched.push(Touched {
                        key: k,
                        before: e.clone(),
                        counts_ref: false,
                        counts_hold: false,
                        delete: false,
                    });
                    index.insert(k, touched.len() - 1);
                    touched.len() - 1
                }
            };
            let t = &mut touched[i];
            t.counts_hold |= it.map_type.hold;
            t.counts_ref |= !it.map_type.hold;
            t.delete |= it.map_type.kind == MapKind::Delete;
        }
        for t in &touched {
            let Some(e) = table.get_mut(t.key) else { continue };
            if t.counts_hold {
                decrement(e, true);
            }
            if t.counts_ref && !e.associated {
                e.ref_count = if t.delete { 0 } else { e.ref_count.saturating_sub(1) };
            }
        }
        // What this exit took from each entry's counts, to give back if it fails.
        let taken: Vec<(usize, u64, u64)> = touched
            .iter()
            .filter_map(|t| {
                let e = table.get(t.key)?;
                Some((t.key, t.before.ref_count - e.ref_count, t.before.hold_count - e.hold_count))
            })
            .collect();
        let mut copies: Vec<PlannedCopy> = Vec::new();
        let mut copied = SmallSet::new();
        for (it, key) in items.iter().zip(&keys).rev() {
            let Some(k) = *key else { continue };
            let Some(e) = table.get(k) else { continue };
            let copy = it.map_type.copies_out() && (it.map_type.always || e.is_released());
            if copy && copied.insert(it.range) {
                copies.push((it.range, e.translate(it.range.begin), k));
            }
        }
        let mut removed: Vec<(Entry, Entry)> = Vec::new();
        for t in touched {
            if table.get(t.key).is_some_and(Entry::is_released) {
                if let Some(e) = table.remove(t.key) {
                    removed.push((e, t.before));
                }
            }
        }
        drop(table);
        // Without the lock: copies back (removed entries' memory is still ours), then frees.
        for &(range, addr, _) in &copies {
            // SAFETY: forwarded from the caller; `addr` lies in the entry.
            if let Err(err) = unsafe { self.copy_from_device(range, addr) } {
                self.undo_exit(&taken, removed);
                return Err(err);
            }
        }
        let mut first_err = None;
        for (e, _) in &removed {
            self.trace.emit(InfoFlags::ENTRIES, || self.entry_line("entry removed", e));
            if let Err(err) = self.release_entry(e) {
                first_err.get_or_insert(err);
            }
        }
        let mut table = self.table.lock();
        for &(range, _, key) in &copies {
            self.note_copy(&mut table, key, range);
        }
        self.dump_after(&table, c);
        first_err.map_or(Ok(()), Err)
    }

    /// Undoes a failed exit: removed entries go back (when nothing took their place
    /// meanwhile, else they are freed); the others get back what this exit took from their
    /// counts.
    fn undo_exit(&self, taken: &[(usize, u64, u64)], removed: Vec<(Entry, Entry)>) {
        let mut table = self.table.lock();
        let gone: SmallSet<usize> = removed.iter().map(|(e, _)| e.range.begin).collect();
        for &(k, ref_count, hold_count) in taken {
            if gone.contains(&k) {
                continue;
            }
            if let Some(e) = table.get_mut(k) {
                e.ref_count += ref_count;
                e.hold_count += hold_count;
            }
        }
        for (e, before) in removed {
            if table.lookup(e.range) == Lookup::Absent {
                table.insert(Entry { ref_count: before.ref_count, hold_count: before.hold_count, ..e });
            } else {
                let _ = self.release_entry(&e);
            }
        }
    }

    /// `target update to/from`: copies present ranges, changes no count.
    ///
    /// # Safety
    /// Host ranges valid for reads (`To`) or for exclusive writes (`From`).
    pub(crate) unsafe fn update(&self, items: &[(HostRange, bool)], dir: UpdateDirection) -> Result<()> {
        // SAFETY: forwarded from the caller.
        self.dump_on_error("target update", unsafe { self.update_list(items, dir) })
    }

    /// # Safety
    /// As [`DeviceState::update`].
    unsafe fn update_list(&self, items: &[(HostRange, bool)], dir: UpdateDirection) -> Result<()> {
        let mut found: Vec<PlannedCopy> = Vec::with_capacity(items.len());
        {
            let table = self.table.lock();
            for &(range, present) in items {
                let key = self.resolve_exit(&table, range, present, "`target update` with `present`")?;
                if let Some(e) = key.filter(|_| range.bytes > 0).and_then(|k| table.get(k)) {
                    found.push((range, e.translate(range.begin), e.range.begin));
                }
            }
        }
        for &(range, addr, _) in &found {
            // SAFETY: forwarded from the caller; the device range lies in the entry, which
            // the program keeps mapped while it updates it.
            unsafe {
                match dir {
                    UpdateDirection::To => self.copy_to_device(addr, range)?,
                    UpdateDirection::From => self.copy_from_device(range, addr)?,
                }
            }
        }
        let mut table = self.table.lock();
        for &(range, _, key) in &found {
            self.note_copy(&mut table, key, range);
        }
        Ok(())
    }

    /// Copies `host` to device address `dst`, counting and tracing it.
    ///
    /// # Safety
    /// `host` valid for reads.
    pub(crate) unsafe fn copy_to_device(&self, dst: u64, host: HostRange) -> Result<()> {
        self.trace.emit(InfoFlags::TRANSFERS, || {
            format!(
                "device {}: copy host->device {} bytes, {host} -> device {dst:#x}",
                self.number, host.bytes
            )
        });
        // SAFETY: forwarded from the caller.
        unsafe { self.write_host(dst, host)? };
        self.stats.record_to_device(host.bytes);
        Ok(())
    }

    /// Copies device address `src` into `host`, counting and tracing it.
    ///
    /// # Safety
    /// `host` valid for exclusive writes.
    pub(crate) unsafe fn copy_from_device(&self, host: HostRange, src: u64) -> Result<()> {
        self.trace.emit(InfoFlags::TRANSFERS, || {
            format!(
                "device {}: copy device->host {} bytes, device {src:#x} -> {host}",
                self.number, host.bytes
            )
        });
        // SAFETY: forwarded from the caller.
        unsafe { self.read_host(host, src)? };
        self.stats.record_from_device(host.bytes);
        Ok(())
    }
}

/// Moves one of an entry's counts up: the hold count for `hold` maps, else the reference
/// count (infinite, so unmoved, for associated entries).
fn increment(e: &mut Entry, hold: bool) {
    if hold {
        e.hold_count += 1;
    } else if !e.associated {
        e.ref_count += 1;
    }
}

/// The inverse of [`increment`], never below zero.
fn decrement(e: &mut Entry, hold: bool) {
    if hold {
        e.hold_count = e.hold_count.saturating_sub(1);
    } else if !e.associated {
        e.ref_count = e.ref_count.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::SmallSet;

    #[test]
    fn small_sets_spill_without_losing_members() {
        let mut s = SmallSet::new();
        for i in 0..100usize {
            assert_eq!(s.insert(i % 40), i < 40, "{i}");
        }
        let s: SmallSet<usize> = (0..100).map(|i| i % 40).collect();
        assert!((0..40).all(|i| s.contains(&i)) && !s.contains(&40));
        let mut t = SmallSet::new();
        assert!(t.insert(3) && !t.insert(3));
    }
}
