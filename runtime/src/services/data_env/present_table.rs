//! The present table: one per device, keyed by host address, found by containment.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fmt::Write as _;

use crate::range::{ArrayName, HostRange, RangeName};

/// One mapped host range and its device copy.
///
/// Its `Debug` and `Display` forms give addresses in hex, as every trace line does, and
/// the name of the map that created it ([`crate::MapItem::named`]):
///
/// ```
/// use offload::{map, Runtime};
///
/// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build()?;
/// let a = [0i32; 8];
/// let _m = rt.device(0)?.enter_data(map::to(&a).named("a"))?;
/// let (device, e) = &rt.live_mappings()[0];
/// let shown = format!("device {device}: {e}");
/// assert!(shown.starts_with("device 0: a[0:8] host 0x") && shown.contains("-> device 0x"), "{shown}");
/// assert!(shown.ends_with("ref count 1 hold count 0"), "{shown}");
/// assert!(format!("{e:?}").contains("device_addr: 0x"), "{e:?}");
/// # Ok::<(), offload::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Entry {
    /// The host bytes this entry covers.
    pub range: HostRange,
    /// Device address of `range.begin`.
    pub device_addr: u64,
    /// The host base pointer of the map that created the entry (C's `A` in
    /// `map(to: A[64:128])`; `range.begin` unless the map named one, with
    /// [`crate::MapItem::with_base`]). As in libomptarget, a zero-length lookup (a
    /// zero-length section, `use_device_ptr`) finds the entry from any address in
    /// `[base, range.end())`.
    pub base: usize,
    /// The reference count OpenMP defines, moved by every construct (`target data`,
    /// target launches, `enter`/`exit data`) except maps with the `hold` modifier.
    /// Meaningless (infinite) for associated entries.
    pub ref_count: u64,
    /// The count of maps with the `hold` modifier (LLVM's `ompx_hold`): while it is above
    /// 0, no `exit data` removes the entry.
    pub hold_count: u64,
    /// Made by `associate_ptr`: an infinite reference count; never freed by unmapping.
    pub associated: bool,
    /// Large copies of this entry's host range so far (for the register-in-place policy).
    pub(crate) large_copies: u32,
    /// Whether the runtime page-locked the host range in place while it is mapped.
    pub registered: bool,
    /// The name of the map that created it ([`crate::MapItem::named`]), for traces.
    pub name: Option<&'static str>,
    /// That map's element size in bytes (traces give offsets in elements).
    pub elem_size: usize,
    /// The index in the named array of the entry's first element
    /// ([`crate::MapItem::named_at`]).
    pub name_index: usize,
    /// Whether a map that copies back (`from`, `tofrom`) named it on entry: its device copy
    /// will or may be copied over the host range (checked by the race warning,
    /// `OFFLOAD_INFO` 0x80). Never set on an associated entry, which maps do not copy.
    pub maps_from: bool,
    /// When the entry was made, on [`next_mark`]'s count (the race warning asks whether
    /// another device copied back over the range since).
    pub(crate) mapped_at: u64,
}

/// A process-wide count that orders the making of entries and copies back between
/// devices (the race warning's "since this device mapped it").
pub(crate) fn next_mark() -> u64 {
    static MARK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    MARK.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Entry {
    pub(crate) fn new(range: HostRange, device_addr: u64, associated: bool) -> Self {
        Self {
            range,
            device_addr,
            base: range.begin,
            ref_count: 0,
            hold_count: 0,
            associated,
            large_copies: 0,
            registered: false,
            name: None,
            elem_size: 1,
            name_index: 0,
            maps_from: false,
            mapped_at: next_mark(),
        }
    }

    /// Takes the name and element size of map `it` when it has a name and the entry none,
    /// and notes a map that copies back (not on an associated entry: maps never copy it).
    pub(crate) fn note_map(&mut self, it: &crate::MapItem) {
        if self.name.is_none() && it.name.is_some() && it.range == self.range {
            (self.name, self.elem_size, self.name_index) = (it.name, it.elem_size, it.name_index);
        }
        self.maps_from |= it.map_type.copies_out() && !self.associated;
    }

    /// The named array the entry is, if its map named it.
    pub(crate) fn array(&self) -> Option<ArrayName> {
        ArrayName::of(self.name, self.elem_size, self.name_index, self.range.begin)
    }

    /// How traces name `range`, a range in (or starting in) this entry.
    pub(crate) fn name_of(&self, range: HostRange) -> RangeName {
        RangeName::new(range, self.array())
    }
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Entry");
        if self.name.is_some() {
            d.field("name", &format_args!("{}", self.name_of(self.range)));
        }
        d.field("range", &self.range)
            .field("device_addr", &format_args!("{:#x}", self.device_addr))
            .field("base", &format_args!("{:#x}", self.base))
            .field("ref_count", &format_args!("{}", self.ref_count_text()))
            .field("hold_count", &self.hold_count)
            .field("associated", &self.associated)
            .field("registered", &self.registered)
            .field("maps_from", &self.maps_from)
            .finish()
    }
}

/// The entry as a line: its name (when its map gave one), host range, device address and
/// counts, addresses in hex (`a[0:8] host 0x..0x.. (32 bytes) -> device 0x.., ref count 1
/// hold count 0`).
impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.is_some() {
            write!(f, "{} ", self.name_of(self.range))?;
        }
        write!(
            f,
            "{} -> device {:#x}, ref count {} hold count {}",
            self.range,
            self.device_addr,
            self.ref_count_text(),
            self.hold_count
        )
    }
}

impl Entry {
    /// Device address of host address `host`, which must lie in (or at the end of) the entry.
    pub fn translate(&self, host: usize) -> u64 {
        self.device_addr + (host - self.range.begin) as u64
    }

    /// With host base pointer `base` (kept only when it lies below `range.begin`: C's
    /// sections never start before their base).
    pub(crate) fn based_at(mut self, base: Option<usize>) -> Self {
        self.base = base.filter(|&b| b < self.range.begin).unwrap_or(self.range.begin);
        self
    }

    /// The device address that corresponds to host address `host` by the entry's offset,
    /// for any `host` (C's pointer arithmetic, wrapping: `use_device_ptr` of a base below
    /// the mapped section).
    pub fn translate_any(&self, host: usize) -> u64 {
        self.device_addr.wrapping_add(host.wrapping_sub(self.range.begin) as u64)
    }

    /// Whether both counts are zero (and it is not associated): the entry leaves.
    pub fn is_released(&self) -> bool {
        !self.associated && self.ref_count == 0 && self.hold_count == 0
    }

    /// The reference count as traces and dumps show it (`inf` for associated entries).
    pub fn ref_count_text(&self) -> String {
        if self.associated {
            "inf".into()
        } else {
            self.ref_count.to_string()
        }
    }
}

/// What a lookup of a host range found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// No entry overlaps the range.
    Absent,
    /// The range lies inside the entry that begins at this key.
    Inside(usize),
    /// The range overlaps this entry but is not inside it.
    Extends(HostRange),
}

/// Host-address-keyed table of one device's mappings.
#[derive(Default, Debug)]
pub(crate) struct PresentTable {
    entries: BTreeMap<usize, Entry>,
    /// Each entry's end by its begin: the searches by containment walk this compact tree
    /// (16 bytes an entry, where an entry is 80) and touch `entries` only for what they
    /// find, so a presence test among 100 000 entries stays in the caches.
    ends: BTreeMap<usize, usize>,
    /// Device blocks that launches or copies made without the lock are using, by device
    /// address: with one reference count, another thread's exit may end their entry
    /// meanwhile, and then the block is freed by its last user, not by the exit.
    in_use: HashMap<u64, BlockInUse>,
    /// Host ranges in transit: entries a construct created and has not published yet (their
    /// copies in are running), and entries an exit took out whose copies back are running.
    /// Another construct entering any of these bytes waits until the range leaves this
    /// list, so that each construct's entry and exit steps are atomic as OpenMP requires
    /// (5.2, 5.8.3): it neither maps anew from a host value about to be overwritten by a
    /// copy back, nor makes a second device copy beside one about to be published. A
    /// multiset, by (begin, end), with each range's number of occurrences: the same range may
    /// be in transit twice (an exit and, after it, an entry).
    transit: BTreeMap<(usize, usize), u32>,
    /// The longest range in transit (0 when none): a search for overlaps starts that far
    /// below the probe, so it is a descent of the tree, not a scan.
    transit_span: usize,
    /// The names of named entries that have left the table, newest last, at most
    /// [`GONE_NAMES`]: trace lines about their ranges after the mapping ended (a zero-length
    /// exit, an update or exit skipped as absent) still give the program's name. A name is
    /// forgotten once an entry is made over any of its bytes. Kept only when `remember`.
    gone: std::collections::VecDeque<(HostRange, ArrayName)>,
    /// Whether names of removed entries are kept (a trace may read them).
    remember: bool,
}

/// How many names of removed entries a table keeps ([`PresentTable::name_of`]).
const GONE_NAMES: usize = 64;

/// Users of one device block, and its entry once that has left the table.
#[derive(Default, Debug)]
struct BlockInUse {
    users: u32,
    retired: Option<Entry>,
}

impl PresentTable {
    /// An empty table; one that keeps the names of the entries that leave it when
    /// `remember_names` (traces name ranges by them: [`PresentTable::name_of`]).
    pub(crate) fn new(remember_names: bool) -> Self {
        Self { remember: remember_names, ..Self::default() }
    }

    /// Finds the entry a request for `r` refers to. A zero-length range is inside an entry
    /// when its address lies in `[begin, end)`, or, as libomptarget's lookup of a zero-length
    /// section reads OpenMP 5.1's pointer initialisation, in `[base, begin)` of the next
    /// entry above it (see [`Entry::base`]); it never "extends" anything.
    pub(crate) fn lookup(&self, r: HostRange) -> Lookup {
        let found = |k: usize, end: usize| {
            let e = HostRange::new(k, end - k);
            if e.contains(&r) {
                Lookup::Inside(k)
            } else {
                Lookup::Extends(e)
            }
        };
        // Most maps name a range from its first byte: one exact descent answers those.
        // (The general search below gives the same answer for them.)
        if let Some(&end) = self.ends.get(&r.begin) {
            return found(r.begin, end);
        }
        if let Some((&k, &end)) = self.ends.range(..=r.begin).next_back() {
            if r.begin < end || (end == k && r.begin == k) {
                return found(k, end);
            }
        }
        if r.bytes == 0 {
            // Only entries whose map named a base below them reach further down.
            use std::ops::Bound::{Excluded, Unbounded};
            return match self.entries.range((Excluded(r.begin), Unbounded)).next() {
                Some((&k, e)) if e.base <= r.begin => Lookup::Inside(k),
                _ => Lookup::Absent,
            };
        }
        match self.ends.range(r.begin + 1..r.end()).next() {
            Some((&k, &end)) => Lookup::Extends(HostRange::new(k, end - k)),
            None => Lookup::Absent,
        }
    }

    /// The entry a zero-length section at host address `host` names ([`PresentTable::lookup`]).
    pub(crate) fn named_by_zero_length(&self, host: usize) -> Option<&Entry> {
        match self.lookup(HostRange::new(host, 0)) {
            Lookup::Inside(k) => self.entries.get(&k),
            Lookup::Absent | Lookup::Extends(_) => None,
        }
    }

    pub(crate) fn get(&self, key: usize) -> Option<&Entry> {
        self.entries.get(&key)
    }

    pub(crate) fn get_mut(&mut self, key: usize) -> Option<&mut Entry> {
        self.entries.get_mut(&key)
    }

    /// The entry containing host address `host`, if any (one descent of the tree: this is
    /// the lookup every presence test and kernel argument pays).
    pub(crate) fn containing(&self, host: usize) -> Option<&Entry> {
        self.containing_key(host).and_then(|k| self.entries.get(&k))
    }

    /// Whether host address `host` lies in a mapped range (`is_present`: the compact tree
    /// alone).
    pub(crate) fn is_mapped(&self, host: usize) -> bool {
        self.containing_key(host).is_some()
    }

    fn containing_key(&self, host: usize) -> Option<usize> {
        let (&k, &end) = self.ends.range(..=host).next_back()?;
        (host < end || (end == k && host == k)).then_some(k)
    }

    pub(crate) fn insert(&mut self, e: Entry) {
        if !self.gone.is_empty() {
            let r = e.range;
            // Zero-length ranges count as their one address here.
            let end = |x: &HostRange| x.end().max(x.begin.saturating_add(1));
            self.gone.retain(|(g, _)| end(g) <= r.begin || end(&r) <= g.begin);
        }
        self.ends.insert(e.range.begin, e.range.end());
        let old = self.entries.insert(e.range.begin, e);
        debug_assert!(old.is_none(), "insert over an existing entry");
    }

    pub(crate) fn remove(&mut self, key: usize) -> Option<Entry> {
        self.ends.remove(&key);
        let e = self.entries.remove(&key)?;
        if let Some(a) = e.array().filter(|_| self.remember) {
            if self.gone.len() == GONE_NAMES {
                self.gone.pop_front();
            }
            self.gone.push_back((e.range, a));
        }
        Some(e)
    }

    /// Counts one more user of the device block at `device_addr` (an entry's).
    pub(crate) fn pin(&mut self, device_addr: u64) {
        self.in_use.entry(device_addr).or_default().users += 1;
    }

    /// Ends one use of the block at `device_addr`; its entry, to free, when that left the
    /// table meanwhile and this was the last use.
    pub(crate) fn unpin(&mut self, device_addr: u64) -> Option<Entry> {
        let b = self.in_use.get_mut(&device_addr)?;
        b.users = b.users.saturating_sub(1);
        if b.users > 0 {
            return None;
        }
        self.in_use.remove(&device_addr).and_then(|b| b.retired)
    }

    /// Takes an entry that has left the table: given back to be freed now, or kept for
    /// the last user of its block to free ([`PresentTable::unpin`]).
    pub(crate) fn retire(&mut self, e: Entry) -> Option<Entry> {
        match self.in_use.get_mut(&e.device_addr) {
            Some(b) if b.users > 0 => {
                b.retired = Some(e);
                None
            }
            _ => Some(e),
        }
    }

    /// Puts `r` in transit ([`PresentTable::in_transit`]) until [`PresentTable::end_transit`].
    pub(crate) fn begin_transit(&mut self, r: HostRange) {
        *self.transit.entry((r.begin, r.end())).or_default() += 1;
        self.transit_span = self.transit_span.max(r.bytes);
    }

    /// Takes one occurrence of `r` out of transit.
    pub(crate) fn end_transit(&mut self, r: HostRange) {
        if let std::collections::btree_map::Entry::Occupied(mut o) = self.transit.entry((r.begin, r.end())) {
            *o.get_mut() -= 1;
            if *o.get() == 0 {
                o.remove();
            }
        }
        if self.transit.is_empty() {
            self.transit_span = 0;
        }
    }

    /// Whether any byte of `r` is in transit (a zero-length `r`: whether its address is in
    /// or at the start of a range in transit, as a zero-length lookup finds an entry).
    pub(crate) fn in_transit(&self, r: HostRange) -> bool {
        if self.transit.is_empty() {
            return false;
        }
        let overlaps = |&(begin, end): &(usize, usize)| {
            let t = HostRange::new(begin, end - begin);
            if r.bytes == 0 || t.bytes == 0 {
                let (point, span) = if r.bytes == 0 { (r.begin, t) } else { (t.begin, r) };
                point == span.begin || (span.begin < point && point < span.end())
            } else {
                r.begin < t.end() && t.begin < r.end()
            }
        };
        let from = (r.begin.saturating_sub(self.transit_span), 0);
        self.transit.range(from..).take_while(|((begin, _), _)| *begin <= r.end()).any(|(k, _)| overlaps(k))
    }

    /// Entries that have left the table whose blocks queued work still uses.
    pub(crate) fn retired_count(&self) -> usize {
        self.in_use.values().filter(|b| b.retired.is_some()).count()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// The table as text, one row per entry, in the manner of libomptarget's
    /// "Host-Device pointer mappings" dump.
    pub(crate) fn dump(&self, device: usize) -> String {
        let mut s = format!(
            "device {device} present table ({} entries)\n{:>18} {:>18} {:>10} {:>9} {:>6} name\n",
            self.entries.len(),
            "host",
            "device",
            "bytes",
            "ref count",
            "hold"
        );
        for e in self.entries.values() {
            let _ = write!(
                s,
                "{:>#18x} {:>#18x} {:>10} {:>9} {:>6}",
                e.range.begin,
                e.device_addr,
                e.range.bytes,
                e.ref_count_text(),
                e.hold_count
            );
            let _ = match e.name {
                Some(_) => writeln!(s, " {}", e.name_of(e.range)),
                None => writeln!(s),
            };
        }
        s
    }

    /// How traces name `range`: as an element section of the named entry it starts in
    /// (`a[256:128]`), or else of the latest named entry that held its first byte and has
    /// left the table; else by its bytes.
    pub(crate) fn name_of(&self, range: HostRange) -> RangeName {
        let array = match self.containing(range.begin) {
            Some(e) => e.array(),
            None => self.gone_name(range.begin),
        };
        RangeName::new(range, array)
    }

    /// The name of the latest named entry that held `host` and has left the table.
    pub(crate) fn gone_name(&self, host: usize) -> Option<ArrayName> {
        let held = |g: &HostRange| g.begin <= host && (host < g.end() || host == g.begin);
        self.gone.iter().rev().find(|(g, _)| held(g)).map(|&(_, a)| a)
    }

    /// The entries that share a byte with `r`, in address order.
    pub(crate) fn overlapping(&self, r: HostRange) -> impl Iterator<Item = &Entry> {
        // The entry containing `r.begin` (begins below it), then those beginning inside `r`.
        let below = self.containing(r.begin).filter(|e| e.range.begin < r.begin && r.bytes > 0);
        let inside = self.entries.range(r.begin..r.end()).map(|(_, e)| e).filter(|e| e.range.bytes > 0);
        below.into_iter().chain(inside)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(ranges: &[(usize, usize)]) -> PresentTable {
        let mut t = PresentTable::default();
        for &(b, n) in ranges {
            let mut e = Entry::new(HostRange::new(b, n), 0x10_0000 + b as u64, false);
            e.ref_count = 1;
            t.insert(e);
        }
        t
    }

    #[test]
    fn lookup_by_containment() {
        let t = table(&[(100, 10), (200, 10)]);
        assert_eq!(t.lookup(HostRange::new(100, 10)), Lookup::Inside(100));
        assert_eq!(t.lookup(HostRange::new(105, 5)), Lookup::Inside(100));
        assert_eq!(t.lookup(HostRange::new(110, 10)), Lookup::Absent);
        assert_eq!(t.lookup(HostRange::new(50, 10)), Lookup::Absent);
    }

    #[test]
    fn partial_overlaps_are_extensions() {
        let t = table(&[(100, 10)]);
        assert_eq!(t.lookup(HostRange::new(105, 10)), Lookup::Extends(HostRange::new(100, 10)));
        assert_eq!(t.lookup(HostRange::new(95, 10)), Lookup::Extends(HostRange::new(100, 10)));
        assert_eq!(t.lookup(HostRange::new(90, 40)), Lookup::Extends(HostRange::new(100, 10)));
    }

    #[test]
    fn zero_length_is_present_only_inside() {
        let t = table(&[(100, 10)]);
        assert_eq!(t.lookup(HostRange::new(100, 0)), Lookup::Inside(100));
        assert_eq!(t.lookup(HostRange::new(109, 0)), Lookup::Inside(100));
        assert_eq!(t.lookup(HostRange::new(110, 0)), Lookup::Absent);
        assert_eq!(t.lookup(HostRange::new(99, 0)), Lookup::Absent);
        assert_eq!(t.containing(105).map(|e| e.translate(105)), Some(0x10_0000 + 105));
    }

    #[test]
    fn zero_length_reaches_down_to_a_base_below_the_entry() {
        // map(A[16:8]) with base A = 84: a zero-length lookup of 84..100 finds it (as
        // libomptarget's), a sized one does not, and nothing below the base does.
        let mut t = PresentTable::default();
        t.insert(Entry::new(HostRange::new(100, 8), 0x5000, false).based_at(Some(84)));
        assert_eq!(t.lookup(HostRange::new(84, 0)), Lookup::Inside(100));
        assert_eq!(t.lookup(HostRange::new(99, 0)), Lookup::Inside(100));
        assert_eq!(t.lookup(HostRange::new(83, 0)), Lookup::Absent);
        assert_eq!(t.lookup(HostRange::new(84, 4)), Lookup::Absent);
        assert!(!t.is_mapped(84));
        assert_eq!(t.get(100).map(|e| e.translate_any(84)), Some(0x5000 - 16));
        // A base above the section is not kept; the top of the address space is no edge.
        assert_eq!(Entry::new(HostRange::new(100, 8), 0, false).based_at(Some(104)).base, 100);
        assert_eq!(t.lookup(HostRange::new(usize::MAX, 0)), Lookup::Absent);
    }

    #[test]
    fn ranges_in_transit_are_found_by_any_byte_and_leave_once_each() {
        let mut t = PresentTable::default();
        let r = HostRange::new(100, 10);
        t.begin_transit(r);
        // An exit's copy back, then an entry of the same range.
        t.begin_transit(r);
        for (probe, hit) in [((95, 5), false), ((95, 6), true), ((109, 4), true), ((110, 4), false)] {
            assert_eq!(t.in_transit(HostRange::new(probe.0, probe.1)), hit, "{probe:?}");
        }
        // Zero-length probes: an address inside, or the start; not one past the end.
        assert!(t.in_transit(HostRange::new(100, 0)) && t.in_transit(HostRange::new(109, 0)));
        assert!(!t.in_transit(HostRange::new(110, 0)) && !t.in_transit(HostRange::new(99, 0)));
        t.end_transit(r);
        assert!(t.in_transit(r), "one occurrence is still in transit");
        t.end_transit(r);
        assert!(!t.in_transit(r));
        // Ending what is not in transit changes nothing.
        t.end_transit(r);
        // A zero-length range in transit holds its address only.
        t.begin_transit(HostRange::new(200, 0));
        assert!(t.in_transit(HostRange::new(190, 11)) && !t.in_transit(HostRange::new(190, 10)));
    }

    #[test]
    fn a_retired_entry_waits_for_the_last_user_of_its_block() {
        let mut t = table(&[(100, 10)]);
        let addr = t.get(100).map(|e| e.device_addr).unwrap();
        t.pin(addr);
        t.pin(addr);
        let e = t.remove(100).unwrap();
        assert!(t.retire(e).is_none(), "a block in use is not freed by the exit");
        assert!(t.unpin(addr).is_none());
        assert_eq!(t.unpin(addr).map(|e| e.range), Some(HostRange::new(100, 10)));
        // Not in use: given back at once; unpinning an unknown block is harmless.
        let e = t.remove(200).or_else(|| Some(Entry::new(HostRange::new(200, 4), 7, false))).unwrap();
        assert!(t.retire(e).is_some());
        assert!(t.unpin(12345).is_none());
    }

    #[test]
    fn named_entries_name_their_sections_in_elements() {
        let mut t = table(&[(100, 40), (200, 10)]);
        let a = crate::MapItem::new(HostRange::new(100, 40), crate::MapType::TOFROM);
        let a = crate::MapItem { elem_size: 4, ..a.named("a") };
        t.get_mut(100).unwrap().note_map(&a);
        assert_eq!(t.name_of(HostRange::new(100, 40)).to_string(), "a[0:10]");
        assert_eq!(t.name_of(HostRange::new(108, 8)).to_string(), "a[2:2]");
        assert_eq!(t.name_of(HostRange::new(101, 2)).to_string(), "a(bytes 1..3)");
        assert_eq!(t.name_of(HostRange::new(200, 4)).to_string(), HostRange::new(200, 4).to_string());
        assert!(t.get(100).is_some_and(|e| e.maps_from));
        // A named entry's name is kept; an unnamed one takes only a whole-range name.
        t.get_mut(100).unwrap().note_map(&crate::MapItem { name: Some("b"), ..a });
        t.get_mut(200).unwrap().note_map(&a);
        assert_eq!((t.get(100).unwrap().name, t.get(200).unwrap().name), (Some("a"), None));
        let d = t.dump(0);
        assert!(d.lines().nth(2).is_some_and(|l| l.ends_with(" a[0:10]")), "{d}");
        assert!(format!("{:?}", t.get(100).unwrap()).contains("device_addr: 0x100064"));
    }

    #[test]
    fn overlapping_finds_every_entry_sharing_a_byte() {
        let t = table(&[(100, 10), (110, 10), (130, 10)]);
        let of = |b, n| t.overlapping(HostRange::new(b, n)).map(|e| e.range.begin).collect::<Vec<_>>();
        assert_eq!(of(105, 10), [100, 110]);
        assert_eq!(of(100, 40), [100, 110, 130]);
        assert_eq!(of(120, 10), Vec::<usize>::new());
        assert_eq!(of(139, 5), [130]);
        assert_eq!(of(105, 0), Vec::<usize>::new());
    }

    #[test]
    fn dump_has_a_row_per_entry() {
        let t = table(&[(100, 10), (200, 10)]);
        let d = t.dump(3);
        assert!(d.starts_with("device 3 present table (2 entries)"));
        assert_eq!(d.lines().count(), 4);
    }

    /// A named entry that leaves the table still names its range's sections, until an
    /// entry is made over any of its bytes; only the latest `GONE_NAMES` are kept.
    #[test]
    fn names_outlive_their_entries_until_remapped() {
        let mut t = PresentTable::new(true);
        let named = |begin: usize, bytes: usize, name: &'static str| {
            let mut e = Entry::new(HostRange::new(begin, bytes), 0x9000, false);
            e.note_map(&crate::MapItem::new(HostRange::new(begin, bytes), crate::MapType::TO).named(name));
            e
        };
        t.insert(named(0x1000, 64, "a"));
        assert!(t.remove(0x1000).is_some());
        assert_eq!(t.name_of(HostRange::new(0x1010, 16)).to_string(), "a[16:16]");
        assert_eq!(t.name_of(HostRange::new(0x1000, 0)).to_string(), "a[0:0]");
        assert!(t.name_of(HostRange::new(0x1040, 4)).array.is_none(), "past the end");
        // An unnamed entry over some of its bytes: the name is forgotten.
        t.insert(Entry::new(HostRange::new(0x1030, 4), 0xa000, false));
        assert!(t.remove(0x1030).is_some());
        assert!(t.name_of(HostRange::new(0x1000, 4)).array.is_none());
        // Only the latest GONE_NAMES are kept.
        for k in 0..=GONE_NAMES {
            let begin = 0x10_0000 + 0x100 * k;
            t.insert(named(begin, 16, "b"));
            assert!(t.remove(begin).is_some());
        }
        assert!(t.name_of(HostRange::new(0x10_0000, 4)).array.is_none(), "the oldest was dropped");
        assert!(t.name_of(HostRange::new(0x10_0100, 4)).array.is_some());
        // A table nobody traces keeps no names.
        let mut t = PresentTable::new(false);
        t.insert(named(0x1000, 64, "a"));
        assert!(t.remove(0x1000).is_some());
        assert!(t.name_of(HostRange::new(0x1000, 4)).array.is_none());
    }
}
