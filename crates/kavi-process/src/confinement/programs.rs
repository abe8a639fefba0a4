//! A role that may start no program but its own interpreter (a skill of a class the scanner
//! forbids `process`): held to that at run time, whatever route the code finds (`ctypes`
//! calling `execv`, `os.posix_spawn` reached by a computed name, a module the scanner does not
//! know).
//!
//! The interpreter is itself started by `execve` (bubblewrap's, and a shim's before it), so a
//! filter installed before that last exec cannot tell it from the next one, and Landlock's
//! execute right on the interpreter alone is not enough either: the kernel opens the ELF
//! loader (`ld-linux`) with the same right, and the loader, once executable, maps and runs any
//! program it is handed (`ld-linux.so /bin/sh`). So the interpreter refuses itself: kavi runs
//! `python -c PRELUDE` in place of the script, and the prelude, before any of the skill's code
//! is read, puts the process under a seccomp program in which `execve` and `execveat` kill the
//! caller ([`super::seccomp::no_programs`]), then runs the script, module, stdin or `-c` code
//! it was given as Python would have. The filter is inherited by every thread and child and
//! cannot be removed; `no_new_privs`, which it needs, is set by bubblewrap already.
//!
//! A fork that execs kills that child (SIGSYS), not the skill: the skill sees a child that died.
//! A skill that execs in its own process is killed, which kavi reports as a security violation.

/// Whether `name` (a file name) is a Python interpreter's: `python`, `python3`, `python3.12`.
pub fn is_python(name: &str) -> bool {
    name.strip_prefix("python")
        .is_some_and(|version| version.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// The prelude: `PROGRAMS` becomes the list of the seccomp programs, in hex.
const PRELUDE: &str = r#"import ctypes as _c, sys as _s
def _kavi_hold(programs):
    libc = _c.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [_c.c_int, _c.c_ulong, _c.c_ulong, _c.c_ulong, _c.c_ulong]
    class Program(_c.Structure):
        _fields_ = [("len", _c.c_ushort), ("filter", _c.c_void_p)]
    for text in programs:
        code = bytes.fromhex(text)
        buffer = _c.create_string_buffer(code, len(code))
        program = Program(len(code) // 8, _c.addressof(buffer))
        # PR_SET_NO_NEW_PRIVS, then PR_SET_SECCOMP with SECCOMP_MODE_FILTER.
        if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, _c.addressof(program), 0, 0):
            return _c.get_errno() or -1
    return 0
_e = _kavi_hold(PROGRAMS)
if _e:
    import os as _o
    _s.stderr.write("kavi: the interpreter could not refuse itself other programs (seccomp: %s); nothing of the program ran\n" % _o.strerror(abs(_e)))
    raise SystemExit(126)
del _kavi_hold, _e, _c
import runpy as _r
del _s.argv[0]
if _s.argv[0] == "-c":
    _code = _s.argv.pop(1)
    exec(compile(_code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
elif _s.argv[0] == "-m":
    del _s.argv[0]
    _r.run_module(_s.argv[0], run_name="__main__", alter_sys=True)
elif _s.argv[0] == "-":
    exec(compile(_s.stdin.read(), "<stdin>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
else:
    _r.run_path(_s.argv[0], run_name="__main__")
"#;

/// Options of the interpreter's own that take no value: they stay before the prelude.
const FLAGS: [&str; 13] = [
    "-I", "-B", "-u", "-O", "-OO", "-q", "-b", "-bb", "-E", "-s", "-S", "-P", "-v",
];

/// The arguments that run `program` (a path) with `args` held to itself: the prelude put
/// before what it runs (the script, `-`, `-m MODULE` or `-c CODE`). A program that is not a
/// Python interpreter, or options the prelude cannot stand before, are refused: nothing else
/// could be held to it.
pub fn held(program: &std::path::Path, args: &[String]) -> Result<Vec<String>, String> {
    let name = program
        .file_name()
        .map(|name| name.to_string_lossy())
        .unwrap_or_default();
    if !is_python(&name) {
        return Err(format!(
            "it may start no program but a Python interpreter, which kavi holds to that, and \
             {} is not one (set `programs = true` in its profile to let it start programs)",
            program.display()
        ));
    }
    let at = args
        .iter()
        .position(|arg| !FLAGS.contains(&arg.as_str()))
        .unwrap_or(args.len());
    match args.get(at).map(String::as_str) {
        Some("-c" | "-m" | "-") => {}
        Some(option) if option.starts_with('-') => {
            return Err(format!(
                "its interpreter option `{option}` cannot be kept while kavi holds the \
                 interpreter to itself"
            ));
        }
        Some(_) => {}
        None => return Err("its interpreter is given nothing to run".to_owned()),
    }
    let programs: Vec<String> = super::seccomp::no_programs()?
        .iter()
        .map(|program| format!("\"{}\"", hex(program)))
        .collect();
    let prelude = PRELUDE.replace("PROGRAMS", &format!("[{}]", programs.join(", ")));
    let mut held = args[..at].to_vec();
    held.extend(["-c".to_owned(), prelude]);
    held.extend(args[at..].iter().cloned());
    Ok(held)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_prelude_stands_before_what_the_interpreter_runs() {
        let args = |list: &[&str]| list.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
        let python = Path::new("/usr/bin/python3.11");
        for (given, at) in [
            (args(&["-I", "-B", "s.py", "x"]), 2),
            (args(&["-I", "-B", "-", "case"]), 2),
            (args(&["-I", "-m", "mod"]), 1),
            (args(&["-I", "-B", "-c", "print(1)"]), 2),
        ] {
            let held = held(python, &given).unwrap();
            assert_eq!(held[..at], given[..at]);
            assert_eq!(held[at], "-c");
            assert!(held[at + 1].contains("_kavi_hold([\""), "{}", held[at + 1]);
            assert_eq!(held[at + 2..], given[at..]);
        }
        let refused = held(Path::new("/bin/sh"), &args(&["-c", "id"])).unwrap_err();
        assert!(refused.contains("/bin/sh is not one"), "{refused}");
        let refused = held(python, &args(&["-X", "importtime", "s.py"])).unwrap_err();
        assert!(refused.contains("`-X` cannot be kept"), "{refused}");
        assert!(is_python("python3") && is_python("python") && !is_python("pythonista"));
    }
}
