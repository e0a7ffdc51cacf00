//! Settings: `OMP_TARGET_OFFLOAD`, `OMP_DEFAULT_DEVICE`, `OFFLOAD_HOST_DEVICES`,
//! `OFFLOAD_INFO`, `OFFLOAD_MEMORY_POOL`, and the builder that can set each of them.
//!
//! A value the runtime does not understand is an error naming the variable, the value and
//! what would have been accepted, never a silent default.

use std::fmt;

use crate::error::{Error, Result};
use crate::info::InfoFlags;
use crate::memory_pool::PoolConfig;
use crate::staging::StagingConfig;
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

/// Where environment values come from (the process environment, or a test's map).
pub(crate) type EnvLookup = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

pub(crate) fn process_env() -> EnvLookup {
    Box::new(|k| std::env::var(k).ok())
}

fn parse_count(var: &'static str, value: &str, expected: &'static str) -> Result<usize> {
    value.trim().parse::<usize>().map_err(|_| Error::InvalidSetting { var, value: value.into(), expected })
}

/// The resolved settings a runtime starts with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    pub policy: OffloadPolicy,
    pub host_devices: usize,
    pub default_device: Option<usize>,
    pub info: InfoFlags,
    pub pool: PoolConfig,
    pub staging: StagingConfig,
    pub topology_xml: Option<PathBuf>,
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
    pub(crate) fn resolve(env: &EnvLookup, over: &Overrides) -> Result<Self> {
        let policy = match (over.policy, env("OMP_TARGET_OFFLOAD")) {
            (Some(p), _) => p,
            (None, Some(v)) => OffloadPolicy::parse(&v)?,
            (None, None) => OffloadPolicy::Default,
        };
        let host_devices = match (over.host_devices, env("OFFLOAD_HOST_DEVICES")) {
            (Some(n), _) => n,
            (None, Some(v)) => parse_count("OFFLOAD_HOST_DEVICES", &v, "a number of host devices, e.g. 2")?,
            (None, None) => 0,
        };
        let default_device = match (over.default_device, env("OMP_DEFAULT_DEVICE")) {
            (Some(d), _) => Some(d),
            (None, Some(v)) => Some(parse_count("OMP_DEFAULT_DEVICE", &v, "a non-negative device number")?),
            (None, None) => None,
        };
        let info = match (over.info, env("OFFLOAD_INFO")) {
            (Some(f), _) => f,
            (None, Some(v)) => InfoFlags::parse(&v).ok_or(Error::InvalidSetting {
                var: "OFFLOAD_INFO",
                value: v.clone(),
                expected: "a bit mask, decimal or 0x-hexadecimal (0x01 kernels, 0x02 existing maps, 0x04 table dumps, 0x08 entries, 0x20 transfers)",
            })?,
            (None, None) => InfoFlags::NONE,
        };
        let mut pool = over.pool.unwrap_or_default();
        if over.pool.is_none() {
            if let Some(v) = env("OFFLOAD_MEMORY_POOL") {
                pool.enabled = parse_switch("OFFLOAD_MEMORY_POOL", v)?;
            }
        }
        let mut staging = over.staging.unwrap_or_default();
        if over.staging.is_none() {
            if let Some(v) = env("OFFLOAD_STAGING") {
                staging.enabled = parse_switch("OFFLOAD_STAGING", v)?;
            }
        }
        let topology_xml =
            over.topology_xml.clone().or_else(|| env("OFFLOAD_TOPOLOGY_XML").map(PathBuf::from));
        Ok(Self { policy, host_devices, default_device, info, pool, staging, topology_xml })
    }
}

/// Builder settings that take precedence over the environment.
#[derive(Clone, Debug, Default)]
pub(crate) struct Overrides {
    pub policy: Option<OffloadPolicy>,
    pub host_devices: Option<usize>,
    pub default_device: Option<usize>,
    pub info: Option<InfoFlags>,
    pub pool: Option<PoolConfig>,
    pub staging: Option<StagingConfig>,
    pub topology_xml: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> EnvLookup {
        Box::new(move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
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
            ]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(s.policy, OffloadPolicy::Mandatory);
        assert_eq!(s.host_devices, 3);
        assert_eq!(s.default_device, Some(1));
        assert_eq!(s.info, InfoFlags::ENTRIES | InfoFlags::TRANSFERS);
        assert!(!s.pool.enabled);
    }

    #[test]
    fn builder_settings_win_over_the_environment() {
        let over =
            Overrides { host_devices: Some(5), policy: Some(OffloadPolicy::Disabled), ..Default::default() };
        let s =
            Settings::resolve(&env(&[("OFFLOAD_HOST_DEVICES", "2"), ("OMP_TARGET_OFFLOAD", "junk")]), &over)
                .unwrap();
        assert_eq!((s.host_devices, s.policy), (5, OffloadPolicy::Disabled));
    }

    #[test]
    fn bad_values_are_errors_that_say_what_was_expected() {
        for (var, value, expect) in [
            ("OMP_TARGET_OFFLOAD", "sometimes", "mandatory, disabled or default"),
            ("OFFLOAD_HOST_DEVICES", "two", "number of host devices"),
            ("OMP_DEFAULT_DEVICE", "-1", "non-negative"),
            ("OFFLOAD_INFO", "lots", "bit mask"),
            ("OFFLOAD_MEMORY_POOL", "maybe", "0/off/false"),
        ] {
            let lookup: EnvLookup = Box::new(move |k| (k == var).then(|| value.to_string()));
            let e = Settings::resolve(&lookup, &Overrides::default()).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(value) && e.contains(expect), "{e}");
        }
    }
}
