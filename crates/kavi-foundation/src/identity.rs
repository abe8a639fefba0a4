//! Who is acting: the account of the process's real user id, as the operating system knows it.
//!
//! Transitions, approvals, rejections and runs record it. An environment variable (`$USER`)
//! would let anyone be recorded as anyone (`USER=someone kavi approve`), and is unset in many
//! containers; the real uid is what the kernel vouches for.

/// `name (uid N)`, or `uid N` for an id with no account (a container's arbitrary uid).
///
/// Looked up once per process (kavi never changes its uid): the lookup goes through NSS, a
/// socket to nscd and two files read here, and a run records it before its first node starts.
pub fn actor() -> String {
    static ACTOR: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ACTOR
        .get_or_init(|| {
            let uid = nix::unistd::getuid();
            match nix::unistd::User::from_uid(uid) {
                Ok(Some(user)) => format!("{} (uid {uid})", user.name),
                _ => format!("uid {uid}"),
            }
        })
        .clone()
}

/// The account `actor` (as [`actor`] wrote it) names: its uid, or `None` for a text that
/// names none (then only the same text is the same account).
pub fn uid_of(actor: &str) -> Option<u32> {
    let inside = actor
        .strip_suffix(')')
        .and_then(|rest| rest.rsplit_once("(uid "))
        .map(|(_, uid)| uid)
        .or_else(|| actor.strip_prefix("uid "))?;
    inside.parse().ok()
}

/// Whether two recorded actors are the same account: by uid (the kernel's), whatever name each
/// was recorded under, as a process can give its uid any name in a namespace of its own.
pub fn same_account(a: &str, b: &str) -> bool {
    match (uid_of(a), uid_of(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a == b,
    }
}

/// The inode number the kernel gives the initial user namespace (`PROC_USER_INIT_INO`).
const INITIAL_USER_NAMESPACE: u64 = 0xEFFF_FFFD;

/// The current account, to record a decision (an approval, an adoption, a review) under; refused
/// when this process runs in a user namespace other than the initial one. There any account is
/// root of its own mount namespace, can bind-mount an `/etc/passwd` or `/etc/group` of its own
/// and so be any name or in any group to the lookups the roles go through.
pub fn deciding_actor() -> Result<String, String> {
    match user_namespace_inode() {
        Ok(INITIAL_USER_NAMESPACE) => Ok(actor()),
        Ok(_) => Err(
            "a decision is never recorded from inside a user namespace: the account's name and \
             groups there are whatever its own mounts say. Run kavi outside it"
                .to_owned(),
        ),
        Err(error) => Err(format!(
            "a decision is not recorded: which user namespace kavi runs in cannot be told \
             ({error})"
        )),
    }
}

/// The inode of this process's user namespace, asked of the kernel through a pidfd (no path a
/// mount namespace could cover); `/proc/self/ns/user` only on a kernel older than 6.11.
fn user_namespace_inode() -> std::io::Result<u64> {
    use nix::libc;
    use std::os::fd::{FromRawFd as _, OwnedFd};
    // _IO(PIDFS_IOCTL_MAGIC, 9): include/uapi/linux/pidfd.h.
    const PIDFD_GET_USER_NAMESPACE: libc::c_ulong = (0xFF << 8) | 9;
    // SAFETY: pidfd_open takes a pid and flags, and returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just opened and nothing else owns it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: this ioctl takes no argument and returns a new descriptor or -1.
    let namespace = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            PIDFD_GET_USER_NAMESPACE as _,
            0,
        )
    };
    if namespace < 0 {
        let error = std::io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENOTTY | libc::EINVAL) => std::fs::metadata("/proc/self/ns/user")
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m)),
            _ => Err(error),
        };
    }
    // SAFETY: as above, a new descriptor owned by nothing else.
    let namespace = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(namespace) });
    namespace
        .metadata()
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
}

#[cfg(test)]
mod tests {
    use super::{same_account, uid_of};

    #[test]
    fn an_actor_is_its_uid_whatever_name_it_was_recorded_under() {
        assert_eq!(uid_of("alice (uid 4201)"), Some(4201));
        assert_eq!(uid_of("uid 7"), Some(7));
        assert_eq!(uid_of("alice"), None);
        assert!(same_account("alice (uid 4201)", "someone-else (uid 4201)"));
        assert!(same_account("uid 4201", "mallory (uid 4201)"));
        assert!(!same_account("alice (uid 1000)", "alice (uid 4201)"));
        assert!(!same_account("alice", "bob"));
    }

    #[test]
    fn the_actor_is_the_real_uid_whatever_the_environment_says() {
        let uid = nix::unistd::getuid();
        let actor = crate::identity::actor();
        assert!(actor.ends_with(&format!("uid {uid})")) || actor == format!("uid {uid}"));
    }
}
