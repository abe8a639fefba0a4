//! The roster: every process group a kavi process started, written down as it starts them.
//!
//! SIGKILL gives kavi no chance to stop its children. The kernel stops the direct ones (see
//! `PR_SET_PDEATHSIG` in [`super::run`]), but what they started in their group lives on. So each
//! group is appended to a file before it can matter, and the next kavi process that finds the
//! file's owner gone stops whatever is still running in those groups.
//!
//! A process id can be reused once its process is gone. Each entry keeps when the group leader
//! started (clock ticks since boot) and the file keeps the boot id, so a group is stopped only
//! when its processes are the ones kavi started: not after a reboot, not when the leader's id now
//! belongs to a newer process, and never a process that started before the group did.
//!
//! The start time is not read back from `/proc/<pid>/stat`, which costs a path walk and the
//! kernel's whole stat line on every node. The kernel stamps a process when it is cloned, on the
//! boot clock, and reports that stamp in clock ticks; kavi reads the same clock just before and
//! just after the clone, so the stamp lies in the window between the two readings, which is
//! almost always a single tick.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// One line of the roster file (JSON Lines: a header, then one line per group).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "entry", rename_all = "snake_case")]
enum Line {
    /// Written once, when the roster is made.
    Header {
        boot_id: String,
        /// The folder this kavi process spills captured output into; removed with it.
        spill: PathBuf,
    },
    /// A process group, by its leader's id and the ticks it started within: from `start` to
    /// `until` (absent in rosters that recorded the exact tick, which is then `start`).
    Group {
        pgid: i32,
        start: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<u64>,
    },
    /// A private folder this process made for what it runs (a confined process's TMPDIR, a
    /// skill's snapshot, the decoys of its tripwires): removed with the process, and by the
    /// recovery of a later kavi when the process was killed first.
    Folder { path: PathBuf },
}

/// The ticks since boot (the unit of `/proc/<pid>/stat`'s start time) that a process can have
/// been stamped with: from a reading of the boot clock taken before it was cloned to one after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartWindow {
    earliest: u64,
    latest: u64,
}

impl StartWindow {
    /// Opens the window: call just before the clone.
    pub fn open() -> Self {
        let now = boot_ticks();
        Self {
            earliest: now,
            latest: now,
        }
    }

    /// The window a roster line gives: from `start` to `until`, or the exact tick `start`.
    fn recorded(start: u64, until: Option<u64>) -> Self {
        Self {
            earliest: start,
            latest: until.unwrap_or(start),
        }
    }

    /// Closes it: call after the clone returned.
    fn close(self) -> Self {
        Self {
            latest: boot_ticks(),
            ..self
        }
    }

    fn holds(self, start: u64) -> bool {
        (self.earliest..=self.latest).contains(&start)
    }
}

/// How long one clock tick of `/proc/<pid>/stat` is, in nanoseconds.
fn nanos_per_tick() -> u64 {
    static NANOS_PER_TICK: OnceLock<u64> = OnceLock::new();
    *NANOS_PER_TICK.get_or_init(|| {
        let hertz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .and_then(|hz| u64::try_from(hz).ok())
            .filter(|&hz| hz > 0)
            .unwrap_or(100);
        1_000_000_000 / hertz
    })
}

/// The boot clock in clock ticks, as the kernel converts a process's start stamp: whole ticks,
/// rounded down.
fn boot_ticks() -> u64 {
    // The boot clock cannot fail on Linux; a zero would only make the window start at boot.
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(|t| u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0);
    now / nanos_per_tick()
}

/// How long ago process `pid` started, to the clock tick; `None` when it is gone, or ended
/// and not yet reaped.
pub fn started_ago(pid: i32) -> Option<std::time::Duration> {
    let stat = Stat::read(pid).ok().filter(|stat| !stat.zombie)?;
    let ticks = boot_ticks().checked_sub(stat.start)?;
    Some(std::time::Duration::from_nanos(
        ticks.saturating_mul(nanos_per_tick()),
    ))
}

/// The file a kavi process lists its process groups in.
#[derive(Debug)]
pub struct Roster {
    file: Mutex<File>,
    spill: PathBuf,
}

impl Roster {
    /// Creates the roster at `path` (which must not exist yet) for a process spilling into `spill`.
    pub fn create(path: &Path, spill: &Path) -> io::Result<Self> {
        // Only the accounts that may recover this process read what it started.
        let mut file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o666 & !kavi_foundation::sandbox::closed_bits(path))
            .open(path)?;
        write_line(
            &mut file,
            &Line::Header {
                boot_id: boot_id()?,
                spill: spill.to_owned(),
            },
        )?;
        Ok(Self {
            file: Mutex::new(file),
            spill: spill.to_owned(),
        })
    }

    /// Where this process's spill files go.
    pub fn spill_dir(&self) -> &Path {
        &self.spill
    }

    /// Writes down a private folder this process made, before anything is put in it.
    pub fn track(&self, folder: &Path) -> io::Result<()> {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        write_line(
            &mut file,
            &Line::Folder {
                path: folder.to_owned(),
            },
        )
    }

    /// Writes down the group `pid` leads, cloned after `window` was opened. Called right after
    /// spawning, before kavi waits for the child.
    pub fn enlist(&self, pid: i32, window: StartWindow) -> io::Result<()> {
        let window = window.close();
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        write_line(
            &mut file,
            &Line::Group {
                pgid: pid,
                start: window.earliest,
                until: Some(window.latest),
            },
        )
    }
}

/// One write per line: appends from one process never interleave.
fn write_line(file: &mut File, line: &Line) -> io::Result<()> {
    let mut text = serde_json::to_string(line).map_err(io::Error::other)?;
    text.push('\n');
    file.write_all(text.as_bytes())
}

fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

/// What the kernel says of one process in `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy)]
struct Stat {
    pid: i32,
    pgrp: i32,
    zombie: bool,
    /// Clock ticks after boot.
    start: u64,
}

impl Stat {
    fn read(pid: i32) -> io::Result<Self> {
        use std::io::Read;
        // One read: the line is at most a few hundred bytes (a 15-byte name and 52 numbers),
        // and `read_to_string` would stat the file and read it in growing pieces, on every
        // node's start.
        let mut buffer = [0u8; 2048];
        let mut file = std::fs::File::open(format!("/proc/{pid}/stat"))?;
        let mut filled = 0;
        loop {
            match file.read(&mut buffer[filled..])? {
                0 => break,
                read => filled += read,
            }
            if filled == buffer.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("/proc/{pid}/stat is longer than a stat line can be"),
                ));
            }
        }
        let text = String::from_utf8_lossy(&buffer[..filled]);
        Self::parse(pid, &text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("/proc/{pid}/stat is not in the expected form"),
            )
        })
    }

    /// The command name sits in parentheses and may itself hold spaces and parentheses, so the
    /// fields are counted from the last `)`.
    fn parse(pid: i32, text: &str) -> Option<Self> {
        let rest = &text[text.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state (field 3), ppid, pgrp (5), ... starttime (22).
        Some(Self {
            pid,
            zombie: *fields.first()? == "Z",
            pgrp: fields.get(2)?.parse().ok()?,
            start: fields.get(19)?.parse().ok()?,
        })
    }
}

/// Every live process on the system, as far as `/proc` can be read.
fn processes() -> Vec<Stat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Stat::read(pid).ok())
        .filter(|stat| !stat.zombie)
        .collect()
}

/// What [`stop_leftovers`] found and did.
#[derive(Debug, Default)]
pub struct Leftovers {
    /// Processes that were still running and got SIGKILL.
    pub killed: usize,
    /// The dead process's spill folder, to remove.
    pub spill: Option<PathBuf>,
    /// The private folders it made, to remove where they are still there.
    pub folders: Vec<PathBuf>,
}

/// How many times the groups are swept: a process being killed may have forked just before.
const SWEEPS: usize = 5;

/// Stops every process still running in the groups the roster at `path` lists.
pub fn stop_leftovers(path: &Path) -> io::Result<Leftovers> {
    let mut leftovers = Leftovers::default();
    let mut groups = Vec::new();
    let mut same_boot = false;
    for line in BufReader::new(File::open(path)?).lines() {
        // A line cut short by the kill is the last one; what came before still counts.
        let Ok(line) = serde_json::from_str::<Line>(&line?) else {
            continue;
        };
        match line {
            Line::Header { boot_id: id, spill } => {
                same_boot = boot_id().is_ok_and(|now| now == id);
                leftovers.spill = Some(spill);
            }
            Line::Group { pgid, start, until } => {
                groups.push((pgid, StartWindow::recorded(start, until)));
            }
            Line::Folder { path } => leftovers.folders.push(path),
        }
    }
    // After a reboot nothing the roster lists can still run.
    if !same_boot || groups.is_empty() {
        return Ok(leftovers);
    }
    for _ in 0..SWEEPS {
        let doomed = ours(&processes(), &groups);
        if doomed.is_empty() {
            break;
        }
        for pid in doomed {
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                leftovers.killed += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(leftovers)
}

/// The processes that belong to the listed groups: in the group, started no earlier than its
/// leader could have, and in a group whose leader id, if it is taken, is still taken by that
/// leader.
fn ours(processes: &[Stat], groups: &[(i32, StartWindow)]) -> Vec<i32> {
    processes
        .iter()
        .filter(|process| {
            groups.iter().any(|&(pgid, window)| {
                let leader_reused = processes
                    .iter()
                    .any(|other| other.pid == pgid && !window.holds(other.start));
                process.pgrp == pgid && process.start >= window.earliest && !leader_reused
            })
        })
        .map(|process| process.pid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let text = "4242 (a) b (c)) S 1 4240 4240 0 -1 4194560 95 0 0 0 0 0 0 0 20 0 1 0 777 1 2";
        let stat = Stat::parse(4242, text).unwrap();
        assert_eq!((stat.pgrp, stat.start, stat.zombie), (4240, 777, false));
        assert!(Stat::parse(1, "1 (cut").is_none());
    }

    fn stat(pid: i32, pgrp: i32, start: u64) -> Stat {
        Stat {
            pid,
            pgrp,
            zombie: false,
            start,
        }
    }

    #[test]
    fn only_processes_of_the_listed_groups_started_after_their_leader_are_ours() {
        let listed = [(100, StartWindow::recorded(50, None))];
        let procs = [
            stat(101, 100, 60), // a child left in the group: ours
            stat(102, 100, 40), // older than the group: not ours
            stat(103, 7, 60),   // another group
        ];
        assert_eq!(ours(&procs, &listed), vec![101]);
        // The leader's id now belongs to a process that started later: the group is not ours.
        let reused = [stat(100, 100, 90), stat(104, 100, 95)];
        assert!(ours(&reused, &listed).is_empty());
    }

    #[test]
    fn a_roster_from_before_a_reboot_stops_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.procs");
        let header = Line::Header {
            boot_id: "not-this-boot".into(),
            spill: dir.path().join("spill"),
        };
        let group = Line::Group {
            pgid: std::process::id() as i32,
            start: 0,
            until: None,
        };
        let mut file = File::create(&path).unwrap();
        write_line(&mut file, &header).unwrap();
        write_line(&mut file, &group).unwrap();
        let leftovers = stop_leftovers(&path).unwrap();
        assert_eq!(leftovers.killed, 0);
        assert_eq!(leftovers.spill, Some(dir.path().join("spill")));
    }

    #[test]
    fn a_listed_group_is_stopped_and_the_rest_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let roster = Roster::create(&dir.path().join("r.procs"), dir.path()).unwrap();
        let spawn = |group: bool| {
            let mut command = std::process::Command::new("sleep");
            command.arg("30");
            if group {
                std::os::unix::process::CommandExt::process_group(&mut command, 0);
            }
            command.spawn().unwrap()
        };
        let window = StartWindow::open();
        let (mut listed, mut other) = (spawn(true), spawn(true));
        roster.enlist(listed.id() as i32, window).unwrap();
        let leftovers = stop_leftovers(&dir.path().join("r.procs")).unwrap();
        assert_eq!(leftovers.killed, 1);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(listed.wait().unwrap().signal(), Some(9));
        assert!(
            other.try_wait().unwrap().is_none(),
            "an unlisted group was stopped"
        );
        other.kill().unwrap();
        other.wait().unwrap();
    }

    #[test]
    fn the_window_holds_the_start_time_the_kernel_reports() {
        for _ in 0..20 {
            let window = StartWindow::open();
            let mut child = std::process::Command::new("true").spawn().unwrap();
            let window = window.close();
            let stat = Stat::read(child.id() as i32).unwrap();
            child.wait().unwrap();
            assert!(
                window.holds(stat.start),
                "started at tick {} outside {window:?}",
                stat.start
            );
        }
    }

    #[test]
    fn a_roster_line_with_an_exact_start_still_reads() {
        let line: Line = serde_json::from_str(r#"{"entry":"group","pgid":7,"start":42}"#).unwrap();
        assert!(matches!(
            line,
            Line::Group {
                pgid: 7,
                start: 42,
                until: None
            }
        ));
    }
}
