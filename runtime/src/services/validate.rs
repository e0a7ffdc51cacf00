//! Checks of what callers pass, made where a call enters the runtime, before anything is
//! mapped, allocated, read or written: host ranges (a null pointer with a size, an end past
//! the address space), the map kinds each construct allows, and checked arithmetic on the
//! addresses and offsets callers pass. Device ranges are checked against each device's
//! memory pool (`MemoryPool::check_range`), which knows every live allocation.
//!
//! The same checks run in debug and release builds: none of them is a `debug_assert`.

use std::fmt::Display;

use crate::data_env::{Construct, MapItem};
use crate::error::{Error, Result};
use crate::range::HostRange;

/// Checks a host range given to `routine` on `device`: a null pointer must have size 0,
/// and the range must end inside the address space. `what` names the argument.
pub(crate) fn host_range(
    routine: &'static str,
    device: usize,
    what: &dyn Display,
    r: HostRange,
) -> Result<()> {
    if host_range_ok(r) {
        return Ok(());
    }
    if r.begin == 0 && r.bytes > 0 {
        return Err(Error::InvalidArgument {
            routine,
            what: format!(
                "device {device}: {what}: {r} has a null host pointer and a non-zero size; \
                 expected a host address, or size 0"
            ),
        });
    }
    if r.checked_end().is_none() {
        return Err(Error::Overflow {
            routine,
            what: format!("device {device}: {what}: host {:#x} + {} bytes", r.begin, r.bytes),
        });
    }
    Ok(())
}

/// Whether [`host_range`] accepts `r` (no message built: the common case's test).
fn host_range_ok(r: HostRange) -> bool {
    (r.begin != 0 || r.bytes == 0) && r.checked_end().is_some()
}

/// The map kinds construct `c` accepts, for messages.
fn allowed_kinds(c: Construct) -> &'static str {
    match c {
        Construct::Target => "to, from, tofrom or alloc, with or without hold or implicit",
        Construct::TargetData => "to, from, tofrom or alloc, with or without hold, not implicit",
        Construct::EnterData => "to, tofrom or alloc, without hold or implicit",
        Construct::ExitData => "from, tofrom, release or delete, without hold or implicit",
    }
}

/// Checks a map list given to construct `c` on `device` (the initial device included, so
/// that a bad list fails the same way wherever it runs): each item's kind is one `c`
/// allows, and its host range passes [`host_range`].
pub(crate) fn map_list(c: Construct, device: usize, items: &[MapItem]) -> Result<()> {
    // The common case first, without building any message.
    if items.iter().all(|it| c.allows(it.map_type) && host_range_ok(it.range)) {
        return Ok(());
    }
    for (i, it) in items.iter().enumerate() {
        if !c.allows(it.map_type) {
            return Err(Error::InvalidArgument {
                routine: c.name(),
                what: format!(
                    "device {device}: map item {i}: map type `{}` is not allowed on {} ({}); expected {}",
                    it.map_type,
                    c.name(),
                    crate::range::RangeName::new(it.range, it.array()),
                    allowed_kinds(c)
                ),
            });
        }
        host_range(c.name(), device, &format_args!("map item {i} ({})", it.map_type), it.range)?;
    }
    Ok(())
}

/// Checks the ranges of a `target update` on `device`.
pub(crate) fn update_list(device: usize, items: &[(HostRange, bool)]) -> Result<()> {
    items
        .iter()
        .enumerate()
        .try_for_each(|(i, &(r, _))| host_range("target update", device, &format_args!("item {i}"), r))
}

/// `base + offset` for an address a caller passed with an offset (`what` names them), or
/// an overflow error naming both values.
pub(crate) fn offset(routine: &'static str, what: &str, base: u64, offset: usize) -> Result<u64> {
    base.checked_add(offset as u64)
        .ok_or_else(|| Error::Overflow { routine, what: format!("{what} {base:#x} + offset {offset}") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data_env::MapType;

    #[test]
    fn null_and_overflowing_ranges_are_refused() {
        let at = |b, n| host_range("r", 3, &"x", HostRange::new(b, n));
        assert!(at(0, 0).is_ok() && at(0x1000, 16).is_ok() && at(usize::MAX, 0).is_ok());
        let e = at(0, 16).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { routine: "r", .. }), "{e}");
        assert!(e.to_string().contains("device 3") && e.to_string().contains("16 bytes"), "{e}");
        let e = at(usize::MAX - 7, 16).unwrap_err();
        assert!(matches!(e, Error::Overflow { .. }), "{e}");
        assert!(e.to_string().contains("0xfffffffffffffff8 + 16 bytes"), "{e}");
    }

    #[test]
    fn map_kinds_are_checked_per_construct() {
        let mut x = [0u8; 4];
        let e = map_list(Construct::EnterData, 0, &[MapItem::slice_mut(&mut x, MapType::FROM)]).unwrap_err();
        assert!(e.to_string().contains("expected to, tofrom or alloc"), "{e}");
        assert!(map_list(Construct::ExitData, 0, &[MapItem::slice_mut(&mut x, MapType::FROM)]).is_ok());
    }

    #[test]
    fn offsets_are_checked() {
        assert_eq!(offset("r", "p", 16, 16).unwrap(), 32);
        let e = offset("r", "p", u64::MAX, 1).unwrap_err();
        assert!(e.to_string().contains("p 0xffffffffffffffff + offset 1 overflows"), "{e}");
    }
}
