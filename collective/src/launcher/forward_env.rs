//! Which of the launching environment's variables reach the ranks. Like horovodrun, kolorun
//! forwards the whole environment (`HOROVOD_*`, `NCCL_*`, the application's own variables)
//! except the ones that describe the launching shell, session or machine and must not override
//! the rank's own, and secrets (Horovod's list is `horovod/runner/common/util/env.py`
//! `IGNORE_REGEXES`: `BASH_FUNC_*`, `OLDPWD`, `*CUDA_VISIBLE_DEVICES`, its secret key).

/// Never forwarded to any rank: names.
pub const DENIED: [&str; 7] = [
    "HOSTNAME",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "KOLO_JOB_SECRET",
    "HOROVOD_SECRET_KEY",
];
/// Never forwarded to any rank: name prefixes.
pub const DENIED_PREFIXES: [&str; 2] = ["SSH_", "BASH_FUNC_"];
/// Not forwarded to ssh ranks (the remote login sets its own): names.
pub const DENIED_REMOTE: [&str; 7] = [
    "HOME", "USER", "LOGNAME", "MAIL", "SHELL", "TERM", "DISPLAY",
];
/// Not forwarded to ssh ranks: name prefixes (`XDG_*` session paths).
pub const DENIED_REMOTE_PREFIXES: [&str; 1] = ["XDG_"];
/// Not forwarded to ssh ranks: name suffixes (GPU lists are the remote machine's, as in
/// Horovod).
pub const DENIED_REMOTE_SUFFIXES: [&str; 1] = ["CUDA_VISIBLE_DEVICES"];

/// True when `name` is kept from local ranks (they inherit everything else).
pub fn denied_locally(name: &str) -> bool {
    DENIED.contains(&name) || DENIED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// True when `name` is not sent to ssh ranks.
pub fn denied_remotely(name: &str) -> bool {
    denied_locally(name)
        || DENIED_REMOTE.contains(&name)
        || DENIED_REMOTE_PREFIXES.iter().any(|p| name.starts_with(p))
        || DENIED_REMOTE_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// The names in this process's environment that local ranks must not inherit.
pub fn local_removals() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| denied_locally(name))
        .collect()
}

/// The variables of this process's environment sent to ssh ranks (UTF-8, exportable by a POSIX
/// shell, not denied), sorted by name.
pub fn remote_forwarded() -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, _)| super::remote::is_shell_name(name) && !denied_remotely(name))
        .collect();
    vars.sort();
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_lists() {
        for name in [
            "HOSTNAME",
            "PWD",
            "OLDPWD",
            "SHLVL",
            "_",
            "SSH_CLIENT",
            "BASH_FUNC_x%%",
        ] {
            assert!(denied_locally(name) && denied_remotely(name), "{name}");
        }
        for name in [
            "HOME",
            "USER",
            "XDG_RUNTIME_DIR",
            "CUDA_VISIBLE_DEVICES",
            "X_CUDA_VISIBLE_DEVICES",
        ] {
            assert!(!denied_locally(name) && denied_remotely(name), "{name}");
        }
        for name in [
            "PATH",
            "HOROVOD_FUSION_THRESHOLD",
            "NCCL_DEBUG",
            "AWS_SECRET_ACCESS_KEY",
            "MY_APP",
        ] {
            assert!(!denied_locally(name) && !denied_remotely(name), "{name}");
        }
    }
}
