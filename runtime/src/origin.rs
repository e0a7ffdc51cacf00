//! The construct that queued some work, kept for the error that reports its failure:
//! its name, its kernel and where the program called it. Constructs of every layer make
//! one; the generic device keeps it with the work it queued.

use std::panic::Location;

use crate::error::Error;

/// The construct that queued some work, for the error that reports its failure.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Origin {
    /// "target", "target enter data", ...
    pub construct: &'static str,
    /// The kernel it launched, if it launched one.
    pub kernel: Option<&'static str>,
    /// Where the program called it.
    pub at: &'static Location<'static>,
}

impl Origin {
    /// A construct without a kernel.
    pub(crate) fn new(construct: &'static str, at: &'static Location<'static>) -> Self {
        Self { construct, kernel: None, at }
    }

    /// `e` as the construct itself reports it: the failure of its own queued work, found
    /// by its own copy back, is its plain error (as if it had waited), not a report of an
    /// earlier construct's.
    pub(crate) fn own_failure(&self, e: Error) -> Error {
        match e {
            Error::Queued { construct, at, source, .. }
                if construct == self.construct() && at == self.at() =>
            {
                *source
            }
            e => e,
        }
    }

    /// `e` as this construct returns it on `device`: its own queued failure as its plain
    /// error ([`Origin::own_failure`]), and a device's failure (a driver call, an
    /// allocation) inside [`Error::Construct`], which names the construct and its caller.
    pub(crate) fn failed(&self, device: usize, e: Error) -> Error {
        match self.own_failure(e) {
            e @ (Error::Driver { .. } | Error::OutOfMemory { .. }) => {
                Error::Construct { device, construct: self.construct(), at: self.at(), source: Box::new(e) }
            }
            e => e,
        }
    }

    /// The construct as errors name it: `target (kernel `k`)`.
    pub(crate) fn construct(&self) -> String {
        match self.kernel {
            Some(k) => format!("{} (kernel `{k}`)", self.construct),
            None => self.construct.to_string(),
        }
    }

    /// Where the program called it, as `file:line`.
    pub(crate) fn at(&self) -> String {
        format!("{}:{}", self.at.file(), self.at.line())
    }
}
