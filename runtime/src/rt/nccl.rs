//! The runtime's door to NCCL (`backend/cuda/nccl.rs`, feature `nccl`) for
//! `crate::collective`: the ranks of a communicator on this runtime's CUDA devices, their
//! grouped sends and receives and sums, each range checked against its device's live
//! blocks first.

#[cfg(feature = "nccl")]
pub(crate) use with_nccl::*;

/// One send or receive of a group ([`Runtime::nccl_group`]): `bytes` of device memory at
/// `addr` on `device` (a device with a rank in the group's ranks), with rank `peer`.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
pub(crate) struct Transfer {
    pub(crate) device: usize,
    pub(crate) send: bool,
    pub(crate) addr: u64,
    pub(crate) bytes: usize,
    pub(crate) peer: usize,
}

#[cfg(feature = "nccl")]
mod with_nccl {
    use std::panic::Location;

    use super::Transfer;
    use crate::backend::cuda::nccl::{self, DeviceComm, P2p};
    use crate::data_env::plan::Short;
    use crate::device::BlocksInUse;
    use crate::error::{Error, Result};
    use crate::kernel::Scalar;
    use crate::origin::Origin;
    use crate::rt::Runtime;

    /// The ranks of one NCCL communicator that this process holds, one CUDA device each.
    #[derive(Debug)]
    pub(crate) struct NcclRanks(Vec<DeviceComm>);

    impl NcclRanks {
        /// `(device, rank)` of each, in the order made.
        pub(crate) fn held(&self) -> Vec<(usize, usize)> {
            self.0.iter().map(|c| (c.device(), c.rank())).collect()
        }
    }

    /// NCCL's version, or why it cannot be loaded.
    pub(crate) fn nccl_probe() -> std::result::Result<String, String> {
        nccl::probe()
    }

    impl Runtime {
        /// A new communicator identity (NCCL found first), made for `device` (named in an
        /// error).
        pub(crate) fn nccl_unique_id(&self, device: usize) -> Result<[u8; 128]> {
            nccl::probe().map_err(|message| Error::Driver { device, call: "load NCCL", message })?;
            nccl::unique_id(device)
        }

        /// Ranks `ranks[i]` of the communicator `id` of `nranks` ranks, on `devices[i]` (CUDA
        /// devices of this runtime, checked by the caller), made in one group.
        pub(crate) fn nccl_ranks(
            &self,
            devices: &[usize],
            ranks: &[usize],
            nranks: usize,
            id: &[u8; 128],
        ) -> Result<NcclRanks> {
            let states = devices.iter().map(|&d| self.device_state(d)).collect::<Result<Vec<_>>>()?;
            let backends: Vec<&dyn crate::backend::Backend> = states.iter().map(|s| s.backend()).collect();
            nccl::init(&backends, ranks, nranks, id).map(NcclRanks)
        }

        /// Queues `ops` on `ranks` as one group, each range checked inside a live block of
        /// its device first, and records the group as each device's queued work (a read or
        /// a free of its buffers waits for it; under `OFFLOAD_SYNC=1` it is waited for).
        ///
        /// # Safety
        /// Each op's memory stays allocated until its device's queued work has run, and no
        /// other work writes a buffer sent or touches a buffer received meanwhile.
        #[track_caller]
        pub(crate) unsafe fn nccl_group(&self, ranks: &NcclRanks, ops: &[Transfer]) -> Result<()> {
            let at = Location::caller();
            let mut p2p = Vec::with_capacity(ops.len());
            for op in ops {
                let Some(comm) = ranks.0.iter().find(|c| c.device() == op.device) else {
                    return Err(Error::InvalidArgument {
                        routine: "NcclComm",
                        what: format!("device {} has no rank here", op.device),
                    });
                };
                self.device_state(op.device)?.check_range("ncclSend/ncclRecv", op.addr, op.bytes)?;
                p2p.push(P2p { comm, send: op.send, addr: op.addr, bytes: op.bytes, peer: op.peer });
            }
            // SAFETY: forwarded from the caller; each range checked inside a live block.
            let sent = unsafe { nccl::group(&p2p) };
            let mut devices: Vec<usize> = ops.iter().map(|op| op.device).collect();
            devices.sort_unstable();
            devices.dedup();
            let recorded = self.nccl_queued(&devices, "an NCCL group of sends and receives", at);
            sent.and(recorded)
        }

        /// Records the NCCL work just queued on each of `devices`' compute queues as the
        /// device's queued work, or waits for it where the device waits for each construct.
        fn nccl_queued(
            &self,
            devices: &[usize],
            what: &'static str,
            at: &'static Location<'static>,
        ) -> Result<()> {
            let mut first_err = None;
            for &d in devices {
                let r = self.device_state(d).and_then(|s| {
                    if s.ordered() {
                        s.queued(Origin::new(what, at), BlocksInUse::new(s), Short::new())
                    } else {
                        s.settle_queue(true)
                    }
                });
                if let Err(e) = r {
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        }

        /// Queues the sum over the communicator's ranks of `count` numbers of `like`'s type
        /// at `addrs[i]` on held rank `i`'s device, in place, each range checked first;
        /// recorded as each device's queued work, as [`Runtime::nccl_group`] does.
        ///
        /// # Safety
        /// Each range stays allocated until its device's queued work has run.
        #[track_caller]
        pub(crate) unsafe fn nccl_sum(
            &self,
            ranks: &NcclRanks,
            addrs: &[u64],
            like: Scalar,
            count: usize,
        ) -> Result<()> {
            let at = Location::caller();
            let bytes = count.checked_mul(like.to_ne_bytes().1).ok_or_else(|| Error::Overflow {
                routine: "NcclComm::sum",
                what: format!("{count} {}", like.type_name()),
            })?;
            let mut held = Vec::with_capacity(addrs.len());
            for (c, &addr) in ranks.0.iter().zip(addrs) {
                self.device_state(c.device())?.check_range("ncclAllReduce", addr, bytes)?;
                held.push((c, addr));
            }
            // SAFETY: forwarded from the caller; each range checked inside a live block.
            let summed = unsafe { nccl::sum(&held, like, count) };
            let devices: Vec<usize> = held.iter().map(|(c, _)| c.device()).collect();
            summed.and(self.nccl_queued(&devices, "an NCCL sum", at))
        }
    }
}
