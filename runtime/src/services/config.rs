//! Settings: `OMP_TARGET_OFFLOAD`, `OMP_DEFAULT_DEVICE`, `OFFLOAD_HOST_DEVICES`,
//! `OFFLOAD_INFO`, `OFFLOAD_MEMORY_POOL`, `OFFLOAD_STAGING`, `OFFLOAD_STREAMING_STORES`,
//! `OFFLOAD_POPULATE_THREADS`, `OFFLOAD_SPLIT_CREWS`, `OFFLOAD_SYNC`, `OFFLOAD_TRACE`,
//! `OFFLOAD_DUMP_KERNELS`, `OFFLOAD_NARROW_INDICES`, `OFFLOAD_HOST_BF16_DOT`, `OFFLOAD_HOST_AVX512`, and the builder that can set each of them.
//!
//! A value the runtime does not understand (including one that is not UTF-8) is an error
//! naming the variable, the value and what would have been accepted, never a silent
//! default. Builder values and the fields of [`StagingConfig`] and [`PoolConfig`] are
//! checked the same way when the runtime is built ([`Error::InvalidConfig`]).

use std::fmt;

use crate::error::{Error, Result};
use crate::info::InfoFlags;
use crate::services::memory_pool::PoolConfig;
use crate::services::staging::StagingConfig;
use std::path::PathBuf;

/// `OMP_TARGET_OFFLOAD`: what to do when no device is available.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OffloadPolicy {
    /// Use devices when there are any, else run on the initial (host) device.
    #[default]
    Default,
    /// Fail, at start-up and in every construct, when there is no device.
    Mandatory,
    /// Use no device: every construct runs on the host; data constructs do nothing.
    Disabled,
}

impl OffloadPolicy {
    /// Parses the variable's value (case-insensitive, as OpenMP specifies).
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "default" => Ok(Self::Default),
            "mandatory" => Ok(Self::Mandatory),
            "disabled" => Ok(Self::Disabled),
            _ => Err(Error::InvalidSetting {
                var: "OMP_TARGET_OFFLOAD",
                value: value.into(),
                expected: "mandatory, disabled or default",
            }),
        }
    }
}

impl fmt::Display for OffloadPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Default => "default",
            Self::Mandatory => "mandatory",
            Self::Disabled => "disabled",
        })
    }
}

/// Most host devices a runtime starts (`OFFLOAD_HOST_DEVICES`, [`crate::RuntimeBuilder::host_devices`]):
/// each has its own worker thread.
pub const MAX_HOST_DEVICES: usize = 64;

/// Most threads of the host kernel pool ([`crate::RuntimeBuilder::kernel_threads`]).
pub const MAX_KERNEL_THREADS: usize = 1024;

/// Where environment values come from (the process environment, or a test's map): the
/// variable's text, `None` when it is unset, an error when it is set but not UTF-8.
pub(crate) type EnvLookup = std::sync::Arc<dyn Fn(&'static str) -> Result<Option<String>> + Send + Sync>;

pub(crate) fn process_env() -> EnvLookup {
    std::sync::Arc::new(|k| env_text(k, std::env::var_os(k)))
}

/// A lookup that cannot meet non-UTF-8 text (the builder's `env`).
pub(crate) fn lookup_from(lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> EnvLookup {
    std::sync::Arc::new(move |k| Ok(lookup(k)))
}

/// The text of variable `var`; a value that is not UTF-8 is an error, not "unset".
fn env_text(var: &'static str, raw: Option<std::ffi::OsString>) -> Result<Option<String>> {
    raw.map(|v| {
        v.into_string().map_err(|v| Error::InvalidSetting {
            var,
            value: v.to_string_lossy().into_owned(),
            expected: "UTF-8 text",
        })
    })
    .transpose()
}

/// What `OFFLOAD_POPULATE_THREADS` and [`StagingConfig::populate_threads`] accept.
const POPULATE_THREADS_EXPECTED: &str = "0..=1024 threads (0: none)";

/// A whole number from 0 to `max`; otherwise an error naming the variable and `expected`.
fn parse_count(var: &'static str, value: &str, max: usize, expected: &'static str) -> Result<usize> {
    match value.trim().parse::<usize>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(Error::InvalidSetting { var, value: value.into(), expected }),
    }
}

/// The resolved settings a runtime starts with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    pub policy: OffloadPolicy,
    /// `None` when neither `OFFLOAD_HOST_DEVICES` nor the builder says: one host device when
    /// no GPU is found, else none ([`Settings::host_devices_with`]).
    pub host_devices: Option<usize>,
    pub default_device: Option<usize>,
    /// `OMP_DEFAULT_DEVICE` given as a device UID (OpenMP 6.0), resolved after discovery.
    pub default_device_uid: Option<String>,
    /// `OMP_AVAILABLE_DEVICES` (OpenMP 6.0): the devices to keep, in order, each a device
    /// number as discovered or a UID; resolved after discovery.
    pub available_devices: Option<Vec<String>>,
    pub info: InfoFlags,
    pub pool: PoolConfig,
    pub staging: StagingConfig,
    pub topology_xml: Option<PathBuf>,
    /// `OFFLOAD_SYNC=1`: every construct waits for the work it queued (as
    /// `CUDA_LAUNCH_BLOCKING` does), so a failure is reported by the construct that caused it.
    pub synchronous: bool,
    /// `OFFLOAD_TRACE=path.json`: the Chrome trace-event file to write (this rank's, under
    /// an MPI launcher: see [`file_of_rank`]).
    pub trace_file: Option<PathBuf>,
    /// The MPI rank an MPI launcher gave this process, when a trace is written.
    pub trace_rank: Option<u32>,
    /// `OFFLOAD_DUMP_KERNELS=dir`: the folder every kernel's CUDA and HIP source is
    /// written to at its first launch.
    pub dump_kernels: Option<PathBuf>,
    /// `OFFLOAD_NARROW_INDICES` (default off): GPU launches run a kernel's variant with
    /// 32-bit index arithmetic when every bound fits ([`crate::Kernel::with_narrow`]). Off
    /// by default: measured, it is faster for some kernels and slower for others
    /// (docs/PERFORMANCE.md, "32-bit index arithmetic").
    pub narrow_indices: bool,
    /// `OFFLOAD_HOST_BF16_DOT` (default on): host devices compute bf16 products with the
    /// CPU's bf16 dot-product instructions (AVX512-BF16) where it has them, instead of
    /// widening the operands to f32 first (docs/PERFORMANCE.md, "bf16 products on the CPU").
    pub host_bf16_dot: bool,
    /// `OFFLOAD_HOST_AVX512` (default on): release builds' generated kernels run, on host
    /// devices whose CPU has AVX-512 (x86-64-v4), a copy compiled for it, which rustc
    /// vectorises 16 floats wide, instead of the baseline x86-64 one (SSE2).
    pub host_avx512: bool,
}

fn parse_switch(var: &'static str, v: String) -> Result<bool> {
    match v.trim() {
        "1" | "on" | "true" => Ok(true),
        "0" | "off" | "false" => Ok(false),
        _ => Err(Error::InvalidSetting { var, value: v, expected: "1/on/true or 0/off/false" }),
    }
}

impl Settings {
    /// Reads every variable through `env`; `None` fields of `over` are taken from it.
    /// A variable is not read at all when the builder set its value.
    pub(crate) fn resolve(env: &EnvLookup, over: &Overrides) -> Result<Self> {
        let read = |var: &'static str, overridden: bool| if overridden { Ok(None) } else { env(var) };
        let policy = match (over.policy, read("OMP_TARGET_OFFLOAD", over.policy.is_some())?) {
            (Some(p), _) => p,
            (None, Some(v)) => OffloadPolicy::parse(&v)?,
            (None, None) => OffloadPolicy::Default,
        };
        let host_devices =
            match (over.host_devices, read("OFFLOAD_HOST_DEVICES", over.host_devices.is_some())?) {
                (Some(n), _) => Some(n),
                (None, Some(v)) => {
                    Some(parse_count("OFFLOAD_HOST_DEVICES", &v, MAX_HOST_DEVICES, HOST_DEVICES_EXPECTED)?)
                }
                (None, None) => None,
            };
        let (default_device, default_device_uid) =
            match (over.default_device, read("OMP_DEFAULT_DEVICE", over.default_device.is_some())?) {
                (Some(d), _) => (Some(d), None),
                // A device's UID (OpenMP 6.0: it has letters, as `GPU-...`, `PCI:...`,
                // `host-1`), looked up once the devices are known; else a number.
                (None, Some(v)) if v.trim().chars().any(|c| c.is_ascii_alphabetic()) => {
                    (None, Some(v.trim().to_string()))
                }
                (None, Some(v)) => (
                    Some(parse_count(
                        "OMP_DEFAULT_DEVICE",
                        &v,
                        usize::MAX,
                        "a non-negative device number or a device UID",
                    )?),
                    None,
                ),
                (None, None) => (None, None),
            };
        let info = match (over.info, read("OFFLOAD_INFO", over.info.is_some())?) {
            (Some(f), _) => f,
            (None, Some(v)) => InfoFlags::parse(&v).ok_or(Error::InvalidSetting {
                var: "OFFLOAD_INFO",
                value: v.clone(),
                expected: "a bit mask, decimal or 0x-hexadecimal, or -1 for all (0x01 kernels, 0x02 existing maps, 0x04 table dumps, 0x08 entries, 0x10 launch details, 0x20 transfers, 0x40 host data with no device counterpart)",
            })?,
            (None, None) => InfoFlags::NONE,
        };
        let mut pool = over.pool.unwrap_or_default();
        if let Some(v) = read("OFFLOAD_MEMORY_POOL", over.pool.is_some())? {
            pool.enabled = parse_switch("OFFLOAD_MEMORY_POOL", v)?;
        }
        let mut staging = over.staging.unwrap_or_default();
        if let Some(v) = read("OFFLOAD_STAGING", over.staging.is_some())? {
            staging.enabled = parse_switch("OFFLOAD_STAGING", v)?;
        }
        if let Some(v) = read("OFFLOAD_STREAMING_STORES", over.staging.is_some())? {
            staging.streaming_stores = parse_switch("OFFLOAD_STREAMING_STORES", v)?;
        }
        if let Some(v) = read("OFFLOAD_SPLIT_CREWS", over.staging.is_some())? {
            staging.split_crews = parse_switch("OFFLOAD_SPLIT_CREWS", v)?;
        }
        if let Some(v) = read("OFFLOAD_POPULATE_THREADS", over.staging.is_some())? {
            staging.populate_threads =
                parse_count("OFFLOAD_POPULATE_THREADS", &v, MAX_KERNEL_THREADS, POPULATE_THREADS_EXPECTED)?;
        }
        let synchronous = match (over.synchronous, read("OFFLOAD_SYNC", over.synchronous.is_some())?) {
            (Some(on), _) => on,
            (None, Some(v)) => parse_switch("OFFLOAD_SYNC", v)?,
            (None, None) => false,
        };
        let narrow_indices =
            match (over.narrow_indices, read("OFFLOAD_NARROW_INDICES", over.narrow_indices.is_some())?) {
                (Some(on), _) => on,
                (None, Some(v)) => parse_switch("OFFLOAD_NARROW_INDICES", v)?,
                (None, None) => false,
            };
        let host_bf16_dot =
            match (over.host_bf16_dot, read("OFFLOAD_HOST_BF16_DOT", over.host_bf16_dot.is_some())?) {
                (Some(on), _) => on,
                (None, Some(v)) => parse_switch("OFFLOAD_HOST_BF16_DOT", v)?,
                (None, None) => true,
            };
        let host_avx512 = match (over.host_avx512, read("OFFLOAD_HOST_AVX512", over.host_avx512.is_some())?) {
            (Some(on), _) => on,
            (None, Some(v)) => parse_switch("OFFLOAD_HOST_AVX512", v)?,
            (None, None) => true,
        };
        let topology_xml = match &over.topology_xml {
            Some(path) => Some(path.clone()),
            None => env("OFFLOAD_TOPOLOGY_XML")?.map(PathBuf::from),
        };
        let available_devices =
            match (&over.available_devices, read("OMP_AVAILABLE_DEVICES", over.available_devices.is_some())?)
            {
                (Some(list), _) => Some(list.clone()),
                (None, None) => None,
                (None, Some(v)) => {
                    let items: Vec<String> = v.split(',').map(|s| s.trim().to_string()).collect();
                    if items.iter().any(String::is_empty) {
                        return Err(Error::InvalidSetting {
                            var: "OMP_AVAILABLE_DEVICES",
                            value: v,
                            expected: "device numbers or device UIDs separated by commas, none empty",
                        });
                    }
                    Some(items)
                }
            };
        let trace_file = match (&over.trace_file, read("OFFLOAD_TRACE", over.trace_file.is_some())?) {
            (Some(path), _) => Some(path.clone()),
            (None, Some(v)) if v.trim().is_empty() => {
                return Err(Error::InvalidSetting {
                    var: "OFFLOAD_TRACE",
                    value: v,
                    expected: "the path of the Chrome trace-event file to write, e.g. trace.json",
                })
            }
            (None, Some(v)) => Some(PathBuf::from(v)),
            (None, None) => None,
        };
        let dump_kernels =
            match (&over.dump_kernels, read("OFFLOAD_DUMP_KERNELS", over.dump_kernels.is_some())?) {
                (Some(dir), _) => Some(dir.clone()),
                (None, Some(v)) if v.trim().is_empty() => {
                    return Err(Error::InvalidSetting {
                        var: "OFFLOAD_DUMP_KERNELS",
                        value: v,
                        expected:
                            "the folder to write every kernel's CUDA and HIP source into, e.g. kernels/",
                    })
                }
                (None, Some(v)) => Some(PathBuf::from(v)),
                (None, None) => None,
            };
        // Under an MPI launcher, a file per rank.
        let trace_rank = match trace_file {
            Some(_) => launcher_rank(&**env)?,
            None => None,
        };
        let trace_file = trace_file.map(|p| file_of_rank(&p, trace_rank));
        let settings = Self {
            policy,
            host_devices,
            default_device,
            default_device_uid,
            available_devices,
            info,
            pool,
            staging,
            topology_xml,
            synchronous,
            trace_file,
            trace_rank,
            dump_kernels,
            narrow_indices,
            host_bf16_dot,
            host_avx512,
        };
        settings.validate(over)?;
        Ok(settings)
    }

    /// How many host devices to start when `gpus` GPUs were found: the number asked for,
    /// else one when there is no GPU (a program always has a device to run on; the device
    /// report says it was the default) and none beside GPUs.
    pub(crate) fn host_devices_with(&self, gpus: usize) -> usize {
        self.host_devices.unwrap_or(usize::from(gpus == 0))
    }

    /// Checks every numeric setting against the range the runtime can work with.
    fn validate(&self, over: &Overrides) -> Result<()> {
        const KIB4: usize = 4096;
        const GIB: usize = 1 << 30;
        let (p, s) = (&self.pool, &self.staging);
        let checks: [(&'static str, usize, bool, &'static str); 11] = [
            (
                "RuntimeBuilder::host_devices",
                self.host_devices.unwrap_or(0),
                self.host_devices.unwrap_or(0) <= MAX_HOST_DEVICES,
                HOST_DEVICES_EXPECTED,
            ),
            (
                "RuntimeBuilder::kernel_threads",
                over.kernel_threads.unwrap_or(1),
                over.kernel_threads.is_none_or(|n| (1..=MAX_KERNEL_THREADS).contains(&n)),
                "1..=1024 threads",
            ),
            (
                "RuntimeBuilder::host_device_memory",
                over.host_memory.unwrap_or(KIB4),
                over.host_memory.is_none_or(|b| b >= KIB4),
                "at least 4096 bytes",
            ),
            ("PoolConfig::max_block", p.max_block, p.max_block <= 1 << 40, "0..=1 TiB (2^40 bytes)"),
            ("PoolConfig::limit", p.limit, p.limit >= KIB4, "at least 4096 bytes"),
            (
                "StagingConfig::chunk",
                s.chunk,
                (KIB4..=GIB).contains(&s.chunk) && s.chunk % KIB4 == 0,
                "4096..=1 GiB bytes, a multiple of 4096",
            ),
            ("StagingConfig::depth", s.depth, (2..=64).contains(&s.depth), "2..=64 buffers"),
            (
                "StagingConfig::threads",
                s.threads,
                (1..=MAX_KERNEL_THREADS).contains(&s.threads),
                "1..=1024 threads",
            ),
            ("StagingConfig::min_chunks", s.min_chunks, s.min_chunks >= 1, "at least 1"),
            ("StagingConfig::min_piece", s.min_piece, s.min_piece >= 1, "at least 1 byte"),
            (
                "StagingConfig::populate_threads",
                s.populate_threads,
                s.populate_threads <= MAX_KERNEL_THREADS,
                POPULATE_THREADS_EXPECTED,
            ),
        ];
        match checks.into_iter().find(|c| !c.2) {
            Some((field, value, _, expected)) => {
                Err(Error::InvalidConfig { field, value: value.to_string(), expected })
            }
            None => Ok(()),
        }
    }
}

const HOST_DEVICES_EXPECTED: &str = "a number of host devices from 0 to 64, e.g. 2";

/// Builder settings that take precedence over the environment.
#[derive(Clone, Debug, Default)]
pub(crate) struct Overrides {
    pub policy: Option<OffloadPolicy>,
    pub host_devices: Option<usize>,
    pub default_device: Option<usize>,
    pub available_devices: Option<Vec<String>>,
    pub info: Option<InfoFlags>,
    pub pool: Option<PoolConfig>,
    pub staging: Option<StagingConfig>,
    pub topology_xml: Option<PathBuf>,
    pub kernel_threads: Option<usize>,
    pub host_memory: Option<usize>,
    pub synchronous: Option<bool>,
    pub trace_file: Option<PathBuf>,
    pub dump_kernels: Option<PathBuf>,
    pub narrow_indices: Option<bool>,
    pub host_bf16_dot: Option<bool>,
    pub host_avx512: Option<bool>,
}

/// The rank an MPI launcher gave this process: Open MPI's `OMPI_COMM_WORLD_RANK`, PMIx's
/// `PMIX_RANK`, MPICH's (Hydra's) `PMI_RANK`, the first set.
fn launcher_rank(env: &dyn Fn(&'static str) -> Result<Option<String>>) -> Result<Option<u32>> {
    for var in ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"] {
        if let Some(v) = env(var)? {
            return v.trim().parse().map(Some).map_err(|_| Error::InvalidSetting {
                var,
                value: v,
                expected: "a rank number (set by the MPI launcher)",
            });
        }
    }
    Ok(None)
}

/// Rank `rank`'s trace file for `path`: `{rank}` in it replaced by the rank, else the rank
/// put before the extension (`run.json` -> `run.rank2.json`); `path` itself with no rank.
pub(crate) fn file_of_rank(path: &std::path::Path, rank: Option<u32>) -> PathBuf {
    let Some(rank) = rank else { return path.to_path_buf() };
    let text = path.to_string_lossy();
    if text.contains("{rank}") {
        return PathBuf::from(text.replace("{rank}", &rank.to_string()));
    }
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> EnvLookup {
        lookup_from(move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn reads_every_variable() {
        let s = Settings::resolve(
            &env(&[
                ("OMP_TARGET_OFFLOAD", "MANDATORY"),
                ("OFFLOAD_HOST_DEVICES", "3"),
                ("OMP_DEFAULT_DEVICE", "1"),
                ("OFFLOAD_INFO", "0x28"),
                ("OFFLOAD_MEMORY_POOL", "0"),
                ("OFFLOAD_STREAMING_STORES", "0"),
                ("OFFLOAD_POPULATE_THREADS", " 4"),
                ("OFFLOAD_SPLIT_CREWS", "on"),
                ("OFFLOAD_DUMP_KERNELS", "out/kernels"),
                ("OFFLOAD_HOST_BF16_DOT", "off"),
                ("OFFLOAD_HOST_AVX512", "0"),
            ]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(s.dump_kernels.as_deref(), Some(std::path::Path::new("out/kernels")));
        assert_eq!(s.policy, OffloadPolicy::Mandatory);
        assert_eq!(s.host_devices, Some(3));
        assert_eq!(s.default_device, Some(1));
        assert_eq!(s.info, InfoFlags::ENTRIES | InfoFlags::TRANSFERS);
        assert!(!s.pool.enabled);
        assert!(!s.staging.streaming_stores && s.staging.enabled);
        assert_eq!(s.staging.populate_threads, 4);
        assert!(s.staging.split_crews);
        assert!(!s.host_bf16_dot);
        assert!(!s.host_avx512);
    }

    #[test]
    fn builder_settings_win_over_the_environment() {
        let over =
            Overrides { host_devices: Some(5), policy: Some(OffloadPolicy::Disabled), ..Default::default() };
        let s =
            Settings::resolve(&env(&[("OFFLOAD_HOST_DEVICES", "2"), ("OMP_TARGET_OFFLOAD", "junk")]), &over)
                .unwrap();
        assert_eq!((s.host_devices, s.policy), (Some(5), OffloadPolicy::Disabled));
    }

    #[test]
    fn the_default_device_may_be_a_uid() {
        let with = |v: &str| {
            let v = v.to_string();
            let lookup = lookup_from(move |k| (k == "OMP_DEFAULT_DEVICE").then(|| v.clone()));
            Settings::resolve(&lookup, &Overrides::default())
        };
        let s = with("GPU-44ca0fc0-f6a9").unwrap();
        assert_eq!((s.default_device, s.default_device_uid.as_deref()), (None, Some("GPU-44ca0fc0-f6a9")));
        assert_eq!(with(" host-1 ").unwrap().default_device_uid.as_deref(), Some("host-1"));
        assert_eq!(with(" 3 ").unwrap().default_device, Some(3));
        assert!(with("").is_err() && with("-1").is_err());
    }

    #[test]
    fn bad_values_are_errors_that_say_what_was_expected() {
        for (var, value, expect) in [
            ("OMP_TARGET_OFFLOAD", "sometimes", "mandatory, disabled or default"),
            ("OFFLOAD_HOST_DEVICES", "two", "number of host devices"),
            ("OMP_DEFAULT_DEVICE", "-1", "non-negative"),
            ("OFFLOAD_INFO", "lots", "bit mask"),
            ("OFFLOAD_MEMORY_POOL", "maybe", "0/off/false"),
            ("OFFLOAD_STREAMING_STORES", "nt", "0/off/false"),
            ("OFFLOAD_SPLIT_CREWS", "2", "0/off/false"),
            ("OFFLOAD_POPULATE_THREADS", "all", "0..=1024 threads"),
            ("OFFLOAD_POPULATE_THREADS", "1025", "0..=1024 threads"),
        ] {
            let lookup = lookup_from(move |k| (k == var).then(|| value.to_string()));
            let e = Settings::resolve(&lookup, &Overrides::default()).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(value) && e.contains(expect), "{e}");
        }
    }

    #[test]
    fn too_many_host_devices_is_an_error_from_the_environment_and_the_builder() {
        let ok = Settings::resolve(&env(&[("OFFLOAD_HOST_DEVICES", "64")]), &Overrides::default()).unwrap();
        assert_eq!(ok.host_devices, Some(MAX_HOST_DEVICES));
        for value in ["65", "1000000", "18446744073709551615"] {
            let lookup = lookup_from(move |k| (k == "OFFLOAD_HOST_DEVICES").then(|| value.to_string()));
            let e = Settings::resolve(&lookup, &Overrides::default()).unwrap_err();
            let s = e.to_string();
            assert!(matches!(e, Error::InvalidSetting { var: "OFFLOAD_HOST_DEVICES", .. }), "{s}");
            assert!(s.contains(value) && s.contains("0 to 64"), "{s}");
        }
        let over = Overrides { host_devices: Some(65), ..Default::default() };
        let e = Settings::resolve(&env(&[]), &over).unwrap_err().to_string();
        assert!(e.contains("RuntimeBuilder::host_devices = 65") && e.contains("0 to 64"), "{e}");
    }

    #[test]
    fn non_utf8_values_are_errors_naming_the_variable() {
        use std::os::unix::ffi::OsStringExt;
        let raw = std::ffi::OsString::from_vec(vec![b'2', 0xff, 0xfe]);
        let e = env_text("OFFLOAD_HOST_DEVICES", Some(raw)).unwrap_err();
        let s = e.to_string();
        assert!(matches!(e, Error::InvalidSetting { var: "OFFLOAD_HOST_DEVICES", .. }), "{s}");
        assert!(s.contains("UTF-8") && s.contains('2'), "{s}");
        assert_eq!(env_text("X", None).unwrap(), None);
        assert_eq!(env_text("X", Some("on".into())).unwrap().as_deref(), Some("on"));
        // Every variable goes through the lookup's error, and a builder value skips the variable.
        for var in [
            "OMP_TARGET_OFFLOAD",
            "OFFLOAD_HOST_DEVICES",
            "OMP_DEFAULT_DEVICE",
            "OMP_AVAILABLE_DEVICES",
            "OFFLOAD_INFO",
            "OFFLOAD_MEMORY_POOL",
            "OFFLOAD_POPULATE_THREADS",
            "OFFLOAD_SPLIT_CREWS",
            "OFFLOAD_STAGING",
            "OFFLOAD_STREAMING_STORES",
            "OFFLOAD_SYNC",
            "OFFLOAD_TOPOLOGY_XML",
            "OFFLOAD_TRACE",
            "OFFLOAD_DUMP_KERNELS",
        ] {
            let bad: EnvLookup = std::sync::Arc::new(move |k| {
                if k == var {
                    env_text(k, Some(std::ffi::OsString::from_vec(vec![0xff])))
                } else {
                    Ok(None)
                }
            });
            let e = Settings::resolve(&bad, &Overrides::default()).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains("UTF-8"), "{e}");
        }
        // (An MPI launcher's rank, read with a trace, has no builder value.)
        let bad: EnvLookup = std::sync::Arc::new(|k| match k {
            "OMPI_COMM_WORLD_RANK" | "PMIX_RANK" | "PMI_RANK" => Ok(None),
            _ => env_text(k, Some(std::ffi::OsString::from_vec(vec![0xff]))),
        });
        let every = Overrides {
            policy: Some(OffloadPolicy::Default),
            host_devices: Some(1),
            default_device: Some(0),
            available_devices: Some(vec!["0".into()]),
            info: Some(InfoFlags::NONE),
            pool: Some(PoolConfig::default()),
            staging: Some(StagingConfig::default()),
            topology_xml: Some("t.xml".into()),
            synchronous: Some(false),
            trace_file: Some("t.json".into()),
            dump_kernels: Some("kernels".into()),
            narrow_indices: Some(true),
            host_bf16_dot: Some(false),
            host_avx512: Some(false),
            ..Default::default()
        };
        Settings::resolve(&bad, &every).unwrap();
    }

    fn config_error(over: Overrides) -> String {
        match Settings::resolve(&env(&[]), &over) {
            Err(e @ Error::InvalidConfig { .. }) => e.to_string(),
            other => panic!("{over:?}: expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn defaults_and_edge_values_are_accepted() {
        let defaults = Settings::resolve(&env(&[]), &Overrides::default()).unwrap();
        assert!(!defaults.narrow_indices, "32-bit index variants are opt-in (measured: not a general win)");
        let on = Settings::resolve(&env(&[("OFFLOAD_NARROW_INDICES", "1")]), &Overrides::default()).unwrap();
        assert!(on.narrow_indices);
        assert!(defaults.host_bf16_dot, "bf16 dot products where the CPU has them, by default");
        assert!(defaults.host_avx512, "generated kernels' AVX-512 copies where the CPU has it, by default");
        let edges = Overrides {
            host_devices: Some(MAX_HOST_DEVICES),
            kernel_threads: Some(1),
            host_memory: Some(4096),
            pool: Some(PoolConfig { max_block: 1 << 40, keep: 0, enabled: true, limit: usize::MAX }),
            staging: Some(StagingConfig {
                chunk: 4096,
                depth: 2,
                threads: 1,
                min_chunks: 1,
                min_piece: 1,
                min_bytes: 0,
                register_after: 0,
                populate_threads: 0,
                ..StagingConfig::default()
            }),
            ..Default::default()
        };
        Settings::resolve(&env(&[]), &edges).unwrap();
        let high = StagingConfig {
            chunk: 1 << 30,
            depth: 64,
            threads: MAX_KERNEL_THREADS,
            ..StagingConfig::default()
        };
        let over =
            Overrides { staging: Some(high), kernel_threads: Some(MAX_KERNEL_THREADS), ..Default::default() };
        Settings::resolve(&env(&[]), &over).unwrap();
    }

    #[test]
    fn each_out_of_range_field_is_an_error_naming_it_and_its_range() {
        let staging = |f: fn(&mut StagingConfig)| {
            let mut c = StagingConfig::default();
            f(&mut c);
            Overrides { staging: Some(c), ..Default::default() }
        };
        let cases: Vec<(Overrides, &str, &str)> = vec![
            (staging(|c| c.chunk = 0), "StagingConfig::chunk = 0", "4096..=1 GiB bytes, a multiple of 4096"),
            (staging(|c| c.chunk = 4097), "StagingConfig::chunk = 4097", "a multiple of 4096"),
            (staging(|c| c.chunk = (1 << 30) + 4096), "StagingConfig::chunk = 1073745920", "4096..=1 GiB"),
            (staging(|c| c.depth = 1), "StagingConfig::depth = 1", "2..=64"),
            (staging(|c| c.depth = 65), "StagingConfig::depth = 65", "2..=64"),
            (staging(|c| c.threads = 0), "StagingConfig::threads = 0", "1..=1024"),
            (staging(|c| c.threads = 1025), "StagingConfig::threads = 1025", "1..=1024"),
            (staging(|c| c.min_chunks = 0), "StagingConfig::min_chunks = 0", "at least 1"),
            (staging(|c| c.min_piece = 0), "StagingConfig::min_piece = 0", "at least 1 byte"),
            (staging(|c| c.populate_threads = 1025), "StagingConfig::populate_threads = 1025", "0..=1024"),
            (
                Overrides {
                    pool: Some(PoolConfig { max_block: (1 << 40) + 1, ..PoolConfig::default() }),
                    ..Default::default()
                },
                "PoolConfig::max_block = 1099511627777",
                "0..=1 TiB",
            ),
            (
                Overrides { kernel_threads: Some(0), ..Default::default() },
                "RuntimeBuilder::kernel_threads = 0",
                "1..=1024",
            ),
            (
                Overrides { kernel_threads: Some(usize::MAX), ..Default::default() },
                "RuntimeBuilder::kernel_threads",
                "1..=1024",
            ),
            (
                Overrides { host_memory: Some(4095), ..Default::default() },
                "RuntimeBuilder::host_device_memory = 4095",
                "at least 4096",
            ),
        ];
        for (over, field, range) in cases {
            let e = config_error(over);
            assert!(e.contains(field) && e.contains(range), "{e}");
        }
        // A disabled configuration is checked too, so that whether a value is accepted does not
        // depend on another field.
        let e = config_error(staging(|c| {
            c.enabled = false;
            c.chunk = 0
        }));
        assert!(e.contains("StagingConfig::chunk"), "{e}");
    }

    #[test]
    fn a_trace_file_per_mpi_rank() {
        let path = std::path::Path::new("/tmp/run.json");
        assert_eq!(file_of_rank(path, None), path);
        assert_eq!(file_of_rank(path, Some(2)), std::path::Path::new("/tmp/run.rank2.json"));
        assert_eq!(file_of_rank("t{rank}/x.json".as_ref(), Some(1)), std::path::Path::new("t1/x.json"));
        assert_eq!(file_of_rank("trace".as_ref(), Some(0)), std::path::Path::new("trace.rank0"));
        let s =
            Settings::resolve(&env(&[("OFFLOAD_TRACE", "a.json"), ("PMI_RANK", "3")]), &Overrides::default());
        let s = s.unwrap();
        assert_eq!((s.trace_file.as_deref(), s.trace_rank), (Some("a.rank3.json".as_ref()), Some(3)));
        // No trace, no rank read: a malformed one matters only to a trace.
        let s = Settings::resolve(&env(&[("OMPI_COMM_WORLD_RANK", "x")]), &Overrides::default()).unwrap();
        assert_eq!(s.trace_rank, None);
        let e = Settings::resolve(
            &env(&[("OFFLOAD_TRACE", "a.json"), ("OMPI_COMM_WORLD_RANK", "x")]),
            &Overrides::default(),
        );
        assert!(e.err().is_some_and(|e| e.to_string().contains("OMPI_COMM_WORLD_RANK")));
    }
}
