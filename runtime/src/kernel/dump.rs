//! `OFFLOAD_DUMP_KERNELS=dir` ([`crate::RuntimeBuilder::dump_kernels`]): the CUDA and HIP
//! source of every kernel, written to `dir` at the kernel's first launch on any device (a
//! host device included), as libomptarget's `-save-temps` keeps what it compiled. A
//! generated kernel's source is what NVRTC (or hiprtc) compiles for it: to read what the
//! kernel compiler made of a loop body without a GPU.
//!
//! Each kernel is written once per runtime, under its symbol: `<symbol>.cu` and
//! `<symbol>.hip` (a generated kernel's checked variant has a symbol of its own; its
//! variant with 32-bit index arithmetic, [`Kernel::narrow_variant`], is written beside
//! it). A kernel with neither source (a host-only [`Kernel`]) writes nothing.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::kernel::Kernel;

/// The folder kernels' sources are written to, and the symbols written so far.
#[derive(Debug)]
pub(crate) struct KernelDump {
    dir: PathBuf,
    written: Mutex<HashSet<&'static str>>,
}

impl KernelDump {
    /// Dumps into `dir`, created now (with its parents) when missing: a folder that cannot
    /// be made fails the runtime's start, not a launch.
    pub(crate) fn new(dir: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&dir).map_err(|e| failed(&dir, &e))?;
        Ok(Self { dir, written: Mutex::new(HashSet::new()) })
    }

    /// Writes `kernel`'s sources, the first time it is launched. A kernel is marked written
    /// only once its files are: a failed write is the launch's error, and the next launch
    /// tries again.
    pub(crate) fn first_launch(&self, kernel: &Kernel) -> Result<()> {
        if let Some(narrow) = kernel.narrow_variant() {
            self.write(narrow)?;
        }
        self.write(kernel)
    }

    /// Writes `kernel`'s sources unless they were.
    fn write(&self, kernel: &Kernel) -> Result<()> {
        let symbol = kernel.symbol();
        let mut written = self.written.lock();
        if written.contains(symbol) {
            return Ok(());
        }
        let file: String =
            symbol.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
        for (source, ext) in [(kernel.cuda_source().map(Into::into), "cu"), (kernel.hip_source(), "hip")] {
            if let Some(text) = source {
                let path = self.dir.join(format!("{file}.{ext}"));
                std::fs::write(&path, text.as_bytes()).map_err(|e| failed(&path, &e))?;
            }
        }
        written.insert(symbol);
        Ok(())
    }
}

fn failed(path: &Path, e: &std::io::Error) -> Error {
    Error::InvalidSetting {
        var: "OFFLOAD_DUMP_KERNELS",
        value: path.display().to_string(),
        expected: match e.kind() {
            std::io::ErrorKind::PermissionDenied => {
                "a folder the program may write kernels' sources into (permission denied)"
            }
            _ => "a folder the runtime can create and write kernels' sources into",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BOTH: Kernel = Kernel::new("both").with_cuda("// cuda").with_hip("// hip");
    static HOST_ONLY: Kernel = Kernel::new("host_only");
    static NARROW: Kernel = Kernel::new("wide").with_symbol("wide__offload_narrow").with_cuda("// narrow");
    static WIDE: Kernel = Kernel::new("wide").with_cuda("// wide").with_narrow(&NARROW);

    #[test]
    fn a_kernels_narrow_variant_is_written_beside_it() {
        let dir = std::env::temp_dir().join(format!("offload-dump-narrow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let dump = KernelDump::new(dir.clone()).unwrap();
        dump.first_launch(&WIDE).unwrap();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        assert_eq!(read("wide.cu").as_deref(), Some("// wide"));
        assert_eq!(read("wide__offload_narrow.cu").as_deref(), Some("// narrow"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn each_kernel_is_written_once_with_each_source_it_has() {
        let dir = std::env::temp_dir().join(format!("offload-dump-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let dump = KernelDump::new(dir.join("nested")).unwrap();
        dump.first_launch(&BOTH).unwrap();
        dump.first_launch(&HOST_ONLY).unwrap();
        let read = |f: &str| std::fs::read_to_string(dir.join("nested").join(f)).ok();
        assert_eq!(read("both.cu").as_deref(), Some("// cuda"));
        assert_eq!(read("both.hip").as_deref(), Some("// hip"));
        assert_eq!(
            std::fs::read_dir(dir.join("nested")).unwrap().count(),
            2,
            "a host-only kernel writes nothing"
        );
        // Written once: a file changed since is left as it is.
        std::fs::write(dir.join("nested/both.cu"), "changed").unwrap();
        dump.first_launch(&BOTH).unwrap();
        assert_eq!(read("both.cu").as_deref(), Some("changed"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_folder_that_cannot_be_made_is_an_error_naming_the_variable_and_path() {
        let file = std::env::temp_dir().join(format!("offload-dump-file-{}", std::process::id()));
        std::fs::write(&file, "").unwrap();
        let e = KernelDump::new(file.join("sub")).unwrap_err();
        std::fs::remove_file(&file).unwrap();
        let text = e.to_string();
        assert!(text.contains("OFFLOAD_DUMP_KERNELS") && text.contains("offload-dump-file-"), "{text}");
    }
}
