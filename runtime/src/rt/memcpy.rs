//! `omp_target_memcpy`, `omp_target_memcpy_rect` and `omp_target_memset` between any two
//! devices, the initial device included.
//!
//! Device to device goes by peer access when both devices have it (and the runtime allows
//! it), otherwise through the pinned staging buffers of the source device (or of the
//! destination), chunk by chunk with the copies overlapped; only between devices that stage
//! nothing (host devices without peer access, staging turned off) through a host bounce
//! buffer.

use crate::backend::{Copy2d, Place};
use crate::device::Target;
use crate::error::{Error, Result};
use crate::range::HostRange;
use crate::rt::Runtime;
use crate::services::validate;

/// Where a rectangular copy reads or writes: a base pointer, its device, and the array's
/// shape and the sub-volume's offsets, in elements, outermost dimension first.
#[derive(Clone, Copy, Debug)]
pub struct RectSide<'a> {
    /// Base address (device address, or host address on the initial device).
    pub ptr: u64,
    /// Device number.
    pub device: usize,
    /// Offsets of the sub-volume, per dimension.
    pub offsets: &'a [usize],
    /// Extents of the whole array, per dimension.
    pub dimensions: &'a [usize],
}

const MEMCPY: &str = "omp_target_memcpy";
const MEMCPY_RECT: &str = "omp_target_memcpy_rect";
const MEMSET: &str = "omp_target_memset";

impl Runtime {
    /// Checks `len` bytes at `addr` on `device` that a routine is about to touch (`side`
    /// names them): on an offload device they must lie inside one live allocation of its
    /// memory pool; on the initial device they are host memory, which the caller vouches
    /// for (OpenMP's contract: any host address), so only overflow is checked there.
    pub(crate) fn check_device_range(
        &self,
        routine: &'static str,
        side: &str,
        device: usize,
        addr: u64,
        len: usize,
    ) -> Result<()> {
        match self.target(device)? {
            Target::Device(d) => d.check_range(routine, addr, len),
            Target::Initial => {
                let host = usize::try_from(addr).ok().map(|a| HostRange::new(a, len));
                match host.and_then(|r| r.checked_end()) {
                    Some(_) => Ok(()),
                    None => Err(Error::Overflow {
                        routine,
                        what: format!("device {device}: {side}: host {addr:#x} + {len} bytes"),
                    }),
                }
            }
        }
    }

    /// `omp_target_memcpy`: copies `len` bytes from `src + src_offset` on `src_device` to
    /// `dst + dst_offset` on `dst_device`. A zero length is a no-op even with null pointers.
    ///
    /// Refused before any byte moves: a null pointer, an offset or length that overflows,
    /// and on an offload device a range not inside one live allocation of that device
    /// (`target_alloc` blocks and mapped entries, at the size asked for; freed blocks are
    /// not live). Host ranges (the initial device) are only checked for null and overflow.
    ///
    /// # Safety
    /// Both ranges must be valid memory of their devices (host memory for the initial
    /// device), and the destination not otherwise accessed during the call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn target_memcpy(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        dst_offset: usize,
        src_offset: usize,
        dst_device: usize,
        src_device: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let null = |side: &str, device: usize| Error::InvalidArgument {
            routine: MEMCPY,
            what: format!("device {device}: {side} pointer is null with length {len}; expected an address"),
        };
        if dst == 0 {
            return Err(null("destination", dst_device));
        }
        if src == 0 {
            return Err(null("source", src_device));
        }
        let d = validate::offset(MEMCPY, "destination", dst, dst_offset)?;
        let s = validate::offset(MEMCPY, "source", src, src_offset)?;
        self.check_device_range(MEMCPY, "destination", dst_device, d, len)?;
        self.check_device_range(MEMCPY, "source", src_device, s, len)?;
        // SAFETY: forwarded from the caller; the device ranges lie in live allocations.
        unsafe { self.copy_bytes(d, dst_device, s, src_device, len)? };
        let fields = || crate::info::InfoFields {
            kind: "memcpy",
            device: Some(if dst_device == self.initial_device() { src_device } else { dst_device }),
            bytes: Some(len),
            ..Default::default()
        };
        self.inner.trace.event(crate::info::InfoFlags::TRANSFERS, fields, || {
            format!(
                "omp_target_memcpy {len} bytes, device {src_device} {:#x} -> device {dst_device} {:#x}",
                src.wrapping_add(src_offset as u64),
                dst.wrapping_add(dst_offset as u64)
            )
        });
        Ok(())
    }

    /// # Safety
    /// As [`Runtime::target_memcpy`], offsets applied.
    unsafe fn copy_bytes(
        &self,
        d: u64,
        dst_device: usize,
        s: u64,
        src_device: usize,
        len: usize,
    ) -> Result<()> {
        match (self.settled(dst_device)?, self.settled(src_device)?) {
            (Target::Initial, Target::Initial) => {
                // SAFETY: the caller guarantees both host ranges.
                unsafe { std::ptr::copy(s as usize as *const u8, d as usize as *mut u8, len) };
                Ok(())
            }
            // SAFETY: the caller guarantees the host source and the device destination.
            (Target::Device(dd), Target::Initial) => unsafe {
                dd.copy_to_device(d, HostRange::new(s as usize, len))
            },
            // SAFETY: the caller guarantees the device source and the host destination.
            (Target::Initial, Target::Device(sd)) => unsafe {
                sd.copy_from_device(HostRange::new(d as usize, len), s)
            },
            // A span of the destination's copy-in queue on the timeline.
            (Target::Device(dd), Target::Device(sd)) => {
                let what = || crate::info::InfoFields {
                    kind: "copy",
                    device_addr: Some(d),
                    bytes: Some(len),
                    direction: Some("device->device"),
                    ..Default::default()
                };
                // SAFETY: forwarded from the caller: both ranges are their devices' memory.
                let copy =
                    || unsafe { dd.copy_from_peer_device(d, sd, s, len, self.reaches(dd.number, sd.number)) };
                dd.timed(crate::backend::Queue::CopyIn, what, copy)
            }
        }
    }

    /// `omp_target_memcpy_rect`: copies a sub-volume of `volume` elements (per dimension,
    /// outermost first) of `element_size` bytes between two arrays of any number of
    /// dimensions on any two devices. Each plane of the innermost two dimensions is one pitched
    /// 2-D driver copy where the backend has one (CUDA), else one copy per row.
    ///
    /// Every offset, extent, stride and product is computed with checked arithmetic, and
    /// each side's touched span (first to last byte of the sub-volume) is checked as
    /// [`Runtime::target_memcpy`] checks its ranges, before any byte moves.
    ///
    /// # Safety
    /// Both arrays must be valid memory of their devices for their whole `dimensions`.
    pub unsafe fn target_memcpy_rect(
        &self,
        element_size: usize,
        volume: &[usize],
        dst: RectSide<'_>,
        src: RectSide<'_>,
    ) -> Result<()> {
        let bad = |what: String| Error::InvalidArgument { routine: MEMCPY_RECT, what };
        let overflow = |what: String| Error::Overflow { routine: MEMCPY_RECT, what };
        let dims = volume.len();
        if dims == 0 || element_size == 0 {
            return Err(bad(format!(
                "{dims} dimensions of {element_size}-byte elements; expected at least one dimension and a \
                 non-zero element size"
            )));
        }
        for (name, side) in [("destination", &dst), ("source", &src)] {
            if side.offsets.len() != dims || side.dimensions.len() != dims {
                return Err(bad(format!(
                    "{name} offsets and dimensions must have {dims} entries, as the volume has (got {} and {})",
                    side.offsets.len(),
                    side.dimensions.len()
                )));
            }
            for (k, ((&off, &vol), &ext)) in side.offsets.iter().zip(volume).zip(side.dimensions).enumerate()
            {
                let end = off
                    .checked_add(vol)
                    .ok_or_else(|| overflow(format!("{name} dimension {k}: offset {off} + volume {vol}")))?;
                if end > ext {
                    return Err(bad(format!(
                        "{name} dimension {k}: offset {off} + volume {vol} exceeds extent {ext}"
                    )));
                }
            }
            if side.ptr == 0 {
                return Err(bad(format!("device {}: {name} pointer is null", side.device)));
            }
        }
        // Byte strides of each dimension, innermost last.
        let strides = |name: &str, d: &[usize]| -> Result<Vec<usize>> {
            let mut s = vec![element_size; dims];
            for k in (0..dims - 1).rev() {
                s[k] = s[k + 1].checked_mul(d[k + 1]).ok_or_else(|| {
                    overflow(format!(
                        "{name} stride of dimension {k}: {} bytes x extent {}",
                        s[k + 1],
                        d[k + 1]
                    ))
                })?;
            }
            Ok(s)
        };
        let (ds, ss) = (strides("destination", dst.dimensions)?, strides("source", src.dimensions)?);
        if volume.contains(&0) {
            return Ok(());
        }
        // Each side's touched span: from the sub-volume's first byte to its last. Every
        // address the copies below compute lies inside it, so they need no further checks.
        for (name, side, st) in [("destination", &dst, &ds), ("source", &src, &ss)] {
            let span = side.offsets.iter().zip(volume).zip(st).try_fold(
                (0usize, element_size),
                |(first, len), ((&off, &vol), &stride)| {
                    Some((
                        first.checked_add(off.checked_mul(stride)?)?,
                        len.checked_add((vol - 1).checked_mul(stride)?)?,
                    ))
                },
            );
            let (first, len) = span.ok_or_else(|| {
                overflow(format!(
                    "{name} span of offsets {:?} + volume {volume:?} in dimensions {:?} of {element_size} bytes",
                    side.offsets, side.dimensions
                ))
            })?;
            let begin = validate::offset(MEMCPY_RECT, name, side.ptr, first)?;
            self.check_device_range(MEMCPY_RECT, name, side.device, begin, len)?;
        }
        let row = volume[dims - 1] * element_size;
        if dims == 1 {
            let (d, s) = (
                dst.ptr + (dst.offsets[0] * element_size) as u64,
                src.ptr + (src.offsets[0] * element_size) as u64,
            );
            // SAFETY: inside both arrays (checked above); validity is the caller's.
            return unsafe { self.copy_bytes(d, dst.device, s, src.device, row) };
        }
        // The innermost two dimensions form pitched planes; the outer ones index planes.
        let rows = volume[dims - 2];
        let planes = volume[..dims - 2]
            .iter()
            .try_fold(1usize, |n, &v| n.checked_mul(v))
            .ok_or_else(|| overflow(format!("planes of volume {volume:?}")))?;
        let mut index = vec![0usize; dims - 2];
        for _ in 0..planes {
            let base = |side: &RectSide<'_>, st: &[usize]| -> u64 {
                let mut off = side.offsets[dims - 1] * element_size + side.offsets[dims - 2] * st[dims - 2];
                for k in 0..dims - 2 {
                    off += (side.offsets[k] + index[k]) * st[k];
                }
                side.ptr + off as u64
            };
            let (d0, s0) = (base(&dst, &ds), base(&src, &ss));
            // SAFETY: every row lies inside both arrays (checked above).
            if !unsafe {
                self.copy_plane_2d(d0, dst.device, ds[dims - 2], s0, src.device, ss[dims - 2], row, rows)?
            } {
                for r in 0..rows {
                    let (d, s) = (d0 + (r * ds[dims - 2]) as u64, s0 + (r * ss[dims - 2]) as u64);
                    // SAFETY: as above.
                    unsafe { self.copy_bytes(d, dst.device, s, src.device, row)? };
                }
            }
            for k in (0..dims - 2).rev() {
                index[k] += 1;
                if index[k] < volume[k] {
                    break;
                }
                index[k] = 0;
            }
        }
        Ok(())
    }

    /// One pitched plane as a single driver copy, when one device's backend can do it;
    /// `false` when the caller must copy row by row.
    ///
    /// # Safety
    /// Every row of both sides is valid memory of its device.
    #[allow(clippy::too_many_arguments)]
    unsafe fn copy_plane_2d(
        &self,
        d: u64,
        dst_device: usize,
        dst_pitch: usize,
        s: u64,
        src_device: usize,
        src_pitch: usize,
        row_bytes: usize,
        rows: usize,
    ) -> Result<bool> {
        let (dev, dst, src) = match (self.settled(dst_device)?, self.settled(src_device)?) {
            (Target::Device(dd), Target::Initial) => (dd, Place::Device(d), Place::Host(s as usize)),
            (Target::Initial, Target::Device(sd)) => (sd, Place::Host(d as usize), Place::Device(s)),
            (Target::Device(dd), Target::Device(sd)) if dd.number == sd.number => {
                (dd, Place::Device(d), Place::Device(s))
            }
            _ => return Ok(false),
        };
        let c = Copy2d { dst, dst_pitch, src, src_pitch, row_bytes, rows };
        // SAFETY: forwarded from the caller.
        let done = unsafe { dev.copy_2d(&c)? };
        if done {
            let bytes = row_bytes * rows;
            dev.record_copy_2d(dst, src, bytes);
        }
        Ok(done)
    }

    /// `omp_target_memset`: sets `bytes` bytes at `ptr` on `device` to `value`. Refused,
    /// before anything is written, as [`Runtime::target_memcpy`] refuses its ranges.
    ///
    /// # Safety
    /// `ptr..ptr+bytes` must be memory of that device (host memory on the initial device).
    pub unsafe fn target_memset(&self, ptr: u64, value: u8, bytes: usize, device: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        if ptr == 0 {
            return Err(Error::InvalidArgument {
                routine: MEMSET,
                what: format!("device {device}: pointer is null with count {bytes}; expected an address"),
            });
        }
        self.check_device_range(MEMSET, "pointer", device, ptr, bytes)?;
        match self.settled(device)? {
            Target::Device(d) => d.memset(ptr, value, bytes),
            // SAFETY: the caller guarantees the host range.
            Target::Initial => unsafe {
                std::ptr::write_bytes(ptr as usize as *mut u8, value, bytes);
                Ok(())
            },
        }
    }
}
