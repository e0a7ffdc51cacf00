//! NCCL through `cudarc` (`nccl`, loaded at run time like the driver): communicators over
//! CUDA devices, point-to-point sends and receives of device memory in a group, sums.
//! Every operation is queued on its device's compute stream, so it runs after the work
//! queued there before it and before the work queued after it.
//!
//! cudarc panics on its first call into a library it cannot load: nothing here calls NCCL
//! before [`probe`] found it.

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

use cudarc::nccl::{result, sys};

use super::CudaDevice;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::kernel::Scalar;

/// The oldest NCCL whose every call this module makes exists (2.14.0).
const MIN_VERSION: c_int = 21400;

/// NCCL's version, or why it cannot be loaded (asked once a process).
pub(crate) fn probe() -> std::result::Result<String, String> {
    static PROBED: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    PROBED
        .get_or_init(|| {
            // SAFETY: only tries to open the library by its names (no symbol is called).
            if !unsafe { sys::is_culib_present() } {
                return Err(
                    "no NCCL library (libnccl.so) on the library path: install the nvidia-nccl-cu13 \
                     wheel and put its lib/ folder, with a libnccl.so link to its libnccl.so.2, on \
                     LD_LIBRARY_PATH (scripts/setup.sh --nccl)"
                        .into(),
                );
            }
            let v =
                result::get_nccl_version().map_err(|e| format!("ncclGetVersion failed: {}", message(e.0)))?;
            let version = format!("NCCL {}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
            // ncclCommFinalize (2.14) is the newest call made here: an older library would
            // make cudarc panic on it.
            if v < MIN_VERSION {
                return Err(format!("{version} is older than 2.14, the oldest this runtime calls"));
            }
            Ok(version)
        })
        .clone()
}

/// A communicator's identity, made by one process and given to every rank of it.
pub(crate) type UniqueId = [u8; 128];

/// A new identity, made for device `device` (named in an error). NCCL must have been
/// found by [`probe`].
pub(crate) fn unique_id(device: usize) -> Result<UniqueId> {
    let id = result::get_uniqueid().map_err(|e| failed(device, "ncclGetUniqueId", e))?;
    Ok(id.internal.map(|c| c as u8))
}

/// One rank of a communicator, on one CUDA device's compute stream.
pub(crate) struct DeviceComm {
    comm: sys::ncclComm_t,
    stream: sys::cudaStream_t,
    device: usize,
    rank: usize,
    /// An operation on it failed: it is aborted, not finalised (which would wait for
    /// operations whose peers may never come).
    failed: std::sync::atomic::AtomicBool,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; the
// runtime's callers serialise their calls on it (`crate::collective` locks it for each
// group), and the stream is the device's, which lives as long as the runtime that holds
// this.
unsafe impl Send for DeviceComm {}
// SAFETY: as above.
unsafe impl Sync for DeviceComm {}

impl std::fmt::Debug for DeviceComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceComm").field("device", &self.device).field("rank", &self.rank).finish()
    }
}

/// One send or receive of `bytes` of device memory at `addr`, on `comm`, with rank `peer`.
pub(crate) struct P2p<'c> {
    pub(crate) comm: &'c DeviceComm,
    pub(crate) send: bool,
    pub(crate) addr: u64,
    pub(crate) bytes: usize,
    pub(crate) peer: usize,
}

/// The ranks `ranks[i]` of a communicator of `nranks` ranks named `id`, on `devices[i]`
/// (CUDA devices of this process, one rank each), made together in one group as NCCL
/// asks of a process that holds several ranks.
pub(crate) fn init(
    devices: &[&dyn Backend],
    ranks: &[usize],
    nranks: usize,
    id: &UniqueId,
) -> Result<Vec<DeviceComm>> {
    let first = devices.first().map_or(0, |d| d.number());
    probe().map_err(|message| Error::Driver { device: first, call: "load NCCL", message })?;
    let n = c_int::try_from(nranks).map_err(|_| Error::InvalidArgument {
        routine: "NCCL communicator",
        what: format!("{nranks} ranks"),
    })?;
    let mut made = Vec::with_capacity(devices.len());
    let cuda: Vec<&CudaDevice> = devices
        .iter()
        .map(|d| super::super::same_vendor::<CudaDevice>(d.number(), *d))
        .collect::<Result<_>>()?;
    let uid = sys::ncclUniqueId { internal: id.map(|b| b as std::ffi::c_char) };
    // Every context checked before the group: a rank left out of it would make
    // ncclGroupEnd wait for it.
    for d in &cuda {
        d.bind()?;
    }
    result::group_start().map_err(|e| failed(first, "ncclGroupStart", e))?;
    let mut first_err = None;
    for (d, &rank) in cuda.iter().zip(ranks) {
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        let r = d.bind().and_then(|()| {
            let rank = c_int::try_from(rank).map_err(|_| Error::InvalidArgument {
                routine: "NCCL communicator",
                what: format!("rank {rank} of {nranks}"),
            })?;
            // SAFETY: `comm` is written by the call; this device's context is current.
            unsafe { result::comm_init_rank(&mut comm, n, uid, rank) }
                .map_err(|e| failed(d.number, "ncclCommInitRank", e))
        });
        match r {
            Ok(_) => made.push(DeviceComm {
                comm,
                stream: d.compute.cu_stream().cast(),
                device: d.number,
                rank,
                failed: Default::default(),
            }),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let ended = result::group_end().map_err(|e| failed(first, "ncclGroupEnd (making communicators)", e));
    if let Some(e) = first_err.or(ended.err()) {
        return Err(e);
    }
    Ok(made)
}

/// Queues `ops` as one group: every send and receive posted before any is waited for, so
/// ranks that exchange both ways never wait on each other.
///
/// # Safety
/// Each op's memory is `bytes` of its communicator's device, live until the op has run,
/// and no other work writes a buffer sent or reads a buffer received meanwhile.
pub(crate) unsafe fn group(ops: &[P2p<'_>]) -> Result<()> {
    let Some(first) = ops.first().map(|op| op.comm.device) else { return Ok(()) };
    result::group_start().map_err(|e| failed(first, "ncclGroupStart", e))?;
    let mut first_err = None;
    for op in ops {
        let peer = c_int::try_from(op.peer).unwrap_or(c_int::MAX);
        let (dt, count) = (sys::ncclDataType_t::ncclUint8, op.bytes);
        let r = if op.send {
            // SAFETY: forwarded from the caller.
            unsafe { result::send(op.addr as *const c_void, count, dt, peer, op.comm.comm, op.comm.stream) }
                .map_err(|e| failed(op.comm.device, "ncclSend", e))
        } else {
            // SAFETY: forwarded from the caller.
            unsafe { result::recv(op.addr as *mut c_void, count, dt, peer, op.comm.comm, op.comm.stream) }
                .map_err(|e| failed(op.comm.device, "ncclRecv", e))
        };
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    // Ended even after a failure: a group left open would swallow the next calls.
    let ended = result::group_end().map_err(|e| failed(first, "ncclGroupEnd", e));
    let r = first_err.or(ended.err()).map_or(Ok(()), Err);
    if r.is_err() {
        ops.iter().for_each(|op| op.comm.failed.store(true, std::sync::atomic::Ordering::Relaxed));
    }
    r
}

/// Queues the sum over the communicator's ranks of `count` numbers of `like`'s type (its
/// value unused), in place, at each held rank's address (`ranks`), in one group.
///
/// # Safety
/// Each address holds `count` numbers of that type on its rank's device, live until the
/// sum has run.
pub(crate) unsafe fn sum(ranks: &[(&DeviceComm, u64)], like: Scalar, count: usize) -> Result<()> {
    let Some(first) = ranks.first().map(|(c, _)| c.device) else { return Ok(()) };
    use sys::ncclDataType_t as T;
    let dt = match like {
        Scalar::F32(_) => T::ncclFloat32,
        Scalar::F64(_) => T::ncclFloat64,
        Scalar::I32(_) => T::ncclInt32,
        Scalar::I64(_) => T::ncclInt64,
        Scalar::U32(_) => T::ncclUint32,
        Scalar::U64(_) => T::ncclUint64,
    };
    let op = sys::ncclRedOp_t::ncclSum;
    result::group_start().map_err(|e| failed(first, "ncclGroupStart", e))?;
    let mut first_err = None;
    for &(c, addr) in ranks {
        let p = addr as *mut c_void;
        // SAFETY: forwarded from the caller.
        if let Err(e) = unsafe { result::all_reduce(p, p, count, dt, op, c.comm, c.stream) } {
            first_err.get_or_insert(failed(c.device, "ncclAllReduce", e));
        }
    }
    let ended = result::group_end().map_err(|e| failed(first, "ncclGroupEnd", e));
    let r = first_err.or(ended.err()).map_or(Ok(()), Err);
    if r.is_err() {
        ranks.iter().for_each(|(c, _)| c.failed.store(true, std::sync::atomic::Ordering::Relaxed));
    }
    r
}

impl DeviceComm {
    /// The runtime's number of the device.
    pub(crate) fn device(&self) -> usize {
        self.device
    }

    /// Its rank in the communicator.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }
}

impl Drop for DeviceComm {
    fn drop(&mut self) {
        // SAFETY: the communicator is this value's. Finalising waits for its queued
        // operations (their buffers are freed only after the device's queued work, which
        // records them); after a failure it is aborted instead, which does not wait.
        unsafe {
            if self.failed.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = result::comm_abort(self.comm);
            } else {
                let _ = result::comm_finalize(self.comm);
                let _ = result::comm_destroy(self.comm);
            }
        }
    }
}

fn message(r: sys::ncclResult_t) -> String {
    // SAFETY: NCCL returns a static string for every result code.
    let s = unsafe { sys::ncclGetErrorString(r) };
    if s.is_null() {
        return format!("{r:?}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

fn failed(device: usize, call: &'static str, e: result::NcclError) -> Error {
    Error::Driver { device, call, message: format!("{} ({:?})", message(e.0), e.0) }
}
