//! Opening a library found by [`super::discover`] and taking its symbols.

use libloading::Library as Dl;

use super::discover::{candidates, site_packages, Library};
use crate::error::{Error, Result};

/// An opened library and the file it came from.
#[derive(Debug)]
pub(crate) struct Opened {
    pub lib: Dl,
    pub path: String,
}

/// Opens the first of `lib`'s candidates that loads; the error lists what was tried.
pub(crate) fn open(lib: Library) -> Result<Opened> {
    let tried = candidates(lib, &site_packages(), |k| std::env::var(k).ok());
    let mut failures = Vec::new();
    for path in &tried {
        // SAFETY: loading a CUDA library runs its initializers, which have no preconditions.
        match unsafe { Dl::new(path) } {
            Ok(dl) => {
                return Ok(Opened {
                    lib: dl,
                    path: path.clone(),
                })
            }
            Err(e) => failures.push(format!("{path}: {e}")),
        }
    }
    Err(Error::Cuda(format!(
        "lib{} could not be loaded; tried {}. Install it (pip install nvidia-{}-cu12 or -cu13, \
         which torch's CUDA wheels bring) or point {} at the file",
        lib.name(),
        failures.join("; "),
        lib.name(),
        lib.env_var()
    )))
}

/// Symbol `name` of `opened` as a `T` (a function pointer type).
///
/// # Safety
/// `T` must be the symbol's real type.
pub(crate) unsafe fn symbol<T: Copy>(opened: &Opened, name: &str) -> Result<T> {
    // SAFETY: the caller guarantees `T` is the symbol's type.
    unsafe { opened.lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| {
            Error::Cuda(format!(
                "{} has no symbol {name} ({e}); the library is too old for kolo",
                opened.path
            ))
        })
}
