//! The C emitter: a lowered body to the CUDA C of a kernel or device function (the HIP
//! backend compiles it translated, as it does hand-written kernels).
//!
//! What the macro cannot write itself is left as a [`Part`] for rustc to fill in at
//! compile time: constants' values, structs' definitions, device functions' sources.

use std::fmt::Write;

use syn::BinOp;

use crate::access::ThreadMap;
use crate::ir::{
    view_repr, Body, Expr, ExprKind, Lit, Math, Order, Place, Role, Stmt, TeamLen, Type, VarId, ViewRepr,
};
use crate::signature::{Elem, KernelSig, ParamKind, Ret, Slot, StructTy};
use crate::ty::{RedOp, Ty};

/// The helpers every generated source starts with.
pub const PRELUDE: &str = include_str!("prelude.cuh");

/// The header before the prelude: the warp shuffle the team reductions use. The HIP
/// backend compiles the same source with `__shfl_down_sync` translated
/// (`offload::kernel::hip_translation`): one HIP path for generated and hand-written kernels.
pub const HEADER: &str =
    "#ifndef offload_shfl_down\n#define offload_shfl_down(v, o) __shfl_down_sync(0xffffffffu, (v), (o))\n#endif\n";

/// A piece of generated source.
#[derive(Clone, Debug)]
pub enum Part {
    Text(String),
    /// `const T name = value;` for the constant item at `path` (written in the body's
    /// module), its type and value rustc's.
    Const {
        name: String,
        path: syn::Path,
    },
    /// A struct's C definition (and those of the structs it holds).
    Struct(StructTy),
    /// An `#[offload::device]` function's source, at `path` (written in the body's module).
    DeviceFn(syn::Path),
}

/// Threads per block of generated kernels (whole warps, as the reductions need).
pub const BLOCK: u32 = 256;

/// Which of a kernel's GPU functions a source defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// `KERNEL`: 64-bit index arithmetic, no checks.
    Plain,
    /// `KERNEL_CHECKED`: every element access checked against its view's length.
    Checked,
    /// `KERNEL_NARROW`: `KERNEL` with its `usize` arithmetic in 32 bits where that gives
    /// the same values (see `narrow`), for launches whose every bound is at most 2^30.
    Narrow,
}

/// The C name of the kernel function: the kernel's name, with a suffix for the checked
/// and the narrow variant.
pub fn symbol(sig: &KernelSig, variant: Variant) -> String {
    use syn::ext::IdentExt;
    let name = sig.name.unraw().to_string();
    match variant {
        Variant::Plain => name,
        Variant::Checked => format!("{name}__offload_checked"),
        Variant::Narrow => format!("{name}__offload_narrow"),
    }
}

struct Emitter<'a> {
    body: &'a Body,
    out: String,
    depth: usize,
    kernel: bool,
    /// Element accesses of bare views go through `offload_at` (a checked launch).
    checked: bool,
    /// What `return;` jumps to in a kernel.
    label: &'static str,
}

fn int_lit(digits: &str, t: Ty) -> String {
    match t {
        Ty::I32 => digits.to_string(),
        Ty::U32 => format!("{digits}u"),
        Ty::I64 => format!("{digits}ll"),
        Ty::U64 | Ty::Usize => format!("{digits}ull"),
        Ty::F32 => format!("{digits}.0f"),
        Ty::F64 => format!("{digits}.0"),
        // Never reached for the 16-bit floats: the language refuses their literals.
        Ty::Bool | Ty::Bf16 | Ty::F16 => digits.to_string(),
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

fn op_text(op: &BinOp) -> &'static str {
    use BinOp::*;
    match op {
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
        _ => "?",
    }
}

impl Emitter<'_> {
    fn line(&mut self, text: &str) {
        for _ in 0..self.depth {
            self.out.push_str("    ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    fn c(&self, v: VarId) -> &str {
        &self.body.vars[v].c
    }

    fn repr(&self, v: VarId) -> ViewRepr {
        view_repr(&self.body.vars[v], self.kernel)
    }

    /// The C type of `t` for a declaration (`auto` where rustc alone knows it).
    fn decl_type(&self, t: &Type) -> String {
        match t {
            Type::Scalar(t) => t.c().to_string(),
            Type::Struct(s) => s.c_name.clone(),
            _ => "auto".to_string(),
        }
    }

    fn view_elem(&self, v: VarId) -> (Elem, bool) {
        match &self.body.vars[v].ty {
            Type::View { elem, mutable } => (elem.clone(), *mutable),
            _ => unreachable!("a view"),
        }
    }

    /// The argument number a view reports in a checked launch: a parameter's position, a
    /// team-local array's after the parameters'.
    fn arg_of(&self, v: VarId) -> usize {
        match self.body.vars[v].role {
            Role::Param(k) => k,
            Role::TeamLocal(_) => {
                let params = self.body.vars.iter().filter(|x| matches!(x.role, Role::Param(_))).count();
                params + self.body.vars[..v].iter().filter(|x| matches!(x.role, Role::TeamLocal(_))).count()
            }
            _ => 0,
        }
    }

    /// A team-local array's length, as a C `unsigned long long`.
    fn array_len(&self, v: VarId) -> String {
        match &self.body.vars[v].role {
            Role::TeamLocal(TeamLen::Lit(n)) => format!("{n}ull"),
            Role::TeamLocal(TeamLen::Const(e, _)) => format!("((unsigned long long)({}))", self.expr(e)),
            _ => "0ull".into(),
        }
    }

    /// Element `index` of view `v`, as an lvalue.
    fn element(&self, v: VarId, index: &Expr) -> String {
        let i = self.expr(index);
        let c = self.c(v);
        match self.repr(v) {
            ViewRepr::Bare if self.checked => {
                format!("(*offload_at({c}, {i}, __offload_len_{c}, {}u, __offload_err))", self.arg_of(v))
            }
            ViewRepr::Array if self.checked => {
                format!("(*offload_at({c}, {i}, {}, {}u, __offload_err))", self.array_len(v), self.arg_of(v))
            }
            ViewRepr::Bare | ViewRepr::Boxed | ViewRepr::Array => format!("{c}[{i}]"),
        }
    }

    /// View `v` as an `offload_view` value.
    fn view_value(&self, v: VarId) -> String {
        let c = self.c(v);
        let len = match self.repr(v) {
            ViewRepr::Boxed => return c.to_string(),
            ViewRepr::Array => self.array_len(v),
            ViewRepr::Bare => format!("__offload_len_{c}"),
        };
        let (elem, mutable) = self.view_elem(v);
        let konst = if mutable { "" } else { "const " };
        let err = if self.checked { "__offload_err" } else { "nullptr" };
        format!("offload_view<{konst}{}>({c}, {len}, {}u, {err})", elem.c(), self.arg_of(v))
    }

    fn place(&self, p: &Place) -> String {
        match p {
            Place::Var(v) => self.c(*v).to_string(),
            Place::Elem { view, index } => self.element(*view, index),
            Place::Field { base, field } => format!("{}.{}", self.place(base), unraw(field)),
        }
    }

    fn expr(&self, e: &Expr) -> String {
        match &e.kind {
            ExprKind::Lit(l) => self.lit(l, &e.ty),
            ExprKind::Var(v) => self.c(*v).to_string(),
            ExprKind::Load { view, index } => self.element(*view, index),
            ExprKind::Field { base, field } => format!("{}.{}", self.expr(base), unraw(field)),
            ExprKind::Len(v) => match self.repr(*v) {
                ViewRepr::Bare => format!("__offload_len_{}", self.c(*v)),
                ViewRepr::Array => self.array_len(*v),
                ViewRepr::Boxed => format!("{}.len", self.c(*v)),
            },
            ExprKind::ViewOf(v) => self.view_value(*v),
            ExprKind::Sub { view, start, end } => {
                format!("offload_sub({}, {}, {})", self.view_value(*view), self.expr(start), self.expr(end))
            }
            ExprKind::Neg(a) => format!("(-{})", self.expr(a)),
            ExprKind::Not(a) => match &a.ty {
                Type::Scalar(Ty::Bool) => format!("(!{})", self.expr(a)),
                Type::Scalar(_) | Type::IntLit => format!("(~{})", self.expr(a)),
                _ => format!("offload_not({})", self.expr(a)),
            },
            ExprKind::Binary(op, a, b) => {
                let (l, r) = (self.expr(a), self.expr(b));
                if matches!(op, BinOp::Rem(_)) {
                    match &e.ty {
                        Type::Scalar(Ty::F32) => return format!("fmodf({l}, {r})"),
                        Type::Scalar(Ty::F64) | Type::FloatLit => return format!("fmod({l}, {r})"),
                        Type::Opaque(_) => return format!("offload_rem({l}, {r})"),
                        _ => {}
                    }
                }
                format!("({l} {} {r})", op_text(op))
            }
            // The 16-bit floats convert through the prelude, bit for bit as `half` does.
            ExprKind::Cast(a, t) if t.is_half() => format!("{}_from_f32({})", t.c(), self.expr(a)),
            ExprKind::Cast(a, t) if a.ty.scalar().is_some_and(Ty::is_half) => {
                format!("offload_half_to_{}({})", t.rust_name(), self.expr(a))
            }
            ExprKind::Cast(a, t) => format!("(({}) {})", t.c(), self.expr(a)),
            ExprKind::Select(c, a, b) => format!("({} ? {} : {})", self.expr(c), self.expr(a), self.expr(b)),
            ExprKind::Math(m, args) => self.math(*m, &e.ty, args),
            ExprKind::Call { path, args } => {
                let name = unraw(&path.segments.last().expect("a path has a segment").ident);
                let args: Vec<String> = args.iter().map(|a| self.expr(a)).collect();
                format!("{name}({})", args.join(", "))
            }
            ExprKind::Builtin { c, .. } => c.clone(),
            ExprKind::TeamSize => "__offload_ts".to_string(),
            ExprKind::TeamReduce(op, value) => {
                let t = e.ty.scalar().unwrap_or(Ty::F32);
                format!(
                    "offload_team_reduce<{}>({}, {}, {})",
                    t.c(),
                    self.expr(value),
                    op.c_identity(t),
                    op.c_functor()
                )
            }
        }
    }

    fn lit(&self, l: &Lit, ty: &Type) -> String {
        match (l, ty) {
            (Lit::Bool(b), _) => b.to_string(),
            (Lit::Int(d), Type::Scalar(t)) => int_lit(d, *t),
            (Lit::Float(d), Type::Scalar(t)) => float_lit(d, *t),
            (Lit::Int(d), Type::IntLit) => d.clone(),
            (Lit::Int(d), Type::Opaque(of)) => format!("((offload_plain<decltype({})>) {d})", self.expr(of)),
            (Lit::Float(d), Type::Opaque(of)) => {
                format!("((offload_plain<decltype({})>) {})", self.expr(of), float_lit(d, Ty::F64))
            }
            (Lit::Float(d), _) => float_lit(d, Ty::F64),
            (Lit::Int(d), _) => d.clone(),
        }
    }

    fn math(&self, m: Math, ty: &Type, args: &[Expr]) -> String {
        let a: Vec<String> = args.iter().map(|x| self.expr(x)).collect();
        let recv = &a[0];
        match (m, ty) {
            (Math::Int(name, _), Type::Scalar(t)) => match name {
                "min" | "max" => format!("offload_{name}({recv}, {})", a[1]),
                "clamp" => format!("offload_clamp({recv}, {}, {})", a[1], a[2]),
                "abs" if *t == Ty::I32 => format!("abs({recv})"),
                _ => format!("llabs({recv})"),
            },
            (Math::Float(name, _), Type::Scalar(t)) if t.is_float() => {
                let f = if *t == Ty::F32 { "f" } else { "" };
                match name {
                    "ln" => format!("log{f}({recv})"),
                    "abs" => format!("fabs{f}({recv})"),
                    "min" => format!("fmin{f}({recv}, {})", a[1]),
                    "max" => format!("fmax{f}({recv}, {})", a[1]),
                    "powf" => format!("pow{f}({recv}, {})", a[1]),
                    "powi" => format!("pow{f}({recv}, ({}) {})", t.c(), a[1]),
                    "mul_add" => format!("fma{f}({recv}, {}, {})", a[1], a[2]),
                    "atan2" | "hypot" => format!("{name}{f}({recv}, {})", a[1]),
                    "recip" => format!("({} / {recv})", float_lit("1", *t)),
                    "clamp" => format!("offload_clamp({recv}, {}, {})", a[1], a[2]),
                    other => format!("{other}{f}({recv})"),
                }
            }
            (Math::Float(name, _) | Math::Int(name, _), _) => format!("offload_m_{name}({})", a.join(", ")),
        }
    }

    // ---- statements -------------------------------------------------------------------

    fn block(&mut self, b: &[Stmt]) {
        self.depth += 1;
        for s in b {
            self.stmt(s);
        }
        self.depth -= 1;
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Let { var, init } => {
                let v = &self.body.vars[*var];
                let value = self.expr(init);
                let ty = self.decl_type(&v.ty);
                let konst = if v.mutable { "" } else { "const " };
                let c = v.c.clone();
                self.line(&format!("{konst}{ty} {c} = {value};"));
            }
            Stmt::Assign { place, op, value, .. } => {
                let p = self.place(place);
                let v = self.expr(value);
                let line = match op {
                    None => format!("{p} = {v};"),
                    Some(BinOp::RemAssign(_)) => match &value.ty {
                        Type::Scalar(Ty::F32) => format!("{p} = fmodf({p}, {v});"),
                        Type::Scalar(Ty::F64) => format!("{p} = fmod({p}, {v});"),
                        Type::Scalar(_) => format!("{p} %= {v};"),
                        _ => format!("{p} = offload_rem({p}, {v});"),
                    },
                    Some(op) => format!("{p} {}= {v};", op_text(op)),
                };
                self.line(&line);
            }
            Stmt::Reduce { var, value, .. } => {
                let c = self.c(*var).to_string();
                let v = self.expr(value);
                let line = match self.body.vars[*var].role {
                    Role::Reduction(RedOp::Add) => format!("{c} += {v};"),
                    Role::Reduction(op) => format!("{c} = {}({c}, {v});", op.c_functor()),
                    _ => unreachable!("a reduction variable"),
                };
                self.line(&line);
            }
            Stmt::Expr(e) => {
                let v = self.expr(e);
                self.line(&format!("{v};"));
            }
            Stmt::If { cond, then, els } => {
                let c = self.expr(cond);
                self.line(&format!("if ({c}) {{"));
                self.block(then);
                match els {
                    None => self.line("}"),
                    Some(b) => {
                        self.line("} else {");
                        self.block(b);
                        self.line("}");
                    }
                }
            }
            // `a..b`: a plain loop. (An inclusive range is counted below: `c <= end; ++c`
            // would never end at the type's largest value, where Rust's `..=` does.)
            Stmt::For { var, start, end, inclusive: false, end_c, step: None, order: Order::Up, body } => {
                let v = self.body.vars[*var].clone();
                let t = self.decl_type(&v.ty);
                let (a, b) = (self.expr(start), self.expr(end));
                self.line(&format!("for ({t} {c} = {a}, {end_c} = {b}; {c} < {end_c}; ++{c}) {{", c = v.c));
                self.block(body);
                self.line("}");
            }
            Stmt::For { var, start, end, inclusive, end_c, step, order, body } => {
                // A counted loop over the values' places: no sum runs past the type's
                // range (as Rust's `step_by` and `rev` never do), whatever the bounds. The
                // sums are unsigned (wrapping), converted back to the loop's type.
                let v = self.body.vars[*var].clone();
                let t = self.decl_type(&v.ty);
                let (a, b) = (self.expr(start), self.expr(end));
                let st = step.as_ref().map_or_else(
                    || "1ull".to_string(),
                    |s| format!("(unsigned long long)({})", self.expr(s)),
                );
                let (c, n, k) = (&v.c, format!("{end_c}_n"), format!("{end_c}_k"));
                let (first, last, stride) =
                    (format!("{end_c}_a"), format!("{end_c}_b"), format!("{end_c}_s"));
                const ULL: &str = "unsigned long long";
                self.line("{");
                self.line(&format!("    {t} {first} = {a};"));
                self.line(&format!("    decltype({first}) {last} = {b};"));
                self.line(&format!("    const {ULL} {stride} = {st};"));
                // The number of values in the range, then of those the walk takes (none for
                // a step of 0, where Rust's `step_by` panics).
                let len = if *inclusive {
                    format!("({first} <= {last} ? ({ULL}){last} - ({ULL}){first} + 1ull : 0ull)")
                } else {
                    format!("({first} < {last} ? ({ULL}){last} - ({ULL}){first} : 0ull)")
                };
                self.line(&format!("    const {ULL} {n} = {stride} == 0ull || {len} == 0ull ? 0ull : ({len} - 1ull) / {stride} + 1ull;"));
                let top =
                    if *inclusive { format!("({ULL}){last}") } else { format!("(({ULL}){last} - 1ull)") };
                let place = match order {
                    Order::Up => format!("({ULL}){first} + {k} * {stride}"),
                    Order::Down => format!("{top} - {k} * {stride}"),
                    Order::UpReversed => format!("({ULL}){first} + ({n} - 1ull - {k}) * {stride}"),
                };
                self.line(&format!("    for ({ULL} {k} = 0ull; {k} < {n}; ++{k}) {{"));
                self.line(&format!("        const decltype({first}) {c} = (decltype({first}))({place});"));
                self.block(body);
                self.line("    }");
                self.line("}");
            }
            Stmt::While { cond, body } => {
                let c = self.expr(cond);
                self.line(&format!("while ({c}) {{"));
                self.block(body);
                self.line("}");
            }
            Stmt::Loop(body) => {
                self.line("while (true) {");
                self.block(body);
                self.line("}");
            }
            Stmt::Barrier => self.line("__syncthreads();"),
            Stmt::Break => self.line("break;"),
            Stmt::Continue => self.line("continue;"),
            Stmt::Return(v, _) => match (self.kernel, v) {
                (true, _) => {
                    let l = format!("goto {};", self.label);
                    self.line(&l);
                }
                (false, None) => self.line("return;"),
                (false, Some(v)) => {
                    let v = self.expr(v);
                    self.line(&format!("return {v};"));
                }
            },
            Stmt::Block(b) => {
                self.line("{");
                self.block(b);
                self.line("}");
            }
        }
    }
}

fn unraw(id: &syn::Ident) -> String {
    use syn::ext::IdentExt;
    id.unraw().to_string()
}

/// The body's statements as C at indentation `depth`.
fn body_text(body: &Body, kernel: bool, checked: bool, depth: usize, label: &'static str) -> String {
    let mut e = Emitter { body, out: String::new(), depth, kernel, checked, label };
    for s in &body.stmts {
        e.stmt(s);
    }
    e.out
}

/// The parts declaring the constants `body` reads, at indentation `depth`.
fn const_parts(body: &Body, depth: usize) -> Vec<Part> {
    let pad = "    ".repeat(depth);
    let mut parts = Vec::new();
    for &v in &body.consts {
        let var = &body.vars[v];
        if let Role::Const(path) = &var.role {
            parts.push(Part::Text(pad.clone()));
            parts.push(Part::Const { name: var.c.clone(), path: path.clone() });
        }
    }
    parts
}

/// The C type of a parameter (a kernel's bare view is a pointer).
fn param_decl(kind: &ParamKind, c: &str, kernel: bool) -> String {
    match kind {
        ParamKind::Scalar(Ty::Bool) if kernel => format!("unsigned int __offload_b_{c}"),
        // A 16-bit float's bits travel in a 32-bit word, as a bool does.
        ParamKind::Scalar(t) if kernel && t.is_half() => format!("unsigned int __offload_h_{c}"),
        ParamKind::Scalar(t) => format!("{} {c}", t.c()),
        ParamKind::Struct(s) => format!("{} {c}", s.c_name),
        ParamKind::View { elem, mutable } if kernel => {
            let konst = if *mutable { "" } else { "const " };
            format!("{konst}{}* __restrict__ {c}", elem.c())
        }
        ParamKind::View { elem, mutable } => {
            let konst = if *mutable { "" } else { "const " };
            format!("offload_view<{konst}{}> {c}", elem.c())
        }
        ParamKind::Reduction { ty, .. } => format!("{}* __restrict__ __offload_red_{c}", ty.c()),
    }
}

/// The structs a signature names.
fn structs_of<'a>(params: impl Iterator<Item = &'a ParamKind>) -> Vec<StructTy> {
    let mut out: Vec<StructTy> = Vec::new();
    for k in params {
        let s = match k {
            ParamKind::Struct(s) | ParamKind::View { elem: Elem::Struct(s), .. } => s,
            _ => continue,
        };
        if !out.contains(s) {
            out.push(s.clone());
        }
    }
    out
}

/// The parts every source of `body` needs before its own text: the structs, the device
/// functions.
fn dependencies(body: &Body, structs: Vec<StructTy>) -> Vec<Part> {
    let mut parts: Vec<Part> = structs.into_iter().map(Part::Struct).collect();
    parts.extend(body.calls.iter().cloned().map(Part::DeviceFn));
    parts
}

/// The source of kernel `sig` with lowered `body` (its variables `index_vars` and
/// `param_vars`; for [`Variant::Narrow`], the body `narrow::narrow` made), `extern "C"`
/// under [`symbol`]: its parameters are the argument block's [`Slot`]s, then the
/// runtime's work-item count.
///
/// The work items are walked with a grid stride (the launch is at most one wave of
/// blocks). In 2-D and 3-D a thread takes a point of the inner dimensions (in `map`'s
/// order: its last index is the fastest-varying thread dimension) and a strip of `rows`
/// consecutive indices of `map`'s first dimension at a time (one division per strip).
#[allow(clippy::too_many_arguments)]
pub fn kernel_source(
    sig: &KernelSig,
    body: &Body,
    index_vars: &[VarId],
    param_vars: &[VarId],
    variant: Variant,
    rows: u32,
    map: &ThreadMap,
) -> Vec<Part> {
    const ULL: &str = "unsigned long long";
    let checked = variant == Variant::Checked;
    // The type of indices and of the decode's counters.
    let idx_t = if variant == Variant::Narrow { "unsigned int" } else { ULL };
    let d = sig.indices.len();
    let symbol_text = symbol(sig, variant);
    let block = sig.teams.as_ref().map_or_else(|| BLOCK.to_string(), |t| t.c(&symbol_text));
    let mut decls = Vec::new();
    let mut lines = Vec::new();
    let mut reductions = Vec::new();
    // A `usize` value of the argument block: in the narrow variant, a parameter under
    // another name and the value, in 32 bits, under its own.
    let word = |decls: &mut Vec<String>, lines: &mut Vec<String>, name: &str, narrow: bool| {
        if narrow {
            let whole = match name.strip_prefix("__offload_") {
                Some(slot) => format!("__offload_arg_{slot}"),
                None => format!("__offload_param_{name}"),
            };
            decls.push(format!("{ULL} {whole}"));
            lines.push(format!("const unsigned int {name} = (unsigned int){whole};"));
        } else {
            decls.push(format!("{ULL} {name}"));
        }
    };
    let narrow = variant == Variant::Narrow;
    for slot in sig.slots(checked) {
        match slot {
            Slot::Start(k) => word(&mut decls, &mut lines, &format!("__offload_s{k}"), narrow),
            Slot::TeamSize => word(&mut decls, &mut lines, "__offload_ts", narrow),
            Slot::InnerLen(k) => word(&mut decls, &mut lines, &format!("__offload_l{k}"), narrow),
            Slot::Param(k, p)
                if matches!(p.kind, ParamKind::Scalar(Ty::Usize))
                    && matches!(body.vars[param_vars[k]].ty, Type::Scalar(Ty::U32)) =>
            {
                word(&mut decls, &mut lines, &body.vars[param_vars[k]].c, true)
            }
            Slot::Param(k, p) => {
                let v = &body.vars[param_vars[k]];
                decls.push(param_decl(&p.kind, &v.c, true));
                match &p.kind {
                    ParamKind::Scalar(Ty::Bool) => {
                        lines.push(format!("const bool {c} = __offload_b_{c} != 0u;", c = v.c))
                    }
                    ParamKind::Scalar(t) if t.is_half() => lines.push(format!(
                        "const {t} {c} = {{ (unsigned short) __offload_h_{c} }};",
                        t = t.c(),
                        c = v.c
                    )),
                    ParamKind::Reduction { ty, op } => {
                        lines.push(format!("{} {} = {};", ty.c(), v.c, op.c_identity(*ty)));
                        reductions.push((v.c.clone(), *ty, *op));
                    }
                    _ => {}
                }
            }
            Slot::ViewLen(k, p) => {
                let c = &body.vars[param_vars[k]].c;
                match p.kind {
                    ParamKind::Reduction { .. } => decls.push(format!("{ULL} __offload_len_red_{c}")),
                    _ => decls.push(format!("{ULL} __offload_len_{c}")),
                }
            }
            Slot::Report => decls.push(format!("{ULL}* __restrict__ __offload_err")),
        }
    }
    word(&mut decls, &mut lines, "__offload_n", narrow);
    let idx: Vec<&str> = index_vars.iter().map(|&v| body.vars[v].c.as_str()).collect();

    let mut parts = vec![Part::Text(HEADER.to_string()), Part::Text(PRELUDE.to_string())];
    parts.extend(dependencies(body, structs_of(sig.params.iter().map(|p| &p.kind))));
    // A team size from constants: declared before the function, for `__launch_bounds__`.
    parts.extend(sig.teams.as_ref().and_then(|t| t.c_decl(&sig.name, &symbol_text)));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__({block}) {symbol_text}({}) {{",
        decls.join(", ")
    );
    parts.push(Part::Text(std::mem::take(&mut s)));
    parts.extend(const_parts(body, 1));
    for l in lines {
        let _ = writeln!(s, "    {l}");
    }
    if let Some(t) = sig.teams.as_ref().map(|t| t.c_ull(&symbol_text)) {
        // One team per block, the blocks looping over the teams (a uniform trip count per
        // block, so every barrier is reached by all of a team's threads).
        let lens =
            Emitter { body, out: String::new(), depth: 1, kernel: true, checked, label: "__offload_next" };
        for v in &body.vars {
            let len = match &v.role {
                Role::TeamLocal(TeamLen::Lit(n)) => n.to_string(),
                Role::TeamLocal(TeamLen::Const(e, _)) => lens.expr(e),
                _ => continue,
            };
            if let Type::View { elem, .. } = &v.ty {
                let _ = writeln!(s, "    __shared__ {} {}[{len}];", elem.c(), v.c);
            }
        }
        if !sig.team_size_at_launch {
            let _ = writeln!(s, "    const {idx_t} __offload_ts = {t};");
        }
        let _ = writeln!(s, "    const {idx_t} __offload_teams = __offload_n / __offload_ts;");
        let _ = writeln!(
            s,
            "    for ({idx_t} __offload_q = blockIdx.x; __offload_q < __offload_teams; __offload_q += gridDim.x) {{\n        {{"
        );
        let _ = writeln!(s, "            const {idx_t} {} = __offload_s0 + __offload_q;", idx[0]);
        let _ = writeln!(s, "            const {idx_t} {} = threadIdx.x;", idx[1]);
        s.push_str(&body_text(body, true, checked, 3, "__offload_next"));
        s.push_str("        }\n        __syncthreads();\n    }\n");
    } else {
        loop_nest(&mut s, body, &idx, d, rows, map, checked, idx_t);
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
    parts.push(Part::Text(s));
    parts
}

/// The grid-stride loop of a 1-D, 2-D or 3-D kernel over its work items, the body in it
/// (see [`kernel_source`]).
#[allow(clippy::too_many_arguments)]
fn loop_nest(
    s: &mut String,
    body: &Body,
    idx: &[&str],
    d: usize,
    rows: u32,
    map: &ThreadMap,
    checked: bool,
    idx_t: &str,
) {
    // Counters and indices in `idx_t`: 64-bit, or 32-bit in the narrow variant (whose
    // launches have fewer than 2^30 items, a grid stride of one wave and starts under
    // 2^30, so no sum here wraps).
    let ull = idx_t;
    let _ = writeln!(s, "    const {ull} __offload_stride = ({ull})gridDim.x * blockDim.x;");
    let _ = writeln!(s, "    {ull} __offload_t = blockIdx.x * ({ull})blockDim.x + threadIdx.x;");
    if d == 1 {
        s.push_str("    for (; __offload_t < __offload_n; __offload_t += __offload_stride) {\n        {\n");
        let _ = writeln!(s, "            const {ull} {} = __offload_s0 + __offload_t;", idx[0]);
        s.push_str(&body_text(body, true, checked, 3, "__offload_next"));
        s.push_str("        }\n");
        if body.returns {
            s.push_str("        __offload_next:;\n");
        }
        s.push_str("    }\n");
    } else {
        // A work unit is one point of the inner dimensions and a strip of `rows`
        // consecutive indices of the strip dimension, walked in order by one thread: a
        // whole strip is an unrolled loop of constant length, so values one point loads
        // (its neighbours along the strip, read through `const __restrict__` pointers)
        // are reused by the next from registers.
        let order = &map.order;
        let len = |k: usize| format!("__offload_l{k}");
        let inner: Vec<String> = (1..d).map(len).collect();
        let _ = writeln!(s, "    const unsigned int __offload_rows = {rows}u;");
        let _ = writeln!(s, "    const {ull} __offload_l0 = __offload_n / ({});", inner.join(" * "));
        let (strip_dim, rest) = (order[0], &order[1..]);
        let rest_len: Vec<String> = rest.iter().map(|&k| len(k)).collect();
        let _ = writeln!(s, "    const {ull} __offload_inner = {};", rest_len.join(" * "));
        let _ = writeln!(
            s,
            "    const {ull} __offload_units = ({} + __offload_rows - 1) / __offload_rows * __offload_inner;",
            len(strip_dim)
        );
        s.push_str("    for (; __offload_t < __offload_units; __offload_t += __offload_stride) {\n");
        let _ = writeln!(s, "        const {ull} __offload_strip = __offload_t / __offload_inner;");
        let _ =
            writeln!(s, "        const {ull} __offload_w = __offload_t - __offload_strip * __offload_inner;");
        let mut decode = Vec::new();
        if rest.len() == 1 {
            decode.push(format!("const {ull} {} = __offload_s{} + __offload_w", idx[rest[0]], rest[0]));
        } else {
            let (mid, fast) = (rest[0], rest[1]);
            let _ = writeln!(s, "        const {ull} __offload_r1 = __offload_w / {};", len(fast));
            let _ =
                writeln!(s, "        const {ull} __offload_r2 = __offload_w - __offload_r1 * {};", len(fast));
            decode.push(format!("const {ull} {} = __offload_s{mid} + __offload_r1", idx[mid]));
            decode.push(format!("const {ull} {} = __offload_s{fast} + __offload_r2", idx[fast]));
        }
        decode.insert(0, format!("const {ull} {} = __offload_s{strip_dim} + __offload_q0", idx[strip_dim]));
        let _ = writeln!(s, "        const {ull} __offload_first = __offload_strip * __offload_rows;");
        let strip_len = len(strip_dim);
        let item = |s: &mut String, label: &'static str| {
            s.push_str("                {\n");
            for l in &decode {
                let _ = writeln!(s, "                    {l};");
            }
            s.push_str(&body_text(body, true, checked, 5, label));
            s.push_str("                }\n");
            if body.returns {
                let _ = writeln!(s, "                {label}:;");
            }
        };
        let _ = writeln!(s, "        if (__offload_first + __offload_rows <= {strip_len}) {{");
        s.push_str("            #pragma unroll\n");
        s.push_str("            for (unsigned int __offload_k = 0u; __offload_k < __offload_rows; ++__offload_k) {\n");
        let _ = writeln!(s, "                const {ull} __offload_q0 = __offload_first + __offload_k;");
        item(s, "__offload_next");
        // The partial strip: a plain loop (unrolling it would only cost registers).
        s.push_str("            }\n        } else {\n            #pragma unroll 1\n");
        let _ = writeln!(
            s,
            "            for ({ull} __offload_q0 = __offload_first; __offload_q0 < {strip_len}; ++__offload_q0) {{"
        );
        item(s, "__offload_next_tail");
        s.push_str("            }\n        }\n    }\n");
    }
}

/// The source of `#[offload::device]` function `name` with `params` (their variables
/// `param_vars`), returning `ret`: a `__device__` function of the same name, guarded so
/// that a kernel reaching it through several callers gets one definition. The prelude is
/// the kernel's.
pub fn device_source(
    name: &str,
    params: &[crate::signature::Param],
    param_vars: &[VarId],
    ret: &Ret,
    body: &Body,
) -> Vec<Part> {
    let mut parts = dependencies(
        body,
        structs_of(
            params.iter().map(|p| &p.kind).chain(
                match ret {
                    Ret::Struct(s) => Some(ParamKind::Struct(s.clone())),
                    _ => None,
                }
                .as_ref(),
            ),
        ),
    );
    let decls: Vec<String> =
        params.iter().zip(param_vars).map(|(p, &v)| param_decl(&p.kind, &body.vars[v].c, false)).collect();
    let r = match ret {
        Ret::Unit => "void".to_string(),
        Ret::Scalar(t) => t.c().to_string(),
        Ret::Struct(s) => s.c_name.clone(),
    };
    // Guarded by name and content: a function reached through several callers is defined
    // once; two functions of one name (from different modules) are both defined, which C
    // refuses (or, with other parameter types, overloads), never one silently for the other.
    let text = body_text(body, false, false, 1, "");
    let head = format!("__device__ {r} {name}({})", decls.join(", "));
    let guard = format!("OFFLOAD_DEVICE_FN_{name}_{:016x}", fingerprint(&format!("{head}{text}")));
    parts.push(Part::Text(format!("#ifndef {guard}\n#define {guard}\n{head} {{\n")));
    parts.extend(const_parts(body, 1));
    parts.push(Part::Text(format!("{text}}}\n#endif\n")));
    parts
}

/// A 64-bit FNV-1a hash of `text` (a stable name for generated definitions' guards).
pub fn fingerprint(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// `parts` as one string, with placeholders for what rustc fills in (for tests).
#[cfg(test)]
pub fn joined(parts: &[Part]) -> String {
    use quote::ToTokens;
    parts
        .iter()
        .map(|p| match p {
            Part::Text(t) => t.clone(),
            Part::Const { name, path } => format!("const <{}> {name} = <value>;\n", path.to_token_stream()),
            Part::Struct(s) => format!("<struct {}>\n", s.c_name),
            Part::DeviceFn(p) => format!("<device fn {}>\n", p.to_token_stream()),
        })
        .collect()
}
