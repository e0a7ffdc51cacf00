//! A generated kernel's source as the compiler assembles it at compile time: text and
//! constants' C declarations ([`c_const`]) joined into one `&'static str`.

/// A piece of a generated kernel's source: text, or a constant's declaration that rustc
/// wrote at compile time.
#[derive(Clone, Copy, Debug)]
pub enum SourcePart {
    /// Text as it is.
    Text(&'static str),
    /// A constant's C declaration (see [`c_const`]).
    Const(CConst),
}

/// Bytes of a [`CConst`]'s text at most.
const CCONST_BYTES: usize = 192;

/// The C declaration of a constant: `const TYPE NAME = VALUE;`, the value written as its
/// bits (so a float is exactly Rust's).
#[derive(Clone, Copy, Debug)]
pub struct CConst {
    bytes: [u8; CCONST_BYTES],
    len: usize,
}

/// The kernel language's scalar types, as constants in C.
pub trait KernelConst: Copy {
    /// The C type.
    const C_TYPE: &'static str;
    /// How the value's bits are written: 0 an integer, 1 an `f32`, 2 an `f64`, 3 a `bool`.
    const KIND: u8;
}

macro_rules! kernel_const {
    ($($t:ty => $c:literal, $k:literal;)*) => {$(
        impl KernelConst for $t {
            const C_TYPE: &'static str = $c;
            const KIND: u8 = $k;
        }
    )*};
}
kernel_const! {
    f32 => "float", 1;
    f64 => "double", 2;
    i32 => "int", 0;
    u32 => "unsigned int", 0;
    i64 => "long long", 0;
    u64 => "unsigned long long", 0;
    usize => "unsigned long long", 0;
    bool => "bool", 3;
}

/// Reinterprets a value of at most 8 bytes as bits, at compile time.
#[repr(C)]
union Pun<T: Copy> {
    value: T,
    bytes: [u8; 8],
}

const fn push(out: &mut [u8; CCONST_BYTES], at: &mut usize, s: &[u8]) {
    let mut i = 0;
    while i < s.len() {
        assert!(
            *at < CCONST_BYTES,
            "c_const: the declaration is too long (a constant's name of ~150 bytes?)"
        );
        out[*at] = s[i];
        *at += 1;
        i += 1;
    }
}

/// `const TYPE name = VALUE;` for constant `value` of a kernel body, at compile time.
pub const fn c_const<T: KernelConst>(name: &str, value: T) -> CConst {
    assert!(std::mem::size_of::<T>() <= 8, "c_const: a scalar of at most 8 bytes");
    let mut pun = Pun { bytes: [0; 8] };
    pun.value = value;
    // SAFETY: every byte of the union was written (zeros, then the value over its first
    // bytes); a byte array accepts any.
    let bits = u64::from_ne_bytes(unsafe { pun.bytes });
    let mut out = [0u8; CCONST_BYTES];
    let mut at = 0;
    push(&mut out, &mut at, b"const ");
    push(&mut out, &mut at, T::C_TYPE.as_bytes());
    push(&mut out, &mut at, b" ");
    push(&mut out, &mut at, name.as_bytes());
    push(&mut out, &mut at, b" = ");
    let (head, digits, tail): (&[u8], usize, &[u8]) = match T::KIND {
        1 => (b"__int_as_float(0x", 8, b"u)"),
        2 => (b"__longlong_as_double(0x", 16, b"ull)"),
        3 => (if bits & 0xff != 0 { b"true" } else { b"false" }, 0, b""),
        _ => (b"(", 0, b""),
    };
    push(&mut out, &mut at, head);
    if T::KIND == 0 {
        push(&mut out, &mut at, T::C_TYPE.as_bytes());
        push(&mut out, &mut at, b") 0x");
    }
    let n = if T::KIND == 0 { 2 * std::mem::size_of::<T>() } else { digits };
    let mut k = n;
    while k > 0 {
        k -= 1;
        let nibble = ((bits >> (4 * k)) & 0xf) as u8;
        let c = if nibble < 10 { b'0' + nibble } else { b'a' + nibble - 10 };
        push(&mut out, &mut at, &[c]);
    }
    if T::KIND == 0 {
        push(&mut out, &mut at, b"ull");
    }
    push(&mut out, &mut at, tail);
    push(&mut out, &mut at, b";\n");
    CConst { bytes: out, len: at }
}

/// The total length of `parts`.
pub const fn source_len(parts: &[SourcePart]) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < parts.len() {
        n += match parts[i] {
            SourcePart::Text(t) => t.len(),
            SourcePart::Const(c) => c.len,
        };
        i += 1;
    }
    n
}

/// `parts` one after the other (`N` must be [`source_len`] of them), at compile time.
pub const fn source_bytes<const N: usize>(parts: &[SourcePart]) -> [u8; N] {
    let mut out = [0u8; N];
    let mut at = 0;
    let mut i = 0;
    while i < parts.len() {
        let (b, len): (&[u8], usize) = match &parts[i] {
            SourcePart::Text(t) => (t.as_bytes(), t.len()),
            SourcePart::Const(c) => (&c.bytes, c.len),
        };
        let mut j = 0;
        while j < len {
            out[at] = b[j];
            at += 1;
            j += 1;
        }
        i += 1;
    }
    assert!(at == N, "source_bytes: N is not the parts' total length");
    out
}

/// `bytes` (a [`source_bytes`] of strings) as a `str`.
pub const fn utf8(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(_) => panic!("generated source is not UTF-8"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARTS: &[SourcePart] = &[
        SourcePart::Text("__device__ "),
        SourcePart::Const(c_const("DT", 0.5f32)),
        SourcePart::Const(c_const("N", -2i32)),
        SourcePart::Const(c_const("B", true)),
        SourcePart::Const(c_const("X", 1.0f64)),
        SourcePart::Text("ü"),
    ];
    const BYTES: [u8; source_len(PARTS)] = source_bytes(PARTS);

    #[test]
    fn sources_and_constants_concatenate_at_compile_time() {
        const S: &str = utf8(&BYTES);
        assert_eq!(
            S,
            "__device__ const float DT = __int_as_float(0x3f000000u);\nconst int N = (int) 0xfffffffeull;\n\
             const bool B = true;\nconst double X = __longlong_as_double(0x3ff0000000000000ull);\nü"
        );
    }
}
