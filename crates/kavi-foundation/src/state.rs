//! The states a node run and a run can be in. Each is distinct in the ledger and in output:
//! a skipped node is never reported as passed, a node that did not run is never "succeeded".

use std::fmt;
use std::str::FromStr;

macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vmeta])* $variant,)* }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok($name::$variant),)*
                    // In words, not the type's name: the operator typed a state.
                    other => Err(format!(
                        "unknown state `{other}`: {}",
                        crate::diagnostic::suggest(other, &[$($text,)*])
                    )),
                }
            }
        }
    };
}

string_enum! {
    /// The state of one node run (one attempt of one node).
    NodeState {
        /// Recorded when the run starts; not reached yet.
        Pending => "pending",
        Running => "running",
        Succeeded => "succeeded",
        Failed => "failed",
        /// Killed, with its whole process group, for running past its timeout.
        TimedOut => "timed_out",
        /// Its `when` condition was false, or a dependency was skipped.
        Skipped => "skipped",
        /// A dependency failed, so it was never started.
        Blocked => "blocked",
        /// Stopped by the user (Ctrl-C), or never started because the run stopped.
        Cancelled => "cancelled",
        /// Reserved for result caching.
        Cached => "cached",
        /// Not run again: `kavi runs resume` took its outputs from the run it resumed, where it
        /// succeeded.
        Reused => "reused",
        /// Reserved for nodes that stop the run for a human decision.
        AwaitingReview => "awaiting_review",
        /// Left running by a kavi process that died; found and marked on a later start.
        Interrupted => "interrupted",
    }
}

impl NodeState {
    /// Terminal states that count as the node having done its work.
    pub fn is_success(self) -> bool {
        matches!(
            self,
            NodeState::Succeeded | NodeState::Cached | NodeState::Reused
        )
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, NodeState::Pending | NodeState::Running)
    }
}

string_enum! {
    /// The state of a whole run.
    RunStatus {
        Running => "running",
        Succeeded => "succeeded",
        Failed => "failed",
        Cancelled => "cancelled",
        /// The kavi process running it died (killed, crashed, machine lost).
        Interrupted => "interrupted",
        /// Stopped for a person's decision (`kavi approve` / `kavi reject`).
        AwaitingReview => "awaiting_review",
        /// Stopped for review, and a person approved going on (a resumed run names this one).
        Approved => "approved",
        /// Stopped for review, and a person rejected it.
        Rejected => "rejected",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_ledger_text() {
        for state in NodeState::ALL {
            assert_eq!(state.as_str().parse::<NodeState>().unwrap(), *state);
        }
        for status in RunStatus::ALL {
            assert_eq!(status.as_str().parse::<RunStatus>().unwrap(), *status);
        }
        assert!("passed".parse::<NodeState>().is_err());
    }
}
