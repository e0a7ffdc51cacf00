//! The MPI world a rank lives in: its rank, its node, collectives, and the runtime of its
//! own devices.

use std::ffi::c_int;

use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Count;

use crate::cluster::placement::{normalize_bus_id, rank_devices};
use crate::error::{Error, Result};
use crate::rt::{Runtime, RuntimeBuilder};

/// This process's place in an MPI job: the world communicator, the node's (a
/// shared-memory split of the world) and what the MPI library can do. Made once per
/// process by [`Cluster::init`]; MPI is finalized when it is dropped.
///
/// MPI is initialized with `MPI_THREAD_MULTIPLE`, so a `Cluster` may be shared by threads
/// (a rank's device threads exchange their own halos, its leader sums the norm). Its
/// collectives (sums, gathers, barriers, [`Cluster::runtime`]) run one at a time within a
/// rank, and, as MPI requires, every rank must make them in the same order: two threads
/// of a rank making collectives at once pair with the other ranks' in whichever order they
/// get here.
pub struct Cluster {
    // Dropped last (fields drop in order): MPI_Finalize after the communicators are freed.
    world: SimpleCommunicator,
    node: SimpleCommunicator,
    /// Held through each collective, so that a collective of two steps (a gather: lengths,
    /// then bytes) never interleaves with another of the same rank.
    collective: parking_lot::Mutex<()>,
    cuda_aware: bool,
    host: String,
    library: String,
    _universe: Universe,
}

// SAFETY: MPI was initialized with MPI_THREAD_MULTIPLE (checked in `init`), under which MPI
// allows calls on one communicator from any thread at once; the collectives are serialized
// by `collective` (their order across ranks is the caller's, as in MPI); the struct holds
// nothing else that is shared mutably.
unsafe impl Sync for Cluster {}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("node_rank", &self.node_rank())
            .field("node_size", &self.node_size())
            .field("host", &self.host)
            .field("cuda_aware", &self.cuda_aware)
            .finish()
    }
}

/// The rank's runtime and what it took, from [`Cluster::runtime`].
#[derive(Debug)]
pub struct RankRuntime {
    /// The runtime, with only this rank's devices.
    pub runtime: Runtime,
    /// The GPUs this rank took, by UUID (bus id where the driver gives none; empty: it runs
    /// on host devices).
    pub gpus: Vec<String>,
    /// One line saying where the rank runs: host, ranks, devices, NUMA nodes, CPUs.
    pub placement: String,
}

fn mpi_error(rank: usize, call: &'static str, message: String) -> Error {
    Error::Mpi { rank, call, message }
}

impl Cluster {
    /// Initializes MPI with `MPI_THREAD_MULTIPLE` (as a singleton of one rank when the
    /// program was not started by `mpirun`), splits off the node's communicator and asks
    /// the library whether it takes device pointers (Open MPI's
    /// `MPIX_Query_cuda_support`, looked up at run time so that MPICH links too).
    ///
    /// An error when MPI was initialized already or cannot give `MPI_THREAD_MULTIPLE`.
    pub fn init() -> Result<Self> {
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| mpi_error(0, "MPI_Init_thread", "MPI is initialized already".into()))?;
        if threading != mpi::Threading::Multiple {
            return Err(mpi_error(
                universe.world().rank() as usize,
                "MPI_Init_thread",
                format!("the MPI library gives {threading:?} threading; offload needs Multiple (a rank's device threads call MPI concurrently)"),
            ));
        }
        let world = universe.world();
        let node = world.split_shared(world.rank());
        let host = mpi::environment::processor_name().unwrap_or_else(|_| "?".into());
        let library = mpi::environment::library_version()
            .map(|s| s.trim_end_matches('\0').lines().next().unwrap_or("").to_string())
            .unwrap_or_default();
        Ok(Self {
            world,
            node,
            collective: parking_lot::Mutex::new(()),
            cuda_aware: query_cuda_support() == Some(1),
            host,
            library,
            _universe: universe,
        })
    }

    /// This rank, `0..size()`.
    pub fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    /// Ranks in the job.
    pub fn size(&self) -> usize {
        self.world.size() as usize
    }

    /// This rank's place among the ranks of its node.
    pub fn node_rank(&self) -> usize {
        self.node.rank() as usize
    }

    /// Ranks on this node.
    pub fn node_size(&self) -> usize {
        self.node.size() as usize
    }

    /// Whether this is rank 0 (which prints).
    pub fn is_root(&self) -> bool {
        self.rank() == 0
    }

    /// The node's name as MPI gives it.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The MPI library's version line.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// Whether the MPI library said at run time that it takes CUDA device pointers.
    pub fn cuda_aware(&self) -> bool {
        self.cuda_aware
    }

    /// The world communicator, for the program's own MPI calls.
    pub fn world(&self) -> &SimpleCommunicator {
        &self.world
    }

    /// Ends the whole job with `code` (`MPI_Abort`): what a rank does when it fails on its
    /// own, so that the others do not wait for it forever.
    pub fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }

    /// Waits for every rank.
    pub fn barrier(&self) {
        let _one = self.collective.lock();
        self.world.barrier();
    }

    /// The sum of every rank's `x` (`MPI_Allreduce`), on every rank.
    pub fn sum(&self, x: f64) -> f64 {
        let _one = self.collective.lock();
        let mut total = 0.0;
        self.world.all_reduce_into(&x, &mut total, SystemOperation::sum());
        total
    }

    /// The largest of every rank's `x`, on every rank.
    pub fn max(&self, x: f64) -> f64 {
        let _one = self.collective.lock();
        let mut m = 0.0;
        self.world.all_reduce_into(&x, &mut m, SystemOperation::max());
        m
    }

    /// Every rank's `text`, in rank order, on rank 0 (`None` on the others). An error
    /// (on every rank alike) when the texts together exceed an MPI count.
    pub fn gather_to_root(&self, text: &str) -> Result<Option<Vec<String>>> {
        let _one = self.collective.lock();
        gather(&self.world, self.rank(), text, false)
    }

    /// Every node rank's `text`, in node order, on every rank of the node.
    fn node_all_gather(&self, text: &str) -> Result<Vec<String>> {
        let _one = self.collective.lock();
        Ok(gather(&self.node, self.rank(), text, true)?.unwrap_or_default())
    }

    /// Builds this rank's runtime: the node's ranks share out the GPUs they see by UUID
    /// ([`rank_devices`]), so a per-rank `CUDA_VISIBLE_DEVICES` or renumbering cannot
    /// make two ranks take one GPU by mistake or one rank take a GPU it was not given;
    /// `builder` then gets exactly the GPUs this rank took (`available_devices` by UID, no
    /// host devices). The runtime binds each device's workers and staging memory to that
    /// GPU's NUMA node, as in one process. A rank that sees no GPU, or whose `builder`
    /// turned GPUs off, gets `builder` as it is (host devices). Collective over the node:
    /// every rank of it must call it.
    pub fn runtime(&self, builder: RuntimeBuilder) -> Result<RankRuntime> {
        // The GPUs this rank can see, by UUID (bus id without one) in its device order; a
        // failed probe still takes part in the gather (with nothing), then is the error.
        let probe = builder.wants_gpus().then(|| builder.clone().host_devices(0).build()).transpose();
        let (ids, uids): (Vec<String>, Vec<String>) = match &probe {
            Ok(Some(rt)) => (0..rt.num_devices())
                .filter_map(|d| {
                    let desc = rt.describe(d).ok()?;
                    let id =
                        desc.uuid.clone().or_else(|| desc.pci_bus_id.as_deref().map(normalize_bus_id))?;
                    Some((id, rt.device_uid(d).ok()?))
                })
                .unzip(),
            _ => (Vec::new(), Vec::new()),
        };
        let probe = probe.map(drop);
        let views: Vec<Vec<String>> = self
            .node_all_gather(&ids.join(","))?
            .into_iter()
            .map(|s| s.split(',').filter(|b| !b.is_empty()).map(str::to_string).collect())
            .collect();
        probe?;
        let mine = rank_devices(&views, self.node_rank())?;
        let gpus: Vec<String> = mine.iter().map(|&i| ids[i].clone()).collect();
        let runtime = if mine.is_empty() {
            builder.build()?
        } else {
            builder.host_devices(0).available_devices(mine.iter().map(|&i| uids[i].clone())).build()?
        };
        let placement = self.placement_line(&runtime);
        Ok(RankRuntime { runtime, gpus, placement })
    }

    /// "rank R of N on HOST (node rank r of n): device 0 NAME bus B, NUMA [..], workers on CPUs ..".
    fn placement_line(&self, rt: &Runtime) -> String {
        let mut line = format!(
            "rank {} of {} on {} (node rank {} of {}):",
            self.rank(),
            self.size(),
            self.host,
            self.node_rank(),
            self.node_size()
        );
        for d in 0..rt.num_devices() {
            let desc = rt.describe(d).ok();
            let name = desc.map_or("", |x| x.name.as_str());
            let bus = desc.and_then(|x| x.pci_bus_id.as_deref());
            let numa = rt.placement(d).map(|p| format!("{:?}", p.numa_nodes)).unwrap_or_default();
            let cpus = match rt.worker_binding(d) {
                Ok(Ok(c)) => crate::topology::ranges(&c),
                Ok(Err(why)) => format!("unbound ({why})"),
                Err(e) => e.to_string(),
            };
            line.push_str(&format!(
                " device {d} {name}{}, NUMA {numa}, workers on CPUs {cpus};",
                bus.map_or(String::new(), |b| format!(" bus {b}"))
            ));
        }
        if rt.num_devices() == 0 {
            line.push_str(" no device (the initial device only)");
        }
        line.trim_end_matches(';').to_string()
    }
}

/// Gathers every rank's `text` of `comm`: on every rank with `all`, else on rank 0. The
/// lengths go to every rank first, so that every rank sees a total that does not fit and
/// returns the same error before the second step.
fn gather(comm: &SimpleCommunicator, rank: usize, text: &str, all: bool) -> Result<Option<Vec<String>>> {
    // One byte more than the text (Open MPI refuses a gather of no bytes at all).
    let framed = format!("{text}\n");
    let bytes = framed.as_bytes();
    let n = comm.size() as usize;
    let mut lens = vec![0u64; n];
    comm.all_gather_into(&(bytes.len() as u64), &mut lens[..]);
    let too_large = || {
        mpi_error(
            rank,
            "MPI_Gatherv",
            format!("{} bytes to gather exceed an MPI count", lens.iter().sum::<u64>()),
        )
    };
    let mut counts = Vec::with_capacity(n);
    let mut displs = Vec::with_capacity(n);
    let mut at: Count = 0;
    for &l in &lens {
        let l = Count::try_from(l).map_err(|_| too_large())?;
        counts.push(l);
        displs.push(at);
        at = at.checked_add(l).ok_or_else(too_large)?;
    }
    let root = comm.process_at_rank(0);
    if !all && comm.rank() != 0 {
        root.gather_varcount_into(bytes);
        return Ok(None);
    }
    let mut all_bytes = vec![0u8; at as usize];
    {
        let mut part = PartitionMut::new(&mut all_bytes[..], &counts[..], &displs[..]);
        if all {
            comm.all_gather_varcount_into(bytes, &mut part);
        } else {
            root.gather_varcount_into_root(bytes, &mut part);
        }
    }
    let texts = counts
        .iter()
        .zip(&displs)
        .map(|(&l, &d)| {
            let t = &all_bytes[d as usize..(d + l) as usize];
            String::from_utf8_lossy(t.strip_suffix(b"\n").unwrap_or(t)).into_owned()
        })
        .collect();
    Ok(Some(texts))
}

/// Open MPI's `MPIX_Query_cuda_support()`, looked up in the loaded libraries (MPICH has no
/// such symbol); `None` where it does not exist.
fn query_cuda_support() -> Option<c_int> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the symbol up.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"MPIX_Query_cuda_support".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    // SAFETY: Open MPI declares it `int MPIX_Query_cuda_support(void)` (mpi-ext.h).
    let f: extern "C" fn() -> c_int = unsafe { std::mem::transmute(sym) };
    Some(f())
}
