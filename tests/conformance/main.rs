//! Every case of docs/SEMANTICS.md, run on every device of every backend present.
//! Case numbers in test names follow the document.

mod alloc_memcpy;
mod associate;
mod counts;
mod diagnostics;
mod multi_device;
mod ordering;
mod overlap;
mod present;
mod structured;
mod zero_length;
