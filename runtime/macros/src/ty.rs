//! The kernel language's scalar types and reduction operators.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::{Ident, Type};

/// A scalar type of the kernel language.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    F32,
    F64,
    I32,
    U32,
    I64,
    U64,
    Usize,
    Bool,
    /// `half::bf16`: stored in 16 bits, computed in f32 and rounded back at each operation.
    Bf16,
    /// `half::f16`: as [`Ty::Bf16`], IEEE binary16.
    F16,
}

impl Ty {
    /// The type named `s` (a Rust type name or literal suffix).
    pub fn from_name(s: &str) -> Option<Ty> {
        Some(match s {
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "i32" => Ty::I32,
            "u32" => Ty::U32,
            "i64" => Ty::I64,
            "u64" => Ty::U64,
            "usize" => Ty::Usize,
            "bool" => Ty::Bool,
            "bf16" => Ty::Bf16,
            "f16" => Ty::F16,
            _ => return None,
        })
    }

    /// The C type (CUDA and HIP alike).
    pub fn c(self) -> &'static str {
        match self {
            Ty::F32 => "float",
            Ty::F64 => "double",
            Ty::I32 => "int",
            Ty::U32 => "unsigned int",
            Ty::I64 => "long long",
            Ty::U64 | Ty::Usize => "unsigned long long",
            Ty::Bool => "bool",
            Ty::Bf16 => "offload_bf16",
            Ty::F16 => "offload_f16",
        }
    }

    /// Bytes of a value in device memory (`usize` is 64-bit there).
    pub fn bytes(self) -> u64 {
        match self {
            Ty::F64 | Ty::I64 | Ty::U64 | Ty::Usize => 8,
            Ty::F32 | Ty::I32 | Ty::U32 => 4,
            Ty::Bf16 | Ty::F16 => 2,
            Ty::Bool => 1,
        }
    }

    /// The Rust type name.
    pub fn rust_name(self) -> &'static str {
        match self {
            Ty::F32 => "f32",
            Ty::F64 => "f64",
            Ty::I32 => "i32",
            Ty::U32 => "u32",
            Ty::I64 => "i64",
            Ty::U64 => "u64",
            Ty::Usize => "usize",
            Ty::Bool => "bool",
            Ty::Bf16 => "bf16",
            Ty::F16 => "f16",
        }
    }

    /// The Rust type, as tokens (the 16-bit floats by their path through `offload`, which
    /// re-exports `half`: the generated module does not see the caller's imports).
    pub fn rust(self) -> TokenStream {
        match self {
            Ty::Bf16 => quote::quote!(::offload::half::bf16),
            Ty::F16 => quote::quote!(::offload::half::f16),
            _ => Ident::new(self.rust_name(), Span::call_site()).into_token_stream(),
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Ty::F32 | Ty::F64)
    }

    pub fn is_int(self) -> bool {
        !self.is_float() && !self.is_half() && self != Ty::Bool
    }

    /// `bf16` or `f16`: a storage type whose values convert to and from f32
    /// (`.to_f32()`, `bf16::from_f32(v)`) and whose operators compute in f32.
    pub fn is_half(self) -> bool {
        matches!(self, Ty::Bf16 | Ty::F16)
    }

    pub fn is_signed(self) -> bool {
        matches!(self, Ty::I32 | Ty::I64 | Ty::F32 | Ty::F64 | Ty::Bf16 | Ty::F16)
    }
}

/// The scalar type written as `ty`, if it is one.
pub fn scalar_type(ty: &Type) -> Option<Ty> {
    match ty {
        Type::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
            let seg = &p.path.segments[0];
            if seg.arguments.is_empty() {
                Ty::from_name(&seg.ident.to_string())
            } else {
                None
            }
        }
        Type::Paren(p) => scalar_type(&p.elem),
        Type::Group(g) => scalar_type(&g.elem),
        _ => None,
    }
}

/// The operator of a reduction (`reduction(+: x)`, `reduction(min: x)`, `reduction(max: x)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedOp {
    Add,
    Min,
    Max,
}

impl RedOp {
    /// As written in `reduction(OP: ...)`.
    pub fn text(self) -> &'static str {
        match self {
            RedOp::Add => "+",
            RedOp::Min => "min",
            RedOp::Max => "max",
        }
    }

    /// The C functor of the prelude that combines two values.
    pub fn c_functor(self) -> &'static str {
        match self {
            RedOp::Add => "offload_op_add()",
            RedOp::Min => "offload_op_min()",
            RedOp::Max => "offload_op_max()",
        }
    }

    /// The value that leaves any other unchanged, as C text of type `t`.
    pub fn c_identity(self, t: Ty) -> &'static str {
        match (self, t) {
            (RedOp::Add, Ty::F32) => "0.0f",
            (RedOp::Add, Ty::F64) => "0.0",
            (RedOp::Add, Ty::I64) => "0ll",
            (RedOp::Add, Ty::U64) => "0ull",
            (RedOp::Add, Ty::U32) => "0u",
            (RedOp::Add, _) => "0",
            (RedOp::Min, Ty::F32) => "__int_as_float(0x7f800000)",
            (RedOp::Min, Ty::F64) => "__longlong_as_double(0x7ff0000000000000ll)",
            (RedOp::Min, Ty::I32) => "2147483647",
            (RedOp::Min, Ty::U32) => "4294967295u",
            (RedOp::Min, Ty::I64) => "9223372036854775807ll",
            (RedOp::Min, _) => "18446744073709551615ull",
            (RedOp::Max, Ty::F32) => "__int_as_float(0xff800000)",
            (RedOp::Max, Ty::F64) => "__longlong_as_double(0xfff0000000000000ull)",
            (RedOp::Max, Ty::I32) => "(-2147483647 - 1)",
            (RedOp::Max, Ty::I64) => "(-9223372036854775807ll - 1ll)",
            (RedOp::Max, _) => "0u",
        }
    }
}

/// The element types a reduction may have.
pub fn reducible(t: Ty) -> bool {
    matches!(t, Ty::F32 | Ty::F64 | Ty::I32 | Ty::U32 | Ty::I64 | Ty::U64)
}
