//! The compiler: Rust tokens in, C text (or a compile error) out, and what it expands to.

use quote::quote;

use crate::expand::{device_c, kernel_c};

fn cuda(attr: proc_macro2::TokenStream, f: proc_macro2::TokenStream) -> Result<String, String> {
    source(attr, f, false)
}

fn source(
    attr: proc_macro2::TokenStream,
    f: proc_macro2::TokenStream,
    checked: bool,
) -> Result<String, String> {
    kernel_c(attr, f, checked).map(|(c, _)| c)
}

fn ok(f: proc_macro2::TokenStream) -> String {
    cuda(quote!(), f).unwrap_or_else(|e| panic!("{e}"))
}

fn fails(f: proc_macro2::TokenStream) -> String {
    cuda(quote!(), f).expect_err("not in the kernel language")
}

#[test]
fn saxpy_has_the_documented_signature() {
    let c = ok(quote!(
        fn saxpy(i: usize, a: f32, x: &[f32], y: &mut [f32]) {
            y[i] = a * x[i] + y[i];
        }
    ));
    assert!(c.contains(
        "extern \"C\" __global__ void __launch_bounds__(256) saxpy(unsigned long long __offload_s0, float a, \
         const float* __restrict__ x, float* __restrict__ y, unsigned long long __offload_len_x, \
         unsigned long long __offload_len_y, unsigned long long __offload_n)"
    ), "{c}");
    assert!(c.contains("const unsigned long long i = __offload_s0 + __offload_t;"), "{c}");
    assert!(c.contains("y[i] = ((a * x[i]) + y[i]);"), "{c}");
    assert!(!c.contains("__offload_next"), "no return, no label: {c}");
}

#[test]
fn two_and_three_dimensions_decode_the_linear_index() {
    // Without `dims`, `nx` would be a third index.
    let c = cuda(
        quote!(dims = 2),
        quote!(
            fn k(i: usize, j: usize, nx: usize, u: &mut [f64]) {
                u[i * nx + j] = 0.0;
            }
        ),
    )
    .unwrap();
    assert!(c.contains("__offload_s0, unsigned long long __offload_s1, unsigned long long __offload_l1, unsigned long long nx"), "{c}");
    assert!(c.contains("const unsigned int __offload_rows = 4u;"), "{c}");
    assert!(c.contains("const unsigned long long __offload_l0 = __offload_n / (__offload_l1);"), "{c}");
    assert!(
        c.contains("i = __offload_s0 + __offload_q0;") && c.contains("j = __offload_s1 + __offload_w;"),
        "{c}"
    );
    // A whole strip is an unrolled loop of constant length; a partial one a plain loop.
    assert!(
        c.contains(
            "#pragma unroll\n            for (unsigned int __offload_k = 0u; __offload_k < __offload_rows;"
        ),
        "{c}"
    );
    assert!(
        c.contains("#pragma unroll 1\n            for (unsigned long long __offload_q0 = __offload_first; __offload_q0 < __offload_l0;"),
        "{c}"
    );
    assert_eq!(c.matches("u[((i * nx) + j)] = 0.0;").count(), 2, "the body in both loops: {c}");
    assert!(c.contains("u[((i * nx) + j)] = 0.0;"), "{c}");
    let c = cuda(
        quote!(dims = 3),
        quote!(
            fn k(a: usize, b: usize, c: usize, u: &mut [u32]) {
                u[a * 100 + b * 10 + c] = 1;
            }
        ),
    )
    .unwrap();
    assert!(
        c.contains("b = __offload_s1 + __offload_r1;") && c.contains("c = __offload_s2 + __offload_r2;"),
        "{c}"
    );
    assert!(c.contains("__offload_r1 = __offload_w / __offload_l2;"), "{c}");
    assert!(c.contains("__offload_l0 = __offload_n / (__offload_l1 * __offload_l2);"), "{c}");
    let c = cuda(
        quote!(dims = 2, rows = 16),
        quote!(
            fn k(a: usize, b: usize, u: &mut [u32]) {
                if a > b {
                    return;
                }
                u[a] = 1;
            }
        ),
    )
    .unwrap();
    assert!(c.contains("__offload_rows = 16u;"), "{c}");
    // Each copy of the body has its own label for `return`.
    assert!(c.contains("goto __offload_next;") && c.contains("goto __offload_next_tail;"), "{c}");
    assert!(c.contains("__offload_next:;") && c.contains("__offload_next_tail:;"), "{c}");

    assert!(c.contains("= 1u;"), "literals take the type of their place: {c}");
}

#[test]
fn dims_lets_a_usize_argument_follow_the_index() {
    let c = cuda(
        quote!(dims = 1),
        quote!(
            fn k(i: usize, m: usize, x: &mut [usize]) {
                x[i] = m;
            }
        ),
    )
    .unwrap();
    assert!(c.contains("unsigned long long m, unsigned long long* __restrict__ x"), "{c}");
}

#[test]
fn control_flow_lets_and_float_methods() {
    let c = ok(quote!(
        fn k(i: usize, n: u32, flag: bool, x: &[f32], y: &mut [f32]) {
            let mut s = 0.0f32;
            let h: f32 = 0.5;
            for q in 0..n {
                if q % 2 == 0 {
                    continue;
                }
                s += (q as f32).sqrt().mul_add(h, 1.0);
            }
            let mut w = 3i64;
            while w > 0 {
                w -= 1;
            }
            if !flag {
                return;
            } else if s > 10.0 {
                s = s.min(10.0);
            } else {
                s = s.powi(2);
            }
            y[i] = if s > 0.0 { s.ln() } else { x[i].abs() };
        }
    ));
    for want in [
        "const bool flag = __offload_b_flag != 0u;",
        "float s = 0.0f;",
        "const float h = 0.5f;",
        "for (unsigned int q = 0u, q_end = n; q < q_end; ++q) {",
        "if (((q % 2u) == 0u)) {",
        "s += fmaf(sqrtf(((float) q)), h, 1.0f);",
        "long long w = 3ll;",
        "while ((w > 0ll)) {",
        "goto __offload_next;",
        "s = fminf(s, 10.0f);",
        "s = powf(s, (float) 2);",
        "y[i] = ((s > 0.0f) ? logf(s) : fabsf(x[i]));",
        "__offload_next:;",
    ] {
        assert!(c.contains(want), "missing `{want}` in\n{c}");
    }
}

#[test]
fn shadowing_gets_fresh_c_names() {
    let c = ok(quote!(
        fn k(i: usize, y: &mut [f64]) {
            let x = 1.0f64;
            let x = x * 2.0;
            y[i] = x;
        }
    ));
    assert!(c.contains("const double x = 1.0;") && c.contains("const double x_1 = (x * 2.0);"), "{c}");
    assert!(c.contains("y[i] = x_1;"), "{c}");
    let c = ok(quote!(
        fn k(i: usize, int: i32, y: &mut [i32]) {
            y[i] = int;
        }
    ));
    assert!(c.contains("int int_1") && c.contains("y[i] = int_1;"), "C keywords are renamed: {c}");
}

#[test]
fn device_functions_are_called_by_name() {
    let c = ok(quote!(
        fn k(i: usize, y: &mut [f32]) {
            let v = lerp(y[i], 1.0, 0.5);
            y[i] = v * 2.0;
        }
    ));
    assert!(c.contains("<device fn lerp>"), "the callee's source is included: {c}");
    assert!(c.contains("const auto v = lerp(y[i], 1.0, 0.5);"), "{c}");
    assert!(c.contains("y[i] = (v * ((offload_plain<decltype(v)>) 2.0));"), "{c}");
}

#[test]
fn constructs_outside_the_subset_are_errors_that_say_why() {
    for (f, why) in [
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    let f = |v: f32| v;
                    y[i] = f(1.0);
                }
            ),
            "closures are not in the kernel language",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    let v = Vec::new();
                }
            ),
            "not in the kernel language",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    y[i] = y[i].signum();
                }
            ),
            "the method `signum` is not in the kernel language",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    println!("{}", i);
                }
            ),
            "macros are not in the kernel language",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    let x = 1.0;
                    y[i] = x;
                }
            ),
            "float literals; annotate it (`let x: f32 = ...`",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    for q in (0..4usize).skip(1) {
                        y[q] = 0.0;
                    }
                }
            ),
            "optionally `.rev()`, `.step_by(s)` or both",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    let half = 256 >> (2 + 1);
                    y[i] = 0.0;
                }
            ),
            "integer literals; annotate it (`let half: usize = ...`",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    for q in 0..4 {
                        y[q] = 0.0;
                    }
                }
            ),
            "give a bound a suffix",
        ),
        (
            quote!(
                fn k(i: usize, x: &[f32]) {
                    x[i] = 1.0;
                }
            ),
            "only elements of `&mut` slices can be assigned",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut Vec<f32>) {}
            ),
            "this parameter type is not in the kernel language",
        ),
        (
            quote!(
                fn k(x: &mut [f32]) {}
            ),
            "first parameters are its 1, 2 or 3 indices",
        ),
        (
            quote!(
                fn k(i: usize, mut a: f32, y: &mut [f32]) {}
            ),
            "`mut` parameters are not in the kernel language",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    y[i] = match i {
                        _ => 1.0,
                    };
                }
            ),
            "`match` is not in the kernel language",
        ),
    ] {
        let e = fails(f);
        assert!(e.starts_with("offload::kernel: ") && e.contains(why), "expected `{why}`, got `{e}`");
    }
}

#[test]
fn device_functions_return_their_tail_and_take_views() {
    let c = device_c(quote!(
        fn relu(x: f64, on: bool) -> f64 {
            if !on {
                return x;
            }
            x.max(0.0)
        }
    ))
    .unwrap();
    assert!(c.contains("__device__ double relu(double x, bool on) {"), "{c}");
    assert!(c.contains("return x;") && c.contains("return fmax(x, 0.0);"), "{c}");
    let c = device_c(quote!(
        fn laplacian(u: &[f32], c: usize, nx: usize) -> f32 {
            u[c - 1] + u[c + 1] + u[c - nx] + u[c + nx] - 4.0 * u[c]
        }
    ))
    .unwrap();
    assert!(c.contains("__device__ float laplacian(offload_view<const float> u, unsigned long long c, unsigned long long nx) {"), "{c}");
    assert!(c.contains("u[(c - 1ull)]"), "{c}");
    let e = device_c(quote!(
        fn g(x: &mut f32) {}
    ))
    .unwrap_err();
    assert!(e.contains("`&mut T` parameters are not in the kernel language"), "{e}");
}

#[test]
fn reductions_keep_a_partial_per_thread_and_combine_once_per_block() {
    let c = cuda(
        quote!(reduction(+: total), reduction(min: lo)),
        quote!(
            fn k(i: usize, x: &[f64], total: &mut f64, lo: &mut i32) {
                *total += x[i];
                *lo = (*lo).min(i as i32);
            }
        ),
    )
    .unwrap();
    assert!(
        c.contains("double* __restrict__ __offload_red_total, int* __restrict__ __offload_red_lo"),
        "{c}"
    );
    assert!(c.contains("double total = 0.0;"), "{c}");
    assert!(c.contains("int lo = 2147483647;"), "{c}");
    assert!(c.contains("total += x[i];"), "{c}");
    assert!(c.contains("lo = offload_op_min()(lo, ((int) i));"), "{c}");
    assert!(c.contains("offload_reduce<double>(total, 0.0, __offload_red_total, offload_op_add());"), "{c}");
    assert!(c.contains("offload_reduce<int>(lo, 2147483647, __offload_red_lo, offload_op_min());"), "{c}");
    // The combination comes after the loop, which every thread leaves.
    assert!(
        c.find("offload_reduce<double>(total").unwrap() > c.find("__offload_t += __offload_stride").unwrap()
    );
    // `(*r).max(v)` is the same update.
    let c = cuda(
        quote!(reduction(max: hi)),
        quote!(
            fn k(i: usize, x: &[f32], hi: &mut f32) {
                *hi = (*hi).max(x[i]);
            }
        ),
    )
    .unwrap();
    assert!(c.contains("hi = offload_op_max()(hi, x[i]);"), "{c}");
    assert!(c.contains("float hi = __int_as_float(0xff800000);"), "{c}");
}

#[test]
fn reduction_variables_are_only_updated() {
    let red = |attr: proc_macro2::TokenStream, body: proc_macro2::TokenStream| {
        cuda(attr, quote!(fn k(i: usize, x: &[f32], s: &mut f32) { #body })).expect_err("misuse")
    };
    let e = red(quote!(reduction(+: s)), quote!(*s = x[i];));
    assert!(e.contains("only added to, as `*sum += value;`"), "{e}");
    let e = red(quote!(reduction(+: s)), quote!(let v: f32 = *s;));
    assert!(e.contains("only added to"), "{e}");
    let e = red(quote!(reduction(+: s)), quote!(*s *= x[i];));
    assert!(e.contains("only added to"), "{e}");
    let e = red(quote!(reduction(min: s)), quote!(*s += x[i];));
    assert!(e.contains("only updated as `*r = (*r).min(value);`"), "{e}");
    let e = red(quote!(reduction(min: s)), quote!(*s = s.max(x[i]);));
    assert!(e.contains("(*r).min(value)"), "{e}");
    let e = red(quote!(reduction(max: s)), quote!(*s = s.max(s.min(x[i]));));
    assert!(e.contains("(*r).max(value)"), "{e}");
    // A `&mut` scalar must be listed, a listed one must be a `&mut` scalar of the subset.
    let e = red(quote!(), quote!(*s += x[i];));
    assert!(e.contains("is a reduction variable: list it as `#[offload::kernel(reduction(+: s))]`"), "{e}");
    let e = cuda(
        quote!(reduction(+: x)),
        quote!(
            fn k(i: usize, x: &[f32]) {}
        ),
    )
    .expect_err("not &mut");
    assert!(e.contains("`x` is listed in `reduction(+: ...)`, so its type is `&mut T`"), "{e}");
    let e = cuda(
        quote!(reduction(+: y)),
        quote!(
            fn k(i: usize, x: &mut usize) {}
        ),
    )
    .expect_err("usize");
    assert!(e.contains("not an argument") || e.contains("reduction variable"), "{e}");
    let e = cuda(
        quote!(reduction(*: s)),
        quote!(
            fn k(i: usize, s: &mut f32) {}
        ),
    )
    .expect_err("operator");
    assert!(e.contains("expected identifier") || e.contains("`+`, `min` or `max`"), "{e}");
    let e = cuda(
        quote!(reduction(+: s, s)),
        quote!(
            fn k(i: usize, s: &mut f32) {}
        ),
    )
    .expect_err("twice");
    assert!(e.contains("already a reduction"), "{e}");
}

#[test]
fn checked_accesses_go_through_offload_at_and_the_report() {
    let f = quote!(
        fn saxpy(i: usize, a: f32, x: &[f32], y: &mut [f32]) {
            y[i] = a * x[i] + y[i];
        }
    );
    let c = source(quote!(), f, true).unwrap();
    assert!(c.contains("void __launch_bounds__(256) saxpy__offload_checked("), "{c}");
    assert!(
        c.contains("unsigned long long* __restrict__ __offload_err, unsigned long long __offload_n)"),
        "{c}"
    );
    assert!(c.contains("(*offload_at(y, i, __offload_len_y, 2u, __offload_err)) = ((a * (*offload_at(x, i, __offload_len_x, 1u, __offload_err)))"), "{c}");
}

#[test]
fn a_slice_has_a_length() {
    let c = ok(quote!(
        fn k(i: usize, x: &mut [f32]) {
            if i + 1 < x.len() {
                x[i] = 1.0;
            }
        }
    ));
    assert!(c.contains("if (((i + 1ull) < __offload_len_x)) {"), "{c}");
    let e = fails(quote!(
        fn k(i: usize, x: &mut [f32]) {
            x.fill(0.0);
        }
    ));
    assert!(e.contains("the only method of a view in the kernel language is `len()`"), "{e}");
}

#[test]
fn leading_usize_parameters_are_indices_only_when_dims_says_or_there_is_one() {
    // One leading `usize`: a 1-D kernel.
    assert!(ok(quote!(
        fn k(i: usize, x: &mut [f32]) {
            x[i] = 1.0;
        }
    ))
    .contains("const unsigned long long i = __offload_s0 + __offload_t;"));
    // Two without `dims`: ambiguous (a 1-D kernel with a `usize` argument, or 2-D?).
    let e = fails(quote!(
        fn k(i: usize, n: usize, x: &mut [f32]) {
            x[i] = 1.0;
        }
    ));
    assert!(
        e.contains("`i`, `n` are `usize`: say how many are indices with `#[offload::kernel(dims = N)]`"),
        "{e}"
    );
    let e = cuda(
        quote!(dims = 3),
        quote!(
            fn k(i: usize, j: usize, x: &mut [f32]) {}
        ),
    )
    .unwrap_err();
    assert!(e.contains("`dims = 3` but the kernel has 2 leading `usize` parameters"), "{e}");
}

#[test]
fn the_unit_stride_index_is_the_fastest_thread_dimension() {
    // OpenMP's `collapse(2)` order with the unit-stride index outermost (the Jacobi port).
    let f = quote!(
        fn step(i: usize, j: usize, n: usize, a: &[f32], b: &mut [f32]) {
            let c = i + j * n;
            b[c] = 0.25f32 * (a[c - 1] + a[c + 1] + a[i + (j - 1) * n] + a[i + (j + 1) * n]);
        }
    );
    let (c, map) = kernel_c(quote!(dims = 2), f, false).unwrap();
    assert_eq!(map.order, vec![1, 0], "{map:?}");
    assert!(
        map.note.contains("consecutive threads take consecutive `i`") && map.note.contains("strip of `j`"),
        "{map:?}"
    );
    assert!(c.contains("const unsigned long long i = __offload_s0 + __offload_w;"), "{c}");
    assert!(c.contains("const unsigned long long j = __offload_s1 + __offload_q0;"), "{c}");
    assert!(c.contains("(__offload_l1 + __offload_rows - 1) / __offload_rows * __offload_inner"), "{c}");
    // The C order stays where the last index has unit stride, or none has.
    for f in [
        quote!(
            fn step(i: usize, j: usize, n: usize, b: &mut [f32]) {
                b[i * n + j] = 1.0;
            }
        ),
        quote!(
            fn step(i: usize, j: usize, n: usize, b: &mut [f32]) {
                b[0] = 1.0;
            }
        ),
    ] {
        let (_, map) = kernel_c(quote!(dims = 2), f, false).unwrap();
        assert_eq!(map.order, vec![0, 1], "{map:?}");
    }
    // 3-D: `x` outermost in the signature, unit stride.
    let (_, map) = kernel_c(
        quote!(dims = 3),
        quote!(
            fn k(x: usize, y: usize, z: usize, nx: usize, ny: usize, u: &mut [f64]) {
                u[x + nx * (y + ny * z)] = 0.0;
            }
        ),
        false,
    )
    .unwrap();
    assert_eq!(map.order, vec![1, 2, 0], "{map:?}");
}

#[test]
fn constants_builtins_and_new_methods() {
    let c = ok(quote!(
        fn k(i: usize, x: &mut [f64]) {
            x[i] = x[i] * DT + params::SCALE + f64::EPSILON;
            x[i] = x[i].tanh().max(f64::NEG_INFINITY) + std::f64::consts::PI;
        }
    ));
    assert!(c.contains("const <DT> DT = <value>;"), "{c}");
    assert!(c.contains("const <params :: SCALE> SCALE = <value>;"), "{c}");
    assert!(c.contains("__longlong_as_double(0x3cb0000000000000ull)"), "EPSILON: {c}");
    assert!(c.contains("fmax(tanh(x[i]), __longlong_as_double(0xfff0000000000000ull))"), "{c}");
    assert!(c.contains("__longlong_as_double(0x400921fb54442d18ull)"), "PI: {c}");
    let c = ok(quote!(
        fn k(i: usize, x: &mut [f32]) {
            x[i] = x[i].clamp(0.0, 1.0) + f32::MAX + (i as f32).recip();
        }
    ));
    assert!(c.contains("offload_clamp(x[i], 0.0f, 1.0f)"), "{c}");
    assert!(c.contains("__int_as_float(0x7f7fffffu)"), "{c}");
    assert!(c.contains("(1.0f / ((float) i))"), "{c}");
}

#[test]
fn sub_slices_are_views() {
    let c = ok(quote!(
        fn k(i: usize, n: u32, a: &[f32], b: &mut [f32]) {
            let row = &a[i * 4..i * 4 + 4];
            b[i] = row[0] + sum(&a[..4]) + sum(row) + row.len() as f32;
        }
    ));
    assert!(
        c.contains("const auto row = offload_sub(offload_view<const float>(a, __offload_len_a, 1u, nullptr), (i * 4ull), ((i * 4ull) + 4ull));"),
        "{c}"
    );
    assert!(c.contains("row[0ull]") && c.contains("row.len"), "{c}");
    assert!(
        c.contains(
            "sum(offload_sub(offload_view<const float>(a, __offload_len_a, 1u, nullptr), 0ull, 4ull))"
        ),
        "{c}"
    );
    let (c, _) = kernel_c(
        quote!(),
        quote!(
            fn k(i: usize, a: &[f32], b: &mut [f32]) {
                b[i] = sum(a);
            }
        ),
        true,
    )
    .unwrap();
    assert!(
        c.contains("sum(offload_view<const float>(a, __offload_len_a, 0u, __offload_err))"),
        "checked: {c}"
    );
    let e = fails(quote!(
        fn k(i: usize, a: &[f32], b: &mut [f32]) {
            let s = &mut a[0..2];
        }
    ));
    assert!(e.contains("a `&mut` sub-slice is taken of a `&mut` view"), "{e}");
}

#[test]
fn structs_are_parameters_and_elements() {
    let c = ok(quote!(
        fn k(i: usize, p: Params, ps: &mut [geom::Particle]) {
            ps[i].x = ps[i].x + p.dt * ps[i].v;
        }
    ));
    assert!(c.contains("<struct Params>") && c.contains("<struct Particle>"), "{c}");
    assert!(c.contains("Params p, Particle* __restrict__ ps"), "{c}");
    assert!(c.contains("ps[i].x = (ps[i].x + (p.dt * ps[i].v));"), "{c}");
    let e = fails(quote!(
        fn k(i: usize, p: Params, y: &mut [f32]) {
            y[i] = p[0];
        }
    ));
    assert!(e.contains("indexing is for views"), "{e}");
}

#[test]
fn teams_kernels_have_team_local_arrays_and_barriers() {
    let (c, map) = kernel_c(
        quote!(teams = 128),
        quote!(
            fn reverse(team: usize, thread: usize, x: &[f32], y: &mut [f32]) {
                let mut tile: [f32; 128] = offload::team_local();
                tile[thread] = x[team * 128 + thread];
                offload::barrier();
                y[team * 128 + thread] = tile[127 - thread];
            }
        ),
        false,
    )
    .unwrap();
    assert!(map.note.contains("teams of 128 threads"), "{map:?}");
    assert!(
        c.contains(
            "__launch_bounds__(128) reverse(unsigned long long __offload_s0, const float* __restrict__ x"
        ),
        "{c}"
    );
    assert!(c.contains("__shared__ float tile[128];"), "{c}");
    assert!(c.contains("const unsigned long long team = __offload_s0 + __offload_q;"), "{c}");
    assert!(c.contains("const unsigned long long thread = threadIdx.x;"), "{c}");
    assert!(c.contains("tile[thread] = x[((team * 128ull) + thread)];"), "{c}");
    let kernel = &c[c.find("extern \"C\"").unwrap()..];
    assert_eq!(kernel.matches("__syncthreads();").count(), 2, "the body's and the team's end: {kernel}");
    let (c, _) = kernel_c(
        quote!(teams = 128),
        quote!(
            fn reverse(team: usize, thread: usize, y: &mut [f32]) {
                let mut tile: [f32; 128] = offload::team_local();
                tile[thread] = 1.0;
                y[team] = tile[0];
            }
        ),
        true,
    )
    .unwrap();
    assert!(
        c.contains("(*offload_at(tile, thread, 128ull, 1u, __offload_err))"),
        "team-local arrays named after the parameters: {c}"
    );

    // What is refused, and why.
    let teams = |body: proc_macro2::TokenStream| {
        cuda(quote!(teams = 64), quote!(fn k(team: usize, thread: usize, y: &mut [f32]) { #body }))
            .unwrap_err()
    };
    let e = teams(quote!(if thread == 0 {
        offload::barrier();
    }));
    assert!(e.contains("a barrier is reached by every thread of the team"), "{e}");
    let e = teams(quote!(for k in 0..thread {
        offload::barrier();
    }));
    assert!(e.contains("a barrier is reached by every thread"), "{e}");
    // Team reductions: a `let`'s value where a barrier may stand, in whole warps.
    let e = teams(quote!(y[thread] = offload::team_sum(1.0f32);));
    assert!(e.contains("a team reduction is a `let`'s value"), "{e}");
    let e = teams(quote!(if thread == 0 {
        let s = offload::team_max(1.0f32);
    }));
    assert!(e.contains("a team reduction is reached by every thread of the team"), "{e}");
    let e = cuda(
        quote!(teams = 48),
        quote!(
            fn k(team: usize, thread: usize, y: &mut [f32]) {
                let s = offload::team_sum(y[thread]);
            }
        ),
    )
    .unwrap_err();
    assert!(e.contains("needs whole warps: the team's 48 threads"), "{e}");
    let e = fails(quote!(
        fn k(i: usize, y: &mut [f32]) {
            let s = offload::team_sum(y[i]);
        }
    ));
    assert!(e.contains("a team reduction is in a teams kernel only"), "{e}");
    let c = cuda(
        quote!(teams = 64),
        quote!(
            fn k(team: usize, thread: usize, y: &mut [f32]) {
                let s = offload::team_product(y[thread]);
                y[thread] = s;
            }
        ),
    )
    .unwrap();
    assert!(c.contains("offload_team_reduce<float>(y[thread], (float)1, offload_op_mul())"), "{c}");
    // Conditions the same for every thread may hold barriers; the refusal names the value
    // that can differ, and why.
    let e = teams(quote!(let mut k = thread; while k < 64 {
        offload::barrier();
        k += 32;
    }));
    assert!(e.contains("reads `k` (set from `thread`, the thread's index)"), "{e}");
    let e = teams(quote!(if y[team] > 0.0 {
        offload::barrier();
    }));
    assert!(e.contains("reads `y[..]`, memory another thread may write"), "{e}");
    let e = teams(quote!(let mut n = 4usize; if thread == 0 { n = 5; } for k in 0..n {
        offload::barrier();
    }));
    assert!(e.contains("reads `n` (assigned under an `if` that reads `thread`"), "{e}");
    assert!(cuda(
        quote!(teams = 64),
        quote!(
            fn k(team: usize, thread: usize, n: usize, y: &mut [f32]) {
                let mut left = team % 3 + n;
                while left > 0 {
                    offload::barrier();
                    left -= 1;
                }
                if n > 2 {
                    offload::barrier();
                }
            }
        )
    )
    .is_ok());
    // `teams = ..=MAX`: the team size is the launch's (a slot), `team_size()` reads it.
    let c = cuda(
        quote!(teams = ..=256),
        quote!(
            fn k(team: usize, thread: usize, y: &mut [f32]) {
                y[team * offload::team_size() + thread] = 1.0;
            }
        ),
    )
    .unwrap();
    assert!(c.contains("__launch_bounds__(256)") && c.contains("unsigned long long __offload_ts,"), "{c}");
    assert!(c.contains("__offload_teams = __offload_n / __offload_ts;"), "{c}");
    for bad in [quote!(teams = 16..=64), quote!(teams = ..64)] {
        let e = cuda(
            bad,
            quote!(
                fn k(team: usize, thread: usize, y: &mut [f32]) {}
            ),
        )
        .unwrap_err();
        assert!(e.contains("`teams = ..=MAX` for a team size given at launch"), "{e}");
    }
    let e = fails(quote!(
        fn k(i: usize, y: &mut [f32]) {
            y[i] = offload::team_size() as f32;
        }
    ));
    assert!(e.contains("`offload::team_size()` is in teams kernels only"), "{e}");
    // A view local's length differs as the view does.
    let e = teams(quote!(let s = &y[0..thread]; if s.len() > 3 {
        offload::barrier();
    }));
    assert!(e.contains("reads `s` (set from `thread`"), "{e}");
    // A team reduction's result is one value: not `let mut`; not over `usize`.
    let e = teams(quote!(let mut s = offload::team_sum(y[thread]);));
    assert!(e.contains("bind it with `let`, not `let mut`"), "{e}");
    let e = teams(quote!(let s = offload::team_sum(thread);));
    assert!(e.contains("(a `usize`: `team_sum(v as u64)`;"), "{e}");
    let e = teams(quote!(for k in (0..4usize).step_by(0) {
        y[k] = 0.0;
    }));
    assert!(e.contains("`.step_by(0)`: a step is at least 1"), "{e}");
    // A step that depends on the thread makes the loop's trip count the thread's own.
    let e = teams(quote!(for k in (0..64usize).step_by(thread + 1) {
        offload::barrier();
    }));
    assert!(e.contains("a barrier is reached by every thread"), "{e}");
    assert!(cuda(
        quote!(teams = 64),
        quote!(
            fn k(team: usize, thread: usize, n: u32, y: &mut [f32]) {
                for k in 0..n {
                    offload::barrier();
                }
            }
        )
    )
    .is_ok());
    let e = teams(quote!(return;));
    assert!(e.contains("`return` is not in teams kernels"), "{e}");
    let e = teams(quote!(if true {
        let mut t: [f32; 4] = offload::team_local();
    }));
    assert!(e.contains("declared at the top of the kernel's body"), "{e}");
    let e = fails(quote!(
        fn k(i: usize, y: &mut [f32]) {
            offload::barrier();
        }
    ));
    assert!(e.contains("a barrier is in a teams kernel only"), "{e}");
    let e = cuda(
        quote!(teams = 64, dims = 2),
        quote!(
            fn k(team: usize, thread: usize) {}
        ),
    )
    .unwrap_err();
    assert!(e.contains("leave out `dims`"), "{e}");
    let e = cuda(
        quote!(teams = 64),
        quote!(
            fn k(team: usize, y: &mut [f32]) {}
        ),
    )
    .unwrap_err();
    assert!(e.contains("its team and its thread"), "{e}");
}

/// A teams twin cuts its body at the barriers into loops over the team's threads, and
/// keeps per thread only the locals read after their stretch.
#[test]
fn teams_twins_are_loops_over_threads_between_barriers() {
    let code = crate::expand::teams_twin(
        quote!(teams = 32),
        quote!(
            fn k(team: usize, thread: usize, n: u32, x: &[f32], y: &mut [f32]) {
                let mut tile: [f32; 32] = offload::team_local();
                let g = team * 32 + thread;
                let scratch = x[g] * 2.0;
                let mut v = scratch + 1.0;
                for _ in 0..n {
                    tile[thread] = v;
                    offload::barrier();
                    let w = tile[31 - thread];
                    v += w;
                }
                y[g] = v;
            }
        ),
    )
    .unwrap();
    let code = code.replace(' ', "");
    // Three stretches: before the loop, the loop's two halves; the tail after it.
    assert_eq!(code.matches("for__offload_threadin0..__offload_ts").count(), 4, "{code}");
    // `g` and `v` live past their stretch, in arrays of the team's length; `scratch` and
    // `w` do not.
    assert_eq!(code.matches("::core::default::Default>::default();32usize]").count(), 2, "{code}");
    assert!(!code.contains("barrier") && !code.contains("thread::scope"), "{code}");
    // The loop's bound is read once by the team.
    assert!(
        code.contains(
            "for__offload_kin({let__offload_thread:usize=0;0u32})..({let__offload_thread:usize=0;n})"
        ),
        "{code}"
    );
    // A block-stride counter set anew after each barrier carries nothing across one: a
    // local of the team's code, not an array per thread.
    let code = crate::expand::teams_twin(
        quote!(teams = 32),
        quote!(
            fn k(team: usize, thread: usize, n: usize, x: &[f32], y: &mut [f32]) {
                let base = team * n;
                let mut s = 0.0f32;
                let mut c = thread;
                while c < n {
                    s += x[c];
                    c += 32;
                }
                offload::barrier();
                c = thread;
                while c < n {
                    y[base + c] = s;
                    c += 32;
                }
            }
        ),
    )
    .unwrap()
    .replace(' ', "");
    assert!(code.contains("letmutc:usize;"), "{code}");
    // `base` is the same for every thread and reads no memory: computed once per team.
    assert!(code.contains("letbase:usize=(team*n);"), "{code}");
    assert_eq!(code.matches("::core::default::Default>::default();32usize]").count(), 1, "only `s`: {code}");
    // Both stretches run their block-stride loops in rounds: thread `t` of round `r` takes
    // element `r + t`, the threads below the bound only.
    assert_eq!(
        code.matches("let__offload_cnt:usize=::core::cmp::min(__offload_ts,__offload_n-__offload_r);")
            .count(),
        2,
        "{code}"
    );
    assert!(code.contains("letc:usize=__offload_r+__offload_thread;"), "{code}");
    // Each round reads `x` and writes `y` through a window of the round's run (checked once
    // per round, indexed by the thread's place), and runs as written where one is not
    // made: two loops per round.
    assert!(code.contains("x.window({letc:usize=__offload_r;c},__offload_cnt)"), "{code}");
    assert!(code.contains("y.window({letc:usize=__offload_r;((team*n)+c)},__offload_cnt)"), "{code}");
    assert!(code.contains("__offload_w0.get(__offload_thread)"), "{code}");
    assert!(code.contains("__offload_w0.set(__offload_i,__offload_v)"), "{code}");
    assert_eq!(code.matches("for__offload_threadin0..__offload_cnt").count(), 4, "{code}");
    // The per-thread partial `s`, as a slice of the round's threads (no check per index).
    assert!(code.contains("&mut__offload_pt_"), "{code}");
    // Accesses that only some threads make take windows too, unless their start could wrap
    // below zero (a debug build would panic where the body does not); an index naming the
    // thread is not one run of the round.
    let code = crate::expand::teams_twin(
        quote!(teams = 32),
        quote!(
            fn k(team: usize, thread: usize, n: usize, x: &[f32], y: &[f32], z: &mut [f32]) {
                let base = team * n;
                let mut c = thread;
                while c < n {
                    let mut v = 0.0f32;
                    if c > 0 {
                        v = x[base + c - 1] + y[base + c];
                    }
                    z[base + c] = v + x[c + thread];
                    c += 32;
                }
            }
        ),
    )
    .unwrap()
    .replace(' ', "");
    assert!(code.contains("y.window("), "{code}");
    assert!(code.contains("z.window("), "{code}");
    assert!(!code.contains("x.window("), "{code}");
    // A tree step's stretch loops over its active threads only, `thread == 0` over one,
    // but a guard on a value that differs per thread keeps the whole team.
    let code = crate::expand::teams_twin(
        quote!(teams = 32),
        quote!(
            fn k(team: usize, thread: usize, x: &[f32], y: &mut [f32]) {
                let mut part: [f32; 32] = offload::team_local();
                part[thread] = x[team * 32 + thread];
                offload::barrier();
                for s in 0..5u32 {
                    let w = 16usize >> s;
                    if thread < w {
                        part[thread] += part[thread + w];
                    }
                    offload::barrier();
                }
                if thread == 0 {
                    y[team] = part[0];
                }
                offload::barrier();
                let v = part[thread];
                if thread < v as usize {
                    y[team] += 1.0;
                }
            }
        ),
    )
    .unwrap()
    .replace(' ', "");
    assert!(code.contains("for__offload_threadin0..::core::cmp::min(__offload_ts,w)"), "{code}");
    assert!(code.contains("__offload_e..if__offload_e<__offload_ts"), "{code}");
    assert_eq!(code.matches("for__offload_threadin0..__offload_ts").count(), 2, "{code}");
}

#[test]
fn erf_is_cudas() {
    let c = ok(quote!(
        fn k(i: usize, f: &mut [f32]) {
            f[i] += offload::erf(i as f32 * 0.01) + offload::erfc(i as f64 * 0.001) as f32;
        }
    ));
    assert!(c.contains("erff((((float) i) * 0.01f))") && c.contains("erfc((((double) i) * 0.001))"), "{c}");
}

/// The narrow variant's CUDA source of kernel `f`.
fn narrow(attr: proc_macro2::TokenStream, f: proc_macro2::TokenStream) -> String {
    crate::expand::kernel_c_variant(attr, f, crate::emit_c::Variant::Narrow)
        .map(|(c, _)| c)
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_narrow_variant_computes_element_indices_in_32_bits() {
    let c = narrow(
        quote!(dims = 2),
        quote!(
            fn red(row: usize, col: usize, num: usize, a: &[f32], b: &mut [f32]) {
                let half: usize = (num >> 1) + 2;
                let size: usize = num * num;
                let ind: usize = 2 * row - (col & 1) - 1 + num * (col - 1);
                b[col * half + row] = a[5 * size + ind];
            }
        ),
    );
    // Its own symbol; the block's 64-bit words read as 32-bit values.
    assert!(c.contains("red__offload_narrow(unsigned long long __offload_arg_s0, unsigned long long __offload_arg_s1, unsigned long long __offload_arg_l1, unsigned long long __offload_param_num,"), "{c}");
    assert!(c.contains("const unsigned int num = (unsigned int)__offload_param_num;"), "{c}");
    assert!(c.contains("const unsigned int __offload_n = (unsigned int)__offload_arg_n;"), "{c}");
    // The decode and the indices.
    assert!(
        c.contains("unsigned int __offload_t = blockIdx.x * (unsigned int)blockDim.x + threadIdx.x;"),
        "{c}"
    );
    assert!(c.contains("const unsigned int col = __offload_s1 + __offload_q0;"), "{c}");
    assert!(c.contains("const unsigned int row = __offload_s0 + __offload_w;"), "{c}");
    // Every local is an index's arithmetic: 32-bit, including a product past 2^32 and a
    // difference (only their low halves reach an element index).
    assert!(c.contains("const unsigned int half = ((num >> 1) + 2u);"), "{c}");
    assert!(c.contains("const unsigned int size = (num * num);"), "{c}");
    assert!(c.contains("b[((col * half) + row)] = a[((5u * size) + ind)];"), "{c}");
    assert!(!c.contains("unsigned long long ind"), "{c}");
}

#[test]
fn the_narrow_variant_keeps_64_bits_where_a_value_is_needed_whole() {
    let c = narrow(
        quote!(dims = 1),
        quote!(
            fn pick(i: usize, n: usize, m: usize, a: &[f32], b: &mut [f32]) {
                // Bounded (both operands under 2^31): divided in 32 bits.
                let q: usize = i / n;
                // A product needs 62 bits: compared in 64, so stored in 64.
                let k: usize = i * n + q;
                if k < m {
                    b[i] = a[k % m];
                }
                // A difference has no bound: its comparison is 64-bit.
                if i - 1 < n {
                    b[i] = 0.0;
                }
                // A loop over bounded values counts in 32 bits.
                for j in 0..n {
                    b[i] += a[j];
                }
                let s: f32 = k as f32;
                b[i] += s;
            }
        ),
    );
    assert!(c.contains("const unsigned int q = (i / n);"), "{c}");
    assert!(c.contains("const unsigned long long k = ((((unsigned long long) i) * ((unsigned long long) n)) + ((unsigned long long) q));"), "{c}");
    assert!(c.contains("if ((k < ((unsigned long long) m))) {"), "{c}");
    assert!(c.contains("b[i] = a[((unsigned int) (k % ((unsigned long long) m)))];"), "{c}");
    assert!(c.contains("if (((((unsigned long long) i) - 1ull) < ((unsigned long long) n))) {"), "{c}");
    assert!(c.contains("for (unsigned int j = 0ull, "), "{c}");
    assert!(c.contains("const float s = ((float) k);"), "{c}");
}

#[test]
fn a_narrow_local_that_grows_without_bound_in_a_loop_is_64_bit_where_compared() {
    let c = narrow(
        quote!(dims = 1),
        quote!(
            fn walk(i: usize, n: usize, a: &mut [f32]) {
                let mut j: usize = i;
                while j < n {
                    a[j] = 1.0;
                    j += 4;
                }
                let mut h: usize = i;
                h = h * 31 + 7;
                a[i] = a[h % n];
            }
        ),
    );
    // `j` is compared each round and has no bound once it grows: 64-bit.
    assert!(c.contains("unsigned long long j = ((unsigned long long) i);"), "{c}");
    // `h` is only hashed into a remainder: 64-bit too (the remainder needs it whole).
    assert!(c.contains("unsigned long long h = ((unsigned long long) i);"), "{c}");
}

#[test]
fn the_narrow_variant_of_a_teams_kernel_counts_teams_in_32_bits() {
    let c = narrow(
        quote!(teams = ..=1024),
        quote!(
            fn rows(row: usize, t: usize, n: usize, x: &mut [f32]) {
                let ts: usize = offload::team_size();
                for c in (t..n).step_by(ts) {
                    x[row * n + c] *= 2.0;
                }
            }
        ),
    );
    assert!(c.contains("const unsigned int __offload_ts = (unsigned int)__offload_arg_ts;"), "{c}");
    assert!(c.contains("for (unsigned int __offload_q = blockIdx.x;"), "{c}");
    assert!(c.contains("const unsigned int ts = __offload_ts;"), "{c}");
    assert!(c.contains("x[((row * n) + c)]"), "{c}");
}

#[test]
fn bf16_and_f16_are_16_bit_structs_converted_and_computed_through_the_prelude() {
    let c = ok(quote!(
        fn k(i: usize, a: bf16, x: &[bf16], h: &mut [f16], y: &mut [f32]) {
            let v = a * x[i] + x[i];
            h[i] = f16::from_f32(v.to_f32());
            y[i] = h[i].to_f32() + bf16::to_f32(-v) + x[i].to_f64() as f32;
        }
    ));
    // A scalar's bits travel in a 32-bit word; views are arrays of the 2-byte structs.
    assert!(
        c.contains(
            "unsigned int __offload_h_a, const offload_bf16* __restrict__ x, offload_f16* __restrict__ h"
        ),
        "{c}"
    );
    assert!(c.contains("const offload_bf16 a = { (unsigned short) __offload_h_a };"), "{c}");
    // Operators are the prelude's (f32, rounded back); conversions its functions.
    assert!(c.contains("((a * x[i]) + x[i])"), "{c}");
    assert!(c.contains("offload_f16_from_f32(offload_half_to_f32(v))"), "{c}");
    assert!(c.contains("offload_half_to_f32((-v))") && c.contains("offload_half_to_f64(x[i])"), "{c}");
    assert!(c.contains("struct offload_bf16 { unsigned short bits; };"), "the prelude defines them: {c}");
}

#[test]
fn what_bf16_and_f16_do_not_do_is_refused_saying_what_to_write() {
    for (f, why) in [
        (
            quote!(
                fn k(i: usize, y: &mut [bf16]) {
                    y[i] = y[i] * 2.0;
                }
            ),
            "bf16 has no literals: `bf16::from_f32(2.0)`",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f16]) {
                    y[i] = 0.5;
                }
            ),
            "f16 has no literals",
        ),
        (
            quote!(
                fn k(i: usize, x: &[bf16], y: &mut [f32]) {
                    y[i] = x[i] as f32;
                }
            ),
            "`as` does not convert bf16",
        ),
        (
            quote!(
                fn k(i: usize, x: &[f32], y: &mut [bf16]) {
                    y[i] = x[i] as bf16;
                }
            ),
            "`as` does not convert bf16",
        ),
        (
            quote!(
                fn k(i: usize, x: &[bf16], y: &mut [bf16]) {
                    y[i] = x[i].max(y[i]);
                }
            ),
            "`max` on bf16 is not in the kernel language",
        ),
        (
            quote!(
                fn k(i: usize, x: &[f64], y: &mut [f16]) {
                    y[i] = f16::from_f64(x[i]);
                }
            ),
            "`f16::from_f64` is not in the kernel language",
        ),
        (
            quote!(
                fn k(i: usize, x: &[f64], y: &mut [bf16]) {
                    y[i] = bf16::from_f32(x[i]);
                }
            ),
            "`bf16::from_f32` takes an f32",
        ),
        (
            quote!(
                fn k(i: usize, x: &[bf16], y: &mut [bf16]) {
                    for j in x[i]..y[i] {}
                }
            ),
            "ranges of this type are not in the kernel language",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [bf16]) {
                    y[i] = bf16::PI;
                }
            ),
            "`bf16::PI` is not in the kernel language: the 16-bit floats' constants are ZERO",
        ),
    ] {
        let e = fails(f);
        assert!(e.contains(why), "expected {why:?} in {e:?}");
    }
    // A device function's bf16 result converts once bound to a typed local.
    let e = fails(quote!(
        fn k(i: usize, x: &[bf16], y: &mut [f32]) {
            y[i] = twice(x[i]).to_f32();
        }
    ));
    assert!(e.contains("bind the value to a typed local first (`let v: bf16 = f(x); v.to_f32()`)"), "{e}");
    let c = ok(quote!(
        fn k(i: usize, x: &[bf16], y: &mut [f32]) {
            let v: bf16 = twice(x[i]);
            y[i] = v.to_f32();
        }
    ));
    assert!(c.contains("offload_half_to_f32(v)"), "{c}");
    // Reductions combine in f32 (a bf16 sum would depend on its order at every step).
    let e = cuda(
        quote!(reduction(+: s)),
        quote!(
            fn k(i: usize, x: &[bf16], s: &mut bf16) {
                *s += x[i];
            }
        ),
    )
    .expect_err("a bf16 reduction");
    assert!(e.contains("reduce `x.to_f32()` into an f32"), "{e}");
    let e = cuda(
        quote!(teams = 32),
        quote!(
            fn k(team: usize, thread: usize, x: &[bf16], y: &mut [f32]) {
                let s = offload::team_sum(x[thread]);
                y[team] = s.to_f32();
            }
        ),
    )
    .expect_err("a bf16 team sum");
    assert!(e.contains("team_sum(v.to_f32())"), "{e}");
}
