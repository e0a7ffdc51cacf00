//! A kernel launch's argument block, stated once on the runtime's side. Every kernel takes
//! its arguments in order and then the work-item count `n`, laid out as C lays out the
//! function's parameters ([`LaunchParams`], what the GPU backends pass, at most
//! [`PARAM_LIMIT`] bytes). A generated kernel's arguments begin with hidden values (each
//! dimension's start, the inner dimensions' lengths, a team size given at launch) and end
//! with each view's length; the kernel compiler writes that order from its `Slot`s
//! (`runtime/macros/src/signature.rs`), and [`expand_c_shaped`] makes it here from one
//! argument per parameter, for a launch in the OpenMP shape ([`OmpSpace`]: the loops or
//! teams a C `target` region gives).

use super::*;

/// What a launch in the OpenMP shape runs ([`crate::omp::target`], [`crate::omp::target_loops`],
/// [`crate::omp::target_teams`], [`crate::Runtime::target_launch_space`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OmpSpace {
    /// `for (i = 0; i < n; i++)`: a loop of `n` iterations from 0 (a 1-D kernel, or any
    /// kernel written by hand, over `n` work items).
    Items(usize),
    /// `collapse(d)` loops, outermost first: `dims` (1 to 3) loops, loop `k` over
    /// `starts[k]..ends[k]` (a 1-D, 2-D or 3-D generated kernel of as many indices).
    Loops {
        /// How many loops.
        dims: usize,
        /// Each loop's first value.
        starts: [usize; 3],
        /// Each loop's end (excluded).
        ends: [usize; 3],
    },
    /// `target teams num_teams(t) thread_limit(l)`: a teams kernel's teams; the team size is
    /// the kernel's, and a `thread_limit` below it is refused.
    Teams {
        /// `num_teams`.
        num_teams: usize,
        /// `thread_limit`, when given.
        thread_limit: Option<usize>,
    },
}

impl OmpSpace {
    /// `collapse(loops.len())` loops over `loops`, outermost first (1 to 3).
    ///
    /// ```
    /// use offload::OmpSpace;
    /// let s = OmpSpace::loops(&[1..63, 1..127])?;
    /// assert_eq!(s, OmpSpace::Loops { dims: 2, starts: [1, 1, 0], ends: [63, 127, 0] });
    /// assert!(OmpSpace::loops(&[]).is_err());
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn loops(loops: &[std::ops::Range<usize>]) -> crate::Result<Self> {
        if !(1..=3).contains(&loops.len()) {
            return Err(crate::Error::InvalidArgument {
                routine: "target_loops",
                what: format!("collapse({}): 1 to 3 loops, outermost first", loops.len()),
            });
        }
        let (mut starts, mut ends) = ([0; 3], [0; 3]);
        for (k, r) in loops.iter().enumerate() {
            starts[k] = r.start;
            ends[k] = r.end.max(r.start);
        }
        Ok(OmpSpace::Loops { dims: loops.len(), starts, ends })
    }
}

/// The work items of `kernel` launched in the OpenMP shape over `space`, with the values its
/// argument block starts with (the loops' starts and inner lengths; a teams kernel's first
/// team, 0), or why `space` does not fit the kernel. A kernel without a [`KernelShape`]
/// takes [`OmpSpace::Items`] only, and nothing before its arguments.
pub(crate) fn omp_space(
    kernel: &Kernel,
    device: usize,
    space: OmpSpace,
) -> crate::Result<(usize, Vec<KernelArg>)> {
    omp_launch(kernel, device, space).map(|(n, lead, _)| (n, lead))
}

/// [`omp_space`], with the GPU block the launch needs when it is not the kernel's own (a
/// team size given at launch: `thread_limit`, at most the kernel's `..=MAX`, rounded down
/// to whole warps when the kernel reduces over its teams; `MAX` without one).
pub(crate) fn omp_launch(
    kernel: &Kernel,
    device: usize,
    space: OmpSpace,
) -> crate::Result<(usize, Vec<KernelArg>, Option<u32>)> {
    let fail = |what: String| crate::Error::KernelArgument { kernel: kernel.name(), index: 0, what };
    if let (Some(shape), OmpSpace::Teams { num_teams, thread_limit }) = (kernel.shape(), space) {
        if shape.dims == 0 && shape.team_size_at_launch {
            let mut size = thread_limit.unwrap_or(shape.threads).min(shape.threads);
            if shape.team_warps {
                size -= size % 32;
            }
            if size == 0 {
                return Err(fail(format!(
                    "device {device}: thread_limit({}) leaves no team: this kernel's teams are 1 to {} threads{}",
                    thread_limit.unwrap_or(0),
                    shape.threads,
                    if shape.team_warps { ", whole warps (it reduces over its teams)" } else { "" }
                )));
            }
            let n = num_teams
                .checked_mul(size)
                .ok_or_else(|| fail(format!("device {device}: the launch's work items overflow a usize")))?;
            let lead = vec![KernelArg::Scalar(Scalar::U64(0)), KernelArg::Scalar(Scalar::U64(size as u64))];
            return Ok((n, lead, Some(size as u32)));
        }
    }
    omp_fixed(kernel, device, space).map(|(n, lead)| (n, lead, None))
}

/// [`omp_space`] for every kernel but those whose team size is the launch's.
fn omp_fixed(kernel: &Kernel, device: usize, space: OmpSpace) -> crate::Result<(usize, Vec<KernelArg>)> {
    let fail = |what: String| crate::Error::KernelArgument { kernel: kernel.name(), index: 0, what };
    let Some(shape) = kernel.shape() else {
        return match space {
            OmpSpace::Items(n) => Ok((n, Vec::new())),
            _ => Err(fail(format!(
                "device {device}: a kernel written by hand takes `n` work items (`omp::target`): loops and teams are \
                 for generated kernels, whose launch shape the runtime knows"
            ))),
        };
    };
    let loops_of = |d: usize| match d {
        0 => "a teams kernel".to_string(),
        d => format!("a {d}-D generated kernel"),
    };
    let overflow = || fail(format!("device {device}: the launch's work items overflow a usize"));
    match (shape.dims, space) {
        (1, OmpSpace::Items(n)) => Ok((n, vec![KernelArg::Scalar(Scalar::U64(0))])),
        (d, OmpSpace::Loops { dims, starts, ends }) if d == dims => {
            let lens: Vec<usize> = (0..d).map(|k| ends[k].saturating_sub(starts[k])).collect();
            let n = lens.iter().try_fold(1usize, |a, &l| a.checked_mul(l)).ok_or_else(overflow)?;
            let block = (0..d)
                .map(|k| KernelArg::Scalar(Scalar::U64(starts[k] as u64)))
                .chain((1..d).map(|k| KernelArg::Scalar(Scalar::U64(lens[k] as u64))))
                .collect();
            Ok((n, block))
        }
        (0, OmpSpace::Teams { num_teams, thread_limit }) => {
            if let Some(limit) = thread_limit.filter(|&l| l < shape.threads) {
                return Err(fail(format!(
                    "device {device}: thread_limit({limit}) is below the kernel's {} threads per team (its `teams = ...`)",
                    shape.threads
                )));
            }
            let n = num_teams.checked_mul(shape.threads).ok_or_else(overflow)?;
            Ok((n, vec![KernelArg::Scalar(Scalar::U64(0))]))
        }
        (0, _) => Err(fail(format!(
            "a teams kernel launches as teams in the OpenMP shape: `omp::target_teams` with num_teams (or `{}::launch`)",
            kernel.name()
        ))),
        (d, OmpSpace::Loops { dims, .. }) => {
            Err(fail(format!("{} launches over {d} loops, not collapse({dims})", loops_of(d))))
        }
        (d, OmpSpace::Items(_)) => Err(fail(format!(
            "{} takes its loops in the OpenMP shape from `omp::target_loops` (collapse({d})), not from `n`",
            loops_of(d)
        ))),
        (d, OmpSpace::Teams { .. }) => {
            Err(fail(format!("{} is a loop kernel: `omp::target_loops`, not teams", loops_of(d))))
        }
    }
}

/// `args`, one per parameter of `kernel` (translated, in the OpenMP shape), as the full
/// argument block of a kernel with a [`KernelShape`] launched over `space` (see
/// [`omp_space`]), then each view's length (its extent in elements). Kernels without a
/// shape take `args` as they are.
pub(crate) fn expand_c_shaped(
    kernel: &Kernel,
    device: usize,
    args: Vec<KernelArg>,
    space: OmpSpace,
) -> crate::Result<Vec<KernelArg>> {
    let fail =
        |index: usize, what: String| crate::Error::KernelArgument { kernel: kernel.name(), index, what };
    let Some(shape) = kernel.shape() else { return Ok(args) };
    let (_, mut full) = omp_space(kernel, device, space)?;
    if args.len() != shape.params.len() {
        return Err(fail(
            args.len().min(shape.params.len()),
            format!("device {device}: the kernel takes {} arguments, got {}", shape.params.len(), args.len()),
        ));
    }
    let mut lens = Vec::new();
    for (k, (a, p)) in args.iter().zip(shape.params).enumerate() {
        match (p, a) {
            (ShapeParam::Value, KernelArg::Scalar(_)) => {}
            (ShapeParam::View { elem_bytes, .. }, KernelArg::Ptr { bytes: Some(b), .. }) => {
                lens.push(KernelArg::Scalar(Scalar::U64((b / (*elem_bytes).max(1)) as u64)));
            }
            (ShapeParam::View { .. }, KernelArg::Ptr { bytes: None, addr }) => {
                return Err(fail(
                    k,
                    format!(
                        "device {device}: the extent of {addr:#x} is unknown (not inside a mapped range or a \
                         target_alloc block): a generated kernel's views need their lengths"
                    ),
                ))
            }
            (ShapeParam::Struct, _) => {
                return Err(fail(
                    k,
                    format!(
                        "a struct by value is not expressible in the OpenMP shape: use `{}::launch`",
                        kernel.name()
                    ),
                ))
            }
            (ShapeParam::Value, KernelArg::Ptr { .. }) => {
                return Err(fail(k, format!("device {device}: a scalar parameter was given a pointer")))
            }
            (ShapeParam::View { .. }, KernelArg::Scalar(_)) => {
                return Err(fail(k, format!("device {device}: a view parameter was given a value")))
            }
        }
        full.push(*a);
    }
    full.extend(lens);
    Ok(full)
}

/// The driver's limit on a launch's parameters, in bytes (CUDA's and HIP's classic limit).
pub const PARAM_LIMIT: usize = 4096;

/// A kernel launch's parameters as GPU drivers take them: one block laid out as C lays out
/// the kernel function's parameters (every argument at its natural alignment, then the
/// work-item count `n`, the [`Kernel`] convention), passed whole (`extra` with
/// `CU_LAUNCH_PARAM_BUFFER_POINTER`, HIP's alike) so that any number of arguments, and a
/// struct's words, need no per-parameter pointer.
#[derive(Debug)]
#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
pub(crate) struct LaunchParams {
    /// 8-byte words, so the block is aligned for every parameter.
    words: Vec<u64>,
    /// The block's size in bytes (a multiple of 8).
    bytes: usize,
}

#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
impl LaunchParams {
    /// The block of `args` and `n` for a launch of `kernel` on `device`; an error past
    /// [`PARAM_LIMIT`].
    pub(crate) fn new(device: usize, kernel: &Kernel, args: &[KernelArg], n: usize) -> crate::Result<Self> {
        let mut bytes: Vec<u8> = Vec::with_capacity(8 * (args.len() + 1));
        let mut put = |b: &[u8]| {
            let align = b.len();
            bytes.resize(bytes.len().next_multiple_of(align), 0);
            bytes.extend_from_slice(b);
        };
        for a in args {
            match *a {
                KernelArg::Scalar(s) => {
                    let (b, len) = s.to_ne_bytes();
                    put(&b[..len]);
                }
                KernelArg::Ptr { addr, .. } => put(&addr.to_ne_bytes()),
            }
        }
        put(&(n as u64).to_ne_bytes());
        let size = bytes.len().next_multiple_of(8);
        if size > PARAM_LIMIT {
            return Err(crate::Error::KernelArgument {
                kernel: kernel.name(),
                index: args.len(),
                what: format!(
                    "device {device}: the launch's {} arguments take {size} bytes; the driver's limit is {PARAM_LIMIT}",
                    args.len()
                ),
            });
        }
        bytes.resize(size, 0);
        let words =
            bytes.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        Ok(Self { words, bytes: size })
    }

    /// The block's address, valid while `self` lives.
    pub(crate) fn block(&mut self) -> *mut std::ffi::c_void {
        self.words.as_mut_ptr().cast()
    }

    /// The block's size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_packed_as_c_lays_them_out_with_n_last() {
        static K: Kernel = Kernel::new("k");
        let args = [
            KernelArg::Scalar(Scalar::F32(1.5)),
            KernelArg::Ptr { addr: 0x1000, bytes: Some(64) },
            KernelArg::Scalar(Scalar::I32(-2)),
        ];
        let mut p = LaunchParams::new(0, &K, &args, 7).expect("fits");
        // f32 at 0, the pointer aligned to 8, the i32 at 16, n aligned to 24: 32 bytes.
        assert_eq!(p.size(), 32);
        // SAFETY: the block holds `size()` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(p.block().cast::<u8>(), p.size()) };
        assert_eq!(&bytes[0..4], &1.5f32.to_ne_bytes());
        assert_eq!(&bytes[4..8], &[0; 4], "padding before the pointer");
        assert_eq!(&bytes[8..16], &0x1000u64.to_ne_bytes());
        assert_eq!(&bytes[16..20], &(-2i32).to_ne_bytes());
        assert_eq!(&bytes[24..32], &7u64.to_ne_bytes());
        let many = vec![KernelArg::Scalar(Scalar::U64(0)); PARAM_LIMIT / 8];
        let e = LaunchParams::new(3, &K, &many, 1).expect_err("one word over the limit");
        assert!(e.to_string().contains("device 3") && e.to_string().contains("4104 bytes"), "{e}");
    }
}
