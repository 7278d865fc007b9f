//! Seccomp filters of the launcher. Always: the kernel's keyrings are
//! refused (keys of one user outlive its processes, so jobs running as the
//! same tool user could pass secrets through them). And the last network
//! closure, for hosts that refuse network
//! namespaces (a container under the default seccomp profile): a filter
//! that makes `socket()` fail for every family but Unix, and refuses
//! io_uring (which can open sockets without that system call). Unix
//! sockets stay: pipes of the tool's own programs use them; the abstract
//! ones outside the sandbox are closed by Landlock's scope, the service's
//! socket directories hidden by the mounts.

use std::collections::BTreeMap;

use nix::libc;
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

/// x86-64's x32 ABI numbers its system calls from here (the same arch value).
#[cfg(target_arch = "x86_64")]
const X32: i64 = 0x4000_0000;

fn apply(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<(), String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno as u32), arch)
        .map_err(|e| e.to_string())?;
    let program: seccompiler::BpfProgram = filter.try_into().map_err(|e: seccompiler::BackendError| e.to_string())?;
    seccompiler::apply_filter(&program).map_err(|e| e.to_string())
}

/// Install the filter on this thread (inherited by everything it starts;
/// `no_new_privs` must be set, as the launcher does).
pub fn unix_sockets_only() -> Result<(), String> {
    let not_unix = || -> Result<Vec<SeccompRule>, String> {
        let cond = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, libc::AF_UNIX as u64)
            .map_err(|e| e.to_string())?;
        Ok(vec![SeccompRule::new(vec![cond]).map_err(|e| e.to_string())?])
    };
    let mut sockets = BTreeMap::new();
    sockets.insert(libc::SYS_socket, not_unix()?);
    #[cfg(target_arch = "x86_64")]
    sockets.insert(X32 + libc::SYS_socket, not_unix()?);
    apply(sockets, libc::EAFNOSUPPORT)?;
    let mut uring = BTreeMap::new();
    uring.insert(libc::SYS_io_uring_setup, vec![]);
    #[cfg(target_arch = "x86_64")]
    uring.insert(X32 + libc::SYS_io_uring_setup, vec![]);
    apply(uring, libc::ENOSYS)
}

/// Refuse the keyring system calls (`add_key`, `keyctl`, `request_key`).
pub fn no_keyrings() -> Result<(), String> {
    let mut rules = BTreeMap::new();
    for nr in [libc::SYS_add_key, libc::SYS_keyctl, libc::SYS_request_key] {
        rules.insert(nr, vec![]);
        #[cfg(target_arch = "x86_64")]
        rules.insert(X32 + nr, vec![]);
    }
    apply(rules, libc::EPERM)
}
