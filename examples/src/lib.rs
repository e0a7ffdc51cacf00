//! Examples live in the `[[example]]` targets of this package.
