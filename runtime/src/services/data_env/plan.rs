//! Map-list planning: a construct's map list and a device's present table in, a plan out.
//!
//! Planning is the part of a construct that needs no device: which items name existing
//! entries and which need new ones, which counts move, which copies to make, which entries
//! leave. It runs under the table's lock; the device's construct execution (`device::constructs`) then makes the copies
//! without the lock, publishes or frees, and undoes a plan when a copy fails. Nothing here
//! calls a driver (allocation is a closure), so these rules are unit-tested, under Miri
//! too, without any device.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

use smallvec::SmallVec;

use super::{Construct, Entry, Lookup, MapItem, MapKind, PresentTable};
use crate::error::{Error, Result};
use crate::range::{ArrayName, HostRange, RangeName};

/// A new entry a construct has allocated and not yet published, with the counts its items
/// move (the reference count, the hold count, or both).
pub(crate) struct Planned {
    pub(crate) range: HostRange,
    pub(crate) device_addr: u64,
    /// The host base pointer of the item that created it ([`Entry::base`]).
    pub(crate) base: Option<usize>,
    pub(crate) counts_ref: bool,
    pub(crate) counts_hold: bool,
    /// The name and element size of the item that created it ([`MapItem::named`]).
    pub(crate) name: Option<&'static str>,
    pub(crate) elem_size: usize,
    pub(crate) name_index: usize,
    /// Whether an item naming it copies back ([`Entry::maps_from`]).
    pub(crate) maps_from: bool,
}

impl Planned {
    /// The entry to publish (its counts not yet moved).
    pub(crate) fn entry(&self) -> Entry {
        let mut e = Entry::new(self.range, self.device_addr, false).based_at(self.base);
        (e.name, e.elem_size, e.name_index) = (self.name, self.elem_size, self.name_index);
        e.maps_from = self.maps_from;
        e
    }

    /// The named array it is, if its item named it.
    pub(crate) fn array(&self) -> Option<crate::range::ArrayName> {
        crate::range::ArrayName::of(self.name, self.elem_size, self.name_index, self.range.begin)
    }
}

/// A list that grows with a construct's map list: held inline for the few items real
/// programs map at once, so that a construct on present data allocates nothing.
pub(crate) type Short<T> = SmallVec<[T; 4]>;

/// A construct's new entries by host begin address, found by containment like the table's
/// (map lists can be long: no linear scans).
#[derive(Default)]
pub(crate) struct PlannedEntries(BTreeMap<usize, Planned>, Vec<usize>);

impl PlannedEntries {
    /// The planned entry containing `r`, or `Err` with one it partly overlaps.
    fn find(&mut self, r: HostRange) -> std::result::Result<Option<&mut Planned>, HostRange> {
        let below = self.0.range(..=r.begin).next_back().map(|(&k, p)| (k, p.range));
        if let Some((k, range)) = below.filter(|(_, range)| r.begin < range.end()) {
            return if range.contains(&r) { Ok(self.0.get_mut(&k)) } else { Err(range) };
        }
        if r.bytes == 0 {
            // As the table's lookup: a zero-length range also names the next entry above it
            // whose item named a base at or below it.
            use std::ops::Bound::{Excluded, Unbounded};
            let k = self
                .0
                .range((Excluded(r.begin), Unbounded))
                .next()
                .filter(|(_, p)| p.base.is_some_and(|b| b <= r.begin))
                .map(|(&k, _)| k);
            return Ok(k.and_then(|k| self.0.get_mut(&k)));
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

    /// The planned entry at host address `key`.
    pub(crate) fn get(&self, key: usize) -> Option<&Planned> {
        self.0.get(&key)
    }

    /// Whether the construct creates no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.1.is_empty()
    }

    /// The planned entries in list order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Planned> {
        self.1.iter().filter_map(|k| self.0.get(k))
    }
}

/// A set that stays a short vector for the short map lists of real programs and becomes a
/// hash set for long ones (no quadratic scans, no allocation for one item).
pub(crate) enum SmallSet<T> {
    Few(Short<T>),
    Many(HashSet<T>),
}

impl<T: Eq + std::hash::Hash + Copy> SmallSet<T> {
    const SPILL: usize = 16;

    pub(crate) fn new() -> Self {
        SmallSet::Few(Short::new())
    }

    /// Adds `v`; `true` when it was not there.
    pub(crate) fn insert(&mut self, v: T) -> bool {
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

    pub(crate) fn contains(&self, v: &T) -> bool {
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
pub(crate) type PlannedCopy = (HostRange, u64, usize);

/// The entry half of a construct (`target data` / launch begin, `enter data`).
#[derive(Default)]
pub(crate) struct EnterPlan {
    /// New entries, allocated and not yet published.
    pub(crate) planned: PlannedEntries,
    /// Existing entries whose count moved, with which count (`true`: hold), each once;
    /// with the entry's device address, which tells it from a later entry at the same key.
    pub(crate) counted: Short<(usize, bool, u64)>,
    /// Host->device copies, in list order (identical ranges may repeat).
    pub(crate) copies: Short<PlannedCopy>,
}

impl EnterPlan {
    /// Plans `items` against `table` on `device`: checks presence and extension against
    /// the table as the construct found it, then resolves each item to an existing entry
    /// (counted now, each of its counts once per construct) or to a new one (allocated by
    /// `alloc`, published later), and lists the copies. `on_exists` sees each existing
    /// entry an item names. On error the plan holds what was done so far, for the caller
    /// to undo ([`undo_counts`], and freeing `planned`). `on_exists` is given the item
    /// too, and whether it moved the entry's count (each count moves once per construct).
    pub(crate) fn build(
        &mut self,
        table: &mut PresentTable,
        items: &[MapItem],
        device: usize,
        mut alloc: impl FnMut(usize) -> Result<u64>,
        mut on_exists: impl FnMut(&Entry, &MapItem, bool),
    ) -> Result<()> {
        if let [it] = items {
            // One item (most constructs): no list bookkeeping.
            let lookup = check_entry(table, it, device)?;
            return self.take(table, it, lookup, device, |_| true, &mut alloc, &mut on_exists);
        }
        // What each item names in the table as the construct found it (the table changes
        // below only in counts, so these stay true).
        let mut found: Short<Lookup> = Short::with_capacity(items.len());
        for it in items {
            found.push(check_entry(table, it, device)?);
        }
        let mut seen = SmallSet::new();
        for (it, lookup) in items.iter().zip(found) {
            let hold = it.map_type.hold;
            // Inside an entry this construct creates: a `to` copies (created anywhere in it).
            match self.planned.find(it.range) {
                Ok(Some(p)) => {
                    p.counts_ref |= !hold;
                    p.counts_hold |= hold;
                    p.maps_from |= it.map_type.copies_out();
                    if it.map_type.copies_in() && it.range.bytes > 0 {
                        let addr = p.device_addr + (it.range.begin - p.range.begin) as u64;
                        self.copies.push((it.range, addr, p.range.begin));
                    }
                    continue;
                }
                Err(existing) => return Err(Error::Extension { device, requested: it.range, existing }),
                Ok(None) => {}
            }
            self.take(table, it, lookup, device, |k| seen.insert((k, hold)), &mut alloc, &mut on_exists)?;
        }
        Ok(())
    }

    /// Resolves item `it` (not inside an entry this construct creates) by what the table
    /// held for it: an existing entry has its count moved when `first` says this construct
    /// has not moved that count of it yet, and a new one is allocated by `alloc`; the
    /// item's copy, if it makes one, is listed. A zero-length item stands for the entry it
    /// lies in (its count moves; it copies nothing) and creates none (rule 6).
    #[allow(clippy::too_many_arguments)]
    fn take(
        &mut self,
        table: &mut PresentTable,
        it: &MapItem,
        lookup: Lookup,
        device: usize,
        first: impl FnOnce(usize) -> bool,
        alloc: &mut impl FnMut(usize) -> Result<u64>,
        on_exists: &mut impl FnMut(&Entry, &MapItem, bool),
    ) -> Result<()> {
        let hold = it.map_type.hold;
        match lookup {
            Lookup::Inside(k) => {
                let Some(e) = table.get_mut(k) else { return Ok(()) };
                let moved = first(k);
                if moved {
                    self.counted.push((k, hold, e.device_addr));
                    increment(e, hold);
                }
                e.note_map(it);
                // Counts with this construct's increment, as libomptarget reports them.
                on_exists(e, it, moved);
                if it.map_type.copies_in() && it.map_type.always && it.range.bytes > 0 {
                    self.copies.push((it.range, e.translate(it.range.begin), k));
                }
            }
            Lookup::Extends(existing) => {
                return Err(Error::Extension { device, requested: it.range, existing })
            }
            Lookup::Absent if it.range.bytes == 0 => {}
            Lookup::Absent => {
                let device_addr = alloc(it.range.bytes)?;
                self.planned.insert(Planned {
                    range: it.range,
                    device_addr,
                    base: it.base,
                    counts_ref: !hold,
                    counts_hold: hold,
                    name: it.name,
                    elem_size: it.elem_size,
                    name_index: it.name_index,
                    maps_from: it.map_type.copies_out(),
                });
                if it.map_type.copies_in() {
                    self.copies.push((it.range, device_addr, it.range.begin));
                }
            }
        }
        Ok(())
    }
}

/// `items` as `table` reads them: an implicit item ([`MapType::implicit`]) that extends a
/// mapped range stands for the part of it that is mapped, as OpenMP 5.2 (5.8.3) and
/// libomptarget read a variable a region maps implicitly where part of it is present.
/// Borrowed when no item is implicit (every explicit construct). Read once, when a region
/// enters: its launch and its end use that reading, not a later lookup.
///
/// [`MapType::implicit`]: crate::MapType::implicit
pub(crate) fn present_parts<'a>(table: &PresentTable, items: &'a [MapItem]) -> Cow<'a, [MapItem]> {
    if !items.iter().any(|it| it.map_type.implicit) {
        return Cow::Borrowed(items);
    }
    let part = |it: &MapItem| match table.lookup(it.range) {
        Lookup::Extends(e) if it.map_type.implicit => {
            let (begin, end) = (it.range.begin.max(e.begin), it.range.end().min(e.end()));
            MapItem { range: HostRange::new(begin, end.saturating_sub(begin)), ..*it }
        }
        _ => *it,
    };
    Cow::Owned(items.iter().map(part).collect())
}

/// What item `it` of an entry construct names in `table`: an error when it extends a
/// mapped range, or is absent with the `present` modifier.
fn check_entry(table: &PresentTable, it: &MapItem, device: usize) -> Result<Lookup> {
    match table.lookup(it.range) {
        Lookup::Extends(existing) => Err(Error::Extension { device, requested: it.range, existing }),
        Lookup::Absent if it.map_type.present => Err(Error::NotPresent {
            device,
            range: it.range,
            what: "a `present` map on entry",
            name: it.array().map(|a| RangeName::new(it.range, Some(a)).to_string()),
        }),
        l => Ok(l),
    }
}

/// Takes back the counts a failed construct added to existing entries (those still there:
/// another thread may have replaced one meanwhile); returns the entries it alone kept
/// alive, removed from the table (for the caller to free).
pub(crate) fn undo_counts(table: &mut PresentTable, counted: &[(usize, bool, u64)]) -> Vec<Entry> {
    let mut gone = Vec::new();
    for &(k, hold, addr) in counted {
        if let Some(e) = table.get_mut(k).filter(|e| e.device_addr == addr) {
            decrement(e, hold);
            if e.is_released() {
                gone.extend(table.remove(k));
            }
        }
    }
    gone
}

/// What an exit does to one entry: the entry before the construct, which counts the
/// construct's items move, and (once they moved) whether it leaves.
#[derive(Clone, Copy)]
struct Touched {
    key: usize,
    device_addr: u64,
    /// The entry's (reference, hold) counts before the construct.
    before: (u64, u64),
    counts_ref: bool,
    counts_hold: bool,
    delete: bool,
    released: bool,
}

impl Touched {
    fn new(key: usize, e: &Entry) -> Self {
        Self {
            key,
            device_addr: e.device_addr,
            before: (e.ref_count, e.hold_count),
            counts_ref: false,
            counts_hold: false,
            delete: false,
            released: false,
        }
    }

    /// Item `it` names this entry: the count it moves, and whether it deletes.
    fn add(&mut self, it: &MapItem) {
        self.counts_hold |= it.map_type.hold;
        self.counts_ref |= !it.map_type.hold;
        self.delete |= it.map_type.kind == MapKind::Delete;
    }

    /// Moves `e`'s counts as the items said (each once; `delete` zeroes the reference
    /// count), records what was taken in `plan`, and whether the entry now leaves.
    fn apply(&mut self, e: &mut Entry, plan: &mut ExitPlan) {
        if self.counts_hold {
            decrement(e, true);
        }
        if self.counts_ref && !e.associated {
            e.ref_count = if self.delete { 0 } else { e.ref_count.saturating_sub(1) };
        }
        let (r, h) = (self.before.0 - e.ref_count, self.before.1 - e.hold_count);
        plan.taken.push((self.key, e.device_addr, r, h));
        self.released = e.is_released();
    }

    /// The copy back item `it` makes: a `from` when the entry leaves, or with `always`;
    /// none for a zero-length item (as libomptarget: it moved the entry's count only).
    fn copy_for(&self, it: &MapItem) -> Option<PlannedCopy> {
        let copy = it.map_type.copies_out() && (it.map_type.always || self.released) && it.range.bytes > 0;
        copy.then(|| (it.range, self.device_addr + (it.range.begin - self.key) as u64, self.key))
    }

    /// Takes the entry out of `table` into `plan` if it leaves.
    fn take_out(&self, table: &mut PresentTable, plan: &mut ExitPlan) {
        if self.released {
            if let Some(e) = table.remove(self.key) {
                plan.removed.push((e, self.before));
            }
        }
    }
}

/// The exit half of a construct (`target data` / launch end, `exit data`), already applied
/// to the table: counts moved, released entries taken out.
#[derive(Default)]
pub(crate) struct ExitPlan {
    /// What the exit took from each remaining entry's counts: (key, device address,
    /// reference, hold).
    pub(crate) taken: Short<(usize, u64, u64, u64)>,
    /// Device->host copies, in reverse list order, identical ranges once.
    pub(crate) copies: Short<PlannedCopy>,
    /// Released entries (taken out of the table), each with its (reference, hold) counts
    /// before the exit.
    pub(crate) removed: Vec<(Entry, (u64, u64))>,
}

impl ExitPlan {
    /// What the exit took from the (reference, hold) counts of the entry at `key` that
    /// stays, at device address `device_addr`: (0, 0) when it took nothing.
    pub(crate) fn taken_from(&self, key: usize, device_addr: u64) -> (u64, u64) {
        let taken = self.taken.iter().find(|t| t.0 == key && t.1 == device_addr);
        taken.map_or((0, 0), |t| (t.2, t.3))
    }

    /// Applies the count changes of `items` (construct `c`) to `table` on `device` and
    /// plans the copies back: each entry's counts move once, in reverse list order
    /// (`delete` zeroes the reference count); a `from` copies when the entry leaves or with
    /// `always`. At exit a range not wholly inside one mapped range is absent, an error
    /// only with `present`, which a region's end never checks (rule 10). On error nothing
    /// has changed.
    ///
    /// Each entry is searched for once per item naming it, then once to move its counts
    /// and once to take it out if it leaves (a construct on present data is a few tree
    /// descents, nothing more).
    #[cfg(test)]
    pub(crate) fn build(
        table: &mut PresentTable,
        items: &[MapItem],
        c: Construct,
        device: usize,
    ) -> Result<Self> {
        let mut plan = ExitPlan::default();
        plan.fill(table, items, c, device)?;
        Ok(plan)
    }

    /// [`ExitPlan::build`] into `self` (empty), where the caller keeps it.
    pub(crate) fn fill(
        &mut self,
        table: &mut PresentTable,
        items: &[MapItem],
        c: Construct,
        device: usize,
    ) -> Result<()> {
        if let [it] = items {
            return self.fill_one(table, it, c, device);
        }
        let plan = self;
        let mut keys: Short<Option<usize>> = Short::with_capacity(items.len());
        for it in items {
            let present = it.map_type.present && !c.is_region();
            // A zero-length item stands for the entry it lies in (rule 6).
            keys.push(resolve_exit(table, it.range, present, device, "a `present` map on exit", it.array())?);
        }
        // Each entry once, in reverse list order, with its counts before the construct and
        // the counts its items move (each at most once); `slot[i]` is item i's entry.
        // Short lists search `touched`; long ones get an index (no quadratic scans).
        let mut touched: Short<Touched> = Short::new();
        let mut slot: Short<Option<usize>> = smallvec::smallvec![None; items.len()];
        let mut index: HashMap<usize, usize> = HashMap::new();
        for (i, (it, key)) in items.iter().zip(&keys).enumerate().rev() {
            let Some(k) = *key else { continue };
            let found = if index.is_empty() {
                touched.iter().position(|t| t.key == k)
            } else {
                index.get(&k).copied()
            };
            let at = match found {
                Some(at) => at,
                None => {
                    let Some(e) = table.get(k) else { continue };
                    touched.push(Touched::new(k, e));
                    if !index.is_empty() {
                        index.insert(k, touched.len() - 1);
                    } else if touched.len() > SmallSet::<usize>::SPILL {
                        index = touched.iter().enumerate().map(|(i, t)| (t.key, i)).collect();
                    }
                    touched.len() - 1
                }
            };
            slot[i] = Some(at);
            touched[at].add(it);
        }
        for t in touched.iter_mut() {
            if let Some(e) = table.get_mut(t.key) {
                t.apply(e, plan);
            }
        }
        let mut copied = SmallSet::new();
        for (it, at) in items.iter().zip(&slot).rev() {
            let Some(copy) = at.and_then(|at| touched[at].copy_for(it)) else { continue };
            if copied.insert(it.range) {
                plan.copies.push(copy);
            }
        }
        for t in &touched {
            t.take_out(table, plan);
        }
        Ok(())
    }

    /// [`ExitPlan::fill`] for a map list of one item (most constructs): the same rules
    /// with no list bookkeeping.
    fn fill_one(
        &mut self,
        table: &mut PresentTable,
        it: &MapItem,
        c: Construct,
        device: usize,
    ) -> Result<()> {
        let present = it.map_type.present && !c.is_region();
        let key = resolve_exit(table, it.range, present, device, "a `present` map on exit", it.array())?;
        let Some(k) = key else { return Ok(()) };
        let Some(e) = table.get_mut(k) else { return Ok(()) };
        let mut t = Touched::new(k, e);
        t.add(it);
        t.apply(e, self);
        self.copies.extend(t.copy_for(it));
        t.take_out(table, self);
        Ok(())
    }

    /// Undoes the plan in `table` after a failed copy: removed entries go back when nothing
    /// took their place meanwhile (those that cannot are returned, for the caller to
    /// free); the others get back what the exit took from their counts.
    pub(crate) fn undo(self, table: &mut PresentTable) -> Vec<Entry> {
        let gone: SmallSet<usize> = self.removed.iter().map(|(e, _)| e.range.begin).collect();
        for &(k, addr, ref_count, hold_count) in &self.taken {
            if gone.contains(&k) {
                continue;
            }
            // Only the entry the exit changed (another thread may have replaced it).
            if let Some(e) = table.get_mut(k).filter(|e| e.device_addr == addr) {
                e.ref_count += ref_count;
                e.hold_count += hold_count;
            }
        }
        let mut lost = Vec::new();
        for (e, before) in self.removed {
            if table.lookup(e.range) == Lookup::Absent {
                table.insert(Entry { ref_count: before.0, hold_count: before.1, ..e });
            } else {
                lost.push(e);
            }
        }
        lost
    }
}

/// At exit and in `update`: the entry wholly containing `range`; a range that is not
/// inside one mapped range is absent there (rule 4), an error only with `present` (naming
/// `range` as a section of `array` when its map was named).
pub(crate) fn resolve_exit(
    table: &PresentTable,
    range: HostRange,
    present: bool,
    device: usize,
    what: &'static str,
    array: Option<ArrayName>,
) -> Result<Option<usize>> {
    match table.lookup(range) {
        Lookup::Inside(k) => Ok(Some(k)),
        Lookup::Absent | Lookup::Extends(_) if present => Err(Error::NotPresent {
            device,
            range,
            what,
            name: array.map(|a| RangeName::new(range, Some(a)).to_string()),
        }),
        Lookup::Absent | Lookup::Extends(_) => Ok(None),
    }
}

/// Moves one of an entry's counts up: the hold count for `hold` maps, else the reference
/// count (infinite, so unmoved, for associated entries).
pub(crate) fn increment(e: &mut Entry, hold: bool) {
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
    use super::*;
    use crate::MapType;

    const DEV: usize = 0;

    fn item(begin: usize, bytes: usize, t: MapType) -> MapItem {
        MapItem::new(HostRange::new(begin, bytes), t)
    }

    /// Plans an entry with a counting allocator (device addresses from 0x10000), publishes
    /// its new entries as `construct` does, and returns the plan.
    fn enter(table: &mut PresentTable, items: &[MapItem]) -> Result<EnterPlan> {
        let mut next = 0x10000u64;
        let mut plan = EnterPlan::default();
        let alloc = |bytes: usize| {
            let a = next;
            next += bytes as u64;
            Ok(a)
        };
        plan.build(table, items, DEV, alloc, |_, _, _| {})?;
        for p in plan.planned.iter() {
            let mut e = p.entry();
            if p.counts_ref {
                increment(&mut e, false);
            }
            if p.counts_hold {
                increment(&mut e, true);
            }
            table.insert(e);
        }
        Ok(plan)
    }

    fn counts(table: &PresentTable, at: usize) -> Option<(u64, u64)> {
        table.containing(at).map(|e| (e.ref_count, e.hold_count))
    }

    #[test]
    fn a_zero_length_item_at_the_base_of_an_entry_the_construct_creates_counts_it_once() {
        // [hold alloc A[64:2] with base A, alloc A[0:0]]: the second names the first's entry
        // (as the table's lookup will at the region's end), so its counts are symmetric.
        let mut t = PresentTable::default();
        let items =
            [item(164, 8, MapType::ALLOC.hold()).with_base(100 as *const u8), item(100, 0, MapType::ALLOC)];
        enter(&mut t, &items).unwrap();
        assert_eq!(counts(&t, 164), Some((1, 1)));
        enter(&mut t, &[item(164, 8, MapType::TO)]).unwrap();
        let p = ExitPlan::build(&mut t, &items, Construct::TargetData, DEV).unwrap();
        assert!(p.removed.is_empty());
        assert_eq!(counts(&t, 164), Some((1, 0)), "the enter data's count is kept");
    }

    #[test]
    fn a_new_entry_is_planned_with_its_copy_and_counted_once() {
        let mut t = PresentTable::default();
        let p = enter(&mut t, &[item(100, 16, MapType::ALLOC), item(100, 16, MapType::TO)]).unwrap();
        assert_eq!(p.planned.iter().count(), 1);
        // The `to` copies although `alloc` created the entry (rule 2).
        assert_eq!(p.copies[..], [(HostRange::new(100, 16), 0x10000, 100)]);
        assert_eq!(counts(&t, 100), Some((1, 0)));
        // Present now: counted once more, no copy without `always`.
        let p = enter(&mut t, &[item(104, 4, MapType::TO), item(100, 16, MapType::TO)]).unwrap();
        assert!(p.copies.is_empty() && p.planned.iter().count() == 0);
        assert_eq!(counts(&t, 100), Some((2, 0)));
        let p = enter(&mut t, &[item(104, 4, MapType::TO.always())]).unwrap();
        assert_eq!(p.copies[..], [(HostRange::new(104, 4), 0x10004, 100)]);
    }

    #[test]
    fn hold_maps_move_the_hold_count() {
        let mut t = PresentTable::default();
        enter(&mut t, &[item(0, 8, MapType::ALLOC.hold()), item(0, 8, MapType::ALLOC)]).unwrap();
        assert_eq!(counts(&t, 0), Some((1, 1)));
        // exit data delete zeroes the reference count only: the hold count keeps the entry.
        let p = ExitPlan::build(&mut t, &[item(0, 8, MapType::DELETE)], Construct::ExitData, DEV).unwrap();
        assert!(p.removed.is_empty());
        assert_eq!(counts(&t, 0), Some((0, 1)));
        let p =
            ExitPlan::build(&mut t, &[item(0, 8, MapType::FROM.hold())], Construct::TargetData, DEV).unwrap();
        assert_eq!(p.removed.len(), 1);
        assert_eq!(p.copies.len(), 1, "the entry left: its `from` copies");
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn extension_and_present_fail_before_anything_changes() {
        let mut t = PresentTable::default();
        enter(&mut t, &[item(0, 8, MapType::ALLOC)]).unwrap();
        let e = enter(&mut t, &[item(64, 8, MapType::TO), item(4, 8, MapType::ALLOC)]).err();
        assert!(matches!(e, Some(Error::Extension { .. })), "{e:?}");
        let e = enter(&mut t, &[item(64, 8, MapType::TO.present())]).err();
        assert!(matches!(e, Some(Error::NotPresent { .. })), "{e:?}");
        assert_eq!((t.len(), counts(&t, 0)), (1, Some((1, 0))));
        // Two items of one list that overlap partly.
        let e = enter(&mut t, &[item(64, 8, MapType::TO), item(68, 8, MapType::TO)]).err();
        assert!(matches!(e, Some(Error::Extension { .. })), "{e:?}");
    }

    #[test]
    fn at_exit_an_extension_is_absent_and_a_region_end_checks_no_present() {
        let mut t = PresentTable::default();
        enter(&mut t, &[item(0, 8, MapType::ALLOC)]).unwrap();
        let p = ExitPlan::build(&mut t, &[item(4, 8, MapType::RELEASE)], Construct::ExitData, DEV).unwrap();
        assert!(p.removed.is_empty() && p.copies.is_empty());
        assert_eq!(counts(&t, 0), Some((1, 0)));
        let e = ExitPlan::build(&mut t, &[item(4, 8, MapType::RELEASE.present())], Construct::ExitData, DEV)
            .err();
        assert!(matches!(e, Some(Error::NotPresent { .. })), "{e:?}");
        let p = ExitPlan::build(&mut t, &[item(64, 8, MapType::FROM.present())], Construct::TargetData, DEV);
        assert!(p.is_ok_and(|p| p.copies.is_empty()), "a region's end must not check `present`");
        assert_eq!(counts(&t, 0), Some((1, 0)));
    }

    #[test]
    fn an_exit_counts_each_entry_once_and_copies_identical_ranges_once() {
        let mut t = PresentTable::default();
        for _ in 0..3 {
            enter(&mut t, &[item(0, 16, MapType::ALLOC)]).unwrap();
        }
        let list = [
            item(0, 16, MapType::FROM.always()),
            item(0, 16, MapType::FROM.always()),
            item(8, 8, MapType::FROM),
        ];
        let p = ExitPlan::build(&mut t, &list, Construct::ExitData, DEV).unwrap();
        assert_eq!(counts(&t, 0), Some((2, 0)));
        assert_eq!(p.copies[..], [(HostRange::new(0, 16), 0x10000, 0)]);
        assert_eq!(p.taken[..], [(0, 0x10000, 1, 0)]);
        // Undone, the counts come back.
        assert!(p.undo(&mut t).is_empty());
        assert_eq!(counts(&t, 0), Some((3, 0)));
    }

    #[test]
    fn an_undone_exit_puts_removed_entries_back() {
        let mut t = PresentTable::default();
        enter(&mut t, &[item(0, 8, MapType::ALLOC), item(32, 8, MapType::ALLOC)]).unwrap();
        let list = [item(0, 8, MapType::FROM), item(32, 8, MapType::DELETE)];
        let p = ExitPlan::build(&mut t, &list, Construct::ExitData, DEV).unwrap();
        // Reverse list order.
        assert_eq!(p.removed.iter().map(|(e, _)| e.range.begin).collect::<Vec<_>>(), vec![32, 0]);
        assert_eq!(t.len(), 0);
        assert!(p.undo(&mut t).is_empty());
        assert_eq!((counts(&t, 0), counts(&t, 32)), (Some((1, 0)), Some((1, 0))));
    }

    #[test]
    fn undone_counts_release_what_only_the_construct_kept() {
        let mut t = PresentTable::default();
        enter(&mut t, &[item(0, 8, MapType::ALLOC)]).unwrap();
        let p = enter(&mut t, &[item(0, 8, MapType::ALLOC.hold())]).unwrap();
        assert_eq!(counts(&t, 0), Some((1, 1)));
        assert!(undo_counts(&mut t, &p.counted).is_empty());
        assert_eq!(counts(&t, 0), Some((1, 0)));
        let e = t.get_mut(0).unwrap();
        e.ref_count = 1;
        // An entry that replaced the counted one keeps its counts.
        assert!(undo_counts(&mut t, &[(0, false, 0xdead)]).is_empty());
        assert_eq!(counts(&t, 0), Some((1, 0)));
        let gone = undo_counts(&mut t, &[(0, false, 0x10000)]);
        assert_eq!(gone.len(), 1);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn long_exit_lists_index_their_entries() {
        let mut t = PresentTable::default();
        let many: Vec<MapItem> = (0..100).map(|i| item(i * 16, 16, MapType::ALLOC)).collect();
        enter(&mut t, &many).unwrap();
        let mut list: Vec<MapItem> =
            many.iter().map(|i| MapItem { map_type: MapType::RELEASE, ..*i }).collect();
        list.extend(list.clone());
        let p = ExitPlan::build(&mut t, &list, Construct::ExitData, DEV).unwrap();
        assert_eq!(p.removed.len(), 100);
        assert_eq!(t.len(), 0);
    }

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
