//! The device services: what the generic device uses beside its backend. The present
//! table and map-list planning ([`data_env`]), the memory pool, the staging ring of pinned
//! buffers and the copy crew that fills it, the settings read from the environment
//! ([`config`]), and the checks of caller input.

pub mod config;
pub(crate) mod copy_crew;
pub mod data_env;
pub(crate) mod memory_pool;
pub(crate) mod pinned_memory;
pub(crate) mod staging;
pub(crate) mod validate;
