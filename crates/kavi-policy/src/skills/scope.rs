//! What a skill may write and run: its `writes` paths and its command, checked against the
//! workspace's reserved entries and the skill's own folder.

use crate::diagnostic::Diagnostic;

/// The workspace's top-level entries that hold kavi's state, its governance or the skills
/// themselves, with what each holds. A skill's `writes` may not equal, contain or lie under one:
/// a skill that could write them could rewrite its own rules, the ledger, or another skill.
const RESERVED: &[(&str, &str)] = &[
    (".kavi", "the ledger, artifacts and registry"),
    (".git", "the repository"),
    ("kavi.toml", "the workspace configuration"),
    ("policies", "the policies that govern every run"),
    ("pipelines", "the pipelines"),
    ("chains", "the chains"),
    ("templates", "the templates"),
    ("proposals", "the skill proposals"),
    ("skills", "the skills' trusted files"),
];

/// Why the `writes` entry `path` is refused, if it is: a path that is not a plain relative one
/// inside the workspace, one that names what [`RESERVED`] lists or another hidden entry at the
/// workspace root (tool configuration such as `.python-version` or `.envrc` lives there), or,
/// given the workspace `root`, one that passes through a symlink. The diagnostic says what was
/// probably meant.
pub fn write_scope_refusal(root: Option<&std::path::Path>, path: &str) -> Option<Diagnostic> {
    let refused =
        |reason: String| Diagnostic::new(format!("`writes` path `{path}` is refused: {reason}"));
    let data = "name the folder of the data the skill writes, relative to the workspace, such as \
                `notes` or `out/reports`";
    if let Some(reason) = crate::sandbox::unsafe_path_reason(path) {
        let help = match path.trim_start_matches('/').trim_end_matches('/') {
            plain if !plain.is_empty() && crate::sandbox::unsafe_path_reason(plain).is_none() => {
                format!(
                    "write it as `{plain}`, relative to the workspace, without leading or trailing `/`"
                )
            }
            _ => data.to_owned(),
        };
        return Some(refused(reason.to_owned()).with_help(help));
    }
    let top = path.split('/').next().unwrap_or(path);
    if let Some((name, holds)) = RESERVED.iter().find(|(name, _)| *name == top) {
        let help = if *name == "skills" {
            "a skill's files change only through the forge (propose, build, verify, promote); \
             for data the skill produces, name a folder of its own, such as `notes`"
                .to_owned()
        } else {
            format!(
                "kavi's own state changes only through kavi's commands and a person's review; {data}"
            )
        };
        return Some(
            refused(format!("`{name}` holds {holds}, which no skill may write")).with_help(help),
        );
    }
    if top.starts_with('.') {
        return Some(
            refused(format!(
                "`{top}` is hidden at the workspace root, where tools read their configuration"
            ))
            .with_help(data),
        );
    }
    let root = root?;
    let mut walked = root.to_path_buf();
    for part in path.split('/') {
        walked.push(part);
        match walked.symlink_metadata() {
            Ok(meta) if meta.file_type().is_symlink() => {
                let shown = walked
                    .strip_prefix(root)
                    .unwrap_or(&walked)
                    .display()
                    .to_string();
                return Some(
                    refused(format!(
                        "`{shown}` is a symlink, and a scope is never followed out of itself"
                    ))
                    .with_help(format!(
                        "replace the link `{shown}` with a real folder, or name the folder it \
                         points to if that lies in the workspace"
                    )),
                );
            }
            Ok(_) => {}
            // Nothing further exists, so nothing further is a link yet; the run makes it.
            Err(_) => break,
        }
    }
    None
}

// Whether a program's file name is a Python interpreter's: where kavi holds one to itself.
pub use crate::process::confinement::programs::is_python;

/// Why `command` could run bytes other than the skill's own, if it could. Only two shapes run
/// nothing else: a file of the skill's `folder` run itself, and a Python interpreter running
/// one. Any other program's arguments are its to interpret (`env LD_PRELOAD=...`, `sh -c`,
/// `python3 -c`, `-X pycache_prefix=...`), and could load code from anywhere the run can read.
pub fn untrusted_program(command: &[String], folder: &str) -> Option<String> {
    let program = command.first()?;
    let in_folder = |arg: &str| std::path::Path::new(arg).starts_with(folder);
    // What runs must be what the policy scan reads as Python: a `README.md` run as a script
    // (or as a program, by its `#!` line) is Python the scan took for text.
    let not_python = |file: &str| {
        (!file.ends_with(".py")).then(|| {
            format!(
                "`{file}` is not a `.py` file: the policy scan reads only those as Python, \
                 and this one would run unscanned"
            )
        })
    };
    if in_folder(program) {
        return not_python(program);
    }
    if !is_python(program) {
        return Some(format!(
            "`{program}` is not a file of the skill's folder nor a Python interpreter running \
             one, and its arguments could make it load code from anywhere"
        ));
    }
    // Options that change how the script runs, never what code it loads (`-W` imports the
    // warning category it names, `-X`, `-c` and `-m` load code of their own).
    const HARMLESS: [&str; 10] = ["-u", "-O", "-OO", "-q", "-b", "-bb", "-E", "-s", "-S", "-P"];
    let mut rest = command[1..].iter();
    loop {
        match rest.next() {
            None => return None,
            Some(option) if HARMLESS.contains(&option.as_str()) => {}
            Some(script) if in_folder(script) => return not_python(script),
            Some(option) if option.starts_with('-') => {
                return Some(format!(
                    "`{option}` is an interpreter option that could load code from outside the \
                     skill's folder"
                ));
            }
            Some(other) => {
                return Some(format!("`{other}` is not a script in the skill's folder"));
            }
        }
    }
}

pub(super) fn path_value(i: usize, arg: &str) -> Option<&str> {
    match (i, arg.split_once('=')) {
        (0, _) => Some(arg),
        (_, Some((flag, value))) if flag.starts_with('-') => Some(value),
        (_, None) if arg.starts_with('-') => None,
        _ => Some(arg),
    }
}
