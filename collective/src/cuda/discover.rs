//! Where the CUDA libraries kolo loads at run time are looked for.
//!
//! libcuda comes with the NVIDIA driver and is always opened by its soname through the system
//! loader. libnccl and libnvrtc are looked for, in this order:
//!
//! 1. the file named by `KOLO_NCCL_LIBRARY` / `KOLO_NVRTC_LIBRARY` (`KOLO_CUDA_LIBRARY` for
//!    libcuda), when set;
//! 2. the `nvidia-*` wheels torch installs, under each given `site-packages` directory
//!    (`nvidia/nccl/lib/libnccl.so.2`, `nvidia/cu13/lib/libnvrtc.so.13`,
//!    `nvidia/cuda_nvrtc/lib/libnvrtc.so.12`, ...);
//! 3. the directories of `LD_LIBRARY_PATH`, `$CUDA_HOME/lib64` and the usual system ones;
//! 4. the bare sonames, for the system loader's own search.
//!
//! ```
//! use kolo_collective::cuda::discover::{candidates, Library};
//!
//! let found = candidates(Library::Nccl, &[], |_| None);
//! assert_eq!(found.last().map(String::as_str), Some("libnccl.so"));
//! ```

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The `site-packages` directories searched for the `nvidia-*` wheels (set by the Python
/// package from `site.getsitepackages()` before anything is loaded).
static SITE_PACKAGES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Adds `dirs` to the `site-packages` directories searched (see the module docs); libraries
/// already loaded stay loaded.
pub fn add_site_packages(dirs: &[PathBuf]) {
    let mut known = SITE_PACKAGES.lock().unwrap_or_else(|p| p.into_inner());
    for dir in dirs {
        if !known.contains(dir) {
            known.push(dir.clone());
        }
    }
}

/// The `site-packages` directories searched.
pub fn site_packages() -> Vec<PathBuf> {
    SITE_PACKAGES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// A shared library kolo opens at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Library {
    /// The CUDA driver (`libcuda.so.1`).
    Cuda,
    /// NCCL (`libnccl.so.2`).
    Nccl,
    /// NVRTC, which compiles the pack/unpack kernel (`libnvrtc.so.13`, `.12`, ...).
    Nvrtc,
}

impl Library {
    /// The library's short name (`cuda`, `nccl`, `nvrtc`).
    pub fn name(self) -> &'static str {
        match self {
            Library::Cuda => "cuda",
            Library::Nccl => "nccl",
            Library::Nvrtc => "nvrtc",
        }
    }

    /// The environment variable that names the file to load.
    pub fn env_var(self) -> &'static str {
        match self {
            Library::Cuda => "KOLO_CUDA_LIBRARY",
            Library::Nccl => "KOLO_NCCL_LIBRARY",
            Library::Nvrtc => "KOLO_NVRTC_LIBRARY",
        }
    }

    /// File names, most preferred first.
    pub fn file_names(self) -> &'static [&'static str] {
        match self {
            Library::Cuda => &["libcuda.so.1", "libcuda.so"],
            Library::Nccl => &["libnccl.so.2", "libnccl.so"],
            Library::Nvrtc => &[
                "libnvrtc.so.13",
                "libnvrtc.so.12",
                "libnvrtc.so.11.2",
                "libnvrtc.so",
            ],
        }
    }

    /// Directories inside `site-packages` where the `nvidia-*` wheels put the library.
    fn wheel_dirs(self) -> &'static [&'static str] {
        match self {
            // The driver never comes from a wheel.
            Library::Cuda => &[],
            Library::Nccl => &["nvidia/nccl/lib"],
            Library::Nvrtc => &["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"],
        }
    }
}

/// Directories the system keeps CUDA libraries in (after `LD_LIBRARY_PATH` and `CUDA_HOME`).
const SYSTEM_DIRS: [&str; 6] = [
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib/wsl/lib",
];

/// What to hand `dlopen`, in order: existing files found as described in the module docs,
/// then the bare file names. `env` reads an environment variable (`std::env::var` in use,
/// a map in tests).
pub fn candidates(
    lib: Library,
    site_packages: &[PathBuf],
    env: impl Fn(&str) -> Option<String>,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let push = |p: String, out: &mut Vec<String>| {
        if !out.contains(&p) {
            out.push(p);
        }
    };
    if let Some(explicit) = env(lib.env_var()).filter(|v| !v.is_empty()) {
        push(explicit, &mut out);
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    for sp in site_packages {
        for sub in lib.wheel_dirs() {
            dirs.push(sp.join(sub));
        }
    }
    if lib != Library::Cuda {
        if let Some(paths) = env("LD_LIBRARY_PATH") {
            dirs.extend(
                paths
                    .split(':')
                    .filter(|p| !p.is_empty())
                    .map(PathBuf::from),
            );
        }
        for var in ["CUDA_HOME", "CUDA_PATH"] {
            if let Some(home) = env(var).filter(|v| !v.is_empty()) {
                dirs.push(Path::new(&home).join("lib64"));
            }
        }
        dirs.extend(SYSTEM_DIRS.iter().map(PathBuf::from));
    }
    for dir in &dirs {
        for name in lib.file_names() {
            let path = dir.join(name);
            if path.is_file() {
                push(path.to_string_lossy().into_owned(), &mut out);
            }
        }
    }
    for name in lib.file_names() {
        push((*name).to_owned(), &mut out);
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Searches the repository's virtual environment (`.venv`, where the dev requirements
    /// install torch's nvidia wheels), as the Python package does with its `site-packages`.
    #[cfg_attr(
        not(feature = "cuda"),
        expect(dead_code, reason = "used by the cuda tests")
    )]
    pub(crate) fn use_the_repository_venv() {
        // The run's CARGO_MANIFEST_DIR (cargo sets it) before the build's: cargo reuses a test
        // binary built in a checkout at another path, whose venv may not be this one's.
        let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
        let lib = manifest_dir.join("../.venv/lib");
        let dirs: Vec<PathBuf> = std::fs::read_dir(lib)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path().join("site-packages"))
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default();
        add_site_packages(&dirs);
    }

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }

    #[test]
    fn wheels_come_before_the_system_and_the_env_var_before_all() {
        let tmp = tempfile::tempdir().unwrap();
        let sp = tmp.path().join("site-packages");
        let nccl = sp.join("nvidia/nccl/lib/libnccl.so.2");
        let nvrtc12 = sp.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
        let nvrtc13 = sp.join("nvidia/cu13/lib/libnvrtc.so.13");
        let ld = tmp.path().join("ld");
        let ld_nccl = ld.join("libnccl.so");
        for p in [&nccl, &nvrtc12, &nvrtc13, &ld_nccl] {
            touch(p);
        }
        let mut vars = HashMap::new();
        vars.insert("LD_LIBRARY_PATH", format!("{}::", ld.display()));
        let env = |k: &str| vars.get(k).cloned();
        let found = candidates(Library::Nccl, std::slice::from_ref(&sp), env);
        let s = |p: &Path| p.to_string_lossy().into_owned();
        assert_eq!(found[0], s(&nccl));
        assert_eq!(found[1], s(&ld_nccl));
        assert_eq!(&found[found.len() - 2..], ["libnccl.so.2", "libnccl.so"]);

        let found = candidates(Library::Nvrtc, std::slice::from_ref(&sp), |_| None);
        assert_eq!(found[0], s(&nvrtc13), "CUDA 13 wheels first");
        assert_eq!(found[1], s(&nvrtc12));

        vars.insert("KOLO_NCCL_LIBRARY", "/opt/nccl/libnccl.so.2".into());
        let env = |k: &str| vars.get(k).cloned();
        let found = candidates(Library::Nccl, &[sp], env);
        assert_eq!(found[0], "/opt/nccl/libnccl.so.2");
    }

    #[test]
    fn the_driver_is_left_to_the_system_loader() {
        let tmp = tempfile::tempdir().unwrap();
        touch(&tmp.path().join("libcuda.so.1"));
        let ld = tmp.path().display().to_string();
        let found = candidates(Library::Cuda, &[tmp.path().to_path_buf()], |k| {
            (k == "LD_LIBRARY_PATH").then(|| ld.clone())
        });
        assert_eq!(found, ["libcuda.so.1", "libcuda.so"]);
    }
}
