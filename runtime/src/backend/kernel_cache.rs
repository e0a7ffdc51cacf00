//! Compiled kernels kept on disk, so that a machine compiles each kernel once.
//!
//! A GPU backend compiles a kernel's source for the device's architecture on its first
//! launch in a process (NVRTC straight to a cubin on CUDA devices). The code it gets is
//! also written here, under a key made of everything that decides it: the backend, the
//! compiler and its version, the architecture, the compile options, the program name and
//! the source text (SHA-256 over each, length-prefixed). A later process that launches
//! the same kernel on the same kind of device loads the stored code instead of compiling.
//!
//! # Where
//!
//! `OFFLOAD_KERNEL_CACHE`, read once per process from its environment:
//!
//! | value | cache |
//! | --- | --- |
//! | unset or empty | `$XDG_CACHE_HOME/offload/kernels` (an absolute `XDG_CACHE_HOME`), else `$HOME/.cache/offload/kernels` |
//! | `off`, `0`, `false` or `none` | none: every process compiles its kernels |
//! | anything else | that directory |
//!
//! [`location`] says which directory this process uses (`None`: none).
//!
//! # Safety against other processes and other users
//!
//! The cache holds code the GPU will run, so what it loads must be what this user stored:
//!
//! - the directory is created private to the user (mode 0700, with any missing parent);
//!   an existing one that is not a directory, not owned by the effective user, or
//!   writable by its group or by others is refused: nothing is read from it or written
//!   to it, and every kernel is compiled;
//! - an entry is loaded only when it is a regular file (not a link) owned by the user and
//!   writable by no one else, and its header (magic, format version, key, payload length,
//!   SHA-256 of the payload) matches the key asked for and the payload that follows, to
//!   the byte count; anything else (a flipped byte, a truncated or extended file, another
//!   kernel's entry under this name) is ignored, the kernel compiled, and the entry
//!   replaced;
//! - an entry is written to a fresh temporary file (mode 0600) in the same directory,
//!   flushed to the disk and renamed over the entry's name, so that a concurrent reader
//!   in another process sees the old entry, the new one or none, never a part.
//!
//! A failure of the cache (a refused directory, an unreadable entry, a full disk) never
//! fails a launch: the kernel is compiled as without a cache. Each lookup is an `offload`
//! trace event of bit `0x10` (launch details), kind `kernel cache`, whose line says `hit`,
//! `miss`, `ignored (why)` or `not stored (why)`.
//!
//! Temporary files left by a process killed between its write and its rename (named
//! `.<key>.<pid>.<n>.tmp`) are never read; deleting the directory empties the cache.

#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::info::InfoFlags;

/// The variable that moves or disables the cache.
pub const ENV_VAR: &str = "OFFLOAD_KERNEL_CACHE";

/// The first bytes of every entry.
const MAGIC: [u8; 8] = *b"OFLDKRN\0";
/// The entry format; an entry of another version is ignored (and replaced).
const FORMAT_VERSION: u32 = 1;
/// Magic, version, key, payload length, payload checksum.
const HEADER_BYTES: usize = 8 + 4 + 32 + 8 + 32;
/// Largest payload read back: a bound on what a bad entry can make the process allocate.
const MAX_PAYLOAD: u64 = 256 << 20;
/// The entries' file name extension.
const ENTRY_EXTENSION: &str = "kernel";

/// What decides a compiled kernel: every part of its key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelSpec<'a> {
    /// The backend, e.g. `cuda`.
    pub backend: &'a str,
    /// The compiler and its version, e.g. `NVRTC 13.0`.
    pub compiler: &'a str,
    /// The device architecture compiled for, e.g. `sm_90`.
    pub arch: &'a str,
    /// The compiler options, in the order given.
    pub options: &'a [String],
    /// The program's name as given to the compiler.
    pub name: &'a str,
    /// The kernel's source text.
    pub source: &'a str,
}

/// An entry's key: SHA-256 over a domain tag and each part of a [`KernelSpec`], each
/// preceded by its length (so that no two different specs can run together the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key([u8; 32]);

impl Key {
    /// The key of `spec`.
    pub(crate) fn new(spec: &KernelSpec<'_>) -> Self {
        let mut h = Sha256::new();
        let mut part = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        part(b"offload kernel cache key");
        part(spec.backend.as_bytes());
        part(spec.compiler.as_bytes());
        part(spec.arch.as_bytes());
        part(&(spec.options.len() as u64).to_le_bytes());
        for o in spec.options {
            part(o.as_bytes());
        }
        part(spec.name.as_bytes());
        part(spec.source.as_bytes());
        Self(h.finalize().into())
    }

    /// The key in hexadecimal: the entry's file name.
    fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// A sound entry: its payload.
    Hit(Vec<u8>),
    /// No entry.
    Miss,
    /// An entry that must not be loaded, and why.
    Ignored(String),
}

/// A cache directory that passed its checks: owned by the user, writable by no one else.
#[derive(Debug)]
pub(crate) struct DiskCache {
    dir: PathBuf,
    uid: u32,
}

/// The effective user id of this process.
#[cfg(unix)]
fn current_uid() -> u32 {
    // SAFETY: `geteuid` takes no arguments, always succeeds and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// The owner and permission bits of `meta`.
#[cfg(unix)]
fn owner_and_mode(meta: &fs::Metadata) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    Some((meta.uid(), meta.mode() & 0o7777))
}

/// Elsewhere ownership cannot be checked, so nothing passes the checks.
#[cfg(not(unix))]
fn owner_and_mode(_meta: &fs::Metadata) -> Option<(u32, u32)> {
    None
}

#[cfg(not(unix))]
fn current_uid() -> u32 {
    u32::MAX
}

/// Why `meta` (of a file or directory that must be the user's own and writable by no one
/// else) is refused, or `None` when it passes.
fn refusal(meta: &fs::Metadata, uid: u32) -> Option<String> {
    match owner_and_mode(meta) {
        None => Some("file ownership cannot be checked on this system".into()),
        Some((owner, _)) if owner != uid => Some(format!("owned by user id {owner}, not {uid}")),
        Some((_, mode)) if mode & 0o022 != 0 => {
            Some(format!("writable by its group or others (mode {mode:04o})"))
        }
        Some(_) => None,
    }
}

/// A unique suffix for this process's temporary files.
fn temp_suffix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

impl DiskCache {
    /// The cache in `dir`, created (mode 0700, with its missing parents) if it is not
    /// there; `Err` says why it cannot be used.
    pub(crate) fn open(dir: &Path) -> Result<Self, String> {
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        builder.create(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let meta = fs::metadata(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        if !meta.is_dir() {
            return Err(format!("{} is not a directory", dir.display()));
        }
        let uid = current_uid();
        if let Some(why) = refusal(&meta, uid) {
            return Err(format!("{} is {why}", dir.display()));
        }
        Ok(Self { dir: dir.to_path_buf(), uid })
    }

    /// The directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the entry of `key` lives.
    fn entry_path(&self, key: &Key) -> PathBuf {
        self.dir.join(format!("{}.{ENTRY_EXTENSION}", key.hex()))
    }

    /// The payload stored under `key`, if a sound entry holds it.
    pub(crate) fn load(&self, key: &Key) -> Lookup {
        let path = self.entry_path(key);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Lookup::Ignored("the entry is a symbolic link".into())
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Ignored(format!("cannot read the entry: {e}")),
        }
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Ignored(format!("cannot open the entry: {e}")),
        };
        // The checks are made on the file opened, not on the name.
        let meta = match file.metadata() {
            Ok(m) => m,
            Err(e) => return Lookup::Ignored(format!("cannot read the entry: {e}")),
        };
        if !meta.is_file() {
            return Lookup::Ignored("the entry is not a regular file".into());
        }
        if let Some(why) = refusal(&meta, self.uid) {
            return Lookup::Ignored(format!("the entry is {why}"));
        }
        let limit = HEADER_BYTES as u64 + MAX_PAYLOAD;
        if meta.len() > limit {
            return Lookup::Ignored(format!("the entry has {} bytes, more than {limit}", meta.len()));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        if let Err(e) = (&mut file).take(limit + 1).read_to_end(&mut bytes) {
            return Lookup::Ignored(format!("cannot read the entry: {e}"));
        }
        match decode(key, &bytes) {
            Ok(payload) => Lookup::Hit(payload.to_vec()),
            Err(why) => Lookup::Ignored(why),
        }
    }

    /// Stores `payload` under `key`, replacing any entry atomically; `Err` says why not.
    pub(crate) fn store(&self, key: &Key, payload: &[u8]) -> Result<(), String> {
        if payload.len() as u64 > MAX_PAYLOAD {
            return Err(format!("{} bytes is more than an entry may hold", payload.len()));
        }
        let path = self.entry_path(key);
        let temp = self.dir.join(format!(".{}.{}.tmp", key.hex(), temp_suffix()));
        let written = write_new(&temp, &encode(key, payload)).and_then(|()| fs::rename(&temp, &path));
        written.map_err(|e| {
            // Best effort: a temporary file left behind is never read.
            let _ = fs::remove_file(&temp);
            format!("cannot write {}: {e}", path.display())
        })
    }
}

/// Writes `bytes` to a new file at `path` (mode 0600) and flushes it to the disk.
fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// SHA-256 of `bytes`.
fn checksum(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// An entry: the header, then `payload`.
fn encode(key: &Key, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&key.0);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(payload));
    out.extend_from_slice(payload);
    out
}

/// The payload of entry `bytes` when it is a sound entry for `key`; else why not.
fn decode<'a>(key: &Key, bytes: &'a [u8]) -> Result<&'a [u8], String> {
    if bytes.len() < HEADER_BYTES {
        return Err(format!("truncated: {} bytes, shorter than the header", bytes.len()));
    }
    let (header, payload) = bytes.split_at(HEADER_BYTES);
    let (magic, rest) = header.split_at(MAGIC.len());
    if magic != MAGIC {
        return Err("not a kernel cache entry (wrong magic)".into());
    }
    let (version, rest) = rest.split_at(4);
    let version = u32::from_le_bytes(version.try_into().map_err(|_| "bad header")?);
    if version != FORMAT_VERSION {
        return Err(format!("entry format {version}, not {FORMAT_VERSION}"));
    }
    let (recorded_key, rest) = rest.split_at(32);
    if recorded_key != key.0 {
        return Err("the entry records another key".into());
    }
    let (length, sum) = rest.split_at(8);
    let length = u64::from_le_bytes(length.try_into().map_err(|_| "bad header")?);
    if length != payload.len() as u64 {
        return Err(format!("the header records {length} bytes of code, the file holds {}", payload.len()));
    }
    if sum != checksum(payload) {
        return Err("the code fails its recorded checksum".into());
    }
    Ok(payload)
}

/// The cache directory for `OFFLOAD_KERNEL_CACHE` = `value` given the user's
/// `XDG_CACHE_HOME` and `HOME`; `Err` says why there is none.
pub(crate) fn resolve_dir(
    value: Option<&OsStr>,
    xdg_cache_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> Result<PathBuf, String> {
    match value {
        Some(v) if !v.is_empty() => {
            let text = v.to_string_lossy();
            if ["off", "0", "false", "none"].iter().any(|off| text.trim().eq_ignore_ascii_case(off)) {
                return Err(format!("{ENV_VAR}={text}"));
            }
            return Ok(PathBuf::from(v));
        }
        _ => {}
    }
    let base = match (xdg_cache_home.map(Path::new), home.map(Path::new)) {
        // The XDG base directory specification: a relative value is ignored.
        (Some(x), _) if x.is_absolute() => x.to_path_buf(),
        (_, Some(h)) if !h.as_os_str().is_empty() => h.join(".cache"),
        _ => return Err("neither XDG_CACHE_HOME (absolute) nor HOME is set".into()),
    };
    Ok(base.join("offload").join("kernels"))
}

/// The process's cache, opened on first use from its environment; `Err` says why there
/// is none.
fn shared() -> &'static Result<DiskCache, String> {
    static SHARED: OnceLock<Result<DiskCache, String>> = OnceLock::new();
    SHARED.get_or_init(|| {
        let var = |k: &str| std::env::var_os(k);
        let found: Option<OsString> = var(ENV_VAR);
        let opened = resolve_dir(found.as_deref(), var("XDG_CACHE_HOME").as_deref(), var("HOME").as_deref())
            .and_then(|dir| DiskCache::open(&dir));
        if let Err(why) = &opened {
            tracing::debug!(
                target: "offload",
                info = InfoFlags::LAUNCH.bits(),
                kind = "kernel cache",
                "kernel cache off: {why}"
            );
        }
        opened
    })
}

/// The directory this process keeps compiled kernels in (opening it, as the first launch
/// would, if no kernel was compiled yet); `None` when the cache is off or its directory was
/// refused (an `OFFLOAD_INFO=0x10` trace says why).
pub fn location() -> Option<PathBuf> {
    shared().as_ref().ok().map(|c| c.dir().to_path_buf())
}

static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);
static IGNORED: AtomicU64 = AtomicU64::new(0);
static STORED: AtomicU64 = AtomicU64::new(0);
static NOT_STORED: AtomicU64 = AtomicU64::new(0);

/// This process's kernel cache lookups and writes so far (for tests and tuning; not a
/// stable API).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Kernels loaded from the disk instead of compiled.
    pub hits: u64,
    /// Kernels compiled for want of an entry.
    pub misses: u64,
    /// Entries found but refused (and their kernels compiled).
    pub ignored: u64,
    /// Entries written.
    pub stored: u64,
    /// Entries that could not be written.
    pub not_stored: u64,
}

/// This process's [`Stats`] (not a stable API).
#[doc(hidden)]
pub fn stats() -> Stats {
    Stats {
        hits: HITS.load(Ordering::Relaxed),
        misses: MISSES.load(Ordering::Relaxed),
        ignored: IGNORED.load(Ordering::Relaxed),
        stored: STORED.load(Ordering::Relaxed),
        not_stored: NOT_STORED.load(Ordering::Relaxed),
    }
}

/// One `kernel cache` trace line.
fn note(device: usize, kernel: &str, arch: &str, what: &str) {
    tracing::debug!(
        target: "offload",
        info = InfoFlags::LAUNCH.bits(),
        kind = "kernel cache",
        device,
        kernel,
        "device {device}: kernel cache {what}: `{kernel}` for {arch}"
    );
}

/// The stored code for `spec`'s `key` from the process's cache, if it has a sound entry;
/// counts and traces the lookup (`device` names the device in the trace).
pub(crate) fn fetch(device: usize, spec: &KernelSpec<'_>, key: &Key) -> Option<Vec<u8>> {
    let cache = shared().as_ref().ok()?;
    match cache.load(key) {
        Lookup::Hit(code) => {
            HITS.fetch_add(1, Ordering::Relaxed);
            note(device, spec.name, spec.arch, "hit");
            Some(code)
        }
        Lookup::Miss => {
            MISSES.fetch_add(1, Ordering::Relaxed);
            note(device, spec.name, spec.arch, "miss");
            None
        }
        Lookup::Ignored(why) => {
            IGNORED.fetch_add(1, Ordering::Relaxed);
            note(device, spec.name, spec.arch, &format!("ignored ({why})"));
            None
        }
    }
}

/// Keeps `code`, compiled for `spec`, under `key` in the process's cache; a failure is
/// counted and traced, never returned.
pub(crate) fn keep(device: usize, spec: &KernelSpec<'_>, key: &Key, code: &[u8]) {
    let Ok(cache) = shared() else { return };
    match cache.store(key, code) {
        Ok(()) => {
            STORED.fetch_add(1, Ordering::Relaxed);
        }
        Err(why) => {
            NOT_STORED.fetch_add(1, Ordering::Relaxed);
            note(device, spec.name, spec.arch, &format!("not stored ({why})"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary directory, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(what: &str) -> Self {
            let path = std::env::temp_dir().join(format!("offload-kernel-cache-{what}-{}", temp_suffix()));
            let _ = fs::remove_dir_all(&path);
            Self(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn spec(source: &str) -> KernelSpec<'_> {
        KernelSpec {
            backend: "cuda",
            compiler: "NVRTC 13.0",
            arch: "sm_90",
            options: &[],
            name: "saxpy.cu",
            source,
        }
    }

    const SRC: &str = "extern \"C\" __global__ void saxpy() {}";

    fn opened(dir: &TempDir) -> DiskCache {
        DiskCache::open(&dir.0.join("kernels")).expect("a fresh cache directory opens")
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        fs::metadata(path).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0)
    }

    #[cfg(unix)]
    fn set_mode(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn every_part_of_the_spec_changes_the_key() {
        let base = Key::new(&spec(SRC));
        assert_eq!(base, Key::new(&spec(SRC)));
        let opts = ["-G".to_string()];
        let variants = [
            KernelSpec { backend: "hip", ..spec(SRC) },
            KernelSpec { compiler: "NVRTC 13.1", ..spec(SRC) },
            KernelSpec { arch: "sm_80", ..spec(SRC) },
            KernelSpec { options: &opts, ..spec(SRC) },
            KernelSpec { name: "other.cu", ..spec(SRC) },
            spec("extern \"C\" __global__ void saxpy() { }"),
        ];
        for v in &variants {
            assert_ne!(Key::new(v), base, "{v:?}");
        }
        // Lengths keep the parts apart: moving a byte from one part to the next is another key.
        let a = KernelSpec { arch: "sm_9", name: "0saxpy.cu", ..spec(SRC) };
        let b = KernelSpec { arch: "sm_90", name: "saxpy.cu", ..spec(SRC) };
        assert_ne!(Key::new(&a), Key::new(&b));
    }

    #[test]
    fn a_stored_entry_loads_back_and_a_missing_one_is_a_miss() {
        let dir = TempDir::new("store");
        let cache = opened(&dir);
        #[cfg(unix)]
        assert_eq!(mode(cache.dir()), 0o700, "the directory is private to the user");
        let key = Key::new(&spec(SRC));
        assert_eq!(cache.load(&key), Lookup::Miss);
        let code: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        cache.store(&key, &code).expect("store");
        assert_eq!(cache.load(&key), Lookup::Hit(code.clone()));
        #[cfg(unix)]
        assert_eq!(mode(&cache.entry_path(&key)), 0o600);
        // Another key is another entry; an empty payload is an entry too.
        let other = Key::new(&spec("another source"));
        assert_eq!(cache.load(&other), Lookup::Miss);
        cache.store(&other, &[]).expect("store");
        assert_eq!(cache.load(&other), Lookup::Hit(Vec::new()));
        assert_eq!(cache.load(&key), Lookup::Hit(code));
        // Reopening finds what was stored; no temporary file is left.
        let again = opened(&dir);
        assert!(matches!(again.load(&key), Lookup::Hit(_)));
        let left: Vec<_> = fs::read_dir(cache.dir())
            .expect("read_dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_flipped_byte_anywhere_makes_the_entry_ignored_and_a_store_replaces_it() {
        let dir = TempDir::new("flip");
        let cache = opened(&dir);
        let key = Key::new(&spec(SRC));
        let code = b"\x7fELF a cubin, say".to_vec();
        cache.store(&key, &code).expect("store");
        let path = cache.entry_path(&key);
        let good = fs::read(&path).expect("read");
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            fs::write(&path, &bad).expect("write");
            match cache.load(&key) {
                Lookup::Ignored(why) => assert!(!why.is_empty()),
                other => panic!("byte {i} flipped: {other:?}"),
            }
        }
        // The checksum catches a payload byte in particular.
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x80;
        fs::write(&path, &bad).expect("write");
        assert!(matches!(cache.load(&key), Lookup::Ignored(why) if why.contains("checksum")));
        cache.store(&key, &code).expect("store over a bad entry");
        assert_eq!(cache.load(&key), Lookup::Hit(code));
    }

    #[test]
    fn a_truncated_or_extended_entry_is_ignored() {
        let dir = TempDir::new("truncated");
        let cache = opened(&dir);
        let key = Key::new(&spec(SRC));
        let code = vec![0xabu8; 4096];
        cache.store(&key, &code).expect("store");
        let path = cache.entry_path(&key);
        let good = fs::read(&path).expect("read");
        for len in [0, 1, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 1, good.len() - 1] {
            fs::write(&path, &good[..len]).expect("write");
            assert!(matches!(cache.load(&key), Lookup::Ignored(_)), "truncated to {len} bytes");
        }
        let mut longer = good.clone();
        longer.push(0);
        fs::write(&path, &longer).expect("write");
        assert!(matches!(cache.load(&key), Lookup::Ignored(_)), "one byte too many");
    }

    #[test]
    fn an_entry_under_another_keys_name_is_ignored() {
        let dir = TempDir::new("renamed");
        let cache = opened(&dir);
        let (a, b) = (Key::new(&spec("a")), Key::new(&spec("b")));
        cache.store(&a, b"code of a").expect("store");
        fs::copy(cache.entry_path(&a), cache.entry_path(&b)).expect("copy");
        assert!(matches!(cache.load(&b), Lookup::Ignored(why) if why.contains("another key")));
    }

    #[cfg(unix)]
    #[test]
    fn a_directory_writable_by_group_or_others_is_refused() {
        let dir = TempDir::new("dir-mode");
        let path = dir.0.join("kernels");
        let cache = opened(&dir);
        let key = Key::new(&spec(SRC));
        cache.store(&key, b"code").expect("store");
        for m in [0o770, 0o702, 0o777] {
            set_mode(&path, m);
            let e = DiskCache::open(&path).expect_err("refused");
            assert!(e.contains("writable by its group or others"), "{e}");
        }
        // Readable by others but writable by the user alone is accepted.
        set_mode(&path, 0o755);
        assert!(DiskCache::open(&path).is_ok());
        // A file where the directory should be.
        let file = dir.0.join("a-file");
        fs::write(&file, b"").expect("write");
        assert!(DiskCache::open(&file).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn an_entry_writable_by_group_or_others_or_a_link_is_ignored() {
        let dir = TempDir::new("entry-mode");
        let cache = opened(&dir);
        let key = Key::new(&spec(SRC));
        cache.store(&key, b"code").expect("store");
        let path = cache.entry_path(&key);
        for m in [0o620, 0o602, 0o666] {
            set_mode(&path, m);
            assert!(
                matches!(cache.load(&key), Lookup::Ignored(why) if why.contains("writable")),
                "mode {m:o}"
            );
        }
        set_mode(&path, 0o644);
        assert!(matches!(cache.load(&key), Lookup::Hit(_)));
        // A symbolic link to a sound entry is not followed.
        let other = Key::new(&spec("other"));
        std::os::unix::fs::symlink(&path, cache.entry_path(&other)).expect("symlink");
        assert!(matches!(cache.load(&other), Lookup::Ignored(why) if why.contains("link")));
        // A directory under an entry's name is not an entry.
        let third = Key::new(&spec("third"));
        fs::create_dir(cache.entry_path(&third)).expect("mkdir");
        assert!(matches!(cache.load(&third), Lookup::Ignored(_)));
    }

    /// Made only as root (CI runs so): an entry and a directory of another user.
    #[cfg(unix)]
    #[test]
    fn an_entry_or_directory_of_another_user_is_refused() {
        if current_uid() != 0 {
            println!("SKIP files of another user: needs root to make them (uid {})", current_uid());
            return;
        }
        let nobody = 65534;
        let dir = TempDir::new("owner");
        let cache = opened(&dir);
        let key = Key::new(&spec(SRC));
        cache.store(&key, b"code").expect("store");
        let path = cache.entry_path(&key);
        std::os::unix::fs::chown(&path, Some(nobody), None).expect("chown");
        assert!(matches!(cache.load(&key), Lookup::Ignored(why) if why.contains("owned by user id 65534")));
        cache.store(&key, b"code").expect("replaced by the user's own");
        assert_eq!(cache.load(&key), Lookup::Hit(b"code".to_vec()));
        std::os::unix::fs::chown(cache.dir(), Some(nobody), None).expect("chown");
        let e = DiskCache::open(cache.dir()).expect_err("refused");
        assert!(e.contains("owned by user id 65534"), "{e}");
    }

    #[test]
    fn writers_racing_on_one_key_leave_a_sound_entry_and_readers_never_see_a_part() {
        let dir = TempDir::new("race");
        let cache = opened(&dir);
        let key = Key::new(&spec(SRC));
        let code: Vec<u8> = (0..1u32 << 18).map(|i| (i * 7 % 251) as u8).collect();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..8 {
                        cache.store(&key, &code).expect("store");
                    }
                });
            }
            s.spawn(|| {
                for _ in 0..64 {
                    match cache.load(&key) {
                        Lookup::Hit(c) => assert!(c == code, "a hit with other code"),
                        Lookup::Miss => {}
                        Lookup::Ignored(why) => panic!("a reader saw a partial entry: {why}"),
                    }
                }
            });
        });
        assert_eq!(cache.load(&key), Lookup::Hit(code));
        let names: Vec<String> = fs::read_dir(cache.dir())
            .expect("read_dir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [format!("{}.{ENTRY_EXTENSION}", key.hex())]);
    }

    #[test]
    fn the_setting_moves_or_disables_the_cache() {
        let s = |v: Option<&str>, xdg: Option<&str>, home: Option<&str>| {
            resolve_dir(v.map(OsStr::new), xdg.map(OsStr::new), home.map(OsStr::new))
        };
        let home = Some("/home/u");
        assert_eq!(s(None, None, home), Ok(PathBuf::from("/home/u/.cache/offload/kernels")));
        assert_eq!(s(Some(""), None, home), Ok(PathBuf::from("/home/u/.cache/offload/kernels")));
        assert_eq!(s(None, Some("/xdg"), home), Ok(PathBuf::from("/xdg/offload/kernels")));
        // A relative XDG_CACHE_HOME is ignored, as the specification says.
        assert_eq!(s(None, Some("rel"), home), Ok(PathBuf::from("/home/u/.cache/offload/kernels")));
        assert_eq!(s(Some("/srv/k"), Some("/xdg"), home), Ok(PathBuf::from("/srv/k")));
        for off in ["off", "0", "false", "none", "OFF", " off "] {
            let e = s(Some(off), Some("/xdg"), home).expect_err(off);
            assert!(e.contains(ENV_VAR), "{e}");
        }
        assert!(s(None, None, None).is_err());
        assert!(s(None, Some("rel"), Some("")).is_err());
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_no_cache() {
        let dir = TempDir::new("blocked");
        fs::create_dir_all(&dir.0).expect("mkdir");
        let file = dir.0.join("a-file");
        fs::write(&file, b"").expect("write");
        let e = DiskCache::open(&file.join("kernels")).expect_err("refused");
        assert!(e.contains("cannot create"), "{e}");
    }
}
