//! `kavi completions SHELL` and `kavi man`: kavi described for shells and `man`, generated from
//! the same clap definitions the parser uses, so they cannot drift from the commands.

use clap::CommandFactory;

use super::Cli;
use crate::error::{Error, exit};

pub fn completions(shell: clap_complete::Shell) -> Result<i32, Error> {
    let mut command = every_command();
    clap_complete::generate(shell, &mut command, "kavi", &mut std::io::stdout());
    Ok(exit::SUCCESS)
}

pub fn man_page() -> Result<i32, Error> {
    clap_mangen::Man::new(every_command())
        .render(&mut std::io::stdout())
        .map_err(|source| Error::Io {
            context: "failed to write the man page".into(),
            source,
        })?;
    Ok(exit::SUCCESS)
}

/// kavi's commands with every argument made: parsing makes only the given command's (see
/// `TopCommand`).
fn every_command() -> clap::Command {
    let mut command = Cli::command();
    command.build();
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command and every argument says what it is for, in `--help`, the man page and
    /// the completions alike.
    #[test]
    fn every_command_and_argument_is_described() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if !matches!(id, "help" | "version") && arg.get_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands() {
                let path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    missing.push(path.clone());
                }
                walk(sub, &path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&every_command(), "kavi", &mut missing);
        assert!(missing.is_empty(), "no description: {missing:#?}");
    }
}
