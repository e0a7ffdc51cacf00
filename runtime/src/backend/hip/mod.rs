//! AMD GPUs through HIP (cargo feature `hip`): the device (`device`), the HIP runtime and
//! hiprtc loaded at run time (`api`: every raw call's type, no ROCm needed to build), and
//! the part that needs no AMD library at all, compiled and tested in every build
//! (`support`: HIP errors as the runtime's).

#[cfg(feature = "hip")]
mod api;
#[cfg(feature = "hip")]
mod device;
#[cfg_attr(not(feature = "hip"), allow(dead_code))]
mod support;

#[cfg(feature = "hip")]
pub(crate) use device::HipPlatform;
