//! The generic platform: discovery, numbering, the peer matrix and the device report,
//! written once over each vendor's small hooks ([`VendorPlatform`]), in the shape of LLVM's
//! `GenericPluginTy` over its vendor plugins. CUDA, HIP and host devices are platforms
//! alike; the runtime's builder only asks each one for its devices ([`Platform::discover`]).

use std::collections::BTreeSet;

use super::{Backend, BackendKind};
use crate::error::Result;

/// What a vendor supplies to the generic platform.
pub(crate) trait VendorPlatform {
    /// The vendor's device type.
    type Device: Backend;

    /// The backend of its devices.
    fn kind(&self) -> BackendKind;

    /// How many devices the driver reports, or why there are none (the report says it).
    fn device_count(&self) -> std::result::Result<usize, String>;

    /// Opens the vendor's device `ordinal` as runtime device `number`.
    fn open(&self, number: usize, ordinal: usize) -> Result<Self::Device>;

    /// Enables `a`'s access to `b`'s memory where the hardware allows it; whether it did
    /// (the generic platform records it in the [`PeerMatrix`]).
    fn enable_peer(&self, _a: &Self::Device, _b: &Self::Device) -> Result<bool> {
        Ok(false)
    }

    /// What the device report says of a device after its number and name (architecture,
    /// PCI bus id, UUID); `None`: the device is not listed one by one.
    fn details(&self, d: &Self::Device) -> Option<String>;

    /// The report line's head for `count` devices.
    fn summary(&self, count: usize) -> String {
        format!("{}: {count} devices", self.kind().name())
    }

    /// Runs once the devices are open (CUDA starts loading NVRTC beside the program).
    fn opened(&self, _devices: &[Self::Device]) {}
}

/// A platform as the runtime's builder sees it.
pub(crate) trait Platform {
    /// The backend of its devices.
    fn kind(&self) -> BackendKind;

    /// Its devices, numbered from `first`, with peer access enabled where possible (each
    /// pair enabled added to `peers`), and one line for the device report (why there are
    /// none, too).
    fn discover(&self, first: usize, peers: &mut PeerMatrix) -> (Vec<Box<dyn Backend>>, String);
}

/// Which devices copy straight from which others' memory (peer access enabled at
/// discovery), by runtime device number: one table above the vendors, which only enable a
/// pair ([`VendorPlatform::enable_peer`]) and copy between the pairs it holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PeerMatrix(BTreeSet<(usize, usize)>);

impl PeerMatrix {
    /// Device `dst` reads device `src`'s memory directly.
    pub(crate) fn allow(&mut self, dst: usize, src: usize) {
        self.0.insert((dst, src));
    }

    /// Whether device `dst` reads device `src`'s memory directly (a device reads its own).
    pub(crate) fn reaches(&self, dst: usize, src: usize) -> bool {
        dst == src || self.0.contains(&(dst, src))
    }

    /// The matrix once devices are chosen and renumbered: new device `n` was `chosen[n]`.
    pub(crate) fn renumbered(&self, chosen: &[usize]) -> Self {
        let new = |old: usize| chosen.iter().position(|&c| c == old);
        Self(self.0.iter().filter_map(|&(d, s)| Some((new(d)?, new(s)?))).collect())
    }
}

impl<P: VendorPlatform> Platform for P {
    fn kind(&self) -> BackendKind {
        VendorPlatform::kind(self)
    }

    fn discover(&self, first: usize, peers: &mut PeerMatrix) -> (Vec<Box<dyn Backend>>, String) {
        let count = match self.device_count() {
            Ok(n) => n,
            Err(why) => return (Vec::new(), format!("{} ({why})", self.summary(0))),
        };
        let mut devices: Vec<P::Device> = Vec::new();
        let mut notes = Vec::new();
        for ordinal in 0..count {
            match self.open(first + devices.len(), ordinal) {
                Ok(d) => devices.push(d),
                Err(e) => notes.push(format!("device {ordinal} of the driver skipped: {e}")),
            }
        }
        for (i, a) in devices.iter().enumerate() {
            for (j, b) in devices.iter().enumerate().filter(|&(j, _)| j != i) {
                match self.enable_peer(a, b) {
                    Ok(true) => peers.allow(first + i, first + j),
                    Ok(false) => {}
                    Err(e) => notes.push(format!("peer access {}->{}: {e}", first + i, first + j)),
                }
            }
        }
        if !devices.is_empty() {
            self.opened(&devices);
        }
        let mut line = self.summary(devices.len());
        for (i, d) in devices.iter().enumerate() {
            if let Some(details) = self.details(d) {
                line.push_str(&format!("; device {} = {} ({details})", first + i, d.description().name));
            }
        }
        for n in notes {
            line.push_str("; ");
            line.push_str(&n);
        }
        (devices.into_iter().map(|d| Box::new(d) as Box<dyn Backend>).collect(), line)
    }
}

/// A kernel's identity on a device: its symbol and where its source lives (two kernels of
/// one name from different sources are different kernels).
#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
pub(crate) type KernelKey = (&'static str, usize);

/// The kernels a GPU has loaded, each once, on its first use there: the per-device half of
/// the kernel cache, written once for every vendor (`F`: the vendor's loaded function and
/// what it learned of it). Compiled code is kept across processes by [`crate::kernel_cache`].
#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
pub(crate) struct LoadedKernels<F>(parking_lot::Mutex<std::collections::HashMap<KernelKey, F>>);

#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
impl<F: Clone> LoadedKernels<F> {
    pub(crate) fn new() -> Self {
        Self(parking_lot::Mutex::new(std::collections::HashMap::new()))
    }

    /// `kernel`'s source for `backend`, `src` (what the kernel has for it), or an error
    /// naming device `device`.
    pub(crate) fn source<'s>(
        device: usize,
        kernel: &crate::kernel::Kernel,
        backend: BackendKind,
        src: Option<&'s str>,
    ) -> Result<&'s str> {
        src.ok_or(crate::Error::NoKernelImpl { device, kernel: kernel.name(), backend: backend.name() })
    }

    /// The function loaded for `kernel` from `src`, loading it by `load` on first use. Two
    /// threads' first uses may both load; the first stored is kept.
    pub(crate) fn get_or_load(
        &self,
        kernel: &crate::kernel::Kernel,
        src: &str,
        load: impl FnOnce() -> Result<F>,
    ) -> Result<F> {
        let key = (kernel.symbol(), src.as_ptr() as usize);
        if let Some(f) = self.0.lock().get(&key) {
            return Ok(f.clone());
        }
        let f = load()?;
        Ok(self.0.lock().entry(key).or_insert(f).clone())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::host::{HostDevice, KernelPool};
    use crate::backend::worker::DeviceWorker;

    /// Two host devices from a vendor whose third device fails to open, each reading the
    /// memory of those numbered above it.
    struct TwoOfThree;

    impl VendorPlatform for TwoOfThree {
        type Device = HostDevice;
        fn kind(&self) -> BackendKind {
            BackendKind::Host
        }
        fn device_count(&self) -> std::result::Result<usize, String> {
            Ok(3)
        }
        fn open(&self, number: usize, ordinal: usize) -> Result<HostDevice> {
            if ordinal == 1 {
                return Err(crate::Error::Driver { device: number, call: "open", message: "broken".into() });
            }
            let topology = crate::topology::Topology::system();
            let w =
                Arc::new(DeviceWorker::spawn(format!("t{ordinal}"), topology, Vec::new()).expect("worker"));
            Ok(HostDevice::new(
                number,
                ordinal,
                1 << 20,
                w,
                KernelPool::new(format!("t{ordinal}"), Some(1), None),
            ))
        }
        fn details(&self, _: &HostDevice) -> Option<String> {
            Some("test".into())
        }
        fn enable_peer(&self, a: &HostDevice, b: &HostDevice) -> Result<bool> {
            Ok(a.number() < b.number())
        }
    }

    #[test]
    fn a_kernel_is_loaded_once_per_device() {
        static K: crate::kernel::Kernel = crate::kernel::Kernel::new("k");
        let loaded = LoadedKernels::new();
        let mut loads = 0;
        for _ in 0..3 {
            let f = loaded.get_or_load(&K, "src", || {
                loads += 1;
                Ok(7u32)
            });
            assert_eq!(f.ok(), Some(7));
        }
        assert_eq!(loads, 1);
        let none = LoadedKernels::<u32>::source(3, &K, BackendKind::Cuda, K.cuda_source());
        assert!(none.is_err_and(|e| e.to_string().contains("device 3: kernel `k` has no cuda")));
    }

    #[test]
    fn discovery_numbers_the_devices_that_open_and_reports_the_others() {
        let mut peers = PeerMatrix::default();
        let (devices, line) = TwoOfThree.discover(5, &mut peers);
        let numbers: Vec<usize> = devices.iter().map(|d| d.number()).collect();
        assert_eq!(numbers, [5, 6]);
        assert!(line.starts_with("host: 2 devices; device 5 = "), "{line}");
        assert!(line.contains("device 1 of the driver skipped: device 6"), "{line}");
        assert!(peers.reaches(5, 6) && !peers.reaches(6, 5), "by the devices' numbers: {peers:?}");
    }

    #[test]
    fn the_peer_matrix_follows_the_devices_chosen() {
        let mut m = PeerMatrix::default();
        for (d, s) in [(0, 1), (1, 0), (1, 2), (2, 3)] {
            m.allow(d, s);
        }
        assert!(m.reaches(0, 1) && m.reaches(3, 3) && !m.reaches(0, 2) && !m.reaches(2, 1));
        // Devices 2 and 1 kept, in that order: 2 becomes 0, 1 becomes 1.
        let r = m.renumbered(&[2, 1]);
        assert!(r.reaches(1, 0), "1 read 2");
        assert!(!r.reaches(0, 1), "2 did not read 1");
        assert_eq!(r.0.len(), 1);
    }
}
