//! Lowering: a kernel's or device function's Rust body to the typed IR, checking that it
//! is in the kernel language. Every compile error about a body comes from here, with the
//! span of the construct it names.

use std::collections::{HashMap, HashSet};

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{BinOp, Expr as SynExpr, Ident, Pat, RangeLimits, Stmt as SynStmt, UnOp};

use crate::ir::{
    compound, visit_vars, Block, Body, Expr, ExprKind, Lit, Math, Order, Place, Role, Stmt, TeamLen, TeamOp,
    Type, Var, VarId,
};
use crate::signature::{err, struct_type, Elem, Param, ParamKind, Ret};
use crate::ty::{scalar_type, RedOp, Ty};

/// Names generated C must not give a Rust variable: C++ keywords, CUDA builtins, the math
/// functions the emitters call, and the prefix of the generated names.
pub const RESERVED: &[&str] = &[
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
    "decltype",
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
    "tanh",
    "tanhf",
    "sinh",
    "sinhf",
    "cosh",
    "coshf",
    "asin",
    "asinf",
    "acos",
    "acosf",
    "atan",
    "atanf",
    "atan2",
    "atan2f",
    "log2",
    "log2f",
    "log10",
    "log10f",
    "exp2",
    "exp2f",
    "cbrt",
    "cbrtf",
    "hypot",
    "hypotf",
    "round",
    "roundf",
    "trunc",
    "truncf",
    "erf",
    "erff",
    "erfc",
    "erfcf",
    "fmod",
    "fmodf",
    "NULL",
];

/// Whether `name` may not name a generated C function.
pub fn is_reserved(name: &str) -> bool {
    RESERVED.contains(&name) || name.starts_with("__") || name.starts_with("offload_")
}

/// What `return` means where the body is.
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// A kernel: `return;` ends this iteration.
    Kernel,
    /// A device function returning this.
    Device(Ret),
}

/// The float methods of the language: Rust name, arity besides the receiver.
const FLOAT_METHODS: &[(&str, usize)] = &[
    ("sqrt", 0),
    ("abs", 0),
    ("exp", 0),
    ("exp2", 0),
    ("ln", 0),
    ("log2", 0),
    ("log10", 0),
    ("sin", 0),
    ("cos", 0),
    ("tan", 0),
    ("asin", 0),
    ("acos", 0),
    ("atan", 0),
    ("sinh", 0),
    ("cosh", 0),
    ("tanh", 0),
    ("cbrt", 0),
    ("floor", 0),
    ("ceil", 0),
    ("round", 0),
    ("trunc", 0),
    ("recip", 0),
    ("powi", 1),
    ("powf", 1),
    ("min", 1),
    ("max", 1),
    ("atan2", 1),
    ("hypot", 1),
    ("mul_add", 2),
    ("clamp", 2),
];

const INT_METHODS: &[(&str, usize)] = &[("min", 1), ("max", 1), ("abs", 0), ("clamp", 2)];

fn float_method_list() -> String {
    FLOAT_METHODS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// A loop being lowered, for the rule that every thread of a team takes the same
/// iterations of a loop with a barrier: a `break` or `continue` under a branch inside it
/// would let some threads skip barriers that the others wait at.
struct LoopFrame {
    /// `divergent` inside the loop's body.
    divergent: usize,
    /// Whether the body (at any depth) has a barrier.
    barrier: bool,
    /// How many conditions surround the loop (see [`Lowerer::conds`]).
    conds_at: usize,
    /// The `break`s and `continue`s of this loop under a branch inside it, each with the
    /// conditions between the loop and it.
    exits: Vec<(Span, Vec<Expr>)>,
}

pub struct Lowerer {
    /// A teams kernel (barriers and team-local arrays allowed).
    teams: bool,
    /// Nesting depth of branches and loops threads may take differently (a barrier there
    /// would not be reached by every thread of the team).
    divergent: usize,
    /// The loops being lowered, innermost last (see [`LoopFrame`]).
    loops: Vec<LoopFrame>,
    vars: Vec<Var>,
    scopes: Vec<HashMap<String, VarId>>,
    used: HashSet<String>,
    mode: Mode,
    returns: bool,
    consts: Vec<VarId>,
    calls: Vec<syn::Path>,
    /// Where the body reduces over its team (`offload::team_sum`), first.
    team_reduce: Option<Span>,
    /// The conditions and loop bounds around the statement being lowered (a teams
    /// kernel's barriers must be reached by every thread: see [`crate::uniform`]).
    conds: Vec<Expr>,
    /// The barriers and team reductions, with the conditions around each.
    sync_sites: Vec<crate::uniform::SyncSite>,
}

fn name_of(id: &Ident) -> String {
    use syn::ext::IdentExt;
    id.unraw().to_string()
}

fn ex(kind: ExprKind, ty: Type, span: Span) -> Expr {
    Expr { kind, ty, span }
}

impl Lowerer {
    pub fn new(mode: Mode) -> Self {
        Self {
            teams: false,
            divergent: 0,
            loops: Vec::new(),
            vars: Vec::new(),
            scopes: vec![HashMap::new()],
            used: RESERVED.iter().map(|s| s.to_string()).collect(),
            mode,
            returns: false,
            consts: Vec::new(),
            calls: Vec::new(),
            team_reduce: None,
            conds: Vec::new(),
            sync_sites: Vec::new(),
        }
    }

    /// Refuses a barrier or team reduction of `stmts` (the lowered body) that some threads
    /// of a team could skip ([`crate::uniform::check`]).
    pub fn check_sync(&self, stmts: &Block) -> syn::Result<()> {
        crate::uniform::check(&self.vars, stmts, &self.sync_sites)
    }

    /// Records a barrier (or team reduction) at `span` with the conditions around it.
    fn sync_site(&mut self, span: Span, what: &'static str) {
        self.loops.iter_mut().for_each(|l| l.barrier = true);
        self.sync_sites.push(crate::uniform::SyncSite { span, what, around: self.conds.clone() });
    }

    /// Where the lowered body first reduces over its team, if it does (a team's threads
    /// must then be whole warps).
    pub fn team_reduce(&self) -> Option<Span> {
        self.team_reduce
    }

    /// Lowers a teams kernel: `offload::barrier()` and team-local arrays are allowed.
    pub fn set_teams(&mut self) {
        self.teams = true;
    }

    /// Keeps `name` out of the C names given to variables (a function's own name).
    pub fn reserve(&mut self, name: &str) {
        self.used.insert(name.to_string());
    }

    /// A C name for Rust name `rust`, distinct from every C name given so far (C++ forbids
    /// redeclaring in one scope, and a declaration is in scope in its own initializer).
    fn fresh(&mut self, rust: &str) -> String {
        let base = if rust.starts_with("__") || rust.starts_with("offload_") {
            format!("u{rust}")
        } else {
            rust.to_string()
        };
        let mut c = base.clone();
        let mut k = 1;
        while self.used.contains(&c) {
            c = format!("{base}_{k}");
            k += 1;
        }
        self.used.insert(c.clone());
        c
    }

    fn declare(&mut self, rust: &Ident, ty: Type, mutable: bool, role: Role, init: Option<Expr>) -> VarId {
        let c = self.fresh(&name_of(rust));
        let id = self.vars.len();
        self.vars.push(Var { rust: rust.clone(), c, ty, mutable, role, init });
        self.scopes.last_mut().expect("a scope").insert(name_of(rust), id);
        id
    }

    /// Declares the kernel's index variables.
    pub fn indices(&mut self, indices: &[Ident]) -> Vec<VarId> {
        indices
            .iter()
            .enumerate()
            .map(|(k, i)| self.declare(i, Type::Scalar(Ty::Usize), false, Role::Index(k), None))
            .collect()
    }

    /// Declares the parameters.
    pub fn params(&mut self, params: &[Param]) -> Vec<VarId> {
        params
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let (ty, role) = match &p.kind {
                    ParamKind::Scalar(t) => (Type::Scalar(*t), Role::Param(k)),
                    ParamKind::Struct(s) => (Type::Struct(s.clone()), Role::Param(k)),
                    ParamKind::View { elem, mutable } => {
                        (Type::View { elem: elem.clone(), mutable: *mutable }, Role::Param(k))
                    }
                    ParamKind::Reduction { ty, op } => (Type::Scalar(*ty), Role::Reduction(*op)),
                };
                self.declare(&p.name, ty, false, role, None)
            })
            .collect()
    }

    pub fn finish(self, stmts: Block) -> Body {
        Body { vars: self.vars, stmts, returns: self.returns, consts: self.consts, calls: self.calls }
    }

    fn lookup(&self, rust: &str) -> Option<VarId> {
        self.scopes.iter().rev().find_map(|s| s.get(rust)).copied()
    }

    fn var(&self, id: VarId) -> &Var {
        &self.vars[id]
    }

    // ---- statements -------------------------------------------------------------------

    fn block(&mut self, b: &syn::Block) -> syn::Result<Block> {
        self.scopes.push(HashMap::new());
        let r = self.stmts(&b.stmts, false);
        self.scopes.pop();
        r
    }

    /// `stmts`; in a device function's body (`tail`), a final expression is its value.
    pub fn stmts(&mut self, stmts: &[SynStmt], tail: bool) -> syn::Result<Block> {
        let mut out = Vec::new();
        for (k, s) in stmts.iter().enumerate() {
            match s {
                SynStmt::Expr(e, None) if tail && k + 1 == stmts.len() && self.returns_value() => {
                    let v = self.returned(e)?;
                    out.push(Stmt::Return(Some(v), e.span()));
                }
                _ => self.stmt(s, &mut out)?,
            }
        }
        Ok(out)
    }

    fn returns_value(&self) -> bool {
        matches!(self.mode, Mode::Device(Ret::Scalar(_) | Ret::Struct(_)))
    }

    /// `e` as the device function's return value.
    fn returned(&mut self, e: &SynExpr) -> syn::Result<Expr> {
        match self.mode.clone() {
            Mode::Device(Ret::Scalar(t)) => self.value(e, Some(&Type::Scalar(t))),
            Mode::Device(Ret::Struct(s)) => self.value(e, Some(&Type::Struct(s))),
            _ => err(e, "this function returns nothing"),
        }
    }

    fn stmt(&mut self, s: &SynStmt, out: &mut Block) -> syn::Result<()> {
        match s {
            SynStmt::Local(l) => self.local(l, out),
            SynStmt::Item(syn::Item::Const(c)) => {
                let Some(t) = scalar_type(&c.ty).filter(|t| !t.is_half()) else {
                    return err(&c.ty, "this constant's type is not in the kernel language: f32, f64, i32, u32, i64, u64, usize or bool \
                                       (a bf16 or f16: `let s = bf16::from_f32(0.5);`)");
                };
                let v = self.value(&c.expr, Some(&Type::Scalar(t)))?;
                let id = self.declare(&c.ident, Type::Scalar(t), false, Role::BodyConst, Some(v.clone()));
                out.push(Stmt::Let { var: id, init: v });
                Ok(())
            }
            SynStmt::Item(i) => {
                err(i, "items other than `const` are not in the kernel language: declare them outside")
            }
            SynStmt::Macro(m) => {
                err(&m.mac, "macros are not in the kernel language: they cannot be translated to C")
            }
            SynStmt::Expr(e, _) => self.stmt_expr(e, out),
        }
    }

    /// `let mut tile: [T; N] = offload::team_local();`, if `l` is one.
    fn team_local(&mut self, l: &syn::Local) -> Option<syn::Result<()>> {
        let Pat::Type(pt) = &l.pat else { return None };
        let syn::Type::Array(arr) = &*pt.ty else { return None };
        let init = l.init.as_ref()?;
        let SynExpr::Call(c) = &*init.expr else { return None };
        let SynExpr::Path(p) = &*c.func else { return None };
        if p.path.segments.last().is_none_or(|s| s.ident != "team_local") {
            return None;
        }
        Some((|| {
            if !self.teams {
                return err(
                    l,
                    "team-local arrays are in teams kernels only (`#[offload::kernel(teams = THREADS)]`)",
                );
            }
            if self.scopes.len() != 1 {
                return err(l, "a team-local array is declared at the top of the kernel's body");
            }
            let Pat::Ident(id) = &*pt.pat else { return err(&pt.pat, "bind one name") };
            if id.mutability.is_none() {
                return err(id, "a team-local array is `let mut`: the team's threads write it");
            }
            let Some(elem) = scalar_type(&arr.elem).filter(|t| *t != Ty::Bool) else {
                let what = "a team-local array holds f32, f64, i32, u32, i64, u64, usize, bf16 or f16";
                let named = struct_type(&arr.elem).map(Type::Struct);
                return err(&arr.elem, named.map_or_else(|| what.to_string(), |t| for_scalars(what, &t)));
            };
            let len = match &arr.len {
                SynExpr::Lit(syn::ExprLit { lit: syn::Lit::Int(n), .. }) => {
                    let len: u64 = n.base10_parse()?;
                    // CUDA's static shared memory per block: larger arrays do not compile for
                    // a GPU, and the host twin would allocate them per team. (A constant
                    // expression's size is checked beside the kernel, by rustc.)
                    let bytes = len.checked_mul(elem.bytes());
                    if bytes.is_none_or(|b| b > SHARED_BYTES) {
                        return err(&arr.len, TEAM_LOCAL_TOO_LARGE);
                    }
                    TeamLen::Lit(len)
                }
                other => {
                    let e = self.value(other, Some(&Type::Scalar(Ty::Usize))).map_err(|e| {
                        syn::Error::new(
                            e.span(),
                            format!(
                                "a team-local array's length is an integer literal or a constant expression of \
                                 module constants (`4 * BSIZE * BSIZE`): {e}"
                            ),
                        )
                    })?;
                    if !is_constant(&e, &self.vars) {
                        return err(
                            other,
                            "a team-local array's length is an integer literal or a constant expression of module \
                             constants (`4 * BSIZE * BSIZE`), not of the kernel's values",
                        );
                    }
                    TeamLen::Const(Box::new(e), Box::new(other.clone()))
                }
            };
            if !c.args.is_empty() {
                return err(c, "`offload::team_local()` takes no arguments");
            }
            let ty = Type::View { elem: Elem::Scalar(elem), mutable: true };
            let v = self.declare(&id.ident, ty, false, Role::TeamLocal(len), None);
            self.vars[v].mutable = false;
            Ok(())
        })())
    }

    fn local(&mut self, l: &syn::Local, out: &mut Block) -> syn::Result<()> {
        if let Some(r) = self.team_local(l) {
            return r;
        }
        let (ident, mutable, annotated) = match &l.pat {
            Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
                (&p.ident, p.mutability.is_some(), None)
            }
            Pat::Type(pt) => match &*pt.pat {
                Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
                    let t = if let Some(t) = scalar_type(&pt.ty) {
                        Type::Scalar(t)
                    } else if let Some(s) = struct_type(&pt.ty) {
                        Type::Struct(s)
                    } else if let Ok(ParamKind::View { elem, mutable }) = crate::signature::param_kind(&pt.ty)
                    {
                        Type::View { elem, mutable }
                    } else {
                        return err(&pt.ty, "this type is not in the kernel language: locals are scalars, DeviceCopy structs or views `&[T]`");
                    };
                    (&p.ident, p.mutability.is_some(), Some(t))
                }
                other => return err(other, "patterns are not in the kernel language: bind one name"),
            },
            other => return err(other, "patterns are not in the kernel language: bind one name"),
        };
        let Some(init) = &l.init else {
            return err(l, "`let` without a value is not in the kernel language: give it one");
        };
        if let Some((_, d)) = &init.diverge {
            return err(d, "`let ... else` is not in the kernel language");
        }
        let team_op = match &*init.expr {
            SynExpr::Call(c) => team_op_of(&c.func).map(|op| (c, op)),
            _ => None,
        };
        if let (Some((c, _)), true) = (team_op, mutable) {
            return err(
                c,
                "a team reduction's result is the team's, one value for every thread: bind it with `let`, not \
                 `let mut` (copy it into a `let mut` local to change it)",
            );
        }
        let v = match team_op {
            Some((c, op)) => self.team_reduction(c, op, annotated.as_ref())?,
            None => self.value(&init.expr, annotated.as_ref())?,
        };
        let ty = match (annotated, &v.ty) {
            (Some(t), _) => t,
            // The suggestion follows the operands: integer literals (`THREADS >> (k + 1)`)
            // want an integer type, float ones a float type.
            (None, Type::IntLit) => {
                return err(
                    l,
                    format!(
                        "the type of `{ident}` cannot be inferred by the kernel language: its operands are \
                         integer literals; annotate it (`let {ident}: usize = ...`, or `u32`, `i32`, ...) \
                         or give a literal a suffix (`1usize`)"
                    ),
                )
            }
            (None, Type::FloatLit) => {
                return err(
                    l,
                    format!(
                        "the type of `{ident}` cannot be inferred by the kernel language: its operands are \
                         float literals; annotate it (`let {ident}: f32 = ...`, or `f64`) or give a literal \
                         a suffix (`1.0f32`)"
                    ),
                )
            }
            (None, t) => t.clone(),
        };
        if matches!(ty, Type::View { .. }) && mutable {
            return err(l, "a view local is not `mut`: bind another view with a new `let`");
        }
        let init_copy = (!mutable).then(|| v.clone());
        let opaque = matches!(ty, Type::Opaque(_));
        let id = self.declare(ident, ty, mutable, Role::Local, init_copy);
        if opaque {
            // C names its type after the local itself: `decltype(v)`.
            self.vars[id].ty = Type::Opaque(Box::new(ex(ExprKind::Var(id), Type::Unit, l.span())));
        }
        out.push(Stmt::Let { var: id, init: v });
        Ok(())
    }

    /// Whether `e` depends on a teams kernel's thread index (through locals too).
    fn on_thread(&self, e: &Expr) -> bool {
        let mut found = false;
        visit_vars(e, &mut |v| {
            found |= match (&self.vars[v].role, &self.vars[v].init) {
                (Role::Index(1), _) => self.teams,
                (Role::Local, Some(init)) => self.on_thread(init),
                (Role::Local, None) => self.teams, // a `let mut` may hold anything
                _ => false,
            }
        });
        found
    }

    fn no_label(&self, label: &Option<impl quote::ToTokens>) -> syn::Result<()> {
        match label {
            Some(l) => err(l, "labels are not in the kernel language"),
            None => Ok(()),
        }
    }

    fn stmt_expr(&mut self, e: &SynExpr, out: &mut Block) -> syn::Result<()> {
        match e {
            SynExpr::If(i) => {
                let s = self.if_stmt(i)?;
                out.push(s);
                Ok(())
            }
            SynExpr::ForLoop(f) => {
                self.no_label(&f.label)?;
                let name = match &*f.pat {
                    Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => p.ident.clone(),
                    Pat::Wild(w) => Ident::new("__offload_k", w.underscore_token.span),
                    _ => return err(&f.pat, "patterns are not in the kernel language: `for x in a..b`"),
                };
                let (r, step, order) = range_walk(&f.expr)?;
                let (Some(a), Some(b)) = (&r.start, &r.end) else {
                    return err(r, "open ranges are not in the kernel language: write both bounds");
                };
                let (start, end) = self.operands(a, b, None)?;
                // Rust's `step_by` takes a `usize`; it is read once, before the loop.
                let step = step.map(|e| self.value(e, Some(&Type::Scalar(Ty::Usize)))).transpose()?;
                if let Some(Expr { kind: ExprKind::Lit(Lit::Int(z)), span, .. }) = &step {
                    let digits: String = z.chars().take_while(char::is_ascii_digit).collect();
                    if digits.parse::<u64>() == Ok(0) {
                        return Err(syn::Error::new(
                            *span,
                            "`.step_by(0)`: a step is at least 1 (Rust's `step_by` panics on 0)",
                        ));
                    }
                }
                let opaque = matches!(start.ty, Type::Opaque(_)) || matches!(end.ty, Type::Opaque(_));
                let ty = match start.ty.scalar().or(end.ty.scalar()) {
                    Some(t) if !t.is_int() => {
                        return err(r, "ranges of this type are not in the kernel language: loop over integers")
                    }
                    Some(t) => Type::Scalar(t),
                    // A constant's type, C's `auto` (both bounds have it).
                    None if opaque => Type::Unit,
                    None => {
                        return err(
                            r,
                            "the loop variable's type cannot be inferred by the kernel language: give a bound a suffix (`0usize..4`)",
                        )
                    }
                };
                self.scopes.push(HashMap::new());
                let var = self.declare(&name, ty, false, Role::Local, None);
                if opaque && self.vars[var].ty.is_unit() {
                    self.vars[var].ty = Type::Opaque(Box::new(ex(ExprKind::Var(var), Type::Unit, r.span())));
                }
                let end_c = self.fresh(&format!("{}_end", self.vars[var].c));
                let thread_bound = self.on_thread(&start)
                    || self.on_thread(&end)
                    || step.as_ref().is_some_and(|s| self.on_thread(s));
                self.divergent += usize::from(thread_bound);
                let bounds = [Some(&start), Some(&end), step.as_ref()].into_iter().flatten().cloned();
                let depth = self.conds.len();
                self.conds.extend(bounds);
                let body = self.loop_body(&f.body);
                self.conds.truncate(depth);
                self.divergent -= usize::from(thread_bound);
                self.scopes.pop();
                out.push(Stmt::For {
                    var,
                    start,
                    end,
                    inclusive: matches!(r.limits, RangeLimits::Closed(_)),
                    end_c,
                    step,
                    order,
                    body: body?,
                });
                Ok(())
            }
            SynExpr::While(w) => {
                self.no_label(&w.label)?;
                if let SynExpr::Let(l) = &*w.cond {
                    return err(l, "`while let` is not in the kernel language");
                }
                let cond = self.value(&w.cond, Some(&Type::Scalar(Ty::Bool)))?;
                self.divergent += 1;
                self.conds.push(cond.clone());
                let body = self.loop_body(&w.body);
                self.conds.pop();
                self.divergent -= 1;
                out.push(Stmt::While { cond, body: body? });
                Ok(())
            }
            SynExpr::Loop(l) => {
                self.no_label(&l.label)?;
                self.divergent += 1;
                let body = self.loop_body(&l.body);
                self.divergent -= 1;
                out.push(Stmt::Loop(body?));
                Ok(())
            }
            SynExpr::Block(b) => {
                self.no_label(&b.label)?;
                let body = self.block(&b.block)?;
                out.push(Stmt::Block(body));
                Ok(())
            }
            SynExpr::Continue(c) => {
                self.no_label(&c.label)?;
                self.loop_exit(c.span());
                out.push(Stmt::Continue);
                Ok(())
            }
            SynExpr::Break(b) => {
                self.no_label(&b.label)?;
                if let Some(v) = &b.expr {
                    return err(v, "`break` with a value is not in the kernel language");
                }
                self.loop_exit(b.span());
                out.push(Stmt::Break);
                Ok(())
            }
            SynExpr::Call(c) if is_offload_fn(&c.func, "barrier") => {
                if !self.teams {
                    return err(
                        c,
                        "a barrier is in a teams kernel only (`#[offload::kernel(teams = THREADS)]`)",
                    );
                }
                if !c.args.is_empty() {
                    return err(c, "`offload::barrier()` takes no arguments");
                }
                self.sync_site(c.span(), "a barrier");
                out.push(Stmt::Barrier);
                Ok(())
            }
            SynExpr::Return(r) if self.teams => {
                err(r, "`return` is not in teams kernels: every thread reaches the team's barriers; use `if`")
            }
            SynExpr::Return(r) => {
                let s = match (self.mode.clone(), &r.expr) {
                    (Mode::Kernel, None) => {
                        self.returns = true;
                        Stmt::Return(None, r.span())
                    }
                    (Mode::Kernel, Some(v)) => {
                        return err(v, "a kernel returns nothing: `return;` ends this iteration")
                    }
                    (Mode::Device(Ret::Unit), None) => Stmt::Return(None, r.span()),
                    (Mode::Device(Ret::Scalar(_) | Ret::Struct(_)), Some(v)) => {
                        Stmt::Return(Some(self.returned(v)?), r.span())
                    }
                    _ => return err(r, "this `return` does not match the device function's return type"),
                };
                out.push(s);
                Ok(())
            }
            SynExpr::Assign(a) => {
                if let Some((var, op)) = self.reduction_var(&a.left) {
                    let value = self.min_max_update(a, var, op)?;
                    out.push(Stmt::Reduce { var, value, span: a.span() });
                    return Ok(());
                }
                let place = self.place(&a.left)?;
                let t = self.place_type(&place);
                let value = self.value(&a.right, Some(&t))?;
                out.push(Stmt::Assign { place, op: None, value, span: a.span() });
                Ok(())
            }
            SynExpr::Binary(b) if compound(&b.op).is_some() => {
                if let Some((var, op)) = self.reduction_var(&b.left) {
                    if !(op == RedOp::Add && matches!(b.op, BinOp::AddAssign(_))) {
                        return reduction_misuse(b, op);
                    }
                    let t = self.vars[var].ty.clone();
                    let value = self.value(&b.right, Some(&t))?;
                    out.push(Stmt::Reduce { var, value, span: b.span() });
                    return Ok(());
                }
                let place = self.place(&b.left)?;
                let t = self.place_type(&place);
                if matches!(t, Type::Struct(_) | Type::View { .. }) {
                    return err(b, for_scalars("compound assignment is for scalars", &t));
                }
                let shift = matches!(b.op, BinOp::ShlAssign(_) | BinOp::ShrAssign(_));
                let value = if shift { self.value(&b.right, None)? } else { self.value(&b.right, Some(&t))? };
                out.push(Stmt::Assign { place, op: Some(b.op), value, span: b.span() });
                Ok(())
            }
            other => {
                let e = self.expr(other, None)?;
                out.push(Stmt::Expr(e));
                Ok(())
            }
        }
    }

    /// A loop's body, checked against [`LoopFrame`]'s rule once lowered.
    fn loop_body(&mut self, body: &syn::Block) -> syn::Result<Vec<Stmt>> {
        let frame = LoopFrame {
            divergent: self.divergent,
            barrier: false,
            conds_at: self.conds.len(),
            exits: Vec::new(),
        };
        self.loops.push(frame);
        let lowered = self.block(body);
        let frame = self.loops.pop();
        let lowered = lowered?;
        // In a loop with a barrier, every thread leaves together: a `break` under a branch
        // stands only under conditions the same for every thread (checked with the
        // barriers).
        if let Some(LoopFrame { barrier: true, exits, .. }) = frame {
            for (span, around) in exits {
                let what = "a `break` or `continue` of a loop with a barrier";
                self.sync_sites.push(crate::uniform::SyncSite { span, what, around });
            }
        }
        Ok(lowered)
    }

    /// Notes a `break` or `continue` of the innermost loop that only some threads may take.
    fn loop_exit(&mut self, span: Span) {
        let divergent = self.divergent;
        if let Some(l) = self.loops.last_mut() {
            if divergent > l.divergent {
                l.exits.push((span, self.conds[l.conds_at..].to_vec()));
            }
        }
    }

    fn if_stmt(&mut self, i: &syn::ExprIf) -> syn::Result<Stmt> {
        if let SynExpr::Let(l) = &*i.cond {
            return err(l, "`if let` is not in the kernel language");
        }
        let cond = self.value(&i.cond, Some(&Type::Scalar(Ty::Bool)))?;
        self.divergent += 1;
        self.conds.push(cond.clone());
        let r = (|| {
            let then = self.block(&i.then_branch)?;
            let els = match i.else_branch.as_ref().map(|(_, e)| &**e) {
                None => None,
                Some(SynExpr::If(next)) => Some(vec![self.if_stmt(next)?]),
                Some(SynExpr::Block(b)) => Some(self.block(&b.block)?),
                Some(other) => return err(other, "this `else` is not in the kernel language"),
            };
            Ok(Stmt::If { cond, then, els })
        })();
        self.divergent -= 1;
        self.conds.pop();
        r
    }

    // ---- places -----------------------------------------------------------------------

    fn place_type(&self, p: &Place) -> Type {
        match p {
            Place::Var(v) => self.vars[*v].ty.clone(),
            Place::Elem { view, .. } => match &self.vars[*view].ty {
                Type::View { elem: Elem::Scalar(t), .. } => Type::Scalar(*t),
                Type::View { elem: Elem::Struct(s), .. } => Type::Struct(s.clone()),
                _ => Type::Unit,
            },
            Place::Field { .. } => Type::Opaque(Box::new(self.place_expr(p))),
        }
    }

    /// The place read as an expression (for `decltype`).
    fn place_expr(&self, p: &Place) -> Expr {
        let span = Span::call_site();
        match p {
            Place::Var(v) => ex(ExprKind::Var(*v), self.vars[*v].ty.clone(), span),
            Place::Elem { view, index } => {
                ex(ExprKind::Load { view: *view, index: Box::new(index.clone()) }, self.place_type(p), span)
            }
            Place::Field { base, field } => {
                let b = self.place_expr(base);
                let e = ex(ExprKind::Field { base: Box::new(b), field: field.clone() }, Type::Unit, span);
                let ty = Type::Opaque(Box::new(e.clone()));
                Expr { ty, ..e }
            }
        }
    }

    /// Place `e`: a mutable local, an element of a `&mut` view, or a field of one.
    fn place(&mut self, e: &SynExpr) -> syn::Result<Place> {
        match e {
            SynExpr::Path(p) => match p.path.get_ident().and_then(|i| self.lookup(&name_of(i))) {
                Some(v) if self.var(v).mutable => Ok(Place::Var(v)),
                Some(_) => err(e, "only `let mut` locals and elements of `&mut` slices can be assigned"),
                None => err(e, "only `let mut` locals and elements of `&mut` slices can be assigned"),
            },
            SynExpr::Index(ix) => {
                let Some(view) = self.view_var(&ix.expr) else {
                    return err(&ix.expr, "indexing is for views (slice parameters and sub-slices)");
                };
                match &self.var(view).ty {
                    Type::View { mutable: true, .. } => {}
                    _ => return err(&ix.expr, "only elements of `&mut` slices can be assigned"),
                }
                if let SynExpr::Range(r) = &*ix.index {
                    return err(r, "assign to one element, not a range");
                }
                let index = self.value(&ix.index, Some(&Type::Scalar(Ty::Usize)))?;
                Ok(Place::Elem { view, index })
            }
            SynExpr::Field(f) => {
                let base = self.place(&f.base)?;
                if !matches!(self.place_type(&base), Type::Struct(_) | Type::Opaque(_)) {
                    return err(&f.base, "field access is for DeviceCopy structs");
                }
                let syn::Member::Named(field) = &f.member else {
                    return err(&f.member, "tuple fields are not in the kernel language: name the field");
                };
                Ok(Place::Field { base: Box::new(base), field: field.clone() })
            }
            SynExpr::Paren(p) => self.place(&p.expr),
            other => {
                err(other, "this place is not in the kernel language: assign to a local or a slice element")
            }
        }
    }

    // ---- expressions ------------------------------------------------------------------

    /// `e` as a value, of type `want` when given (literals take it).
    fn value(&mut self, e: &SynExpr, want: Option<&Type>) -> syn::Result<Expr> {
        let v = self.expr(e, want)?;
        if v.ty.is_unit() {
            return err(e, "this expression has no value");
        }
        Ok(match want {
            Some(t) if v.ty.is_lit() => {
                no_half_literal(e, t)?;
                coerce(v, t)
            }
            _ => v,
        })
    }

    fn lit(&self, l: &syn::Lit, want: Option<&Type>, span: Span) -> syn::Result<Expr> {
        if let Some(t) = want {
            no_half_literal(l, t)?;
        }
        match l {
            syn::Lit::Int(i) => {
                let t = match i.suffix() {
                    "" => match want {
                        Some(Type::Scalar(t)) if *t != Ty::Bool => Type::Scalar(*t),
                        Some(o @ Type::Opaque(_)) => o.clone(),
                        _ => Type::IntLit,
                    },
                    s => Type::Scalar(Ty::from_name(s).ok_or_else(|| {
                        syn::Error::new_spanned(
                            i,
                            "offload::kernel: this literal suffix is not in the kernel language",
                        )
                    })?),
                };
                Ok(ex(ExprKind::Lit(Lit::Int(i.base10_digits().to_string())), t, span))
            }
            syn::Lit::Float(f) => {
                let t = match f.suffix() {
                    "" => match want {
                        Some(Type::Scalar(t)) if t.is_float() => Type::Scalar(*t),
                        Some(o @ Type::Opaque(_)) => o.clone(),
                        _ => Type::FloatLit,
                    },
                    "f32" => Type::Scalar(Ty::F32),
                    "f64" => Type::Scalar(Ty::F64),
                    _ => return err(f, "this literal suffix is not in the kernel language"),
                };
                Ok(ex(ExprKind::Lit(Lit::Float(f.base10_digits().to_string())), t, span))
            }
            syn::Lit::Bool(b) => Ok(ex(ExprKind::Lit(Lit::Bool(b.value)), Type::Scalar(Ty::Bool), span)),
            other => err(other, "this literal is not in the kernel language: numbers and booleans only"),
        }
    }

    /// Two operands of one type: a literal takes the other's type.
    fn operands(&mut self, a: &SynExpr, b: &SynExpr, want: Option<&Type>) -> syn::Result<(Expr, Expr)> {
        let ea = self.expr(a, want)?;
        let hint = if ea.ty.is_lit() { want.cloned() } else { Some(ea.ty.clone()) };
        let eb = self.expr(b, hint.as_ref())?;
        if ea.ty.is_unit() {
            return err(a, "this operand has no value");
        }
        if eb.ty.is_unit() {
            return err(b, "this operand has no value");
        }
        if ea.ty.is_lit() && !eb.ty.is_lit() {
            no_half_literal(a, &eb.ty)?;
        }
        if eb.ty.is_lit() && !ea.ty.is_lit() {
            no_half_literal(b, &ea.ty)?;
        }
        let ea = if ea.ty.is_lit() && !eb.ty.is_lit() { coerce(ea, &eb.ty) } else { ea };
        Ok((ea, eb))
    }

    fn view_var(&self, e: &SynExpr) -> Option<VarId> {
        let SynExpr::Path(p) = e else { return None };
        let v = self.lookup(&name_of(p.path.get_ident()?))?;
        matches!(self.var(v).ty, Type::View { .. }).then_some(v)
    }

    /// `(variable, operator)` when `e` is `*r` with `r` a reduction variable.
    fn reduction_var(&self, e: &SynExpr) -> Option<(VarId, RedOp)> {
        let SynExpr::Unary(syn::ExprUnary { op: UnOp::Deref(_), expr, .. }) = e else { return None };
        let SynExpr::Path(p) = &**expr else { return None };
        let v = self.lookup(&name_of(p.path.get_ident()?))?;
        match self.var(v).role {
            Role::Reduction(op) => Some((v, op)),
            _ => None,
        }
    }

    /// The value of `*r = r.min(v)` (or `(*r).min(v)`; `max` alike) for reduction `r`.
    fn min_max_update(&mut self, a: &syn::ExprAssign, var: VarId, op: RedOp) -> syn::Result<Expr> {
        let method = match op {
            RedOp::Min => "min",
            RedOp::Max => "max",
            RedOp::Add => return reduction_misuse(a, op),
        };
        let mut right = &*a.right;
        while let SynExpr::Paren(p) = right {
            right = &p.expr;
        }
        let SynExpr::MethodCall(m) = right else { return reduction_misuse(a, op) };
        let mut recv = &*m.receiver;
        while let SynExpr::Paren(p) = recv {
            recv = &p.expr;
        }
        let same: &SynExpr = match recv {
            SynExpr::Unary(syn::ExprUnary { op: UnOp::Deref(_), expr, .. }) => expr,
            other => other,
        };
        let is_r = matches!(same, SynExpr::Path(p) if p.path.get_ident().and_then(|i| self.lookup(&name_of(i))) == Some(var));
        if m.method != method || m.args.len() != 1 || !is_r {
            return reduction_misuse(a, op);
        }
        let t = self.vars[var].ty.clone();
        self.value(&m.args[0], Some(&t))
    }

    fn path_expr(&mut self, p: &syn::ExprPath, span: Span) -> syn::Result<Expr> {
        if p.qself.is_some() {
            return err(p, "qualified paths are not in the kernel language");
        }
        if let Some(id) = p.path.get_ident() {
            if let Some(v) = self.lookup(&name_of(id)) {
                let var = self.var(v);
                return match (&var.role, &var.ty) {
                    (Role::Reduction(op), _) => reduction_misuse(p, *op),
                    (_, Type::View { .. }) => Ok(ex(ExprKind::ViewOf(v), var.ty.clone(), span)),
                    _ => Ok(ex(ExprKind::Var(v), var.ty.clone(), span)),
                };
            }
        }
        if let Some(b) = builtin_const(&p.path, span) {
            return Ok(b);
        }
        if let Some((h, name)) = half_function(&p.path) {
            return err(
                p,
                format!(
                    "`{}::{name}` is not in the kernel language: the 16-bit floats' constants are ZERO, NEG_ZERO, ONE, \
                     NEG_ONE, MAX, MIN, MIN_POSITIVE, MIN_POSITIVE_SUBNORMAL, MAX_SUBNORMAL, EPSILON, INFINITY, \
                     NEG_INFINITY and NAN (others: `{}::from_f32(...)`)",
                    h.rust_name(),
                    h.rust_name()
                ),
            );
        }
        // A constant item: its value and type are rustc's to know.
        if p.path.segments.iter().any(|s| !s.arguments.is_empty()) {
            return err(p, "generic paths are not in the kernel language");
        }
        let key = quote::quote!(#p).to_string();
        let existing = self.consts.iter().copied().find(|&v| match &self.vars[v].role {
            Role::Const(path) => quote::quote!(#path).to_string() == key,
            _ => false,
        });
        let v = match existing {
            Some(v) => v,
            None => {
                let last = &p.path.segments.last().expect("a path has a segment").ident;
                let c = self.fresh(&name_of(last));
                let id = self.vars.len();
                let placeholder = ex(ExprKind::Var(id), Type::Unit, span);
                self.vars.push(Var {
                    rust: last.clone(),
                    c,
                    ty: Type::Opaque(Box::new(placeholder)),
                    mutable: false,
                    role: Role::Const(p.path.clone()),
                    init: None,
                });
                self.consts.push(id);
                id
            }
        };
        Ok(ex(ExprKind::Var(v), self.vars[v].ty.clone(), span))
    }

    pub fn expr(&mut self, e: &SynExpr, want: Option<&Type>) -> syn::Result<Expr> {
        let span = e.span();
        match e {
            SynExpr::Lit(l) => self.lit(&l.lit, want, span),
            SynExpr::Path(p) => self.path_expr(p, span),
            SynExpr::Paren(p) => self.expr(&p.expr, want),
            SynExpr::Group(g) => self.expr(&g.expr, want),
            SynExpr::Unary(u) => match u.op {
                UnOp::Neg(_) => {
                    let v = self.expr(&u.expr, want)?;
                    let ty = v.ty.clone();
                    Ok(ex(ExprKind::Neg(Box::new(v)), ty, span))
                }
                UnOp::Not(_) => {
                    let v = self.expr(&u.expr, want)?;
                    let ty = v.ty.clone();
                    Ok(ex(ExprKind::Not(Box::new(v)), ty, span))
                }
                UnOp::Deref(_) => match self.reduction_var(e) {
                    Some((_, op)) => reduction_misuse(e, op),
                    None => err(
                        u,
                        "dereferencing is in the kernel language only for reduction variables (`*sum += v`)",
                    ),
                },
                _ => err(u, "this operator is not in the kernel language"),
            },
            SynExpr::Binary(b) => self.binary(b, want),
            SynExpr::Assign(a) => err(a, "an assignment is a statement here, not a value"),
            SynExpr::Cast(c) => {
                let Some(t) = scalar_type(&c.ty) else {
                    return err(
                        &c.ty,
                        "casts to this type are not in the kernel language: cast between its scalars",
                    );
                };
                let v = self.value(&c.expr, None)?;
                if matches!(v.ty, Type::Struct(_) | Type::View { .. }) {
                    return err(&c.expr, "only scalars can be cast");
                }
                if let Some(h) = [Some(t), v.ty.scalar()].into_iter().flatten().find(|t| t.is_half()) {
                    let h = h.rust_name();
                    return err(
                        c,
                        format!("`as` does not convert {h} (Rust has no such cast): `x.to_f32()`, `{h}::from_f32(v)`"),
                    );
                }
                Ok(ex(ExprKind::Cast(Box::new(v), t), Type::Scalar(t), span))
            }
            SynExpr::Index(ix) => {
                let Some(view) = self.view_var(&ix.expr) else {
                    return err(
                        &ix.expr,
                        "indexing is for views (slice parameters and sub-slices): index one by name",
                    );
                };
                if let SynExpr::Range(r) = &*ix.index {
                    return err(r, "a sub-slice is borrowed: write `&x[a..b]`");
                }
                let index = self.value(&ix.index, Some(&Type::Scalar(Ty::Usize)))?;
                let ty = match &self.var(view).ty {
                    Type::View { elem: Elem::Scalar(t), .. } => Type::Scalar(*t),
                    Type::View { elem: Elem::Struct(s), .. } => Type::Struct(s.clone()),
                    _ => unreachable!("a view"),
                };
                Ok(ex(ExprKind::Load { view, index: Box::new(index) }, ty, span))
            }
            SynExpr::Reference(r) => {
                let SynExpr::Index(ix) = &*r.expr else {
                    return err(r, "references are in the kernel language only as sub-slices `&x[a..b]`");
                };
                let Some(view) = self.view_var(&ix.expr) else {
                    return err(&ix.expr, "sub-slices are taken of views (slice parameters and sub-slices)");
                };
                let SynExpr::Range(range) = &*ix.index else {
                    return err(r, "references are in the kernel language only as sub-slices `&x[a..b]`");
                };
                let Type::View { elem, mutable } = self.var(view).ty.clone() else { unreachable!("a view") };
                if r.mutability.is_some() && !mutable {
                    return err(r, "a `&mut` sub-slice is taken of a `&mut` view");
                }
                let usize_t = Type::Scalar(Ty::Usize);
                let start = match &range.start {
                    Some(s) => self.value(s, Some(&usize_t))?,
                    None => ex(ExprKind::Lit(Lit::Int("0".into())), usize_t.clone(), span),
                };
                let end = match &range.end {
                    Some(e) => {
                        let e = self.value(e, Some(&usize_t))?;
                        if matches!(range.limits, RangeLimits::Closed(_)) {
                            let one = ex(ExprKind::Lit(Lit::Int("1".into())), usize_t.clone(), span);
                            ex(
                                ExprKind::Binary(syn::parse_quote!(+), Box::new(e), Box::new(one)),
                                usize_t.clone(),
                                span,
                            )
                        } else {
                            e
                        }
                    }
                    None => ex(ExprKind::Len(view), usize_t.clone(), span),
                };
                let ty = Type::View { elem, mutable: r.mutability.is_some() };
                Ok(ex(ExprKind::Sub { view, start: Box::new(start), end: Box::new(end) }, ty, span))
            }
            SynExpr::Field(f) => {
                let base = self.value(&f.base, None)?;
                if !matches!(base.ty, Type::Struct(_) | Type::Opaque(_)) {
                    return err(&f.base, "field access is for DeviceCopy structs");
                }
                let syn::Member::Named(field) = &f.member else {
                    return err(&f.member, "tuple fields are not in the kernel language: name the field");
                };
                let e = ex(ExprKind::Field { base: Box::new(base), field: field.clone() }, Type::Unit, span);
                let ty = Type::Opaque(Box::new(e.clone()));
                Ok(Expr { ty, ..e })
            }
            SynExpr::MethodCall(m) => self.method(m, want),
            SynExpr::Call(c) => self.call(c, want),
            SynExpr::If(i) => {
                let (Some((_, els)), [SynStmt::Expr(a, None)]) = (&i.else_branch, &i.then_branch.stmts[..])
                else {
                    return err(
                        i,
                        "`if` as a value is in the kernel language only as `if c { a } else { b }`",
                    );
                };
                let b =
                    match &**els {
                        SynExpr::Block(b) => match &b.block.stmts[..] {
                            [SynStmt::Expr(b, None)] => b.clone(),
                            _ => return err(
                                els,
                                "`if` as a value is in the kernel language only as `if c { a } else { b }`",
                            ),
                        },
                        other => other.clone(),
                    };
                let cond = self.value(&i.cond, Some(&Type::Scalar(Ty::Bool)))?;
                let (ea, eb) = self.operands(a, &b, want)?;
                let ty = if ea.ty.is_lit() { eb.ty.clone() } else { ea.ty.clone() };
                Ok(ex(ExprKind::Select(Box::new(cond), Box::new(ea), Box::new(eb)), ty, span))
            }
            SynExpr::Closure(c) => {
                err(c, "closures are not in the kernel language: C has none; write the loop body inline")
            }
            SynExpr::Macro(m) => {
                err(m, "macros are not in the kernel language: they cannot be translated to C")
            }
            SynExpr::Struct(s) => {
                err(s, "struct literals are not in the kernel language: take the struct as a parameter")
            }
            SynExpr::Array(a) => err(a, "arrays are not in the kernel language: use slice arguments"),
            SynExpr::Tuple(t) => err(t, "tuples are not in the kernel language"),
            SynExpr::Range(r) => {
                err(r, "ranges are in the kernel language only as `for` loop bounds and sub-slices")
            }
            SynExpr::Try(t) => err(t, "`?` is not in the kernel language"),
            SynExpr::Match(m) => err(m, "`match` is not in the kernel language: use `if`/`else`"),
            SynExpr::Unsafe(u) => err(u, "unsafe is not in the kernel language: kernels are safe Rust"),
            SynExpr::Async(a) => err(a, "async is not in the kernel language"),
            SynExpr::Await(a) => err(a, "await is not in the kernel language"),
            SynExpr::Block(b) => err(b, "a block as a value is not in the kernel language"),
            other => err(other, "this expression is not in the kernel language"),
        }
    }

    fn binary(&mut self, b: &syn::ExprBinary, want: Option<&Type>) -> syn::Result<Expr> {
        use BinOp::*;
        let span = b.span();
        match b.op {
            Add(_) | Sub(_) | Mul(_) | Div(_) | Rem(_) | BitAnd(_) | BitOr(_) | BitXor(_) => {
                let (l, r) = self.operands(&b.left, &b.right, want)?;
                let ty = result_type(&l.ty, &r.ty);
                Ok(ex(ExprKind::Binary(b.op, Box::new(l), Box::new(r)), ty, span))
            }
            Shl(_) | Shr(_) => {
                let l = self.value(&b.left, want)?;
                let r = self.value(&b.right, None)?;
                let ty = l.ty.clone();
                Ok(ex(ExprKind::Binary(b.op, Box::new(l), Box::new(r)), ty, span))
            }
            And(_) | Or(_) => {
                let bool_t = Type::Scalar(Ty::Bool);
                let l = self.value(&b.left, Some(&bool_t))?;
                let r = self.value(&b.right, Some(&bool_t))?;
                Ok(ex(ExprKind::Binary(b.op, Box::new(l), Box::new(r)), bool_t, span))
            }
            Eq(_) | Lt(_) | Le(_) | Ne(_) | Ge(_) | Gt(_) => {
                let (l, r) = self.operands(&b.left, &b.right, None)?;
                if matches!(l.ty, Type::Struct(_) | Type::View { .. }) {
                    return err(b, for_scalars("comparisons are for scalars", &l.ty));
                }
                Ok(ex(ExprKind::Binary(b.op, Box::new(l), Box::new(r)), Type::Scalar(Ty::Bool), span))
            }
            _ if compound(&b.op).is_some() => {
                err(b, "a compound assignment is a statement here, not a value")
            }
            _ => err(b, "this operator is not in the kernel language"),
        }
    }

    fn method(&mut self, m: &syn::ExprMethodCall, want: Option<&Type>) -> syn::Result<Expr> {
        let span = m.span();
        if let Some(t) = &m.turbofish {
            return err(t, "turbofish is not in the kernel language");
        }
        let name = m.method.to_string();
        if let Some(view) = self.view_var(&m.receiver) {
            if name == "len" && m.args.is_empty() {
                return Ok(ex(ExprKind::Len(view), Type::Scalar(Ty::Usize), span));
            }
            return err(&m.method, "the only method of a view in the kernel language is `len()`");
        }
        let recv = self.value(&m.receiver, want)?;
        let args: Vec<&SynExpr> = m.args.iter().collect();
        self.math(&name, &m.method, recv, &args, span)
    }

    /// Math method `name` on `recv` with `args`.
    fn math(
        &mut self,
        name: &str,
        at: &dyn quote::ToTokens,
        recv: Expr,
        args: &[&SynExpr],
        span: Span,
    ) -> syn::Result<Expr> {
        let rt = recv.ty.clone();
        if let Type::Scalar(h) = rt {
            if h.is_half() {
                return half_conversion(name, at, recv, args, span);
            }
        }
        let (math, arity) = match &rt {
            Type::Scalar(t) if t.is_float() => match FLOAT_METHODS.iter().find(|(n, _)| *n == name) {
                Some(&(n, a)) => (Math::Float(n, a), a),
                None => {
                    return err(
                        at,
                        format!(
                            "the method `{name}` is not in the kernel language: floats have {}",
                            float_method_list()
                        ),
                    )
                }
            },
            Type::Scalar(t) if t.is_int() => match INT_METHODS.iter().find(|(n, _)| *n == name) {
                Some(&("abs", _)) if !t.is_signed() => {
                    return err(at, format!("`abs` on {} is not in the kernel language", t.rust_name()))
                }
                Some(&(n, a)) => (Math::Int(n, a), a),
                None => {
                    return err(
                        at,
                        format!(
                        "`{name}` on {} is not in the kernel language: integers have min, max, abs, clamp",
                        t.rust_name()
                    ),
                    )
                }
            },
            Type::Opaque(_) => match FLOAT_METHODS.iter().find(|(n, _)| *n == name) {
                // Overloaded helpers in C pick the float or integer version.
                Some(&(n, a)) => (Math::Float(n, a), a),
                // A device function's or a constant's value: its type is rustc's alone here.
                None if name == "to_f32" || name == "to_f64" => {
                    return err(
                        at,
                        format!(
                            "`{name}` converts a bf16 or f16 the kernel knows as one: bind the value to a typed local \
                             first (`let v: bf16 = f(x); v.{name}()`)"
                        ),
                    )
                }
                None => return err(at, format!("the method `{name}` is not in the kernel language")),
            },
            Type::IntLit | Type::FloatLit => {
                return Err(syn::Error::new(
                    span,
                    "offload::kernel: give this literal a suffix (`2.0f32`) so the kernel knows its type",
                ))
            }
            _ => return err(at, format!("`{name}` on this value is not in the kernel language")),
        };
        if args.len() != arity {
            return err(at, format!("`{name}` takes {arity} arguments"));
        }
        let mut all = vec![recv];
        for a in args {
            let want = if name == "powi" { Type::Scalar(Ty::I32) } else { rt.clone() };
            all.push(self.value(a, Some(&want))?);
        }
        Ok(ex(ExprKind::Math(math, all), rt, span))
    }

    /// `offload::team_sum(v)` (or product, min, max) as a `let`'s value: a collective every
    /// thread of the team reaches, as a barrier.
    fn team_reduction(&mut self, c: &syn::ExprCall, op: TeamOp, want: Option<&Type>) -> syn::Result<Expr> {
        if !self.teams {
            return err(
                c,
                "a team reduction is in a teams kernel only (`#[offload::kernel(teams = THREADS)]`)",
            );
        }
        let [arg] = &c.args.iter().collect::<Vec<_>>()[..] else {
            return err(c, "a team reduction takes one value: `offload::team_sum(v)`");
        };
        let value = self.value(arg, want)?;
        if !matches!(value.ty, Type::Scalar(t) if t != Ty::Bool && t != Ty::Usize && !t.is_half())
            && !value.ty.is_lit()
        {
            return err(
                arg,
                "a team reduction combines f32, f64, i32, u32, i64 or u64 (a `usize`: `team_sum(v as u64)`; \
                 a bf16 or f16: `team_sum(v.to_f32())`)",
            );
        }
        self.sync_site(c.span(), "a team reduction");
        self.team_reduce.get_or_insert(c.span());
        let ty = value.ty.clone();
        Ok(ex(ExprKind::TeamReduce(op, Box::new(value)), ty, c.span()))
    }

    fn call(&mut self, c: &syn::ExprCall, want: Option<&Type>) -> syn::Result<Expr> {
        let span = c.span();
        if is_offload_fn(&c.func, "team_size") {
            if !self.teams {
                return err(
                    c,
                    "`offload::team_size()` is in teams kernels only (`#[offload::kernel(teams = THREADS)]`)",
                );
            }
            if !c.args.is_empty() {
                return err(c, "`offload::team_size()` takes no arguments");
            }
            return Ok(ex(ExprKind::TeamSize, Type::Scalar(Ty::Usize), span));
        }
        if team_op_of(&c.func).is_some() {
            return err(
                c,
                "a team reduction is a `let`'s value, where a barrier may stand: `let s = offload::team_sum(v);`",
            );
        }
        let SynExpr::Path(p) = &*c.func else {
            return err(
                &c.func,
                "calls are in the kernel language only to `#[offload::device]` functions by name",
            );
        };
        if p.qself.is_some() || p.path.segments.iter().any(|s| !s.arguments.is_empty()) {
            return err(&c.func, "generic or qualified calls are not in the kernel language");
        }
        // `bf16::from_f32(v)` (also through `half::` or `offload::half::`), `f16::to_f32(x)`.
        if let Some((h, name)) = half_function(&p.path) {
            let [x] = &c.args.iter().collect::<Vec<_>>()[..] else {
                return err(c, format!("`{}::{name}` takes one argument", h.rust_name()));
            };
            if name == "from_f32" {
                let v = self.value(x, Some(&Type::Scalar(Ty::F32)))?;
                if !matches!(v.ty, Type::Scalar(Ty::F32) | Type::Opaque(_)) {
                    return err(x, format!("`{}::from_f32` takes an f32", h.rust_name()));
                }
                return Ok(ex(ExprKind::Cast(Box::new(v), h), Type::Scalar(h), span));
            }
            let at = &p.path.segments.last().expect("two segments").ident;
            if name != "to_f32" && name != "to_f64" {
                return Err(half_refusal(h, &name, at));
            }
            let recv = self.value(x, Some(&Type::Scalar(h)))?;
            if !matches!(recv.ty, Type::Scalar(t) if t == h) {
                return err(x, format!("`{}::{name}` takes one {} value", h.rust_name(), h.rust_name()));
            }
            return half_conversion(&name, at, recv, &[], span);
        }
        // `f32::max(a, b)`, `f64::sqrt(x)`: the methods, called as functions.
        if p.path.segments.len() == 2 {
            let first = p.path.segments[0].ident.to_string();
            if let Some(t) = Ty::from_name(&first) {
                let name = p.path.segments[1].ident.to_string();
                let Some(recv) = c.args.first() else {
                    return err(c, format!("`{first}::{name}` takes a receiver"));
                };
                let recv = self.value(recv, Some(&Type::Scalar(t)))?;
                let args: Vec<&SynExpr> = c.args.iter().skip(1).collect();
                return self.math(&name, &p.path.segments[1].ident, recv, &args, span);
            }
        }
        let _ = want;
        // `offload::erf(x)`, `offload::erfc(x)`: CUDA's functions Rust's std lacks.
        for name in ["erf", "erfc"] {
            if is_offload_fn(&c.func, name) && p.path.segments.len() > 1 {
                let [x] = &c.args.iter().collect::<Vec<_>>()[..] else {
                    return err(c, format!("`offload::{name}` takes one argument"));
                };
                let recv = self.value(x, want)?;
                if !matches!(recv.ty, Type::Scalar(Ty::F32 | Ty::F64) | Type::Opaque(_)) {
                    return err(x, format!("`offload::{name}` takes an f32 or an f64"));
                }
                let ty = recv.ty.clone();
                let m = if name == "erf" { Math::Float("erf", 0) } else { Math::Float("erfc", 0) };
                return Ok(ex(ExprKind::Math(m, vec![recv]), ty, span));
            }
        }
        if is_offload_fn(&c.func, "team_local") || is_offload_fn(&c.func, "barrier") {
            return err(
                c,
                "`offload::team_local()` initializes a `let mut x: [T; N]` at the top of a teams kernel; \
                 `offload::barrier()` is a statement of one",
            );
        }
        // `Type::function(..)`: an associated function of a type (not a device function).
        let segs = &p.path.segments;
        if segs
            .iter()
            .take(segs.len() - 1)
            .any(|s| s.ident.to_string().starts_with(|c: char| c.is_ascii_uppercase()))
        {
            return err(
                c,
                "associated functions are not in the kernel language: calls are to `#[offload::device]` functions \
                 and the float types' math (`f32::max(a, b)`)",
            );
        }
        let mut args = Vec::new();
        for a in &c.args {
            let v = self.value(a, None)?;
            args.push(v);
        }
        if !self.calls.iter().any(|q| quote::quote!(#q).to_string() == quote::quote!(#p).to_string()) {
            self.calls.push(p.path.clone());
        }
        let e = ex(ExprKind::Call { path: p.path.clone(), args }, Type::Unit, span);
        let ty = Type::Opaque(Box::new(e.clone()));
        Ok(Expr { ty, ..e })
    }
}

/// Whether `f` names `offload::NAME` (or `NAME` imported from it: any path ending in it
/// whose first segment is `offload`, or the bare name).
/// The operator of a call of `offload::team_sum` (product, min, max), if it is one.
fn team_op_of(f: &SynExpr) -> Option<TeamOp> {
    let SynExpr::Path(p) = f else { return None };
    let name = p.path.segments.last()?.ident.to_string();
    TeamOp::of(&name).filter(|_| is_offload_fn(f, &name))
}

fn is_offload_fn(f: &SynExpr, name: &str) -> bool {
    let SynExpr::Path(p) = f else { return false };
    let segs = &p.path.segments;
    segs.last().is_some_and(|s| s.ident == name) && (segs.len() == 1 || segs[0].ident == "offload")
}

/// The type of `a op b`: the known one of the two.
fn result_type(a: &Type, b: &Type) -> Type {
    match (a, b) {
        (Type::Scalar(_), _) => a.clone(),
        (_, Type::Scalar(_)) => b.clone(),
        (Type::FloatLit, Type::IntLit) | (Type::IntLit, Type::FloatLit) => Type::FloatLit,
        (t, _) if !t.is_lit() => a.clone(),
        _ => b.clone(),
    }
}

/// `e` with every untyped literal in it given type `t`.
pub fn coerce(mut e: Expr, t: &Type) -> Expr {
    if !e.ty.is_lit() {
        return e;
    }
    e.ty = t.clone();
    e.kind = match e.kind {
        ExprKind::Neg(a) => ExprKind::Neg(Box::new(coerce(*a, t))),
        ExprKind::Not(a) => ExprKind::Not(Box::new(coerce(*a, t))),
        ExprKind::Binary(op, a, b) => ExprKind::Binary(op, Box::new(coerce(*a, t)), Box::new(coerce(*b, t))),
        ExprKind::Select(c, a, b) => ExprKind::Select(c, Box::new(coerce(*a, t)), Box::new(coerce(*b, t))),
        k => k,
    };
    e
}

/// `f32::EPSILON`, `f64::consts::PI`, `i32::MAX` and the like: their C text.
fn builtin_const(path: &syn::Path, span: Span) -> Option<Expr> {
    // `bf16::ONE`, `half::f16::MAX`: the constant's bits; the twin names it through `offload`.
    if let Some((t, name)) = half_function(path) {
        let bits = half_const(t, &name)?;
        let (ty, ident) = (t.rust(), syn::Ident::new(&name, span));
        let c = format!("{}{{(unsigned short) 0x{bits:04x}u}}", t.c());
        return Some(ex(
            ExprKind::Builtin { c, rust: syn::parse_quote!(#ty::#ident) },
            Type::Scalar(t),
            span,
        ));
    }
    let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (ty, name) = match segs.as_slice() {
        [t, n] => (*t, *n),
        ["std" | "core", t, n] => (*t, *n),
        [t, "consts", n] => (*t, *n),
        ["std" | "core", t, "consts", n] => (*t, *n),
        _ => return None,
    };
    let t = Ty::from_name(ty)?;
    let c = match t {
        // Rust's own constants' bits, so C's value is exactly Rust's.
        Ty::F32 => f32_const(name).map(|v| format!("__int_as_float(0x{:08x}u)", v.to_bits()))?,
        Ty::F64 => f64_const(name).map(|v| format!("__longlong_as_double(0x{:016x}ull)", v.to_bits()))?,
        _ => {
            let (min, max): (i128, i128) = match t {
                Ty::I32 => (i32::MIN.into(), i32::MAX.into()),
                Ty::U32 => (0, u32::MAX.into()),
                Ty::I64 => (i64::MIN.into(), i64::MAX.into()),
                Ty::U64 | Ty::Usize => (0, u64::MAX.into()),
                _ => return None,
            };
            let v = match name {
                "MIN" => min,
                "MAX" => max,
                "BITS" => {
                    return Some(ex(
                        ExprKind::Builtin { c: format!("{}u", bits(t)), rust: path.clone() },
                        Type::Scalar(Ty::U32),
                        span,
                    ))
                }
                _ => return None,
            };
            let c = if v < 0 { format!("({} - 1)", v + 1) } else { v.to_string() };
            format!(
                "(({}) {c}{})",
                t.c(),
                if matches!(t, Ty::U64 | Ty::Usize | Ty::U32) { "ull" } else { "ll" }
            )
        }
    };
    Some(ex(ExprKind::Builtin { c, rust: path.clone() }, Type::Scalar(t), span))
}

fn bits(t: Ty) -> u32 {
    match t {
        Ty::I32 | Ty::U32 => 32,
        _ => 64,
    }
}

/// `f64_const` and `f32_const`: the named associated constant of the float type.
macro_rules! float_consts {
    ($($f:ident: $t:ident),*) => {$(
        fn $f(name: &str) -> Option<$t> {
            use std::$t::consts as c;
            Some(match name {
                "MAX" => $t::MAX,
                "MIN" => $t::MIN,
                "MIN_POSITIVE" => $t::MIN_POSITIVE,
                "EPSILON" => $t::EPSILON,
                "INFINITY" => $t::INFINITY,
                "NEG_INFINITY" => $t::NEG_INFINITY,
                "NAN" => $t::NAN,
                "PI" => c::PI,
                "TAU" => c::TAU,
                "E" => c::E,
                "SQRT_2" => c::SQRT_2,
                "LN_2" => c::LN_2,
                "LN_10" => c::LN_10,
                "FRAC_PI_2" => c::FRAC_PI_2,
                "FRAC_PI_4" => c::FRAC_PI_4,
                "FRAC_1_PI" => c::FRAC_1_PI,
                "FRAC_2_PI" => c::FRAC_2_PI,
                "FRAC_1_SQRT_2" => c::FRAC_1_SQRT_2,
                "FRAC_2_SQRT_PI" => c::FRAC_2_SQRT_PI,
                "LOG2_E" => c::LOG2_E,
                "LOG10_E" => c::LOG10_E,
                _ => return None,
            })
        }
    )*};
}
float_consts!(f64_const: f64, f32_const: f32);

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

/// The range a `for` walks and how: `a..b` (or `a..=b`), `(a..b).rev()`,
/// `(a..b).step_by(s)`, `(a..b).rev().step_by(s)` or `(a..b).step_by(s).rev()`.
fn range_walk(e: &SynExpr) -> syn::Result<(&syn::ExprRange, Option<&SynExpr>, Order)> {
    fn unparen(e: &SynExpr) -> &SynExpr {
        match e {
            SynExpr::Paren(p) => unparen(&p.expr),
            other => other,
        }
    }
    // One method call on a receiver: `.rev()` or `.step_by(s)`.
    fn call(e: &SynExpr) -> Option<(&SynExpr, &'static str, Option<&SynExpr>)> {
        let SynExpr::MethodCall(m) = e else { return None };
        match (m.method.to_string().as_str(), m.args.len(), m.turbofish.is_none()) {
            ("rev", 0, true) => Some((&m.receiver, "rev", None)),
            ("step_by", 1, true) => Some((&m.receiver, "step_by", m.args.first())),
            _ => None,
        }
    }
    let refused = || {
        err(
            e,
            "iterators are not in the kernel language: loop over a range `a..b` or `a..=b`, optionally \
             `.rev()`, `.step_by(s)` or both",
        )
    };
    fn range(e: &SynExpr) -> Option<&syn::ExprRange> {
        match unparen(e) {
            SynExpr::Range(r) => Some(r),
            _ => None,
        }
    }
    let found = match call(unparen(e)) {
        None => range(e).map(|r| (r, None, Order::Up)),
        Some((inner, "rev", _)) => match call(unparen(inner)) {
            None => range(inner).map(|r| (r, None, Order::Down)),
            Some((inner, "step_by", s)) => range(inner).map(|r| (r, s, Order::UpReversed)),
            Some(_) => None,
        },
        Some((inner, _, s)) => match call(unparen(inner)) {
            None => range(inner).map(|r| (r, s, Order::Up)),
            Some((inner, "rev", None)) => range(inner).map(|r| (r, s, Order::Down)),
            Some(_) => None,
        },
    };
    match found {
        Some(f) => Ok(f),
        None => refused(),
    }
}

/// `what` (an error for a value that is not a scalar), with a hint when the value's type is
/// a one-word name the macro took for a struct: it may be an alias of a scalar type, which
/// the macro cannot see through unless told.
fn for_scalars(what: &str, t: &Type) -> String {
    match t {
        Type::Struct(s) if s.path.segments.len() == 1 => format!(
            "{what}: `{n}` is read as a struct, since the macro does not know the name; if it is an alias of \
             a scalar type (`type {n} = f32;`), tell the macro: `#[offload::kernel(types({n} = f32))]` (or \
             `#[offload::device(types(..))]`)",
            n = s.c_name
        ),
        _ => what.to_string(),
    }
}

/// CUDA's static shared memory per block, which team-local arrays share.
pub const SHARED_BYTES: u64 = 48 * 1024;

/// The error of a team-local array past [`SHARED_BYTES`].
pub const TEAM_LOCAL_TOO_LARGE: &str =
    "a team-local array holds at most 48 KiB (a GPU block's static shared memory)";

/// Whether `e` reads only literals and constants outside the body.
fn is_constant(e: &Expr, vars: &[Var]) -> bool {
    let mut constant = true;
    crate::ir::walk_expr(e, &mut |x| {
        if let ExprKind::Var(v) = &x.kind {
            constant &= matches!(vars[*v].role, Role::Const(_));
        }
    });
    constant
}

/// Refuses a literal (`e`) that would take 16-bit float type `t`: Rust has no such
/// literals, and a conversion says where the rounding happens.
fn no_half_literal(e: &dyn quote::ToTokens, t: &Type) -> syn::Result<()> {
    match t {
        Type::Scalar(h) if h.is_half() => {
            let h = h.rust_name();
            err(
                e,
                format!(
                    "{h} has no literals: `{h}::from_f32(2.0)`, or compute in f32 (`x.to_f32() * 2.0`) \
                     and convert once"
                ),
            )
        }
        _ => Ok(()),
    }
}

/// `bf16::NAME` or `f16::NAME` as a function path (`bf16::from_f32`, also written
/// `half::bf16::...` or `offload::half::bf16::...`): the type and NAME.
fn half_function(path: &syn::Path) -> Option<(Ty, String)> {
    let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (t, name) = match segs.as_slice() {
        [t, n] | ["half", t, n] | ["offload", "half", t, n] => (*t, *n),
        _ => return None,
    };
    let t = Ty::from_name(t).filter(|t| t.is_half())?;
    Some((t, name.to_string()))
}

/// Why `name` of 16-bit float type `h` is not in the language, and what to write instead.
fn half_refusal(h: Ty, name: &str, at: &dyn quote::ToTokens) -> syn::Error {
    let h = h.rust_name();
    let why = if name == "from_f64" {
        format!(
            "`{h}::from_f64` is not in the kernel language: `{h}::from_f32(v as f32)` rounds the same way on every \
             backend"
        )
    } else {
        format!(
            "`{name}` on {h} is not in the kernel language: a {h} converts (`.to_f32()`, `.to_f64()`, \
             `{h}::from_f32(v)`) and has the arithmetic operators; compute the rest in f32"
        )
    };
    syn::Error::new_spanned(at, format!("offload::kernel: {why}"))
}

/// What a 16-bit float (`recv`) offers in a kernel: `to_f32()` and `to_f64()`, exact on
/// every backend; arithmetic goes through f32 (its operators, or explicitly).
fn half_conversion(
    name: &str,
    at: &dyn quote::ToTokens,
    recv: Expr,
    args: &[&SynExpr],
    span: Span,
) -> syn::Result<Expr> {
    let to = match name {
        "to_f32" => Ty::F32,
        "to_f64" => Ty::F64,
        _ => return Err(half_refusal(recv.ty.scalar().unwrap_or(Ty::Bf16), name, at)),
    };
    if !args.is_empty() {
        return err(at, format!("`{name}` takes no arguments"));
    }
    Ok(ex(ExprKind::Cast(Box::new(recv), to), Type::Scalar(to), span))
}

/// The bits of `half`'s associated constant `name` of 16-bit float type `t` (those of
/// half 2.7; the kernel tests compare each with the crate's own).
fn half_const(t: Ty, name: &str) -> Option<u16> {
    const BF16: &[(&str, u16)] = &[
        ("ZERO", 0x0000),
        ("NEG_ZERO", 0x8000),
        ("ONE", 0x3f80),
        ("NEG_ONE", 0xbf80),
        ("MAX", 0x7f7f),
        ("MIN", 0xff7f),
        ("MIN_POSITIVE", 0x0080),
        ("MIN_POSITIVE_SUBNORMAL", 0x0001),
        ("MAX_SUBNORMAL", 0x007f),
        ("EPSILON", 0x3c00),
        ("INFINITY", 0x7f80),
        ("NEG_INFINITY", 0xff80),
        ("NAN", 0x7fc0),
    ];
    const F16: &[(&str, u16)] = &[
        ("ZERO", 0x0000),
        ("NEG_ZERO", 0x8000),
        ("ONE", 0x3c00),
        ("NEG_ONE", 0xbc00),
        ("MAX", 0x7bff),
        ("MIN", 0xfbff),
        ("MIN_POSITIVE", 0x0400),
        ("MIN_POSITIVE_SUBNORMAL", 0x0001),
        ("MAX_SUBNORMAL", 0x03ff),
        ("EPSILON", 0x1400),
        ("INFINITY", 0x7c00),
        ("NEG_INFINITY", 0xfc00),
        ("NAN", 0x7e00),
    ];
    let table = if t == Ty::Bf16 { BF16 } else { F16 };
    table.iter().find(|(n, _)| *n == name).map(|&(_, b)| b)
}
