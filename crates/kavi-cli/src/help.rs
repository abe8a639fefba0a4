//! `kavi man`: kavi described for `man`, generated from the same clap definitions the parser
//! uses, so it cannot drift from the commands.

use std::io::Write;

use clap::CommandFactory;

use super::Cli;

/// Writes kavi's man page (roff) to `out`.
pub fn man_page(out: &mut dyn Write) -> std::io::Result<()> {
    clap_mangen::Man::new(every_command()).render(out)
}

/// Writes a man page per command into `dir`: kavi.1 names its subcommands' pages
/// (`kavi-pipeline(1)`), and these are them.
pub fn man_pages(dir: &std::path::Path) -> std::io::Result<()> {
    clap_mangen::generate_to(every_command(), dir)
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
