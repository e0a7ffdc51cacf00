//! The translator: Rust tokens in, CUDA C text (or a compile error) out.

use quote::quote;

use crate::cuda::kernel_source;
use crate::types::{kernel_sig, KernelOptions};

fn cuda(attr: proc_macro2::TokenStream, f: proc_macro2::TokenStream) -> Result<String, String> {
    source(attr, f, false)
}

fn source(
    attr: proc_macro2::TokenStream,
    f: proc_macro2::TokenStream,
    checked: bool,
) -> Result<String, String> {
    let opts: KernelOptions = syn::parse2(attr).map_err(|e| e.to_string())?;
    let f: syn::ItemFn = syn::parse2(f).map_err(|e| e.to_string())?;
    let sig = kernel_sig(&f, opts.dims, &opts.reductions).map_err(|e| e.to_string())?;
    let rows = opts.rows.map_or(crate::types::DEFAULT_ROWS, |(r, _)| r);
    kernel_source(&sig, &f.block, &opts.device_fns, checked, rows).map_err(|e| e.to_string())
}

fn ok(f: proc_macro2::TokenStream) -> String {
    cuda(quote!(), f).unwrap_or_else(|e| panic!("{e}"))
}

fn fails(f: proc_macro2::TokenStream) -> String {
    cuda(quote!(), f).expect_err("not in the subset")
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
    assert!(c.contains("const unsigned long long __offload_l0 = __offload_n / __offload_inner;"), "{c}");
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
    let c = ok(quote!(
        fn k(a: usize, b: usize, c: usize, u: &mut [u32]) {
            u[a + b + c] = 1;
        }
    ));
    assert!(
        c.contains("b = __offload_s1 + __offload_r1;") && c.contains("c = __offload_s2 + __offload_r2;"),
        "{c}"
    );
    assert!(c.contains("__offload_r1 = __offload_w / __offload_l2;"), "{c}");
    assert!(c.contains("__offload_inner = __offload_l1 * __offload_l2;"), "{c}");
    let c = cuda(
        quote!(rows = 16),
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
        "s += fmaf(sqrtf((((float) q))), h, 1.0f);",
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
fn device_function_calls_need_a_listed_signature() {
    let f = quote!(
        fn k(i: usize, y: &mut [f32]) {
            y[i] = lerp(y[i], 1.0, 0.5);
        }
    );
    let c = cuda(quote!(device_fns = [lerp(f32, f32, f32) -> f32]), f.clone()).unwrap();
    assert!(c.contains("y[i] = lerp(y[i], 1.0f, 0.5f);"), "{c}");
    assert!(fails(f).contains("not in the kernel subset: calls are to `#[offload::device]` functions"));
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
            "closures are not in the kernel subset",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    let v = Vec::new();
                }
            ),
            "not in the kernel subset",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    y[i] = y[i].signum();
                }
            ),
            "the method `signum` is not in the kernel subset",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    println!("{}", i);
                }
            ),
            "macros are not in the kernel subset",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    y[i] = GLOBAL;
                }
            ),
            "references to items outside the kernel",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    let x = 1.0;
                    y[i] = x;
                }
            ),
            "annotate it",
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
            "this parameter type is not in the kernel subset",
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
            "`mut` parameters are not in the kernel subset",
        ),
        (
            quote!(
                fn k(i: usize, y: &mut [f32]) {
                    y[i] = match i {
                        _ => 1.0,
                    };
                }
            ),
            "`match` is not in the kernel subset",
        ),
    ] {
        let e = fails(f);
        assert!(e.starts_with("offload::kernel: ") && e.contains(why), "expected `{why}`, got `{e}`");
    }
}

#[test]
fn device_functions_return_their_tail_and_take_scalars_only() {
    let f: syn::ItemFn = syn::parse2(quote!(
        fn relu(x: f64, on: bool) -> f64 {
            if !on {
                return x;
            }
            x.max(0.0)
        }
    ))
    .unwrap();
    let (params, ret) = crate::types::device_sig(&f).unwrap();
    let c = crate::cuda::device_source(&f, &params, ret, &[]).unwrap();
    assert!(c.contains("__device__ double relu(double x, bool on) {"), "{c}");
    assert!(c.contains("return x;") && c.contains("return fmax(x, 0.0);"), "{c}");
    let f: syn::ItemFn = syn::parse2(quote!(
        fn g(x: &[f32]) -> f32 {
            x[0]
        }
    ))
    .unwrap();
    let e = crate::types::device_sig(&f).unwrap_err().to_string();
    assert!(e.contains("device functions: they take scalars"), "{e}");
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
    assert!(e.contains("the only method of a slice in the kernel subset is `len()`"), "{e}");
}

/// The expansion of `#[offload::kernel(attr)] f`, as text without spaces.
fn expansion(attr: proc_macro2::TokenStream, f: proc_macro2::TokenStream) -> String {
    let out = crate::expand::kernel(attr, f).unwrap_or_else(|e| panic!("{e}"));
    out.to_string().chars().filter(|c| !c.is_whitespace()).collect()
}

#[test]
fn reduce_takes_the_other_arguments_and_returns_the_values() {
    let e = expansion(
        quote!(reduction(+: total), reduction(min: lo)),
        quote!(
            fn k(i: usize, a: f32, total: &mut f64, x: &[f64], lo: &mut i32) {
                *total += x[i];
                *lo = (*lo).min(i as i32);
            }
        ),
    );
    // The reduction variables are left out, the values come back as a tuple.
    assert!(
        e.contains(
            "pubfnreduce<'__offload_a>(device:&::offload::Device<'_>,space:impl::offload::IndexSpace<1usize>,a:f32,\
             x:::offload::DeviceSlice<'__offload_a,f64>)->::offload::Result<(f64,i32)>"
        ),
        "{e}"
    );
    // Each slot's launch position (after the one start) and identity.
    assert!(e.contains("(2usize,<f64as::offload::KernelScalar>::into_scalar(<f64as::offload::__private::Reducible>::ZERO))"), "{e}");
    assert!(e.contains("(4usize,<i32as::offload::KernelScalar>::into_scalar(<i32as::offload::__private::Reducible>::MIN_IDENTITY))"), "{e}");
    // Placeholders where the variables sit; one element each after the slices' lengths.
    assert!(
        e.contains("(__offload_g.starts()[0usize]asu64,a,::offload::DevicePtr::NULL,x,::offload::DevicePtr::NULL,1u64,x.len()asu64,1u64,)"),
        "{e}"
    );
    // One reduction: the value itself.
    let e = expansion(
        quote!(reduction(max: hi)),
        quote!(
            fn k(i: usize, hi: &mut u64) {
                *hi = (*hi).max(i as u64);
            }
        ),
    );
    assert!(e.contains("->::offload::Result<u64>"), "{e}");
    // No reduction: no `reduce`.
    let e = expansion(
        quote!(),
        quote!(
            fn k(i: usize, y: &mut [f32]) {
                y[i] = 1.0;
            }
        ),
    );
    assert!(!e.contains("pubfnreduce"), "{e}");
}
