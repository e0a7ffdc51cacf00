//! A model-based property test of the device data environment.
//!
//! A small reference model of docs/SEMANTICS.md's rules (one present table per device with
//! reference and hold counts, the copies each construct makes, presence, and the contents
//! of the host array and of every device copy) runs beside the runtime. Random sequences
//! of constructs over overlapping and nested ranges of one host array, on two or three
//! devices, go to both; after every step the test compares whether the construct
//! succeeded, every device's table (ranges and counts), the host array and every device
//! copy. `proptest` shrinks a divergence to a minimal sequence and prints it.
//!
//! The normal run makes at least [`OPERATIONS`] operations per backend; the ignored test
//! [`one_million_operations`] makes ten times as many
//! (`cargo test -p offload-tests --release --test model -- --ignored`).

use std::collections::{BTreeMap, HashMap, HashSet};

use offload::backend::{FaultKind, FaultPlan};
use offload::{LaunchArg, MapItem, MapKind, MapType, Result, Runtime, Scalar, UpdateDirection};
use offload_tests::{backends, read_device};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

/// Elements of the host array every sequence maps parts of.
const ARENA: usize = 64;
/// Most operations in one sequence.
const STEPS: usize = 100;
/// Operations the normal run makes per backend, and again with faults on host devices.
const OPERATIONS: u64 = 100_000;

/// A device operation that fails during a step: the `nth` operation of `kind` the step's
/// device makes from the step's start (an allocation fails with the one after it, so that
/// the pool's retry after giving back its cached blocks fails too).
#[derive(Clone, Copy, Debug)]
struct Fault {
    kind: FaultKind,
    nth: u64,
}

/// One step: an operation, and the device operation that fails during it (fault runs).
#[derive(Clone, Debug)]
struct Step {
    op: Op,
    fault: Option<Fault>,
}

/// A range of the host array, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Span {
    start: usize,
    len: usize,
}

impl Span {
    fn end(self) -> usize {
        self.start + self.len
    }
    fn contains(self, o: Span) -> bool {
        o.start >= self.start && o.end() <= self.end()
    }
}

/// One map item of a generated construct.
#[derive(Clone, Copy, Debug)]
struct Item {
    span: Span,
    kind: MapKind,
    always: bool,
    present: bool,
    hold: bool,
}

impl Item {
    fn map_type(self) -> MapType {
        let mut t = MapType {
            kind: self.kind,
            always: self.always,
            present: self.present,
            hold: false,
            implicit: false,
        };
        if self.hold {
            t = t.hold();
        }
        t
    }
    fn copies_in(self) -> bool {
        self.map_type().copies_in()
    }
    fn copies_out(self) -> bool {
        self.map_type().copies_out()
    }
}

/// One step of a sequence.
#[derive(Clone, Debug)]
enum Op {
    /// `target enter data`.
    Enter { dev: usize, items: Vec<Item> },
    /// `target exit data`.
    Exit { dev: usize, items: Vec<Item> },
    /// `target data` begins (a region opens on the device).
    Begin { dev: usize, items: Vec<Item> },
    /// The device's innermost open region ends (nothing when none is open).
    End { dev: usize },
    /// `target update to/from`.
    Update { dev: usize, to: bool, span: Span, present: bool },
    /// The host program writes `value` into a range.
    HostWrite { span: Span, value: i32 },
    /// A kernel writes `value` into the device copy of a range (only when it is mapped).
    DeviceWrite { dev: usize, span: Span, value: i32 },
    /// `omp_target_associate_ptr` with a fresh, zeroed `target_alloc` block.
    Associate { dev: usize, span: Span },
    /// `omp_target_disassociate_ptr` at an element.
    Disassociate { dev: usize, at: usize },
}

fn span() -> impl Strategy<Value = Span> {
    // Even starts and a few lengths make nested, overlapping and equal ranges common.
    (0..ARENA / 2, prop::sample::select(vec![0usize, 1, 2, 4, 8, 16, 32, 64]))
        .prop_map(|(k, len)| Span { start: 2 * k, len: len.min(ARENA - 2 * k) })
}

fn items(kinds: &'static [MapKind], hold: bool) -> impl Strategy<Value = Vec<Item>> {
    let item = (span(), prop::sample::select(kinds), any::<[bool; 3]>()).prop_map(move |(span, kind, f)| {
        // `always` and `present` on a quarter of the items each; `hold` on half (regions).
        Item { span, kind, always: f[0] && f[1], present: f[1] && f[2], hold: hold && f[2] }
    });
    prop::collection::vec(item, 1..4)
}

fn op(devices: usize) -> impl Strategy<Value = Op> {
    use MapKind::*;
    let dev = 0..devices;
    prop_oneof![
        3 => (dev.clone(), items(&[To, ToFrom, Alloc], false)).prop_map(|(dev, items)| Op::Enter { dev, items }),
        3 => (dev.clone(), items(&[From, ToFrom, Release, Delete], false))
            .prop_map(|(dev, items)| Op::Exit { dev, items }),
        2 => (dev.clone(), items(&[To, From, ToFrom, Alloc], true)).prop_map(|(dev, items)| Op::Begin { dev, items }),
        2 => dev.clone().prop_map(|dev| Op::End { dev }),
        2 => (dev.clone(), any::<bool>(), span(), any::<bool>())
            .prop_map(|(dev, to, span, present)| Op::Update { dev, to, span, present }),
        2 => (span(), 1..1000i32).prop_map(|(span, value)| Op::HostWrite { span, value }),
        2 => (dev.clone(), span(), 1..1000i32).prop_map(|(dev, span, value)| Op::DeviceWrite { dev, span, value }),
        1 => (dev.clone(), span()).prop_map(|(dev, span)| Op::Associate { dev, span }),
        1 => (dev, 0..ARENA).prop_map(|(dev, at)| Op::Disassociate { dev, at }),
    ]
}

/// Steps of [`op`], half of them with a fault when `faults`: an operation of a kind the
/// step may make (the others would not fail).
fn step(devices: usize, faults: bool) -> impl Strategy<Value = Step> {
    // Mostly the first operation of the kind: most steps make one.
    let nth = prop_oneof![3 => Just(1u64), 1 => Just(2u64)];
    let fault =
        if faults { prop::option::weighted(0.5, (any::<u8>(), nth)).boxed() } else { Just(None).boxed() };
    (op(devices), fault).prop_map(|(op, fault)| {
        let fault = fault.map(|(pick, nth)| {
            let kinds = kinds_of(&op);
            Fault { kind: kinds[pick as usize % kinds.len()], nth }
        });
        Step { op, fault }
    })
}

/// The kinds of device operation a step may make whose failure the step itself reports
/// (an event's wait is left out: it may be a later construct's, or a query's).
fn kinds_of(op: &Op) -> &'static [FaultKind] {
    use FaultKind::*;
    match op {
        Op::Enter { .. } | Op::Begin { .. } => &[Alloc, CopyIn],
        Op::Exit { .. } | Op::End { .. } => &[CopyOut],
        Op::Update { to: true, .. } => &[CopyIn],
        Op::Update { to: false, .. } => &[CopyOut],
        Op::DeviceWrite { .. } => &[Launch],
        Op::Associate { .. } => &[Alloc, Fill],
        Op::HostWrite { .. } | Op::Disassociate { .. } => &[CopyIn],
    }
}

/// The device a step's fault is armed on: the op's device (a host write has none).
fn device_of(op: &Op) -> Option<usize> {
    match op {
        Op::Enter { dev, .. }
        | Op::Exit { dev, .. }
        | Op::Begin { dev, .. }
        | Op::End { dev }
        | Op::Update { dev, .. }
        | Op::DeviceWrite { dev, .. }
        | Op::Associate { dev, .. }
        | Op::Disassociate { dev, .. } => Some(*dev),
        Op::HostWrite { .. } => None,
    }
}

/// A value the model knows, or `None` for bytes nobody wrote (fresh device memory, and
/// what was copied from it).
type Cell = Option<i32>;

/// One entry of the model's present table (keyed by its start element).
#[derive(Clone, Debug)]
struct ModelEntry {
    len: usize,
    ref_count: u64,
    hold_count: u64,
    associated: bool,
    data: Vec<Cell>,
}

impl ModelEntry {
    fn released(&self) -> bool {
        !self.associated && self.ref_count == 0 && self.hold_count == 0
    }
    fn inc(&mut self, hold: bool) {
        if hold {
            self.hold_count += 1;
        } else if !self.associated {
            self.ref_count += 1;
        }
    }
}

/// What a lookup of a span found.
enum Look {
    Absent,
    Inside(usize),
    Extends,
}

/// The reference model: the host array and each device's table.
#[derive(Clone, Debug)]
struct Model {
    host: Vec<Cell>,
    tables: Vec<BTreeMap<usize, ModelEntry>>,
}

fn lookup(t: &BTreeMap<usize, ModelEntry>, s: Span) -> Look {
    if let Some((&k, e)) = t.range(..=s.start).next_back() {
        if s.start < k + e.len {
            return if k + e.len >= s.end() { Look::Inside(k) } else { Look::Extends };
        }
    }
    if s.len == 0 {
        return Look::Absent;
    }
    match t.range(s.start + 1..s.end()).next() {
        Some(_) => Look::Extends,
        None => Look::Absent,
    }
}

impl Model {
    fn new(devices: usize, host: &[i32]) -> Self {
        Self { host: host.iter().map(|&v| Some(v)).collect(), tables: vec![BTreeMap::new(); devices] }
    }

    /// Enter half of `target data` or `enter data`: `Err` when the construct must fail (and
    /// then nothing changed).
    fn enter(&mut self, dev: usize, items: &[Item]) -> std::result::Result<(), ()> {
        let t = &self.tables[dev];
        for it in items {
            match lookup(t, it.span) {
                Look::Extends => return Err(()),
                Look::Absent if it.present => return Err(()),
                _ => {}
            }
        }
        // New entries by start: (len, counts ref, counts hold); list order kept.
        let mut planned: BTreeMap<usize, (usize, bool, bool)> = BTreeMap::new();
        let mut counted: Vec<(usize, bool)> = Vec::new();
        let mut seen = HashSet::new();
        let mut copies: Vec<(Span, usize)> = Vec::new();
        // A zero-length item stands for the entry it lies in, and creates none (rule 6).
        for it in items {
            let s = it.span;
            let overlapping: Vec<usize> = planned
                .iter()
                .filter(|(&k, p)| (k < s.end() || k == s.start) && s.start < k + p.0)
                .map(|(&k, _)| k)
                .collect();
            if let Some(&k) = overlapping.first() {
                let p = planned.get_mut(&k).expect("just found");
                if !(Span { start: k, len: p.0 }).contains(s) {
                    return Err(());
                }
                if it.hold {
                    p.2 = true;
                } else {
                    p.1 = true;
                }
                if it.copies_in() {
                    copies.push((s, k));
                }
                continue;
            }
            match lookup(t, s) {
                Look::Inside(k) => {
                    if seen.insert((k, it.hold)) {
                        counted.push((k, it.hold));
                    }
                    if it.copies_in() && it.always {
                        copies.push((s, k));
                    }
                }
                Look::Extends => return Err(()),
                Look::Absent if s.len == 0 => {}
                Look::Absent => {
                    planned.insert(s.start, (s.len, !it.hold, it.hold));
                    if it.copies_in() {
                        copies.push((s, s.start));
                    }
                }
            }
        }
        let t = &mut self.tables[dev];
        for (k, hold) in counted {
            if let Some(e) = t.get_mut(&k) {
                e.inc(hold);
            }
        }
        for (k, (len, r, h)) in planned {
            let e = ModelEntry {
                len,
                ref_count: r as u64,
                hold_count: h as u64,
                associated: false,
                data: vec![None; len],
            };
            t.insert(k, e);
        }
        for (s, k) in copies {
            if let Some(e) = t.get_mut(&k) {
                e.data[s.start - k..s.end() - k].copy_from_slice(&self.host[s.start..s.end()]);
            }
        }
        Ok(())
    }

    /// Exit half of `target data` (`region`) or `exit data`.
    fn exit(&mut self, dev: usize, items: &[Item], region: bool) -> std::result::Result<(), ()> {
        let t = &mut self.tables[dev];
        let mut keys = Vec::new();
        for it in items {
            let k = match lookup(t, it.span) {
                Look::Inside(k) => Some(k),
                _ if it.present && !region => return Err(()),
                _ => None,
            };
            keys.push(k);
        }
        // Per entry: (moves ref, moves hold, delete).
        let mut touched: HashMap<usize, (bool, bool, bool)> = HashMap::new();
        for (it, k) in items.iter().zip(&keys) {
            if let Some(k) = *k {
                let m = touched.entry(k).or_default();
                m.0 |= !it.hold;
                m.1 |= it.hold;
                m.2 |= it.kind == MapKind::Delete;
            }
        }
        for (k, (r, h, delete)) in &touched {
            let e = t.get_mut(k).expect("touched entries exist");
            if *h {
                e.hold_count = e.hold_count.saturating_sub(1);
            }
            if *r && !e.associated {
                e.ref_count = if *delete { 0 } else { e.ref_count.saturating_sub(1) };
            }
        }
        for (it, k) in items.iter().zip(&keys).rev() {
            let Some(k) = *k else { continue };
            let e = &t[&k];
            if it.copies_out() && (it.always || e.released()) {
                let s = it.span;
                self.host[s.start..s.end()].copy_from_slice(&e.data[s.start - k..s.end() - k]);
            }
        }
        t.retain(|_, e| !e.released());
        Ok(())
    }

    /// The state after a construct failed on a device operation, from the state before it
    /// (`self`) and the one its success would have given: what R9 says a failure leaves.
    /// Every construct but a region's end is all or nothing, so its tables and counts are
    /// as before; a region's end cannot be undone, so its entries leave as on success.
    /// Data a copy or kernel may have written part of is unknown.
    fn after_failure(&self, succeeded: &Model, region_end: bool) -> Model {
        let mut m = if region_end { succeeded.clone() } else { self.clone() };
        for (i, cell) in m.host.iter_mut().enumerate() {
            if self.host[i] != succeeded.host[i] {
                *cell = None;
            }
        }
        for (dev, table) in m.tables.iter_mut().enumerate() {
            for (k, e) in table.iter_mut() {
                let (Some(b), Some(s)) = (self.tables[dev].get(k), succeeded.tables[dev].get(k)) else {
                    continue;
                };
                for (j, cell) in e.data.iter_mut().enumerate() {
                    if b.data.get(j) != s.data.get(j) {
                        *cell = None;
                    }
                }
            }
        }
        m
    }

    fn update(&mut self, dev: usize, to: bool, s: Span, present: bool) -> std::result::Result<(), ()> {
        let t = &mut self.tables[dev];
        match lookup(t, s) {
            Look::Inside(k) if s.len > 0 => {
                let e = t.get_mut(&k).expect("found");
                let (d, h) = (&mut e.data[s.start - k..s.end() - k], &mut self.host[s.start..s.end()]);
                if to {
                    d.copy_from_slice(h);
                } else {
                    h.copy_from_slice(d);
                }
                Ok(())
            }
            Look::Inside(_) => Ok(()),
            _ if present => Err(()),
            _ => Ok(()),
        }
    }
}

/// The runtime side of one sequence: the host array, open regions and associated blocks.
struct Harness<'rt> {
    rt: &'rt Runtime,
    host: Vec<i32>,
    regions: Vec<Vec<Vec<Item>>>,
    blocks: Vec<(usize, usize, u64)>,
}

impl<'rt> Harness<'rt> {
    fn new(rt: &'rt Runtime) -> Self {
        let devices = rt.num_devices();
        Self { rt, host: (0..ARENA as i32).collect(), regions: vec![Vec::new(); devices], blocks: Vec::new() }
    }

    fn base(&mut self) -> *mut i32 {
        self.host.as_mut_ptr()
    }

    fn list(&mut self, items: &[Item]) -> Vec<MapItem> {
        let base = self.base();
        // SAFETY (of later use): the spans lie inside `host`, which lives as long as `self`.
        items
            .iter()
            .map(|it| MapItem::raw(base.wrapping_add(it.span.start), it.span.len * 4, it.map_type()))
            .collect()
    }

    /// Runs `op`; `Ok(None)` when the op does not apply (nothing was done).
    fn apply(&mut self, op: &Op, model: &Model) -> Result<Option<Result<()>>> {
        let rt = self.rt;
        Ok(Some(match op {
            Op::Enter { dev, items } => {
                let l = self.list(items);
                // SAFETY: the host array outlives the mapping (cleaned up at the end).
                unsafe { rt.enter_data(*dev, &l) }
            }
            Op::Exit { dev, items } => {
                let l = self.list(items);
                // SAFETY: `from` copies write into the host array, borrowed by no one now.
                unsafe { rt.exit_data(*dev, &l) }
            }
            Op::Begin { dev, items } => {
                let l = self.list(items);
                // SAFETY: as for enter; the matching end runs in `End` or at clean-up.
                let r = unsafe { rt.target_data_begin(*dev, &l) };
                if r.is_ok() {
                    self.regions[*dev].push(items.clone());
                }
                r
            }
            Op::End { dev } => {
                let Some(items) = self.regions[*dev].pop() else { return Ok(None) };
                let l = self.list(&items);
                // SAFETY: as for exit.
                unsafe { rt.target_data_end(*dev, &l) }
            }
            Op::Update { dev, to, span, present } => {
                let r = offload::HostRange::new(self.base().wrapping_add(span.start) as usize, span.len * 4);
                let dir = if *to { UpdateDirection::To } else { UpdateDirection::From };
                // SAFETY: the range lies in the host array, which nothing else touches.
                unsafe { rt.update(*dev, dir, &[(r, *present)]) }
            }
            Op::HostWrite { span, value } => {
                self.host[span.start..span.end()].fill(*value);
                Ok(())
            }
            Op::DeviceWrite { dev, span, value } => {
                if span.len == 0 || !matches!(lookup(&model.tables[*dev], *span), Look::Inside(_)) {
                    return Ok(None);
                }
                let at = self.base().wrapping_add(span.start);
                let args = [LaunchArg::Value(Scalar::I32(*value)), LaunchArg::mapped(at)];
                // SAFETY: no map list; the span lies inside one mapped entry (checked by the
                // model, and the runtime translates it through its table).
                unsafe { rt.target_launch(*dev, &offload_kernels::FILL_I32, span.len, &[], &args) }
            }
            Op::Associate { dev, span } => {
                let at = self.base().wrapping_add(span.start) as usize;
                let bytes = span.len * 4;
                // A failed allocation or fill (fault runs) fails the step.
                let block = match rt.target_alloc(bytes.max(4), *dev) {
                    Ok(block) => block,
                    Err(e) => return Ok(Some(Err(e))),
                };
                // SAFETY: the block holds at least `bytes` bytes.
                if let Err(e) = unsafe { rt.target_memset(block, 0, bytes.max(4), *dev) } {
                    // SAFETY: never associated; nothing uses it.
                    unsafe { rt.target_free(block, *dev)? };
                    return Ok(Some(Err(e)));
                }
                // SAFETY: the block stays allocated until it is disassociated and freed.
                let r = unsafe { rt.associate_ptr(at, block, bytes, 0, *dev) };
                if r.is_ok() {
                    self.blocks.push((*dev, span.start, block));
                } else {
                    // SAFETY: never associated; nothing uses it.
                    unsafe { rt.target_free(block, *dev)? };
                }
                r
            }
            Op::Disassociate { dev, at } => {
                let host = self.base().wrapping_add(*at) as usize;
                // SAFETY: no kernel runs.
                let r = unsafe { rt.disassociate_ptr(host, *dev) };
                if r.is_ok() {
                    self.free_block_of(*dev, *at)?;
                }
                r
            }
        }))
    }

    /// Frees the block associated with the entry holding element `at`.
    fn free_block_of(&mut self, dev: usize, at: usize) -> Result<()> {
        let found = self.blocks.iter().position(|&(d, start, _)| {
            d == dev
                && start <= at
                && self.rt.entry(self.host.as_ptr() as usize + 4 * start, d).ok().flatten().is_none()
        });
        if let Some(i) = found {
            let (d, _, block) = self.blocks.swap_remove(i);
            // SAFETY: disassociated; nothing uses it.
            unsafe { self.rt.target_free(block, d)? };
        }
        Ok(())
    }

    /// Ends every open region, removes every entry, frees every block; from any state.
    fn clean_up(&mut self) -> Result<()> {
        let rt = self.rt;
        for dev in 0..rt.num_devices() {
            while let Some(items) = self.regions[dev].pop() {
                let l = self.list(&items);
                // SAFETY: as in `apply`.
                let _ = unsafe { rt.target_data_end(dev, &l) };
            }
        }
        offload_tests::unmap_everything(rt)?;
        for (d, _, block) in self.blocks.drain(..) {
            // SAFETY: disassociated above; nothing uses it.
            unsafe { rt.target_free(block, d)? };
        }
        Ok(())
    }

    /// Compares the runtime with the model: tables, counts, host and device contents.
    fn compare(&self, model: &Model) -> std::result::Result<(), String> {
        let base = self.host.as_ptr() as usize;
        for (i, (&h, m)) in self.host.iter().zip(&model.host).enumerate() {
            if m.is_some_and(|m| m != h) {
                return Err(format!("host element {i} is {h}, the model says {m:?}"));
            }
        }
        let live = self.rt.live_mappings();
        for (dev, table) in model.tables.iter().enumerate() {
            let actual: Vec<_> = live
                .iter()
                .filter(|(d, _)| *d == dev)
                .map(|(_, e)| {
                    let rc = if e.associated { 0 } else { e.ref_count };
                    let start = e.range.begin.checked_sub(base).map_or(usize::MAX, |b| b / 4);
                    (start, e.range.bytes / 4, rc, e.hold_count, e.associated)
                })
                .collect();
            let expected: Vec<_> = table
                .iter()
                .map(|(&k, e)| {
                    (k, e.len, if e.associated { 0 } else { e.ref_count }, e.hold_count, e.associated)
                })
                .collect();
            if actual != expected {
                return Err(format!(
                    "device {dev}: table (start, len, ref, hold, associated) is {actual:?}, the model says {expected:?}"
                ));
            }
            for (&k, e) in table {
                let addr = self
                    .rt
                    .mapped_ptr(base + 4 * k, dev)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("device {dev}: element {k} has no mapped pointer"))?;
                let data: Vec<i32> = read_device(self.rt, addr, e.len, dev).map_err(|e| e.to_string())?;
                for (j, (&d, m)) in data.iter().zip(&e.data).enumerate() {
                    if m.is_some_and(|m| m != d) {
                        return Err(format!("device {dev}: element {} is {d}, the model says {m:?}", k + j));
                    }
                }
            }
        }
        Ok(())
    }
}

thread_local! {
    /// Operations this thread's test has run (each test counts its own: the tests of this
    /// file run at once, on threads of their own, and proptest runs cases on the test's).
    static DONE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Of those, steps whose armed fault fired.
    static FAILED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Runs one sequence against a fresh model; a divergence fails the case with the step.
fn run_sequence(rt: &Runtime, steps: &[Step]) -> std::result::Result<(), TestCaseError> {
    let mut h = Harness::new(rt);
    let mut model = Model::new(rt.num_devices(), &h.host);
    // A panic (in the runtime or the model) fails the case like a divergence, after the
    // clean-up, so that the next case starts from an empty table.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for (step, Step { op, fault }) in steps.iter().enumerate() {
            let before = model.clone();
            let region_end = matches!(op, Op::End { dev } if !h.regions[*dev].is_empty());
            let predicted = match op {
                Op::Enter { dev, items } | Op::Begin { dev, items } => model.enter(*dev, items),
                Op::Exit { dev, items } => model.exit(*dev, items, false),
                Op::End { dev } => match h.regions[*dev].last() {
                    Some(items) => model.exit(*dev, &items.clone(), true),
                    None => Ok(()),
                },
                Op::Update { dev, to, span, present } => model.update(*dev, *to, *span, *present),
                Op::HostWrite { span, value } => {
                    model.host[span.start..span.end()].fill(Some(*value));
                    Ok(())
                }
                Op::DeviceWrite { dev, span, value } => {
                    if let (true, Look::Inside(k)) = (span.len > 0, lookup(&model.tables[*dev], *span)) {
                        let e = model.tables[*dev].get_mut(&k).expect("found");
                        e.data[span.start - k..span.end() - k].fill(Some(*value));
                    }
                    Ok(())
                }
                Op::Associate { dev, span } => match lookup(&model.tables[*dev], *span) {
                    Look::Absent if span.len > 0 => {
                        let e = ModelEntry {
                            len: span.len,
                            ref_count: 0,
                            hold_count: 0,
                            associated: true,
                            data: vec![Some(0); span.len],
                        };
                        model.tables[*dev].insert(span.start, e);
                        Ok(())
                    }
                    _ => Err(()),
                },
                Op::Disassociate { dev, at } => {
                    let t = &mut model.tables[*dev];
                    match lookup(t, Span { start: *at, len: 0 }) {
                        Look::Inside(k) if t[&k].associated && t[&k].hold_count == 0 => {
                            t.remove(&k);
                            Ok(())
                        }
                        _ => Err(()),
                    }
                }
            };
            // The step's fault, armed on its device for the step alone.
            let armed = fault.zip(device_of(op));
            let injected = |dev: usize, kind: FaultKind| {
                rt.fault_counts(dev).map(|c| c.map_or(0, |c| c.injected[kind as usize])).unwrap_or(0)
            };
            let injected_before = armed.map(|(f, dev)| injected(dev, f.kind));
            if let Some((f, dev)) = armed {
                rt.arm_fault(dev, f.kind, f.nth).map_err(|e| e.to_string())?;
                if f.kind == FaultKind::Alloc {
                    rt.arm_fault(dev, f.kind, f.nth + 1).map_err(|e| e.to_string())?;
                }
            }
            let r = h.apply(op, &before);
            let fired = match armed {
                Some((f, dev)) => {
                    rt.disarm_faults(dev).map_err(|e| e.to_string())?;
                    injected(dev, f.kind) > injected_before.unwrap_or(0)
                }
                None => false,
            };
            let r = r.map_err(|e| format!("step {step} {op:?}: harness failed: {e}"))?;
            DONE.set(DONE.get() + 1);
            if fired {
                FAILED.set(FAILED.get() + 1);
                // The construct fails, and leaves what R9 says.
                if let Some(Ok(())) = r {
                    return Err(format!("step {step} {op:?} with {fault:?}: the runtime succeeded"));
                }
                model = before.after_failure(&model, region_end);
            } else {
                if let Some(r) = r {
                    if r.is_ok() != predicted.is_ok() {
                        return Err(format!(
                            "step {step} {op:?}: the runtime returned {r:?}, the model {predicted:?}"
                        ));
                    }
                }
                if predicted.is_err() {
                    // All or nothing: a failed construct changed nothing.
                    model = before;
                }
            }
            h.compare(&model).map_err(|e| format!("step {step} {op:?}: {e}"))?;
        }
        Ok(())
    }))
    .unwrap_or_else(|p| {
        let why =
            p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
        Err(format!("panicked: {}", why.unwrap_or_default()))
    });
    let cleaned = h.clean_up();
    outcome.map_err(TestCaseError::fail)?;
    cleaned.map_err(|e| TestCaseError::fail(format!("clean-up failed: {e}")))?;
    let live = rt.live_mappings();
    prop_assert!(live.is_empty(), "clean-up left mappings: {live:?}");
    for d in 0..rt.num_devices() {
        let usage = rt.pool_usage(d).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(usage.live_allocations, 0, "device {} leaked allocations", d);
    }
    Ok(())
}

/// Runs `operations` operations in sequences of [`STEPS`] on every backend present (host
/// backends with three devices); with `faults`, on three host devices whose operations
/// fail where the steps say (a third of the steps).
fn check_against_the_model(operations: u64, faults: bool) {
    let backends = if faults { backends().into_iter().take(1).collect() } else { backends() };
    for b in backends {
        let build = || {
            let builder = if b.name == "host" { b.builder().host_devices(3) } else { b.builder() };
            let builder = if faults { builder.inject_faults(FaultPlan::default()) } else { builder };
            builder.build().unwrap_or_else(|e| panic!("[{}] start: {e}", b.name))
        };
        // One runtime for all cases, cleaned after each; a failed case may leave it dirty
        // (its clean-up relies on the rules it broke), so the next case gets a fresh one.
        let rt = std::cell::RefCell::new(build());
        let devices = rt.borrow().num_devices();
        if devices == 0 {
            continue;
        }
        // Sequences of 1..=STEPS operations (so a divergence shrinks to a short one), about
        // STEPS / 2 on average: enough cases for `operations` with a wide margin.
        let cases = (operations * 22 / 10).div_ceil(STEPS as u64) as u32;
        let config = Config { cases, failure_persistence: None, ..Config::default() };
        let (start, failed_start) = (DONE.get(), FAILED.get());
        let strategy = prop::collection::vec(step(devices, faults), 1..=STEPS);
        let case = |ops: Vec<Step>| {
            let r = run_sequence(&rt.borrow(), &ops);
            if r.is_err() {
                *rt.borrow_mut() = build();
            }
            r
        };
        match TestRunner::new(config).run(&strategy, case) {
            Ok(()) => {}
            Err(TestError::Fail(why, ops)) => {
                let steps: Vec<String> =
                    ops.iter().enumerate().map(|(i, op)| format!("{i:3}: {op:?}")).collect();
                panic!(
                    "[{}] the runtime diverged from the model: {why}\nminimal sequence:\n{}",
                    b.name,
                    steps.join("\n")
                )
            }
            Err(e) => panic!("[{}] {e}", b.name),
        }
        let done = DONE.get() - start;
        let failed = FAILED.get() - failed_start;
        assert!(done >= operations, "[{}] only {done} operations ran", b.name);
        assert!(!faults || failed >= operations / 50, "[{}] only {failed} steps failed", b.name);
        let with =
            if faults { format!(" ({failed} with a device operation failing)") } else { String::new() };
        println!("[{}] {done} operations on {devices} devices{with} agree with the model", b.name);
    }
}

#[test]
fn one_hundred_thousand_operations() {
    check_against_the_model(OPERATIONS, false);
}

#[test]
fn one_hundred_thousand_operations_with_faults() {
    check_against_the_model(OPERATIONS, true);
}

#[test]
#[ignore = "long: a million operations (run with --release --ignored)"]
fn one_million_operations() {
    check_against_the_model(10 * OPERATIONS, false);
}

#[test]
#[ignore = "long: a million operations with faults (run with --release --ignored)"]
fn one_million_operations_with_faults() {
    check_against_the_model(10 * OPERATIONS, true);
}

#[test]
fn the_model_reads_conformance_case_24_as_the_runtime_does() {
    // A hand-written sequence through the model alone: a hold region survives exit data.
    let mut m = Model::new(1, &[0; ARENA]);
    let s = Span { start: 0, len: 4 };
    let hold = Item { span: s, kind: MapKind::From, always: false, present: false, hold: true };
    assert!(m.enter(0, &[hold]).is_ok());
    let release = Item { kind: MapKind::Release, hold: false, ..hold };
    assert!(m.exit(0, &[release], false).is_ok());
    assert_eq!((m.tables[0][&0].ref_count, m.tables[0][&0].hold_count), (0, 1));
    assert!(m.exit(0, &[hold], true).is_ok());
    assert!(m.tables[0].is_empty());
}

// ---- many threads at once ---------------------------------------------------------------

/// What one thread does to the shared counters in one block: every block adds `k` to each
/// counter it names on the device, and every exit that can be the last copies back, so
/// whatever the interleaving OpenMP's rules give one result: each counter ends at the sum
/// of the additions (every entry's life ends with a copy back of all the additions made
/// during it, and the next life starts from that value).
#[derive(Clone, Copy, Debug)]
enum Block {
    /// `target map(tofrom: c...)` adding `k`.
    Region(i32),
    /// `enter data map(to:)`, a region with no map, `exit data map(from:)`.
    EnterExit(i32),
    /// `enter data map(to:)`, a `tofrom` region inside it, `exit data map(from:)`.
    Nested(i32),
    /// `enter data map(to:)`, a region with no map, `update from`, `exit data map(from:)`.
    UpdateThenExit(i32),
}

/// A block and the counters it names (element offsets).
type Placed = (Block, Vec<usize>);

/// Counters in the host array (elements 0, 16 and 32: apart, so they are three mappings).
const COUNTERS: [usize; 3] = [0, 16, 32];

fn block() -> impl Strategy<Value = Placed> {
    let kind = (1i32..4).prop_flat_map(|k| {
        prop_oneof![
            Just(Block::Region(k)),
            Just(Block::EnterExit(k)),
            Just(Block::Nested(k)),
            Just(Block::UpdateThenExit(k))
        ]
    });
    // One to three of the counters, in list order.
    (kind, prop::sample::subsequence(COUNTERS.to_vec(), 1..=3))
}

/// Runs `block` over the counters at `at` (element offsets) of the array at `base` on `dev`.
///
/// # Safety
/// `base` points to the host array, which only the runtime's copies touch meanwhile.
unsafe fn run_block(rt: &Runtime, dev: usize, base: usize, (block, at): &Placed) -> Result<()> {
    let ptr = |i: usize| (base as *mut i32).wrapping_add(i);
    let maps = |t: MapType| -> Vec<MapItem> { at.iter().map(|&i| MapItem::raw(ptr(i), 4, t)).collect() };
    let add = |k: i32, maps: &[MapItem]| -> Result<()> {
        for &i in at {
            let args = [LaunchArg::Value(Scalar::I32(k)), LaunchArg::mapped(ptr(i).cast_const())];
            // SAFETY: forwarded from the caller.
            unsafe { rt.target_launch(dev, &offload_kernels::ADD_I32, 1, maps, &args)? };
        }
        Ok(())
    };
    // SAFETY: forwarded from the caller.
    unsafe {
        match *block {
            Block::Region(k) => add(k, &maps(MapType::TOFROM)),
            Block::EnterExit(k) => {
                rt.enter_data(dev, &maps(MapType::TO))?;
                add(k, &[])?;
                rt.exit_data(dev, &maps(MapType::FROM))
            }
            Block::Nested(k) => {
                rt.enter_data(dev, &maps(MapType::TO))?;
                add(k, &maps(MapType::TOFROM))?;
                rt.exit_data(dev, &maps(MapType::FROM))
            }
            Block::UpdateThenExit(k) => {
                rt.enter_data(dev, &maps(MapType::TO))?;
                add(k, &[])?;
                let items: Vec<_> =
                    at.iter().map(|&i| (offload::HostRange::new(ptr(i) as usize, 4), false)).collect();
                rt.update(dev, UpdateDirection::From, &items)?;
                rt.exit_data(dev, &maps(MapType::FROM))
            }
        }
    }
}

/// Random programs of four threads, each a sequence of blocks over three shared counters
/// on one device, run at once: every counter must end at the sum of what was added to it,
/// and nothing stay mapped. Each construct's entry and exit being atomic is what makes the
/// result one; before it, the interleavings lost additions. (One device per program: a
/// counter mapped on two devices at once has two device copies, each copied back over the
/// host, and loses additions in C too.)
#[test]
fn many_threads_on_shared_counters_agree_with_the_model() {
    const THREADS: usize = 4;
    for b in backends() {
        let builder = if b.name == "host" { b.builder().host_devices(2) } else { b.builder() };
        let rt = builder.build().unwrap_or_else(|e| panic!("[{}] start: {e}", b.name));
        let devices = rt.num_devices();
        if devices == 0 {
            continue;
        }
        let thread = prop::collection::vec(block(), 1..=40);
        let program = (0..devices, prop::collection::vec(thread, THREADS..=THREADS));
        let config = Config { cases: 32, failure_persistence: None, ..Config::default() };
        let case = |(dev, threads): (usize, Vec<Vec<Placed>>)| {
            let mut host = vec![0i32; ARENA];
            let base = host.as_mut_ptr() as usize;
            let ran = offload_tests::run_threads(THREADS, |t| {
                // SAFETY: only the runtime touches `host` until the threads end.
                threads[t].iter().try_for_each(|b| unsafe { run_block(&rt, dev, base, b) })
            });
            ran.map_err(|e| TestCaseError::fail(format!("a construct failed: {e}")))?;
            let mut want = vec![0i32; ARENA];
            for (block, at) in threads.iter().flatten() {
                let (Block::Region(k) | Block::EnterExit(k) | Block::Nested(k) | Block::UpdateThenExit(k)) =
                    *block;
                for &i in at {
                    want[i] += k;
                }
            }
            prop_assert_eq!(&host, &want, "device {}: the counters lost additions", dev);
            prop_assert!(rt.live_mappings().is_empty(), "{:?}", rt.live_mappings());
            Ok(())
        };
        match TestRunner::new(config).run(&program, case) {
            Ok(()) => println!("[{}] 32 programs of {THREADS} threads agree with the model", b.name),
            Err(TestError::Fail(why, (dev, threads))) => {
                panic!("[{}] device {dev}: {why}\nthreads: {threads:#?}", b.name)
            }
            Err(e) => panic!("[{}] {e}", b.name),
        }
    }
}
