//! Processing a construct's map list against one device's present table.
//!
//! The table's lock is held for the whole construct, copies included, so another thread
//! never sees an entry whose data has not arrived yet; kernels run without it.

use std::collections::HashSet;

use super::{Construct, Entry, Lookup, MapItem, MapKind, PresentTable, UpdateDirection};
use crate::error::{Error, HostRange, Result};
use crate::info::InfoFlags;
use crate::runtime::DeviceState;

impl DeviceState {
    fn check_allowed(&self, items: &[MapItem], c: Construct) -> Result<()> {
        match items.iter().find(|i| !c.allows(i.map_type.kind)) {
            Some(i) => Err(Error::InvalidArgument {
                routine: c.name(),
                what: format!("map type `{}` is not allowed on {} ({})", i.map_type, c.name(), i.range),
            }),
            None => Ok(()),
        }
    }

    fn entry_line(&self, what: &str, e: &Entry) -> String {
        format!(
            "device {}: {what} {} -> device {:#x}, counts dynamic {} structured {}",
            self.number,
            e.range,
            e.device_addr,
            if e.associated { "inf".into() } else { e.dynamic.to_string() },
            e.structured
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
        self.check_allowed(items, c)?;
        let mut table = self.table.lock();
        // Presence and extension are judged against the table as the construct found it.
        for it in items {
            match table.lookup(it.range) {
                Lookup::Extends(existing) => {
                    return Err(Error::Extension { device: self.number, requested: it.range, existing })
                }
                Lookup::Absent if it.map_type.present => {
                    return Err(Error::NotPresent {
                        device: self.number,
                        range: it.range,
                        what: "a `present` map on entry",
                    })
                }
                _ => {}
            }
        }
        let mut keys: Vec<Option<usize>> = Vec::with_capacity(items.len());
        let mut created: Vec<usize> = Vec::new();
        let mut counted: Vec<usize> = Vec::new();
        // SAFETY: forwarded from the caller.
        let r = unsafe { self.enter_locked(&mut table, items, c, &mut keys, &mut created, &mut counted) };
        if let Err(e) = r {
            for &k in &counted {
                if let Some(entry) = table.get_mut(k) {
                    decrement(entry, c);
                }
            }
            for &k in &created {
                if let Some(entry) = table.remove(k) {
                    let _ = self.release_entry(&entry);
                }
            }
            return Err(e);
        }
        self.dump_after(&table, c);
        Ok(())
    }

    /// # Safety
    /// As [`DeviceState::map_enter`].
    unsafe fn enter_locked(
        &self,
        table: &mut PresentTable,
        items: &[MapItem],
        c: Construct,
        keys: &mut Vec<Option<usize>>,
        created: &mut Vec<usize>,
        counted: &mut Vec<usize>,
    ) -> Result<()> {
        for it in items {
            if it.range.bytes == 0 {
                keys.push(None); // zero-length sections make no entry
                continue;
            }
            let key = match table.lookup(it.range) {
                Lookup::Inside(k) => {
                    if let Some(e) = table.get(k) {
                        self.trace.emit(InfoFlags::MAPPING_EXISTS, || self.entry_line("mapping exists", e));
                    }
                    k
                }
                Lookup::Extends(existing) => {
                    return Err(Error::Extension { device: self.number, requested: it.range, existing })
                }
                Lookup::Absent => {
                    let device_addr = self.pool.alloc(&*self.backend, it.range.bytes)?;
                    table.insert(Entry::new(it.range, device_addr, false));
                    created.push(it.range.begin);
                    it.range.begin
                }
            };
            keys.push(Some(key));
        }
        for k in keys.iter().flatten() {
            if counted.contains(k) {
                continue;
            }
            counted.push(*k);
            if let Some(e) = table.get_mut(*k) {
                // An associated entry's dynamic count is infinite; its structured count
                // still moves, so that `disassociate` can refuse while a region holds it.
                if c.is_structured() {
                    e.structured += 1;
                } else if !e.associated {
                    e.dynamic += 1;
                }
            }
        }
        for k in created.iter() {
            if let Some(e) = table.get(*k) {
                self.trace.emit(InfoFlags::ENTRIES, || self.entry_line("entry created", e));
            }
        }
        let mut copied = HashSet::new();
        for (it, key) in items.iter().zip(keys.iter()) {
            let Some(k) = *key else { continue };
            let Some(e) = table.get(k) else { continue };
            let copy = it.map_type.copies_in() && (it.map_type.always || created.contains(&k));
            if copy && copied.insert(it.range) {
                // SAFETY: the caller guarantees the host range; the device range lies inside
                // the entry.
                unsafe { self.copy_to_device(e.translate(it.range.begin), it.range)? };
                self.note_copy(table, k, it.range);
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
        self.check_allowed(items, c)?;
        let mut table = self.table.lock();
        let mut keys = Vec::with_capacity(items.len());
        for it in items {
            let key = match table.lookup(it.range) {
                Lookup::Extends(existing) => {
                    return Err(Error::Extension { device: self.number, requested: it.range, existing })
                }
                Lookup::Absent if it.map_type.present => {
                    return Err(Error::NotPresent {
                        device: self.number,
                        range: it.range,
                        what: "a `present` map on exit",
                    })
                }
                Lookup::Absent => None,
                Lookup::Inside(_) if it.range.bytes == 0 => None,
                Lookup::Inside(k) => Some(k),
            };
            keys.push(key);
        }
        // Each entry once, in reverse list order, with its counts before the construct.
        let mut touched: Vec<(usize, Entry)> = Vec::new();
        for k in keys.iter().rev().flatten() {
            if !touched.iter().any(|(t, _)| t == k) {
                if let Some(e) = table.get(*k) {
                    touched.push((*k, e.clone()));
                }
            }
        }
        let mut dynamic_ended = Vec::new();
        for (k, before) in &touched {
            let delete = items
                .iter()
                .zip(&keys)
                .any(|(it, key)| *key == Some(*k) && it.map_type.kind == MapKind::Delete);
            let Some(e) = table.get_mut(*k) else { continue };
            if c.is_structured() {
                decrement(e, c);
            } else if !e.associated {
                e.dynamic = if delete { 0 } else { e.dynamic.saturating_sub(1) };
                if before.dynamic > 0 && e.dynamic == 0 {
                    dynamic_ended.push(*k);
                }
            }
        }
        let mut copied = HashSet::new();
        let mut result = Ok(());
        for (it, key) in items.iter().zip(&keys).rev() {
            let Some(k) = *key else { continue };
            let Some(e) = table.get(k) else { continue };
            let copy = it.map_type.copies_out()
                && (it.map_type.always || e.is_released() || dynamic_ended.contains(&k));
            if copy && copied.insert(it.range) {
                // SAFETY: forwarded from the caller; the device range lies in the entry.
                result = unsafe { self.copy_from_device(it.range, e.translate(it.range.begin)) };
                if result.is_err() {
                    break;
                }
                self.note_copy(&mut table, k, it.range);
            }
        }
        if let Err(e) = result {
            for (k, before) in touched {
                if let Some(entry) = table.get_mut(k) {
                    *entry = before;
                }
            }
            return Err(e);
        }
        let mut first_err = None;
        for (k, _) in &touched {
            if table.get(*k).is_some_and(Entry::is_released) {
                if let Some(e) = table.remove(*k) {
                    self.trace.emit(InfoFlags::ENTRIES, || self.entry_line("entry removed", &e));
                    if let Err(err) = self.release_entry(&e) {
                        first_err.get_or_insert(err);
                    }
                }
            }
        }
        self.dump_after(&table, c);
        first_err.map_or(Ok(()), Err)
    }

    /// `target update to/from`: copies present ranges, changes no count.
    ///
    /// # Safety
    /// Host ranges valid for reads (`To`) or for exclusive writes (`From`).
    pub(crate) unsafe fn update(&self, items: &[(HostRange, bool)], dir: UpdateDirection) -> Result<()> {
        let mut table = self.table.lock();
        let mut found = Vec::with_capacity(items.len());
        for &(range, present) in items {
            match table.lookup(range) {
                Lookup::Extends(existing) => {
                    return Err(Error::Extension { device: self.number, requested: range, existing })
                }
                Lookup::Absent if present => {
                    return Err(Error::NotPresent {
                        device: self.number,
                        range,
                        what: "`target update` with `present`",
                    })
                }
                Lookup::Inside(k) if range.bytes > 0 => found.push((range, k)),
                _ => {}
            }
        }
        for (range, k) in found {
            let Some(e) = table.get(k) else { continue };
            let addr = e.translate(range.begin);
            // SAFETY: forwarded from the caller; the device range lies in the entry.
            unsafe {
                match dir {
                    UpdateDirection::To => self.copy_to_device(addr, range)?,
                    UpdateDirection::From => self.copy_from_device(range, addr)?,
                }
            }
            self.note_copy(&mut table, k, range);
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

fn decrement(e: &mut Entry, c: Construct) {
    if c.is_structured() {
        e.structured = e.structured.saturating_sub(1);
    } else if !e.associated {
        e.dynamic = e.dynamic.saturating_sub(1);
    }
}
