//! `#[derive(offload::DeviceCopy)]`: a `#[repr(C)]` struct of the kernel language's
//! scalars (and of such structs) as a kernel parameter and a view's element.

use proc_macro2::TokenStream;
use quote::quote;
use syn::ext::IdentExt;
use syn::{Data, DeriveInput, Fields};

use crate::emit_c::Part;
use crate::signature::struct_type;
use crate::ty::{scalar_type, Ty};

pub fn device_copy(item: TokenStream) -> syn::Result<TokenStream> {
    let d: DeriveInput = syn::parse2(item)?;
    let name = &d.ident;
    let c_name = name.unraw().to_string();
    if !d.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &d.generics,
            "DeviceCopy: generic structs are not supported: name the types",
        ));
    }
    // The items of every `#[repr(...)]`, by name (`packed(2)` and `align(8)` by theirs).
    let mut repr = Vec::new();
    for a in d.attrs.iter().filter(|a| a.path().is_ident("repr")) {
        a.parse_nested_meta(|m| {
            if let Some(id) = m.path.get_ident() {
                repr.push(id.clone());
            }
            if m.input.peek(syn::token::Paren) {
                let _content;
                syn::parenthesized!(_content in m.input);
            }
            Ok(())
        })?;
    }
    if let Some(bad) = repr.iter().find(|i| *i == "packed" || *i == "align") {
        return Err(syn::Error::new_spanned(
            bad,
            "DeviceCopy: `packed` and `align` change the layout from the C struct the GPU's code declares: \
             use plain `#[repr(C)]`",
        ));
    }
    let repr_c = repr.iter().any(|i| i == "C");
    if !repr_c {
        return Err(syn::Error::new_spanned(
            name,
            "DeviceCopy: the struct must be `#[repr(C)]` (the GPU's C code lays it out as C does)",
        ));
    }
    let Data::Struct(s) = &d.data else {
        return Err(syn::Error::new_spanned(
            name,
            "DeviceCopy: only structs (with named fields) can be derived",
        ));
    };
    let Fields::Named(fields) = &s.fields else {
        return Err(syn::Error::new_spanned(&s.fields, "DeviceCopy: the struct's fields are named"));
    };
    if crate::lower::is_reserved(&c_name) {
        return Err(syn::Error::new_spanned(
            name,
            "DeviceCopy: this name is reserved in C; rename the struct",
        ));
    }
    let mut parts = Vec::new();
    let mut decls = Vec::new();
    let mut types = Vec::new();
    let mut scalars = Vec::new();
    for f in &fields.named {
        let fname = f.ident.as_ref().expect("named").unraw().to_string();
        if crate::lower::is_reserved(&fname) {
            return Err(syn::Error::new_spanned(
                &f.ident,
                "DeviceCopy: this field name is reserved in C; rename it",
            ));
        }
        let ty = &f.ty;
        let c = match (scalar_type(ty), struct_type(ty)) {
            (Some(Ty::Bool), _) => {
                return Err(syn::Error::new_spanned(
                    ty,
                    "DeviceCopy: a `bool` field is not supported (not every byte is a bool): use u32",
                ))
            }
            (Some(t), _) if t.is_half() => {
                return Err(syn::Error::new_spanned(
                    ty,
                    "DeviceCopy: a bf16 or f16 field is not supported: keep 16-bit floats in slices (`&[bf16]`) \
                     or store the field as f32",
                ))
            }
            (Some(t), _) => {
                scalars.push((ty.clone(), t.rust()));
                t.c().to_string()
            }
            (None, Some(st)) => {
                parts.push(Part::Struct(st.clone()));
                st.c_name
            }
            _ => {
                return Err(syn::Error::new_spanned(
                    ty,
                    "DeviceCopy: this field type is not supported: f32, f64, i32, u32, i64, u64, usize or another \
                     `#[derive(offload::DeviceCopy)]` struct",
                ))
            }
        };
        decls.push(format!("    {c} {fname};\n"));
        types.push(ty.clone());
    }
    // Guarded by name and content: one struct reached twice is defined once; two structs
    // of one name (from different modules) are both defined, which C refuses, loudly.
    let body = decls.concat();
    let guard = format!("OFFLOAD_STRUCT_{c_name}_{:016x}", crate::emit_c::fingerprint(&body));
    parts.push(Part::Text(format!(
        "#ifndef {guard}\n#define {guard}\nstruct {c_name} {{\n{body}}};\n#endif\n"
    )));
    let mut items = Vec::new();
    let src = crate::expand::source_expr(&parts, &format!("STRUCT_{c_name}"), false, &mut items);
    let too_big = format!(
        "DeviceCopy: `{c_name}` is larger than 512 bytes (a checked launch's out-of-range accesses go to a scratch of \
         that size): pass a view of it instead"
    );
    let msg = format!(
        "DeviceCopy: `{c_name}` has padding between or after its fields (reorder them, largest first, or add explicit \
         fields): padding bytes would be copied to the device unset"
    );
    let assert_fields = types.iter().map(|t| quote!(::offload::__private::assert_kernel_field::<#t>();));
    // A scalar field is known by its written name, which a type alias in scope could give
    // another type: its size and alignment must be the primitive's that the C side uses.
    let alias = format!(
        "DeviceCopy: a field of `{c_name}` is named as a scalar type but is not that primitive (a type alias?): \
         the C struct would differ"
    );
    let assert_scalars = scalars.iter().map(|(t, prim)| {
        quote!(::core::assert!(
            ::core::mem::size_of::<#t>() == ::core::mem::size_of::<::core::primitive::#prim>()
                && ::core::mem::align_of::<#t>() == ::core::mem::align_of::<::core::primitive::#prim>(),
            #alias
        );)
    });
    Ok(quote! {
        const _: () = {
            #(#items)*
            // SAFETY: a `#[repr(C)]` struct of fields that are DeviceCopy (every bit pattern
            // valid, no pointers), with no padding (asserted below): every bit pattern of it
            // is valid too.
            unsafe impl ::offload::DeviceCopy for #name {}
            // SAFETY: `C_SOURCE` declares the same fields, of the same C types, in the same
            // order, in a C struct: the layouts agree (plain `repr(C)`, never `packed` or
            // `align`; each scalar field the size and alignment of its primitive: asserted
            // below).
            unsafe impl ::offload::KernelStruct for #name {
                const C_SOURCE: &'static str = #src;
            }
            #[allow(clippy::all)]
            const _: () = {
                #(#assert_fields)*
                #(#assert_scalars)*
                ::core::assert!(
                    ::core::mem::size_of::<#name>() == 0 #(+ ::core::mem::size_of::<#types>())*,
                    #msg
                );
                ::core::assert!(::core::mem::size_of::<#name>() <= 512, #too_big);
            };
        };
    })
}
