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

#[cfg(test)]
mod tests {
    #[test]
    fn the_actor_is_the_real_uid_whatever_the_environment_says() {
        let uid = nix::unistd::getuid();
        let actor = crate::identity::actor();
        assert!(actor.ends_with(&format!("uid {uid})")) || actor == format!("uid {uid}"));
    }
}
