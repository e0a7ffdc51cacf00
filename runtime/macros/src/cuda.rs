//! Translation of the kernel subset to CUDA C.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use syn::ext::IdentExt;
use syn::{BinOp, Block, Expr, Ident, Lit, Pat, RangeLimits, Stmt, UnOp};

use crate::types::{err, scalar_type, DeviceFnDecl, KernelSig, Param, ParamKind, RedOp, Ty};

/// Names a kernel's C code must not give a Rust variable: C++ keywords, CUDA builtins, the
/// math functions the translation calls, and the prefix of the generated names.
const RESERVED: &[&str] = &[
    "alignas",
    "alignof",
    "and",
    "asm",
    "auto",
    "bool",
    "case",
    "catch",
    "char",
    "class",
    "const",
    "constexpr",
    "default",
    "delete",
    "do",
    "double",
    "enum",
    "explicit",
    "export",
    "extern",
    "float",
    "friend",
    "goto",
    "inline",
    "int",
    "long",
    "namespace",
    "new",
    "noexcept",
    "not",
    "nullptr",
    "operator",
    "or",
    "private",
    "protected",
    "public",
    "register",
    "short",
    "signed",
    "sizeof",
    "static",
    "switch",
    "template",
    "this",
    "throw",
    "try",
    "typedef",
    "typeid",
    "typename",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "xor",
    "threadIdx",
    "blockIdx",
    "blockDim",
    "gridDim",
    "warpSize",
    "abs",
    "llabs",
    "fabs",
    "fabsf",
    "sqrt",
    "sqrtf",
    "exp",
    "expf",
    "log",
    "logf",
    "sin",
    "sinf",
    "cos",
    "cosf",
    "tan",
    "tanf",
    "pow",
    "powf",
    "fma",
    "fmaf",
    "floor",
    "floorf",
    "ceil",
    "ceilf",
    "fmin",
    "fminf",
    "fmax",
    "fmaxf",
    "min",
    "max",
    "NULL",
    "offload_min",
    "offload_max",
    "offload_at",
    "offload_op_add",
    "offload_op_min",
    "offload_op_max",
    "offload_atomic",
    "offload_reduce",
    "OFFLOAD_GENERATED_PRELUDE",
];

/// Helpers of generated code, defined once however many generated sources are joined:
/// integer min/max, the checked element access, and the reductions (warp shuffles, one
/// partial per warp in shared memory, one atomic per block; floats' min/max by CAS, with
/// `fmin`/`fmax`'s NaN rule, which is Rust's).
const PRELUDE: &str = r#"#ifndef OFFLOAD_GENERATED_PRELUDE
#define OFFLOAD_GENERATED_PRELUDE
template <typename T> __device__ __forceinline__ T offload_min(T a, T b) { return b < a ? b : a; }
template <typename T> __device__ __forceinline__ T offload_max(T a, T b) { return a < b ? b : a; }
// Element i of a view of len elements, or (out of range) a scratch word of the error
// report, whose first word records the first violation: 1, argument, index, length.
template <typename T> __device__ __forceinline__ T* offload_at(T* p, unsigned long long i,
        unsigned long long len, unsigned int arg, unsigned long long* err) {
    if (i < len) return p + i;
    if (atomicCAS(err, 0ull, 1ull) == 0ull) { err[1] = arg; err[2] = i; err[3] = len; }
    return (T*)(err + 4);
}
struct offload_op_add {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct offload_op_min {
    __device__ __forceinline__ float operator()(float a, float b) const { return fminf(a, b); }
    __device__ __forceinline__ double operator()(double a, double b) const { return fmin(a, b); }
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return b < a ? b : a; }
};
struct offload_op_max {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
    __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a < b ? b : a; }
};
__device__ __forceinline__ void offload_atomic(offload_op_add, float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void offload_atomic(offload_op_add, double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void offload_atomic(offload_op_add, int* p, int v) { atomicAdd(p, v); }
__device__ __forceinline__ void offload_atomic(offload_op_add, unsigned int* p, unsigned int v) { atomicAdd(p, v); }
__device__ __forceinline__ void offload_atomic(offload_op_add, unsigned long long* p, unsigned long long v) { atomicAdd(p, v); }
__device__ __forceinline__ void offload_atomic(offload_op_add, long long* p, long long v) {
    atomicAdd((unsigned long long*)p, (unsigned long long)v);
}
#define OFFLOAD_INT_MINMAX(T) \
    __device__ __forceinline__ void offload_atomic(offload_op_min, T* p, T v) { atomicMin(p, v); } \
    __device__ __forceinline__ void offload_atomic(offload_op_max, T* p, T v) { atomicMax(p, v); }
OFFLOAD_INT_MINMAX(int)
OFFLOAD_INT_MINMAX(unsigned int)
OFFLOAD_INT_MINMAX(long long)
OFFLOAD_INT_MINMAX(unsigned long long)
template <typename Op> __device__ __forceinline__ void offload_atomic(Op op, float* p, float v) {
    unsigned int* u = (unsigned int*)p;
    unsigned int old = *u;
    while (true) {
        const unsigned int next = __float_as_uint(op(__uint_as_float(old), v));
        if (next == old) return;
        const unsigned int seen = atomicCAS(u, old, next);
        if (seen == old) return;
        old = seen;
    }
}
template <typename Op> __device__ __forceinline__ void offload_atomic(Op op, double* p, double v) {
    unsigned long long* u = (unsigned long long*)p;
    unsigned long long old = *u;
    while (true) {
        const unsigned long long next = (unsigned long long)__double_as_longlong(op(__longlong_as_double((long long)old), v));
        if (next == old) return;
        const unsigned long long seen = atomicCAS(u, old, next);
        if (seen == old) return;
        old = seen;
    }
}
// Combines every thread's v into *out: a shuffle tree per warp, the warps' partials in
// shared memory, a shuffle tree over them, one atomic per block. Every thread of the block
// calls it; blocks are whole warps (the launch's 256 threads).
template <typename T, typename Op> __device__ __forceinline__ void offload_reduce(T v, T identity, T* out, Op op) {
    __shared__ T partials[32];
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    __syncthreads();  // an earlier reduction of this type may still be reading the partials
    if (lane == 0) partials[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < ((blockDim.x + 31u) >> 5) ? partials[lane] : identity;
        for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
        if (lane == 0) offload_atomic(op, out, v);
    }
}
#endif
"#;

/// Whether `name` may not name a generated C function.
pub fn is_reserved(name: &str) -> bool {
    RESERVED.contains(&name) || name.starts_with("__")
}

/// The type of a translated expression: a subset type, a literal whose type its context
/// decides, or nothing (a statement-like expression).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ETy {
    T(Ty),
    IntLit,
    FloatLit,
    Unit,
}

impl ETy {
    fn ty(self) -> Option<Ty> {
        match self {
            ETy::T(t) => Some(t),
            _ => None,
        }
    }
    fn is_lit(self) -> bool {
        matches!(self, ETy::IntLit | ETy::FloatLit)
    }
}

#[derive(Clone, Debug)]
enum VarKind {
    Scalar(Ty),
    /// A slice argument: element type, writable, its position among the arguments and the
    /// C name of its length.
    Slice {
        elem: Ty,
        mutable: bool,
        arg: usize,
        len: String,
    },
    /// A reduction variable: its type and operator (its C name is the thread's partial).
    Reduction(Ty, RedOp),
}

#[derive(Clone, Debug)]
struct Var {
    c: String,
    kind: VarKind,
    mutable: bool,
}

/// What `return` means where the code is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// In a kernel: ends this iteration.
    Kernel,
    /// In a device function returning this type (or nothing).
    Device(Option<Ty>),
}

struct Translator<'a> {
    scopes: Vec<HashMap<String, Var>>,
    used: HashSet<String>,
    device_fns: &'a [DeviceFnDecl],
    mode: Mode,
    out: String,
    depth: usize,
    returns: bool,
    /// Element accesses go through `offload_at` (a checked launch).
    checked: bool,
}

fn name_of(id: &Ident) -> String {
    id.unraw().to_string()
}

impl<'a> Translator<'a> {
    fn new(device_fns: &'a [DeviceFnDecl], mode: Mode) -> Self {
        Self {
            scopes: vec![HashMap::new()],
            used: RESERVED.iter().map(|s| s.to_string()).collect(),
            device_fns,
            mode,
            out: String::new(),
            depth: 1,
            returns: false,
            checked: false,
        }
    }

    /// A C name for Rust name `rust`, distinct from every C name given so far (C++ forbids
    /// redeclaring in one scope, and a declaration is in scope in its own initializer).
    fn fresh(&mut self, rust: &str) -> String {
        // C++ reserves names with `__`; the generated names use it.
        let base = if rust.starts_with("__") { format!("u{rust}") } else { rust.to_string() };
        let mut c = base.clone();
        let mut k = 1;
        while self.used.contains(&c) {
            c = format!("{base}_{k}");
            k += 1;
        }
        self.used.insert(c.clone());
        c
    }

    fn declare(&mut self, rust: &str, kind: VarKind, mutable: bool) -> String {
        let c = self.fresh(rust);
        self.scopes
            .last_mut()
            .expect("a scope")
            .insert(rust.to_string(), Var { c: c.clone(), kind, mutable });
        c
    }

    fn lookup(&self, rust: &str) -> Option<&Var> {
        self.scopes.iter().rev().find_map(|s| s.get(rust))
    }

    fn line(&mut self, text: &str) {
        for _ in 0..self.depth {
            self.out.push_str("    ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    // ---- statements -------------------------------------------------------------------

    fn block(&mut self, b: &Block) -> syn::Result<()> {
        self.scopes.push(HashMap::new());
        self.depth += 1;
        let r = self.stmts(&b.stmts, false);
        self.depth -= 1;
        self.scopes.pop();
        r
    }

    /// `stmts`; in a device function's body (`tail`), a final expression is its value.
    fn stmts(&mut self, stmts: &[Stmt], tail: bool) -> syn::Result<()> {
        for (k, s) in stmts.iter().enumerate() {
            match s {
                Stmt::Expr(e, None) if tail && k + 1 == stmts.len() && self.mode != Mode::Device(None) => {
                    let Mode::Device(Some(t)) = self.mode else { unreachable!("checked above") };
                    let (c, _) = self.value(e, t)?;
                    self.line(&format!("return {c};"));
                }
                _ => self.stmt(s)?,
            }
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> syn::Result<()> {
        match s {
            Stmt::Local(l) => self.local(l),
            Stmt::Item(syn::Item::Const(c)) => {
                let Some(t) = scalar_type(&c.ty) else {
                    return err(&c.ty, "this constant's type is not in the kernel subset");
                };
                let (v, _) = self.value(&c.expr, t)?;
                let name = self.declare(&name_of(&c.ident), VarKind::Scalar(t), false);
                self.line(&format!("const {} {name} = {v};", t.c()));
                Ok(())
            }
            Stmt::Item(i) => {
                err(i, "items other than `const` are not in the kernel subset: declare them outside")
            }
            Stmt::Macro(m) => {
                err(&m.mac, "macros are not in the kernel subset: they cannot be translated to CUDA C")
            }
            Stmt::Expr(e, _) => self.stmt_expr(e),
        }
    }

    fn local(&mut self, l: &syn::Local) -> syn::Result<()> {
        let (ident, mutable, annotated) = match &l.pat {
            Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
                (&p.ident, p.mutability.is_some(), None)
            }
            Pat::Type(pt) => match &*pt.pat {
                Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
                    let Some(t) = scalar_type(&pt.ty) else {
                        return err(&pt.ty, "this type is not in the kernel subset: locals are scalars");
                    };
                    (&p.ident, p.mutability.is_some(), Some(t))
                }
                other => return err(other, "patterns are not in the kernel subset: bind one name"),
            },
            other => return err(other, "patterns are not in the kernel subset: bind one name"),
        };
        let Some(init) = &l.init else {
            return err(l, "`let` without a value is not in the kernel subset: give it one");
        };
        if let Some((_, d)) = &init.diverge {
            return err(d, "`let ... else` is not in the kernel subset");
        }
        let (c, t) = match annotated {
            Some(t) => (self.value(&init.expr, t)?.0, t),
            None => {
                let (c, et) = self.expr(&init.expr, None)?;
                match et {
                    ETy::T(t) => (c, t),
                    _ => {
                        return err(
                            l,
                            format!(
                                "the type of `{}` cannot be inferred by the kernel subset: annotate it \
                                 (`let {}: f32 = ...`) or give the literal a suffix (`1.0f32`)",
                                ident, ident
                            ),
                        )
                    }
                }
            }
        };
        let name = self.declare(&name_of(ident), VarKind::Scalar(t), mutable);
        let konst = if mutable { "" } else { "const " };
        self.line(&format!("{konst}{} {name} = {c};", t.c()));
        Ok(())
    }

    fn no_label(&self, label: &Option<impl quote::ToTokens>) -> syn::Result<()> {
        match label {
            Some(l) => err(l, "labels are not in the kernel subset"),
            None => Ok(()),
        }
    }

    fn stmt_expr(&mut self, e: &Expr) -> syn::Result<()> {
        match e {
            Expr::If(i) => self.if_stmt(i, ""),
            Expr::ForLoop(f) => {
                self.no_label(&f.label)?;
                let Pat::Ident(p) = &*f.pat else {
                    return err(&f.pat, "patterns are not in the kernel subset: `for x in a..b`");
                };
                let Expr::Range(r) = &*f.expr else {
                    return err(
                        &f.expr,
                        "iterators are not in the kernel subset: loop over a range `a..b` or `a..=b`",
                    );
                };
                let (Some(a), Some(b)) = (&r.start, &r.end) else {
                    return err(r, "open ranges are not in the kernel subset: write both bounds");
                };
                let (mut ca, ta) = self.expr(a, None)?;
                let (cb, tb) = self.expr(b, ta.ty())?;
                let t = match (ta.ty(), tb.ty()) {
                    (Some(t), _) => t,
                    (None, Some(t)) => {
                        ca = self.value(a, t)?.0;
                        t
                    }
                    _ => return err(
                        r,
                        "the loop variable's type cannot be inferred by the kernel subset: give a bound a \
                             suffix (`0usize..4`)",
                    ),
                };
                if !t.is_int() {
                    return err(r, "ranges of this type are not in the kernel subset: loop over integers");
                }
                self.scopes.push(HashMap::new());
                let v = self.declare(&name_of(&p.ident), VarKind::Scalar(t), false);
                let end = self.fresh(&format!("{v}_end"));
                let cmp = if matches!(r.limits, RangeLimits::Closed(_)) { "<=" } else { "<" };
                self.line(&format!("for ({} {v} = {ca}, {end} = {cb}; {v} {cmp} {end}; ++{v}) {{", t.c()));
                let r = self.block(&f.body);
                self.scopes.pop();
                r?;
                self.line("}");
                Ok(())
            }
            Expr::While(w) => {
                self.no_label(&w.label)?;
                if let Expr::Let(l) = &*w.cond {
                    return err(l, "`while let` is not in the kernel subset");
                }
                let (c, _) = self.value(&w.cond, Ty::Bool)?;
                self.line(&format!("while ({c}) {{"));
                self.block(&w.body)?;
                self.line("}");
                Ok(())
            }
            Expr::Loop(l) => {
                self.no_label(&l.label)?;
                self.line("while (true) {");
                self.block(&l.body)?;
                self.line("}");
                Ok(())
            }
            Expr::Block(b) => {
                self.no_label(&b.label)?;
                self.line("{");
                self.block(&b.block)?;
                self.line("}");
                Ok(())
            }
            Expr::Continue(c) => {
                self.no_label(&c.label)?;
                self.line("continue;");
                Ok(())
            }
            Expr::Break(b) => {
                self.no_label(&b.label)?;
                if let Some(v) = &b.expr {
                    return err(v, "`break` with a value is not in the kernel subset");
                }
                self.line("break;");
                Ok(())
            }
            Expr::Return(r) => match (self.mode, &r.expr) {
                (Mode::Kernel, None) => {
                    self.returns = true;
                    self.line("goto __offload_next;");
                    Ok(())
                }
                (Mode::Kernel, Some(v)) => err(v, "a kernel returns nothing: `return;` ends this iteration"),
                (Mode::Device(None), None) => {
                    self.line("return;");
                    Ok(())
                }
                (Mode::Device(Some(t)), Some(v)) => {
                    let (c, _) = self.value(v, t)?;
                    self.line(&format!("return {c};"));
                    Ok(())
                }
                _ => err(r, "this `return` does not match the device function's return type"),
            },
            other => {
                let (c, _) = self.expr(other, None)?;
                self.line(&format!("{c};"));
                Ok(())
            }
        }
    }

    fn if_stmt(&mut self, i: &syn::ExprIf, prefix: &str) -> syn::Result<()> {
        if let Expr::Let(l) = &*i.cond {
            return err(l, "`if let` is not in the kernel subset");
        }
        let (c, _) = self.value(&i.cond, Ty::Bool)?;
        self.line(&format!("{prefix}if ({c}) {{"));
        self.block(&i.then_branch)?;
        match i.else_branch.as_ref().map(|(_, e)| &**e) {
            None => self.line("}"),
            Some(Expr::If(next)) => self.if_stmt(next, "} else ")?,
            Some(Expr::Block(b)) => {
                self.line("} else {");
                self.block(&b.block)?;
                self.line("}");
            }
            Some(other) => return err(other, "this `else` is not in the kernel subset"),
        }
        Ok(())
    }

    // ---- expressions ------------------------------------------------------------------

    /// `e` as a value of type `t`.
    fn value(&mut self, e: &Expr, t: Ty) -> syn::Result<(String, ETy)> {
        let (c, et) = self.expr(e, Some(t))?;
        if et == ETy::Unit {
            return err(e, "this expression has no value");
        }
        Ok((c, et))
    }

    /// An integer literal as C text of type `t`.
    fn int_lit(digits: &str, t: Ty) -> String {
        match t {
            Ty::I32 => digits.to_string(),
            Ty::U32 => format!("{digits}u"),
            Ty::I64 => format!("{digits}ll"),
            Ty::U64 | Ty::Usize => format!("{digits}ull"),
            Ty::F32 => format!("{digits}.0f"),
            Ty::F64 => format!("{digits}.0"),
            Ty::Bool => digits.to_string(),
        }
    }

    fn float_lit(digits: &str, t: Ty) -> String {
        let d = if digits.contains(['.', 'e', 'E']) { digits.to_string() } else { format!("{digits}.0") };
        if t == Ty::F32 {
            format!("{d}f")
        } else {
            d
        }
    }

    fn lit(&self, l: &Lit, want: Option<Ty>) -> syn::Result<(String, ETy)> {
        match l {
            Lit::Int(i) => {
                let t = match i.suffix() {
                    "" => want.filter(|t| *t != Ty::Bool),
                    s => Some(Ty::from_name(s).ok_or_else(|| {
                        syn::Error::new_spanned(
                            i,
                            "offload::kernel: this literal suffix is not in the kernel subset",
                        )
                    })?),
                };
                Ok(match t {
                    Some(t) => (Self::int_lit(i.base10_digits(), t), ETy::T(t)),
                    None => (i.base10_digits().to_string(), ETy::IntLit),
                })
            }
            Lit::Float(f) => {
                let t = match f.suffix() {
                    "" => want.filter(|t| t.is_float()),
                    "f32" => Some(Ty::F32),
                    "f64" => Some(Ty::F64),
                    _ => return err(f, "this literal suffix is not in the kernel subset"),
                };
                Ok(match t {
                    Some(t) => (Self::float_lit(f.base10_digits(), t), ETy::T(t)),
                    None => (Self::float_lit(f.base10_digits(), Ty::F64), ETy::FloatLit),
                })
            }
            Lit::Bool(b) => Ok((b.value.to_string(), ETy::T(Ty::Bool))),
            other => err(other, "this literal is not in the kernel subset: numbers and booleans only"),
        }
    }

    /// Two operands of one type: the second typed by the first, or the first re-translated
    /// with the second's type when it was a literal.
    fn operands(&mut self, a: &Expr, b: &Expr, want: Option<Ty>) -> syn::Result<(String, String, ETy)> {
        let (mut ca, mut ta) = self.expr(a, want)?;
        let (cb, tb) = self.expr(b, ta.ty().or(want))?;
        if ta.is_lit() {
            if let Some(t) = tb.ty() {
                (ca, ta) = self.expr(a, Some(t))?;
            }
        }
        let t =
            if ta.is_lit() && tb.is_lit() {
                if ta == ETy::FloatLit || tb == ETy::FloatLit {
                    ETy::FloatLit
                } else {
                    ETy::IntLit
                }
            } else {
                ETy::T(ta.ty().or(tb.ty()).ok_or_else(|| {
                    syn::Error::new_spanned(a, "offload::kernel: this operand has no value")
                })?)
            };
        Ok((ca, cb, t))
    }

    fn path_var(&self, e: &Expr) -> Option<Var> {
        let Expr::Path(p) = e else { return None };
        let id = p.path.get_ident()?;
        if p.qself.is_some() {
            return None;
        }
        self.lookup(&name_of(id)).cloned()
    }

    /// The C text of place `e` (a mutable local or an element of a `&mut` slice) and its type.
    fn place(&mut self, e: &Expr) -> syn::Result<(String, Ty)> {
        match e {
            Expr::Path(_) => match self.path_var(e) {
                Some(Var { c, kind: VarKind::Scalar(t), mutable: true }) => Ok((c, t)),
                Some(_) => err(e, "only `let mut` locals and elements of `&mut` slices can be assigned"),
                None => err(e, "references to items outside the kernel are not in the kernel subset: use parameters and locals"),
            },
            Expr::Index(ix) => {
                let (c, t) = self.index(ix)?;
                match self.path_var(&ix.expr) {
                    Some(Var { kind: VarKind::Slice { mutable: true, .. }, .. }) => Ok((c, t)),
                    _ => err(&ix.expr, "only elements of `&mut` slices can be assigned"),
                }
            }
            Expr::Paren(p) => self.place(&p.expr),
            other => err(other, "this place is not in the kernel subset: assign to a local or a slice element"),
        }
    }

    fn index(&mut self, ix: &syn::ExprIndex) -> syn::Result<(String, Ty)> {
        let (c, elem, arg, len) = match self.path_var(&ix.expr) {
            Some(Var { c, kind: VarKind::Slice { elem, arg, len, .. }, .. }) => (c, elem, arg, len),
            Some(_) => return err(&ix.expr, "indexing is in the kernel subset for slice parameters only"),
            None => {
                return err(
                    &ix.expr,
                    "indexing is in the kernel subset for slice parameters only: index a parameter by name",
                )
            }
        };
        if let Expr::Range(r) = &*ix.index {
            return err(r, "sub-slices are not in the kernel subset: index one element");
        }
        let (i, _) = self.value(&ix.index, Ty::Usize)?;
        if self.checked {
            return Ok((format!("(*offload_at({c}, {i}, {len}, {arg}u, __offload_err))"), elem));
        }
        Ok((format!("{c}[{i}]"), elem))
    }

    fn expr(&mut self, e: &Expr, want: Option<Ty>) -> syn::Result<(String, ETy)> {
        match e {
            Expr::Lit(l) => self.lit(&l.lit, want),
            Expr::Path(p) => match self.path_var(e) {
                Some(Var { c, kind: VarKind::Scalar(t), .. }) => Ok((c, ETy::T(t))),
                Some(Var { kind: VarKind::Reduction(_, op), .. }) => reduction_misuse(e, op),
                Some(_) => err(e, "a slice is in the kernel subset only indexed (`x[i]`) or as `x.len()`"),
                None if p.path.get_ident().is_some() => {
                    err(e, "references to items outside the kernel are not in the kernel subset: use parameters, locals and constants declared in the body")
                }
                None => err(e, "paths are not in the kernel subset: use parameters and locals"),
            },
            Expr::Paren(p) => {
                let (c, t) = self.expr(&p.expr, want)?;
                Ok((format!("({c})"), t))
            }
            Expr::Group(g) => self.expr(&g.expr, want),
            Expr::Unary(u) => match u.op {
                UnOp::Neg(_) => {
                    let (c, t) = self.expr(&u.expr, want)?;
                    Ok((format!("(-{c})"), t))
                }
                UnOp::Not(_) => {
                    let (c, t) = self.expr(&u.expr, want)?;
                    let op = if t == ETy::T(Ty::Bool) { "!" } else { "~" };
                    Ok((format!("({op}{c})"), t))
                }
                UnOp::Deref(_) => match self.path_var(&u.expr) {
                    Some(Var { kind: VarKind::Reduction(_, op), .. }) => reduction_misuse(e, op),
                    _ => err(u, "dereferencing is in the kernel subset only for reduction variables (`*sum += v`)"),
                },
                _ => err(u, "this operator is not in the kernel subset"),
            },
            Expr::Binary(b) => self.binary(b, want),
            Expr::Assign(a) => {
                if let Some((c, t, op)) = self.reduction_var(&a.left) {
                    return self.min_max_update(a, &c, t, op);
                }
                let (p, t) = self.place(&a.left)?;
                let (v, _) = self.value(&a.right, t)?;
                Ok((format!("{p} = {v}"), ETy::Unit))
            }
            Expr::Cast(c) => {
                let Some(t) = scalar_type(&c.ty) else {
                    return err(&c.ty, "casts to this type are not in the kernel subset: cast between its scalars");
                };
                let (v, _) = self.expr(&c.expr, None)?;
                Ok((format!("(({}) {v})", t.c()), ETy::T(t)))
            }
            Expr::Index(ix) => {
                let (c, t) = self.index(ix)?;
                Ok((c, ETy::T(t)))
            }
            Expr::MethodCall(m) => self.method(m, want),
            Expr::Call(c) => self.call(c),
            Expr::If(i) => {
                let (Some((_, els)), [Stmt::Expr(a, None)]) = (&i.else_branch, &i.then_branch.stmts[..]) else {
                    return err(i, "`if` as a value is in the kernel subset only as `if c { a } else { b }`");
                };
                let b = match &**els {
                    Expr::Block(b) => match &b.block.stmts[..] {
                        [Stmt::Expr(b, None)] => b.clone(),
                        _ => return err(els, "`if` as a value is in the kernel subset only as `if c { a } else { b }`"),
                    },
                    other => other.clone(),
                };
                let (c, _) = self.value(&i.cond, Ty::Bool)?;
                let (ca, cb, t) = self.operands(a, &b, want)?;
                Ok((format!("({c} ? {ca} : {cb})"), t))
            }
            Expr::Closure(c) => err(c, "closures are not in the kernel subset: CUDA C has none; write the loop body inline"),
            Expr::Macro(m) => err(m, "macros are not in the kernel subset: they cannot be translated to CUDA C"),
            Expr::Struct(s) => err(s, "struct literals are not in the kernel subset: kernels use scalars and slices"),
            Expr::Array(a) => err(a, "arrays are not in the kernel subset: use slice arguments"),
            Expr::Tuple(t) => err(t, "tuples are not in the kernel subset"),
            Expr::Reference(r) => err(r, "references are not in the kernel subset"),
            Expr::Range(r) => err(r, "ranges are in the kernel subset only as `for` loop bounds"),
            Expr::Field(f) => err(f, "field access is not in the kernel subset"),
            Expr::Try(t) => err(t, "`?` is not in the kernel subset"),
            Expr::Match(m) => err(m, "`match` is not in the kernel subset: use `if`/`else`"),
            Expr::Unsafe(u) => err(u, "unsafe is not in the kernel subset: kernels are safe Rust"),
            Expr::Async(a) => err(a, "async is not in the kernel subset"),
            Expr::Await(a) => err(a, "await is not in the kernel subset"),
            Expr::Block(b) => err(b, "a block as a value is not in the kernel subset"),
            other => err(other, "this expression is not in the kernel subset"),
        }
    }

    fn binary(&mut self, b: &syn::ExprBinary, want: Option<Ty>) -> syn::Result<(String, ETy)> {
        use BinOp::*;
        let op = match b.op {
            Add(_) | AddAssign(_) => "+",
            Sub(_) | SubAssign(_) => "-",
            Mul(_) | MulAssign(_) => "*",
            Div(_) | DivAssign(_) => "/",
            Rem(_) | RemAssign(_) => "%",
            BitAnd(_) | BitAndAssign(_) => "&",
            BitOr(_) | BitOrAssign(_) => "|",
            BitXor(_) | BitXorAssign(_) => "^",
            Shl(_) | ShlAssign(_) => "<<",
            Shr(_) | ShrAssign(_) => ">>",
            And(_) => "&&",
            Or(_) => "||",
            Eq(_) => "==",
            Lt(_) => "<",
            Le(_) => "<=",
            Ne(_) => "!=",
            Ge(_) => ">=",
            Gt(_) => ">",
            _ => return err(b, "this operator is not in the kernel subset"),
        };
        match b.op {
            AddAssign(_) | SubAssign(_) | MulAssign(_) | DivAssign(_) | RemAssign(_) | BitAndAssign(_)
            | BitOrAssign(_) | BitXorAssign(_) | ShlAssign(_) | ShrAssign(_) => {
                if let Some((c, t, op)) = self.reduction_var(&b.left) {
                    if !(op == RedOp::Add && matches!(b.op, AddAssign(_))) {
                        return reduction_misuse(b, op);
                    }
                    let (v, _) = self.value(&b.right, t)?;
                    return Ok((format!("{c} += {v}"), ETy::Unit));
                }
                let (p, t) = self.place(&b.left)?;
                let shift = matches!(b.op, ShlAssign(_) | ShrAssign(_));
                let (v, _) = if shift { self.expr(&b.right, None)? } else { self.value(&b.right, t)? };
                if t == Ty::F32 && op == "%" {
                    return Ok((format!("{p} = fmodf({p}, {v})"), ETy::Unit));
                }
                if t == Ty::F64 && op == "%" {
                    return Ok((format!("{p} = fmod({p}, {v})"), ETy::Unit));
                }
                Ok((format!("{p} {op}= {v}"), ETy::Unit))
            }
            Shl(_) | Shr(_) => {
                let (l, t) = self.expr(&b.left, want)?;
                let (r, _) = self.expr(&b.right, None)?;
                Ok((format!("({l} {op} {r})"), t))
            }
            And(_) | Or(_) => {
                let (l, _) = self.value(&b.left, Ty::Bool)?;
                let (r, _) = self.value(&b.right, Ty::Bool)?;
                Ok((format!("({l} {op} {r})"), ETy::T(Ty::Bool)))
            }
            Eq(_) | Lt(_) | Le(_) | Ne(_) | Ge(_) | Gt(_) => {
                let (l, r, _) = self.operands(&b.left, &b.right, None)?;
                Ok((format!("({l} {op} {r})"), ETy::T(Ty::Bool)))
            }
            _ => {
                let (l, r, t) = self.operands(&b.left, &b.right, want)?;
                if op == "%" && matches!(t, ETy::T(Ty::F32 | Ty::F64)) {
                    let f = if t == ETy::T(Ty::F32) { "fmodf" } else { "fmod" };
                    return Ok((format!("{f}({l}, {r})"), t));
                }
                Ok((format!("({l} {op} {r})"), t))
            }
        }
    }

    fn method(&mut self, m: &syn::ExprMethodCall, want: Option<Ty>) -> syn::Result<(String, ETy)> {
        if let Some(t) = &m.turbofish {
            return err(t, "turbofish is not in the kernel subset");
        }
        let name = m.method.to_string();
        if let Some(Var { kind: VarKind::Slice { len, .. }, .. }) = self.path_var(&m.receiver) {
            if name == "len" && m.args.is_empty() {
                return Ok((len, ETy::T(Ty::Usize)));
            }
            return err(&m.method, "the only method of a slice in the kernel subset is `len()`");
        }
        let (recv, rt) = self.expr(&m.receiver, want)?;
        let t = match rt {
            ETy::T(t) => t,
            ETy::IntLit | ETy::FloatLit => {
                return err(&m.receiver, "give this literal a suffix (`2.0f32`) so the kernel knows its type")
            }
            ETy::Unit => return err(&m.receiver, "this expression has no value"),
        };
        let arity = match name.as_str() {
            "sqrt" | "abs" | "exp" | "ln" | "sin" | "cos" | "tan" | "floor" | "ceil" => 0,
            "powi" | "powf" | "min" | "max" => 1,
            "mul_add" => 2,
            _ => {
                return err(
                    &m.method,
                    format!(
                        "the method `{name}` is not in the kernel subset: it has sqrt, abs, exp, ln, sin, cos, tan, \
                         powi, powf, mul_add, floor, ceil, min and max"
                    ),
                )
            }
        };
        if m.args.len() != arity {
            return err(m, format!("`{name}` takes {arity} arguments"));
        }
        let mut args = Vec::new();
        for a in &m.args {
            let at = if name == "powi" { Ty::I32 } else { t };
            args.push(self.value(a, at)?.0);
        }
        if t.is_float() {
            let f = if t == Ty::F32 { "f" } else { "" };
            let c = match name.as_str() {
                "ln" => format!("log{f}({recv})"),
                "abs" => format!("fabs{f}({recv})"),
                "min" => format!("fmin{f}({recv}, {})", args[0]),
                "max" => format!("fmax{f}({recv}, {})", args[0]),
                "powf" => format!("pow{f}({recv}, {})", args[0]),
                "powi" => format!("pow{f}({recv}, ({}) {})", t.c(), args[0]),
                "mul_add" => format!("fma{f}({recv}, {}, {})", args[0], args[1]),
                other => format!("{other}{f}({recv})"),
            };
            return Ok((c, ETy::T(t)));
        }
        if t.is_int() {
            let c = match name.as_str() {
                "min" | "max" => format!("offload_{name}({recv}, {})", args[0]),
                "abs" if t == Ty::I32 => format!("abs({recv})"),
                "abs" if t == Ty::I64 => format!("llabs({recv})"),
                _ => {
                    return err(
                        &m.method,
                        format!("`{name}` on {} is not in the kernel subset", t.rust_name()),
                    )
                }
            };
            return Ok((c, ETy::T(t)));
        }
        err(&m.method, format!("`{name}` on bool is not in the kernel subset"))
    }

    /// `(partial's C name, type, operator)` when `e` is `*r` with `r` a reduction variable.
    fn reduction_var(&self, e: &Expr) -> Option<(String, Ty, RedOp)> {
        let Expr::Unary(syn::ExprUnary { op: UnOp::Deref(_), expr, .. }) = e else { return None };
        match self.path_var(expr)? {
            Var { c, kind: VarKind::Reduction(t, op), .. } => Some((c, t, op)),
            _ => None,
        }
    }

    /// `*r = r.min(v)` (or `(*r).min(v)`; `max` alike) for a `min`/`max` reduction `r`.
    fn min_max_update(
        &mut self,
        a: &syn::ExprAssign,
        c: &str,
        t: Ty,
        op: RedOp,
    ) -> syn::Result<(String, ETy)> {
        let method = match op {
            RedOp::Min => "min",
            RedOp::Max => "max",
            RedOp::Add => return reduction_misuse(a, op),
        };
        let mut right = &*a.right;
        while let Expr::Paren(p) = right {
            right = &p.expr;
        }
        let Expr::MethodCall(m) = right else { return reduction_misuse(a, op) };
        let mut recv = &*m.receiver;
        while let Expr::Paren(p) = recv {
            recv = &p.expr;
        }
        let same = match recv {
            Expr::Unary(syn::ExprUnary { op: UnOp::Deref(_), expr, .. }) => expr,
            other => other,
        };
        let is_r =
            matches!(self.path_var(same), Some(Var { c: rc, kind: VarKind::Reduction(..), .. }) if rc == c);
        if m.method != method || m.args.len() != 1 || !is_r {
            return reduction_misuse(a, op);
        }
        let (v, _) = self.value(&m.args[0], t)?;
        Ok((format!("{c} = {}({c}, {v})", op.c_functor()), ETy::Unit))
    }

    fn call(&mut self, c: &syn::ExprCall) -> syn::Result<(String, ETy)> {
        let Expr::Path(p) = &*c.func else {
            return err(
                &c.func,
                "calls are in the kernel subset only to `#[offload::device]` functions by name",
            );
        };
        let text = quote::quote!(#p).to_string();
        let Some(d) = self.device_fns.iter().find(|d| {
            let path = &d.path;
            quote::quote!(#path).to_string() == text
        }) else {
            return err(
                c,
                format!(
                    "the call to `{text}` is not in the kernel subset: calls are to `#[offload::device]` functions \
                     listed in `#[offload::kernel(device_fns = [{text}(T, ..) -> R])]`"
                ),
            );
        };
        let d = d.clone();
        if d.params.len() != c.args.len() {
            return err(c, format!("`{text}` is listed with {} parameters", d.params.len()));
        }
        let mut args = Vec::new();
        for (a, t) in c.args.iter().zip(&d.params) {
            args.push(self.value(a, *t)?.0);
        }
        let ret = d.ret.map_or(ETy::Unit, ETy::T);
        Ok((format!("{}({})", d.name(), args.join(", ")), ret))
    }
}

/// The error for any use of a reduction variable but its update.
fn reduction_misuse<T>(at: impl quote::ToTokens, op: RedOp) -> syn::Result<T> {
    match op {
        RedOp::Add => err(
            at,
            "a `+` reduction variable is only added to, as `*sum += value;` (each thread adds to its own \
             partial; the partials are combined after the loop)",
        ),
        RedOp::Min | RedOp::Max => {
            let m = op.text();
            err(
                at,
                format!(
                    "a `{m}` reduction variable is only updated as `*r = (*r).{m}(value);` (each thread keeps its \
                     own partial; the partials are combined after the loop)"
                ),
            )
        }
    }
}

/// Declares `params` in `t` and gives their C parameter declarations, with the C lines
/// that begin the body: a `bool` parameter (passed as `unsigned int`) made a `bool`, a
/// reduction's partial set to its identity.
fn declare_params(t: &mut Translator<'_>, params: &[Param], kernel: bool) -> (Vec<String>, Vec<String>) {
    let mut decls = Vec::new();
    let mut lines = Vec::new();
    for (arg, p) in params.iter().enumerate() {
        match p.kind {
            ParamKind::Scalar(Ty::Bool) if kernel => {
                let c = t.declare(&p.text(), VarKind::Scalar(Ty::Bool), false);
                decls.push(format!("unsigned int __offload_b_{c}"));
                lines.push(format!("const bool {c} = __offload_b_{c} != 0u;"));
            }
            ParamKind::Scalar(ty) => {
                let c = t.declare(&p.text(), VarKind::Scalar(ty), false);
                decls.push(format!("{} {c}", ty.c()));
            }
            ParamKind::Slice { elem, mutable } => {
                let c = t.fresh(&p.text());
                let len = format!("__offload_len_{c}");
                let kind = VarKind::Slice { elem, mutable, arg, len };
                t.scopes
                    .last_mut()
                    .expect("a scope")
                    .insert(p.text(), Var { c: c.clone(), kind, mutable: false });
                let konst = if mutable { "" } else { "const " };
                decls.push(format!("{konst}{}* __restrict__ {c}", elem.c()));
            }
            ParamKind::Reduction { ty, op } => {
                let c = t.declare(&p.text(), VarKind::Reduction(ty, op), false);
                decls.push(format!("{}* __restrict__ __offload_red_{c}", ty.c()));
                lines.push(format!("{} {c} = {};", ty.c(), op.c_identity(ty)));
            }
        }
    }
    (decls, lines)
}

/// The C name of the kernel function: the kernel's name, with a suffix for the checked
/// variant.
pub fn symbol(sig: &KernelSig, checked: bool) -> String {
    let name = sig.name.unraw().to_string();
    if checked {
        format!("{name}__offload_checked")
    } else {
        name
    }
}

/// The CUDA C source of kernel `sig` with body `body`, `extern "C"` under
/// [`symbol`]. Its parameters: the start of each index, the length of each inner index,
/// the arguments (a reduction variable as a pointer to its one-element view), the length
/// of each view argument, in the checked variant the error report's address, then the
/// runtime's work-item count.
///
/// The work items are walked with a grid stride (the launch is at most one wave of
/// blocks). In 2-D and 3-D a thread takes a point of the inner dimensions and a strip of
/// `rows` consecutive outer indices at a time (one division per strip).
pub fn kernel_source(
    sig: &KernelSig,
    body: &Block,
    device_fns: &[DeviceFnDecl],
    checked: bool,
    rows: u32,
) -> syn::Result<String> {
    let mut t = Translator::new(device_fns, Mode::Kernel);
    t.checked = checked;
    for d in device_fns {
        t.used.insert(d.name());
    }
    let d = sig.indices.len();
    let mut decls: Vec<String> = (0..d).map(|k| format!("unsigned long long __offload_s{k}")).collect();
    decls.extend((1..d).map(|k| format!("unsigned long long __offload_l{k}")));
    let (args, lines) = declare_params(&mut t, &sig.params, true);
    decls.extend(args);
    let mut reductions = Vec::new();
    for p in &sig.params {
        match t.lookup(&p.text()).cloned() {
            Some(Var { kind: VarKind::Slice { len, .. }, .. }) => {
                decls.push(format!("unsigned long long {len}"))
            }
            Some(Var { c, kind: VarKind::Reduction(ty, op), .. }) => {
                decls.push(format!("unsigned long long __offload_len_{c}"));
                reductions.push((c, ty, op));
            }
            _ => {}
        }
    }
    if checked {
        decls.push("unsigned long long* __restrict__ __offload_err".to_string());
    }
    decls.push("unsigned long long __offload_n".to_string());
    // The index variables, in an inner scope.
    t.scopes.push(HashMap::new());
    let idx: Vec<String> =
        sig.indices.iter().map(|i| t.declare(&name_of(i), VarKind::Scalar(Ty::Usize), false)).collect();
    const ULL: &str = "unsigned long long";
    t.depth = if d == 1 { 3 } else { 5 };
    t.stmts(&body.stmts, false)?;
    let mut s = String::from(PRELUDE);
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {}({}) {{",
        symbol(sig, checked),
        decls.join(", ")
    );
    for l in lines {
        let _ = writeln!(s, "    {l}");
    }
    let _ = writeln!(s, "    const {ULL} __offload_stride = ({ULL})gridDim.x * blockDim.x;");
    let _ = writeln!(s, "    {ULL} __offload_t = blockIdx.x * ({ULL})blockDim.x + threadIdx.x;");
    if d == 1 {
        s.push_str("    for (; __offload_t < __offload_n; __offload_t += __offload_stride) {\n        {\n");
        let _ = writeln!(s, "            {};", index_decl(&idx[0], "__offload_s0 + __offload_t"));
        s.push_str(&t.out);
        s.push_str("        }\n");
        if t.returns {
            s.push_str("        __offload_next:;\n");
        }
        s.push_str("    }\n");
    } else {
        // A work unit is one point of the inner dimensions and a strip of `rows`
        // consecutive outer indices, walked in order by one thread: a whole strip is an
        // unrolled loop of constant length, so values one point loads (its neighbours
        // along the outer index, read through `const __restrict__` pointers) are reused
        // by the next from registers.
        let inner =
            if d == 2 { "__offload_l1".to_string() } else { "__offload_l1 * __offload_l2".to_string() };
        let _ = writeln!(s, "    const unsigned int __offload_rows = {rows}u;");
        let _ = writeln!(s, "    const {ULL} __offload_inner = {inner};");
        let _ = writeln!(s, "    const {ULL} __offload_l0 = __offload_n / __offload_inner;");
        let _ = writeln!(
            s,
            "    const {ULL} __offload_units = (__offload_l0 + __offload_rows - 1) / __offload_rows * __offload_inner;"
        );
        s.push_str("    for (; __offload_t < __offload_units; __offload_t += __offload_stride) {\n");
        let _ = writeln!(s, "        const {ULL} __offload_strip = __offload_t / __offload_inner;");
        let _ =
            writeln!(s, "        const {ULL} __offload_w = __offload_t - __offload_strip * __offload_inner;");
        let mut decode = Vec::new();
        if d == 2 {
            decode.push(index_decl(&idx[1], "__offload_s1 + __offload_w"));
        } else {
            let _ = writeln!(s, "        const {ULL} __offload_r1 = __offload_w / __offload_l2;");
            let _ =
                writeln!(s, "        const {ULL} __offload_r2 = __offload_w - __offload_r1 * __offload_l2;");
            decode.push(index_decl(&idx[1], "__offload_s1 + __offload_r1"));
            decode.push(index_decl(&idx[2], "__offload_s2 + __offload_r2"));
        }
        decode.insert(0, index_decl(&idx[0], "__offload_s0 + __offload_q0"));
        let _ = writeln!(s, "        const {ULL} __offload_first = __offload_strip * __offload_rows;");
        let item = |s: &mut String, label: &str| {
            s.push_str("                {\n");
            for l in &decode {
                let _ = writeln!(s, "                    {l};");
            }
            s.push_str(&t.out.replace("goto __offload_next;", &format!("goto {label};")));
            s.push_str("                }\n");
            if t.returns {
                let _ = writeln!(s, "                {label}:;");
            }
        };
        s.push_str("        if (__offload_first + __offload_rows <= __offload_l0) {\n");
        s.push_str("            #pragma unroll\n");
        s.push_str("            for (unsigned int __offload_k = 0u; __offload_k < __offload_rows; ++__offload_k) {\n");
        let _ = writeln!(s, "                const {ULL} __offload_q0 = __offload_first + __offload_k;");
        item(&mut s, "__offload_next");
        // The partial strip: a plain loop (unrolling it would only cost registers).
        s.push_str("            }\n        } else {\n            #pragma unroll 1\n");
        let _ = writeln!(
            s,
            "            for ({ULL} __offload_q0 = __offload_first; __offload_q0 < __offload_l0; ++__offload_q0) {{"
        );
        item(&mut s, "__offload_next_tail");
        s.push_str("            }\n        }\n    }\n");
    }
    for (c, ty, op) in reductions {
        let _ = writeln!(
            s,
            "    offload_reduce<{}>({c}, {}, __offload_red_{c}, {});",
            ty.c(),
            op.c_identity(ty),
            op.c_functor()
        );
    }
    s.push_str("}\n");
    Ok(s)
}

/// The declaration of index variable `name` with value `value`, with a `;` to follow.
fn index_decl(name: &str, value: &str) -> String {
    format!("const unsigned long long {name} = {value}")
}

/// Threads per block of generated kernels (whole warps, as the reductions need).
pub const BLOCK: u32 = 256;

/// The CUDA C source of `#[offload::device]` function `f`: a `__device__` function of the
/// same name.
pub fn device_source(
    f: &syn::ItemFn,
    params: &[Param],
    ret: Option<Ty>,
    device_fns: &[DeviceFnDecl],
) -> syn::Result<String> {
    let mut t = Translator::new(device_fns, Mode::Device(ret));
    t.used.insert(name_of(&f.sig.ident));
    for d in device_fns {
        t.used.insert(d.name());
    }
    let (decls, _) = declare_params(&mut t, params, false);
    t.stmts(&f.block.stmts, true)?;
    let r = ret.map_or("void", Ty::c);
    let name = f.sig.ident.unraw();
    // Guarded, so that a kernel including this function through several callers gets one
    // definition.
    Ok(format!(
        "{PRELUDE}#ifndef OFFLOAD_DEVICE_FN_{name}\n#define OFFLOAD_DEVICE_FN_{name}\n__device__ {r} {name}({}) {{\n{}}}\n#endif\n",
        decls.join(", "),
        t.out
    ))
}
