//! Host memory as the present table keys it: a [`HostRange`] of bytes, and how traces name
//! one (an element section of a named array, `a[256:128]`, else its bytes).

use std::fmt;

/// A byte range of host memory, `[begin, begin + bytes)`, as the present table keys it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostRange {
    /// First byte of the range.
    pub begin: usize,
    /// Length in bytes.
    pub bytes: usize,
}

impl HostRange {
    /// A range starting at `begin` of `bytes` bytes.
    pub const fn new(begin: usize, bytes: usize) -> Self {
        Self { begin, bytes }
    }

    /// The range a slice occupies.
    pub fn of<T>(slice: &[T]) -> Self {
        Self::new(slice.as_ptr() as usize, std::mem::size_of_val(slice))
    }

    /// One past the last byte, or `None` when that overflows the address space.
    pub const fn checked_end(&self) -> Option<usize> {
        self.begin.checked_add(self.bytes)
    }

    /// One past the last byte. Saturates for a range whose end overflows: every range that
    /// enters the runtime is first checked with [`HostRange::checked_end`], so there it is
    /// exact.
    pub const fn end(&self) -> usize {
        self.begin.saturating_add(self.bytes)
    }

    /// Whether `other` lies entirely inside `self`.
    pub const fn contains(&self, other: &HostRange) -> bool {
        other.begin >= self.begin && other.end() <= self.end()
    }
}

impl fmt::Debug for HostRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for HostRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.checked_end() {
            Some(end) => write!(f, "host {:#x}..{end:#x} ({} bytes)", self.begin, self.bytes),
            None => write!(f, "host {:#x}..(past the address space) ({} bytes)", self.begin, self.bytes),
        }
    }
}

/// A host array as a map named it ([`crate::MapItem::named`]): its name, the size of
/// one element and the host address of the element the name's index 0 stands for. Traces
/// print a range inside it as an element section, as LLVM's do (`a[256:128]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ArrayName {
    pub(crate) name: &'static str,
    /// Bytes per element (at least 1).
    pub(crate) elem: usize,
    /// The host address of element 0.
    pub(crate) begin: usize,
}

impl ArrayName {
    /// The array `name` whose element `index` (of `elem` bytes) is at host address `at`;
    /// `None` when unnamed, or when element 0 would lie below address 0.
    pub(crate) fn of(name: Option<&'static str>, elem: usize, index: usize, at: usize) -> Option<Self> {
        let elem = elem.max(1);
        let begin = at.checked_sub(index.checked_mul(elem)?)?;
        name.map(|name| Self { name, elem, begin })
    }
}

/// How a trace names a host range: as an element section of the named array it lies in
/// (`a[256:128]`), else by its bytes (`host 0x..0x.. (16 bytes)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RangeName {
    pub(crate) range: HostRange,
    pub(crate) array: Option<ArrayName>,
}

impl RangeName {
    /// `range`, named by `array` when there is one.
    pub(crate) const fn new(range: HostRange, array: Option<ArrayName>) -> Self {
        Self { range, array }
    }
}

impl fmt::Display for RangeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.range;
        match self.array {
            // Below the array's first element there is no section to name.
            Some(a) if r.begin >= a.begin => {
                let (offset, elem) = (r.begin - a.begin, a.elem.max(1));
                if offset % elem == 0 && r.bytes.is_multiple_of(elem) {
                    write!(f, "{}[{}:{}]", a.name, offset / elem, r.bytes / elem)
                } else {
                    // Not whole elements: the section in bytes.
                    write!(f, "{}(bytes {offset}..{})", a.name, offset + r.bytes)
                }
            }
            _ => fmt::Display::fmt(&r, f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containment() {
        let r = HostRange::new(100, 10);
        assert!(r.contains(&HostRange::new(100, 10)));
        assert!(r.contains(&HostRange::new(105, 5)));
        assert!(r.contains(&HostRange::new(110, 0)));
        assert!(!r.contains(&HostRange::new(105, 6)));
        assert!(!r.contains(&HostRange::new(99, 2)));
    }

    #[test]
    fn an_overflowing_range_is_shown_and_compared_without_overflow() {
        let r = HostRange::new(usize::MAX - 3, 8);
        assert_eq!(r.checked_end(), None);
        assert_eq!(r.end(), usize::MAX);
        assert_eq!(HostRange::new(8, 8).checked_end(), Some(16));
        let s = r.to_string();
        assert!(s.contains("0xfffffffffffffffc") && s.contains("8 bytes"), "{s}");
        assert!(!HostRange::new(0, 16).contains(&r));
    }
}
