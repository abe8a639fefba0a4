//! `kavi completions SHELL` and `kavi man`: kavi described for shells and `man`, generated from
//! the same clap definitions the parser uses, so they cannot drift from the commands.

use clap::CommandFactory;

use super::Cli;
use crate::error::{Error, exit};

pub fn completions(shell: clap_complete::Shell) -> Result<i32, Error> {
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, "kavi", &mut std::io::stdout());
    Ok(exit::SUCCESS)
}

pub fn man_page() -> Result<i32, Error> {
    clap_mangen::Man::new(Cli::command())
        .render(&mut std::io::stdout())
        .map_err(|source| Error::Io {
            context: "failed to write the man page".into(),
            source,
        })?;
    Ok(exit::SUCCESS)
}
