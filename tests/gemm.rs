//! `Device::gemm` on every device of every backend: every transposition, scalar pair and
//! epilogue (bias, ReLU, GELU) in fp32, TF32, fp16 and bf16 against an f64 reference of the
//! operands as stored, rows of C past `m` untouched; a plan reused with other scalars (the
//! same shape with `beta != 0` after `beta = 0`) still right; strided batches product by
//! product.

use offload::half::{bf16, f16};
use offload::{map, Activation, Gemm, GemmElement};
use offload_tests::{activation_f64, check, on_every_device};

fn values<T: GemmElement>(seed: u64, n: usize) -> Vec<T> {
    offload_tests::values(seed, n).into_iter().map(T::from_f32).collect()
}

/// `g` on device `d` over random operands, each element of C against f64 within `tol`
/// (relative to `1 + |want|`, per square root of the depth). The bias, when there is one,
/// is `bias_at` elements into its array (so aligned to its element only, for an odd
/// `bias_at`).
fn agrees<T: GemmElement>(
    rt: &offload::Runtime,
    d: usize,
    g: Gemm,
    with_bias: bool,
    bias_at: usize,
    tol: f64,
) -> offload::Result<()> {
    let dev = rt.device(d)?;
    let (ea, eb, ec) = g.extents()?;
    let (a, b, c0) = (values::<T>(1, ea), values::<T>(2, eb), values::<T>(3, ec));
    let bias_array = values::<T>(4, g.m + bias_at);
    let bias = &bias_array[bias_at..];
    let mut c = c0.clone();
    dev.data(
        (map::to(&a), map::to(&b), map::to(&bias_array), map::tofrom(&mut c)),
        |(av, bv, biasv, cv)| {
            dev.gemm(&g, av, bv, cv, if with_bias { Some(biasv.slice(bias_at..)?) } else { None })
        },
    )?;
    let f = |v: T| f64::from(v.to_f32());
    let ec1 = g.one_extents()?.2;
    for t in 0..g.batch {
        // Product `t`'s operands.
        let (a, b) = (&a[t * g.stride_a..], &b[t * g.stride_b..]);
        let (c, c0) = (&c[t * g.stride_c..], &c0[t * g.stride_c..]);
        for j in 0..g.n {
            for i in 0..g.m {
                let at = |p: usize| f(if g.transa { a[p + i * g.lda] } else { a[i + p * g.lda] });
                let bt = |p: usize| f(if g.transb { b[j + p * g.ldb] } else { b[p + j * g.ldb] });
                let dot: f64 = (0..g.k).map(|p| at(p) * bt(p)).sum();
                let beta_c = if g.beta == 0.0 { 0.0 } else { f64::from(g.beta) * f(c0[i + j * g.ldc]) };
                let v = f64::from(g.alpha) * dot + beta_c + if with_bias { f(bias[i]) } else { 0.0 };
                let want = activation_f64(g.activation, v);
                let got = f(c[i + j * g.ldc]);
                let bound = tol * (1.0 + want.abs()) * (1.0 + g.k as f64).sqrt();
                check!(
                    (got - want).abs() <= bound,
                    "{:?} {g:?} product {t} at ({i}, {j}): {got} vs {want}",
                    T::TYPE
                );
            }
            for i in g.m..g.ldc.min(ec1 - j * g.ldc) {
                check!(
                    c[i + j * g.ldc].to_f32().to_bits() == c0[i + j * g.ldc].to_f32().to_bits(),
                    "{g:?}: product {t}'s row {i} of column {j} written"
                );
            }
        }
        // Between two products' C, nothing is written.
        let gap = if t + 1 < g.batch { g.stride_c - ec1 } else { 0 };
        check!(
            (ec1..ec1 + gap).all(|e| c[e].to_f32().to_bits() == c0[e].to_f32().to_bits()),
            "{g:?}: the gap after product {t} written"
        );
    }
    Ok(())
}

fn every_case<T: GemmElement>(rt: &offload::Runtime, d: usize, tf32: bool, tol: f64) -> offload::Result<()> {
    for (m, n, k) in [(1, 1, 1), (7, 5, 3), (33, 70, 17), (64, 64, 64), (130, 3, 41)] {
        for (transa, transb) in [(false, false), (true, false), (false, true), (true, true)] {
            let (ra, rb) = (if transa { k } else { m }, if transb { n } else { k });
            // Leading dimensions with room to spare (even, so that half-precision columns
            // keep 4-byte alignment).
            let base = Gemm {
                transa,
                transb,
                m,
                n,
                k,
                lda: ra + 2,
                ldb: rb + 2,
                ldc: m + 4,
                tf32,
                ..Gemm::default()
            };
            for (alpha, beta, activation, bias) in [
                (1.0, 0.0, Activation::Identity, false),
                (0.5, -2.0, Activation::Identity, false),
                (1.0, 0.0, Activation::Relu, true),
                (1.0, 0.0, Activation::Gelu, true),
                (1.0, 0.5, Activation::Relu, false),
            ] {
                agrees::<T>(rt, d, Gemm { alpha, beta, activation, ..base }, bias, 0, tol)?;
            }
        }
    }
    Ok(())
}

#[test]
fn fp32_agrees_with_f64_on_every_shape_and_epilogue() {
    on_every_device("gemm fp32", |rt, d| every_case::<f32>(rt, d, false, 1e-5));
}

#[test]
fn tf32_agrees_within_its_rounding() {
    on_every_device("gemm tf32", |rt, d| every_case::<f32>(rt, d, true, 2e-3));
}

#[test]
fn fp16_and_bf16_agree_within_their_rounding() {
    on_every_device("gemm fp16 and bf16", |rt, d| {
        every_case::<f16>(rt, d, false, 2e-3)?;
        every_case::<bf16>(rt, d, false, 1e-2)
    });
}

#[test]
fn a_bias_aligned_only_to_its_element_is_added_as_an_aligned_one() {
    on_every_device("gemm bias alignment", |rt, d| {
        for bias_at in [0, 1, 3] {
            for activation in [Activation::Identity, Activation::Relu] {
                let g =
                    Gemm { m: 64, n: 48, k: 32, lda: 64, ldb: 32, ldc: 64, activation, ..Gemm::default() };
                agrees::<f32>(rt, d, g, true, bias_at, 1e-5)?;
                agrees::<f32>(rt, d, Gemm { tf32: true, ..g }, true, bias_at, 2e-3)?;
                agrees::<f16>(rt, d, g, true, bias_at, 2e-3)?;
                agrees::<bf16>(rt, d, g, true, bias_at, 1e-2)?;
            }
        }
        Ok(())
    });
}

/// One column with a leading dimension of C far beyond its rows: only `ldc * (n - 1)` must
/// fit, and the host product once worked out `ldc * 16` columns, which wrapped (a debug
/// panic; in release, writes at wild offsets).
#[test]
fn one_column_with_a_huge_leading_dimension_is_computed() {
    on_every_device("gemm, one column, huge ldc", |rt, d| {
        let dev = rt.device(d)?;
        let m = 64;
        let (a, b) = (vec![1.5f32; m], vec![2.0f32; 1]);
        let mut c = vec![0f32; m];
        let g = Gemm { m, n: 1, k: 1, lda: m, ldb: 1, ldc: (1usize << 60) + 1, ..Gemm::default() };
        dev.data((map::to(&a), map::to(&b), map::tofrom(&mut c)), |(a, b, c)| dev.sgemm(&g, a, b, c))?;
        check!(c.iter().all(|&v| v == 3.0), "C = {:?}", &c[..4]);
        Ok(())
    });
}

/// A strided batch: each product against f64, B shared (stride 0) or not, A and C with gaps
/// between products that stay untouched, transposed or not, with a bias and an activation,
/// in f32 and bf16; and a C stride shorter than C refused.
#[test]
fn a_strided_batch_agrees_product_by_product() {
    on_every_device("gemm batch", |rt, d| {
        for (m, n, k, batch) in [(5, 3, 4, 3), (16, 1, 40, 6), (9, 7, 1, 2)] {
            for (transa, shared_b) in [(false, false), (true, true), (true, false)] {
                let ra = if transa { k } else { m };
                let one = Gemm { transa, m, n, k, lda: ra + 2, ldb: k, ldc: m + 1, ..Gemm::default() };
                let (ea, eb, ec) = one.one_extents()?;
                let g = Gemm {
                    batch,
                    stride_a: ea + 3,
                    stride_b: if shared_b { 0 } else { eb },
                    stride_c: ec + 5,
                    activation: Activation::Gelu,
                    ..one
                };
                agrees::<f32>(rt, d, g, true, 0, 1e-5)?;
                agrees::<bf16>(rt, d, g, true, 0, 1e-2)?;
            }
        }
        let dev = rt.device(d)?;
        let g = Gemm { m: 2, n: 2, k: 2, lda: 2, ldb: 2, ldc: 2, batch: 2, stride_c: 3, ..Gemm::default() };
        let x = vec![1f32; 8];
        let mut y = vec![0f32; 8];
        let r = dev.data((map::to(&x), map::from(&mut y)), |(x, y)| dev.gemm(&g, x, x, y, None));
        check!(
            matches!(&r, Err(offload::Error::InvalidArgument { what, .. }) if what.contains("C stride 3 is shorter than C's 4 elements")),
            "{r:?}"
        );
        Ok(())
    });
}

/// A kernel that writes a bf16 operand in place (doubles it).
#[offload::kernel]
fn double_bf16(i: usize, x: &mut [bf16]) {
    x[i] = bf16::from_f32(x[i].to_f32() * 2.0);
}

/// A 16-bit operand read by several products and written between them, every way a
/// program can write device memory (a kernel, a copy from the host, a copy within the
/// device, a memset, a GEMM's output), is read anew after each write: host devices keep
/// an f32 copy of such an operand while it is unwritten, and must drop it on each.
#[test]
fn a_16_bit_operand_written_between_products_is_read_anew() {
    on_every_device("gemm after writes", |rt, d| {
        let dev = rt.device(d)?;
        let n = 16;
        // C = A B with B the identity: C is A, whatever A was when the product ran.
        let g = Gemm { m: n, n, k: n, lda: n, ldb: n, ldc: n, ..Gemm::default() };
        let eye: Vec<bf16> =
            (0..n * n).map(|i| bf16::from_f32(if i % (n + 1) == 0 { 1.0 } else { 0.0 })).collect();
        let start: Vec<bf16> = values(11, n * n);
        let mut a = offload::DeviceBuffer::from_slice(&dev, &start)?;
        let b = offload::DeviceBuffer::from_slice(&dev, &eye)?;
        let c = offload::DeviceBuffer::<bf16>::new(&dev, n * n)?;
        let product = |a: &offload::DeviceBuffer<'_, bf16>| -> offload::Result<Vec<bf16>> {
            dev.gemm(&g, a.view(), b.view(), c.view(), None)?;
            c.to_vec()
        };
        // Read unwritten three times (kept from the second), then after each write.
        for _ in 0..3 {
            check!(product(&a)? == start, "unwritten");
        }
        double_bf16::launch(&dev, n * n, a.view())?;
        let doubled: Vec<bf16> = start.iter().map(|v| bf16::from_f32(v.to_f32() * 2.0)).collect();
        check!(product(&a)? == doubled, "after a kernel");
        check!(product(&a)? == doubled);
        let fresh: Vec<bf16> = values(12, n * n);
        a.write(0, &fresh)?;
        check!(product(&a)? == fresh, "after a write from the host");
        check!(product(&a)? == fresh);
        a.copy_from(&b)?;
        check!(product(&a)? == eye, "after a copy within the device");
        check!(product(&a)? == eye);
        a.fill_bytes(0)?;
        check!(product(&a)? == vec![bf16::ZERO; n * n], "after a memset");
        check!(product(&a)? == vec![bf16::ZERO; n * n]);
        // A product into A itself: A = B B = the identity.
        dev.gemm(&g, b.view(), b.view(), a.view(), None)?;
        check!(product(&a)? == eye, "after a GEMM's output");
        Ok(())
    });
}

/// Host devices multiply bf16 with the CPU's bf16 dot products (AVX512-BF16) where it has
/// them, and widen to f32 when `host_bf16_dot(false)` says so: told apart by a subnormal
/// input, which the instruction counts as zero.
#[test]
fn host_bf16_products_follow_the_dot_product_setting() {
    #[cfg(target_arch = "x86_64")]
    let has_dot = std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512bf16");
    #[cfg(not(target_arch = "x86_64"))]
    let has_dot = false;
    // A 1 x 1 x 1 product of the smallest subnormal and 2^100: 2^-33 exactly, or 0.
    let a = [bf16::from_bits(1)];
    let b = [bf16::from_f32(2f32.powi(100))];
    let exact = a[0].to_f32() * b[0].to_f32();
    assert!(exact > 0.0);
    for dot in [true, false] {
        let rt = offload::Runtime::builder()
            .env(|_| None)
            .gpus(false)
            .host_devices(1)
            .host_bf16_dot(dot)
            .build()
            .unwrap();
        let dev = rt.device(0).unwrap();
        let mut c = [bf16::ONE];
        let g = Gemm { m: 1, n: 1, k: 1, lda: 1, ldb: 1, ldc: 1, ..Gemm::default() };
        dev.data((map::to(&a[..]), map::to(&b[..]), map::from(&mut c[..])), |(a, b, c)| {
            dev.gemm(&g, a, b, c, None)
        })
        .unwrap();
        let want = if dot && has_dot { 0.0 } else { exact };
        assert_eq!(
            c[0].to_f32(),
            want,
            "host_bf16_dot({dot}) on a CPU with{} AVX512-BF16",
            if has_dot { "" } else { "out" }
        );
    }
}
