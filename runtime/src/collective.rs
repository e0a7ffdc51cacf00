//! A collective library's communicator over devices: NCCL on CUDA GPUs, loaded at run time
//! (built with feature `nccl`, on by default).
//!
//! An [`NcclComm`] holds the ranks of one communicator that this process drives, one CUDA
//! device each: every device of a process ([`NcclComm::of_devices`]), or one rank of an MPI
//! job whose identity ([`NcclId`]) rank 0 made and broadcast ([`NcclComm::of_rank`]). Its
//! sends, receives and sums are queued on each device's compute queue, after the work
//! queued there before them and before the work queued after: no thread waits.
//! [`crate::partition::DistributedGrid::exchange_halos_over`] moves a grid's halos with
//! one; `cluster::GridRanks` moves them between ranks with one (`OFFLOAD_HALO=nccl`).
//!
//! Where NCCL cannot run (not built in, no library, a device that is not a CUDA GPU, two
//! ranks on one device), making a communicator fails with the reason, and
//! [`NcclComm::available`] says so before anything is made.
//!
//! ```
//! use offload::collective::NcclComm;
//! use offload::Runtime;
//!
//! let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
//! // Host devices are not CUDA GPUs: refused, with the reason.
//! let err = NcclComm::of_devices(&rt, &[0, 1]).unwrap_err();
//! assert!(err.to_string().contains("not a CUDA GPU"), "{err}");
//! # Ok::<(), offload::Error>(())
//! ```

use std::ops::Range;

use crate::api::DeviceBuffer;
use crate::error::{Error, Result};
use crate::kernel::{DeviceCopy, KernelScalar, Scalar};
use crate::rt::Runtime;
use crate::BackendKind;

pub(crate) use crate::rt::nccl::Transfer;
#[cfg(feature = "nccl")]
use crate::rt::nccl::{nccl_probe, NcclRanks};

/// A communicator's identity: made once ([`NcclId::new`]), given to every rank (over MPI,
/// as bytes), which then makes its rank with it ([`NcclComm::of_rank`]).
#[derive(Clone, PartialEq, Eq)]
pub struct NcclId([u8; 128]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclId(..)")
    }
}

impl NcclId {
    /// A new identity (NCCL's `ncclGetUniqueId`), made by the process that will hold a
    /// rank on `device` of `rt` (named in an error).
    ///
    /// Errors: NCCL not built in or not loadable ([`Error::InvalidArgument`] with the
    /// reason), or its call failing ([`Error::Driver`]).
    pub fn new(rt: &Runtime, device: usize) -> Result<Self> {
        #[cfg(feature = "nccl")]
        {
            nccl_probe().map_err(unavailable)?;
            rt.nccl_unique_id(device).map(Self)
        }
        #[cfg(not(feature = "nccl"))]
        {
            let _ = (rt, device);
            Err(unavailable(not_built()))
        }
    }

    /// The identity as bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0
    }

    /// The identity another rank made, from its bytes.
    pub fn from_bytes(bytes: [u8; 128]) -> Self {
        Self(bytes)
    }
}

/// The ranks of an NCCL communicator that this process drives, one CUDA device each.
pub struct NcclComm<'rt> {
    rt: &'rt Runtime,
    /// `(device, rank)` of each rank held here, in the order made.
    held: Vec<(usize, usize)>,
    ranks: usize,
    /// One group at a time: NCCL's calls on a communicator are not to interleave.
    #[cfg(feature = "nccl")]
    comms: parking_lot::Mutex<NcclRanks>,
}

impl std::fmt::Debug for NcclComm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm").field("held", &self.held).field("ranks", &self.ranks).finish()
    }
}

impl<'rt> NcclComm<'rt> {
    /// NCCL's version where it can run in this process, else why not (not built in, no
    /// library on the library path).
    pub fn available() -> std::result::Result<String, String> {
        #[cfg(feature = "nccl")]
        {
            nccl_probe()
        }
        #[cfg(not(feature = "nccl"))]
        Err(not_built())
    }

    /// A communicator of this process alone over `devices` of `rt`: rank `i` on
    /// `devices[i]` (each rank made by `ncclCommInitRank`, in one group).
    ///
    /// One group runs at a time on a communicator; two communicators over one GPU must not
    /// be used from two threads at once (NCCL's rule: their kernels may wait on each
    /// other).
    ///
    /// Errors: no devices, a device twice, or one that is not a CUDA GPU; NCCL not built
    /// in or not loadable ([`Error::InvalidArgument`], with the reason); NCCL's calls
    /// failing ([`Error::Driver`]).
    pub fn of_devices(rt: &'rt Runtime, devices: &[usize]) -> Result<Self> {
        let ranks: Vec<usize> = (0..devices.len()).collect();
        Self::checked(rt, devices, devices.len())?;
        #[cfg(feature = "nccl")]
        {
            let id = NcclId::new(rt, devices[0])?.0;
            Self::made(rt, devices, &ranks, devices.len(), &id)
        }
        #[cfg(not(feature = "nccl"))]
        {
            let _ = ranks;
            Err(unavailable(not_built()))
        }
    }

    /// Rank `rank` of a communicator of `ranks` ranks named `id`, on `device` of `rt` (one
    /// rank of an MPI job: every rank calls this with the same `id`, together).
    ///
    /// Errors: as [`NcclComm::of_devices`]; a rank not below `ranks`.
    pub fn of_rank(rt: &'rt Runtime, device: usize, rank: usize, ranks: usize, id: &NcclId) -> Result<Self> {
        if rank >= ranks {
            return Err(Error::InvalidArgument {
                routine: "NcclComm::of_rank",
                what: format!("rank {rank} of {ranks}; expected a rank below {ranks}"),
            });
        }
        Self::checked(rt, &[device], ranks)?;
        #[cfg(feature = "nccl")]
        {
            nccl_probe().map_err(unavailable)?;
            Self::made(rt, &[device], &[rank], ranks, &id.0)
        }
        #[cfg(not(feature = "nccl"))]
        {
            let _ = id;
            Err(unavailable(not_built()))
        }
    }

    /// Refuses devices NCCL cannot take: none, one twice, one not a CUDA GPU.
    fn checked(rt: &Runtime, devices: &[usize], ranks: usize) -> Result<()> {
        let bad = |what: String| Error::InvalidArgument { routine: "NcclComm", what };
        if devices.is_empty() || ranks == 0 {
            return Err(bad("no devices; expected one CUDA GPU a rank".into()));
        }
        for (i, &d) in devices.iter().enumerate() {
            if devices[..i].contains(&d) {
                return Err(bad(format!("device {d} twice; NCCL takes one rank a GPU")));
            }
            let kind = rt.describe(d)?.kind;
            if kind != BackendKind::Cuda {
                return Err(bad(format!("device {d} is a {} device, not a CUDA GPU", kind.name())));
            }
        }
        Ok(())
    }

    #[cfg(feature = "nccl")]
    fn made(
        rt: &'rt Runtime,
        devices: &[usize],
        ranks: &[usize],
        nranks: usize,
        id: &[u8; 128],
    ) -> Result<Self> {
        let made = rt.nccl_ranks(devices, ranks, nranks, id)?;
        let held = made.held();
        Ok(Self { rt, held, ranks: nranks, comms: parking_lot::Mutex::new(made) })
    }

    /// The runtime its devices are of.
    pub fn runtime(&self) -> &'rt Runtime {
        self.rt
    }

    /// How many ranks the communicator has in all (in every process).
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// `(device, rank)` of each rank this process holds.
    pub fn held(&self) -> &[(usize, usize)] {
        &self.held
    }

    /// The rank held here on `device`, if any.
    pub fn rank_of(&self, device: usize) -> Option<usize> {
        self.held.iter().find(|&&(d, _)| d == device).map(|&(_, r)| r)
    }

    /// Sums elements `range` of `values` over the ranks, in place (NCCL's `ncclAllReduce`,
    /// queued on each device after its work queued before): `values[i]` on the device of
    /// held rank `i` ([`NcclComm::held`]), all of one length. Afterwards every rank's
    /// `range` holds the sum of all ranks' (a read of a buffer waits for it).
    ///
    /// Errors: a buffer per held rank on its device, of one length, expected; a range
    /// inside them expected ([`Error::InvalidArgument`]); a type NCCL has no sum for (the
    /// kernel scalars `i32`, `u32`, `i64`, `u64`, `f32` and `f64` it has); NCCL's call
    /// failing ([`Error::Driver`]).
    #[track_caller]
    pub fn sum<T: KernelScalar + DeviceCopy>(
        &self,
        values: &[&DeviceBuffer<'_, T>],
        range: Range<usize>,
    ) -> Result<()> {
        let bad = |what: String| Error::InvalidArgument { routine: "NcclComm::sum", what };
        if values.len() != self.held.len() {
            return Err(bad(format!("{} buffers for {} ranks held here", values.len(), self.held.len())));
        }
        let len = values.first().map_or(0, |v| v.len());
        for (v, &(d, _)) in values.iter().zip(&self.held) {
            if v.device().number() != d || v.len() != len || !v.device().runtime().same_as(self.rt) {
                return Err(bad(format!(
                    "a buffer of {} values on device {}; expected {len} on device {d} of this runtime",
                    v.len(),
                    v.device().number(),
                )));
            }
        }
        if range.start > range.end || range.end > len {
            return Err(bad(format!("elements {range:?} of buffers of {len}")));
        }
        let like = [
            Scalar::F32(0.0),
            Scalar::F64(0.0),
            Scalar::I32(0),
            Scalar::I64(0),
            Scalar::U32(0),
            Scalar::U64(0),
        ]
        .into_iter()
        .find(|s| T::from_scalar(*s).is_some())
        .ok_or_else(|| bad(format!("{}: not a type NCCL sums", std::any::type_name::<T>())))?;
        if range.is_empty() {
            return Ok(());
        }
        #[cfg(feature = "nccl")]
        {
            let size = std::mem::size_of::<T>() as u64;
            let addrs: Vec<u64> = values.iter().map(|v| v.addr() + range.start as u64 * size).collect();
            // SAFETY: each range lies in a live allocation of its rank's device (checked
            // above, and again by the runtime), borrowed for the call; a free of a buffer
            // waits for the device's queued work, the sum included.
            unsafe { self.rt.nccl_sum(&self.comms.lock(), &addrs, like, range.len()) }
        }
        #[cfg(not(feature = "nccl"))]
        {
            let _ = like;
            Err(unavailable(not_built()))
        }
    }

    /// Queues `ops` as one group (every send and receive posted before any is waited for).
    ///
    /// # Safety
    /// Each op's `bytes` at `addr` lie in a live allocation of its device, kept until the
    /// device's queued work has run; no other work writes a buffer sent or touches a
    /// buffer received meanwhile.
    #[track_caller]
    pub(crate) unsafe fn group(&self, ops: &[Transfer]) -> Result<()> {
        #[cfg(feature = "nccl")]
        {
            // SAFETY: forwarded from the caller (the runtime checks each range).
            unsafe { self.rt.nccl_group(&self.comms.lock(), ops) }
        }
        #[cfg(not(feature = "nccl"))]
        {
            let _ = ops;
            Err(unavailable(not_built()))
        }
    }
}

#[cfg(not(feature = "nccl"))]
fn not_built() -> String {
    "NCCL is not built into this binary (feature `nccl`)".into()
}

fn unavailable(why: String) -> Error {
    Error::InvalidArgument { routine: "NcclComm", what: format!("NCCL cannot run here: {why}") }
}
