//! `policies/confinement.toml`: one profile per role, its paths templates over the values kavi
//! provides for that role (the sandbox, a private temp folder, ...).

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::Profile;
use super::proxy::HostAllowlist;
use crate::confinement::network::NetworkPolicy;
use kavi_foundation::diagnostic::{Diagnostic, SourceFile};
use kavi_foundation::template::{TemplateEngine, describe_error};

pub const DEFAULT_POLICY: &str = "policies/confinement.toml";

/// The values the builder's path templates may read.
const BUILDER_VALUES: &[&str] = &["sandbox", "tmp"];

/// The values a gate's path templates may read: `snapshot` is the copy of the skill's files the
/// gates judge, laid out as the workspace is.
const GATE_VALUES: &[&str] = &["workspace", "tmp", "snapshot"];

/// The values a skill's path templates may read. An entry that reads `write` is repeated once
/// for each path the skill's proposal declares in `writes`, and gives nothing when it has none.
const SKILL_VALUES: &[&str] = &["workspace", "tmp", "write", "snapshot"];

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    system: RawSystem,
    builder: RawProfile,
    gate: RawProfile,
    read_only: RawProfile,
    file_write: RawProfile,
    network: RawProfile,
    secret_read: RawProfile,
}

/// What every role's view holds and how it finds programs.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawSystem {
    /// Read-only in every role's view: the system's programs, libraries and the few files of
    /// /etc they need.
    read: Vec<String>,
    /// The search path programs are found on, inside the view.
    path: String,
    /// Where decoys are laid in every view, where the view shows nothing else: a process that
    /// opens one is stopped as a security violation. `~/` is kavi's home.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    tripwires: Vec<Spanned<String>>,
}

/// The part of the view every role shares.
#[derive(Debug)]
struct System {
    read: Vec<PathBuf>,
    path: String,
    tripwires: Vec<PathBuf>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    #[serde(default = "yes")]
    require: bool,
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    read: Vec<Spanned<String>>,
    #[schemars(with = "Vec<String>")]
    write: Vec<Spanned<String>>,
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    hide: Vec<Spanned<String>>,
    /// Globs, matched below each of the role's own `read` folders (not the system's): every
    /// match is hidden too (secrets, keys, databases the workspace holds).
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    hide_matching: Vec<Spanned<String>>,
    #[serde(default)]
    network: bool,
    /// Whether the role's program may start other programs. Without, a Python interpreter is
    /// held to itself once it has started (see [`super::programs`]) and any other program is
    /// refused. Default: yes for the builder and gates, no for a skill class.
    #[serde(default)]
    programs: Option<bool>,
    /// Whether the role's processes may take file locks. Without, every lock and lease is
    /// refused (see [`super::seccomp`]). Default: yes.
    #[serde(default = "yes")]
    locks: bool,
    #[serde(default)]
    limits: super::Limits,
}

fn yes() -> bool {
    true
}

/// A path template, and whether it reads `write` (and so is repeated per declared path).
#[derive(Debug, Clone)]
struct PathTemplate {
    text: String,
    per_write: bool,
}

/// One role's profile as the policy writes it: path templates, not yet resolved.
#[derive(Debug, Clone)]
pub struct RoleProfile {
    role: String,
    /// The policy file it comes from, and that file's hash: what the ledger names it by.
    policy: super::PolicyRef,
    require: bool,
    read: Vec<PathTemplate>,
    write: Vec<PathTemplate>,
    hide: Vec<PathTemplate>,
    /// Globs checked when the policy was parsed.
    hide_matching: Vec<String>,
    /// The same, compiled then (`None` when there are none): resolving a profile for each
    /// launch does not compile them again.
    hide_globs: Option<Arc<globset::GlobSet>>,
    network: bool,
    /// The hosts a process with the network may reach through kavi's proxy, and the policy
    /// they come from (`policies/network.toml`): none until [`ConfinementPolicy::with_hosts`].
    hosts: Arc<HostAllowlist>,
    hosts_policy: Option<super::PolicyRef>,
    programs: bool,
    locks: bool,
    limits: super::Limits,
    /// The system's part of the view, shared by every role.
    system: Arc<System>,
}

impl RoleProfile {
    /// The confinement a process of this role runs under: the profile resolved with the role's
    /// values (and `writes`, for the entries that read `write`), made ready for the kernel, with
    /// `kavi_state` (kavi's own files: the ledger, the artifact store...) hidden wherever the
    /// view would show them, whatever the policy says. An error says why the process may not
    /// run: a bad path, or a kernel that cannot confine it.
    pub fn confine(
        &self,
        templates: &TemplateEngine,
        values: &minijinja::Value,
        writes: &[String],
        kavi_state: &[PathBuf],
    ) -> Result<super::Confinement, String> {
        let mut profile = self.resolve(templates, values, writes)?;
        // Only what the view would show and the policy does not hide already.
        let shown = |path: &PathBuf| {
            profile
                .read
                .iter()
                .chain(&profile.write)
                .any(|visible| path.starts_with(visible))
                && !profile.hide.iter().any(|hidden| path.starts_with(hidden))
        };
        let hidden: Vec<PathBuf> = kavi_state.iter().filter(|p| shown(p)).cloned().collect();
        profile.hide.extend(hidden);
        let mut confinement = super::prepare(profile).map_err(|e| e.to_string())?;
        confinement.policy = Some(self.policy.clone());
        if self.network {
            confinement.hosts_policy = self.hosts_policy.clone();
        }
        Ok(confinement)
    }

    /// Whether the role's process may use the network (through kavi's proxy).
    pub fn network(&self) -> bool {
        self.network
    }

    /// Resolves the path templates with the role's values, repeating the entries that read
    /// `write` once per path in `writes`; every path must come out absolute.
    fn resolve(
        &self,
        templates: &TemplateEngine,
        values: &minijinja::Value,
        writes: &[String],
    ) -> Result<Profile, String> {
        let render = |paths: &[PathTemplate]| -> Result<Vec<PathBuf>, String> {
            paths
                .iter()
                .flat_map(|template| {
                    let each: Vec<minijinja::Value> = if template.per_write {
                        writes
                            .iter()
                            .map(|write| minijinja::context! { write => write, ..values.clone() })
                            .collect()
                    } else {
                        vec![values.clone()]
                    };
                    each.into_iter().map(move |values| (&template.text, values))
                })
                .map(|(template, values)| {
                    let path = templates.render_str(template, &values).map_err(|e| {
                        format!(
                            "failed to render the {} profile's path `{template}`: {}",
                            self.role,
                            describe_error(&e)
                        )
                    })?;
                    let path = PathBuf::from(path);
                    if path.is_absolute() {
                        Ok(path)
                    } else {
                        Err(format!(
                            "the {} profile's path `{template}` is not absolute: {}",
                            self.role,
                            path.display()
                        ))
                    }
                })
                .collect()
        };
        let mut read = self.system.read.clone();
        let own = render(&self.read)?;
        // The workspace, where the view shows it (through any folder the profile reads).
        let workspace = values
            .get_attr("workspace")
            .ok()
            .and_then(|value| value.as_str().map(PathBuf::from))
            .filter(|root| {
                root.is_absolute() && read.iter().chain(&own).any(|p| root.starts_with(p))
            });
        for path in &own {
            // One mount a path: the snapshot is the workspace when nothing else runs.
            if !read.contains(path) {
                read.push(path.clone());
            }
        }
        Ok(Profile {
            role: self.role.to_owned(),
            read,
            write: render(&self.write)?,
            hide: render(&self.hide)?,
            hide_matching: match &self.hide_globs {
                _ if self.hide_matching.is_empty() => None,
                Some(globs) => Some(Arc::clone(globs)),
                // A union of classes whose globs differ: compiled here.
                None => {
                    let mut globs = globset::GlobSetBuilder::new();
                    for pattern in &self.hide_matching {
                        globs.add(globset::Glob::new(pattern).map_err(|e| e.to_string())?);
                    }
                    Some(Arc::new(globs.build().map_err(|e| e.to_string())?))
                }
            }
            .map(|globs| {
                let mut roots: Vec<PathBuf> = own.into_iter().filter(|p| p.is_dir()).collect();
                roots.dedup();
                (globs, roots)
            }),
            network: self.network,
            hosts: Arc::clone(&self.hosts),
            programs: self.programs,
            locks: self.locks,
            require: self.require,
            limits: self.limits,
            path: self.system.path.clone(),
            tripwires: self.system.tripwires.clone(),
            workspace,
        })
    }
}

/// The confinement policy: a checked profile for every role.
#[derive(Debug, Clone)]
pub struct ConfinementPolicy {
    pub builder: RoleProfile,
    pub gate: RoleProfile,
    pub read_only: RoleProfile,
    pub file_write: RoleProfile,
    pub network: RoleProfile,
    pub secret_read: RoleProfile,
    /// The policy's text, which the ledger keeps among the specs.
    pub source: Arc<SourceFile>,
}

impl ConfinementPolicy {
    /// The profile a skill of `classes` runs under: its one class's, or for several, their
    /// union (every path either may read or write, the network if either may use it, and
    /// confinement required if either requires it).
    pub fn for_skill(&self, classes: kavi_foundation::side_effect::SideEffects) -> RoleProfile {
        use kavi_foundation::side_effect::SideEffect;
        let profiles: Vec<&RoleProfile> = classes
            .iter()
            .map(|class| match class {
                SideEffect::ReadOnly => &self.read_only,
                SideEffect::FileWrite => &self.file_write,
                SideEffect::Network => &self.network,
                SideEffect::SecretRead => &self.secret_read,
            })
            .collect();
        let mut union = RoleProfile {
            role: format!("{classes} skill"),
            policy: self.read_only.policy.clone(),
            require: false,
            read: Vec::new(),
            write: Vec::new(),
            hide: Vec::new(),
            hide_matching: Vec::new(),
            hide_globs: None,
            network: false,
            hosts: Arc::clone(&self.read_only.hosts),
            hosts_policy: self.read_only.hosts_policy.clone(),
            programs: false,
            locks: true,
            limits: super::Limits::default(),
            system: Arc::clone(&self.read_only.system),
        };
        let mut first = true;
        for profile in &profiles {
            union.require |= profile.require;
            union.network |= profile.network;
            union.programs |= profile.programs;
            union.locks &= profile.locks;
            // Every class's hidden matches are hidden.
            for pattern in &profile.hide_matching {
                if !union.hide_matching.contains(pattern) {
                    union.hide_matching.push(pattern.clone());
                }
            }
            // Each bound the tightest any class sets: a union must not loosen one silently.
            union.limits = if std::mem::take(&mut first) {
                profile.limits
            } else {
                union.limits.tightest(&profile.limits)
            };
            for (from, into) in [
                (&profile.read, &mut union.read),
                (&profile.write, &mut union.write),
                (&profile.hide, &mut union.hide),
            ] {
                for path in from {
                    if !into.iter().any(|p: &PathTemplate| p.text == path.text) {
                        into.push(path.clone());
                    }
                }
            }
        }
        // One class's globs, or the same in every class: compiled already.
        union.hide_globs = profiles
            .iter()
            .find(|profile| profile.hide_matching == union.hide_matching)
            .and_then(|profile| profile.hide_globs.clone());
        union
    }
}

impl ConfinementPolicy {
    /// The hosts every role with the network may reach through kavi's proxy: `[processes]
    /// allowed_hosts` of `network` (`policies/network.toml`). Without it, none.
    pub fn with_hosts(mut self, network: Option<&Arc<SourceFile>>) -> Result<Self, Diagnostic> {
        let Some(source) = network else {
            return Ok(self);
        };
        let hosts = Arc::new(NetworkPolicy::parse(source)?.process_hosts(source)?);
        let policy = super::PolicyRef {
            path: source.path.display().to_string(),
            hash: source.spec_hash().to_owned(),
        };
        for role in [
            &mut self.builder,
            &mut self.gate,
            &mut self.read_only,
            &mut self.file_write,
            &mut self.network,
            &mut self.secret_read,
        ] {
            role.hosts = Arc::clone(&hosts);
            role.hosts_policy = Some(policy.clone());
        }
        Ok(self)
    }

    /// Whether any role may use the network: then `policies/network.toml` governs its runs.
    pub fn any_network(&self) -> bool {
        [
            &self.builder,
            &self.gate,
            &self.read_only,
            &self.file_write,
            &self.network,
            &self.secret_read,
        ]
        .iter()
        .any(|role| role.network)
    }
}

impl ConfinementPolicy {
    /// Parses the policy; a path template that reads a value its role does not provide is an
    /// error at the template.
    pub fn parse(source: &Arc<SourceFile>, templates: &TemplateEngine) -> Result<Self, Diagnostic> {
        let raw: RawPolicy = toml::from_str(&source.text)
            .map_err(|e| kavi_foundation::diagnostic::toml_error(source, &e))?;
        let mut tripwires = Vec::new();
        for entry in &raw.system.tripwires {
            if !(entry.get_ref().starts_with('/') || entry.get_ref().starts_with("~/")) {
                return Err(Diagnostic::new(format!(
                    "a tripwire is an absolute path or one in kavi's home (`~/...`); \
                     did you mean `~/{}`?",
                    entry.get_ref().trim_start_matches(['~', '/'])
                ))
                .at(source, entry.span()));
            }
            tripwires.push(entry.get_ref().clone());
        }
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let system = Arc::new(System {
            read: raw.system.read.iter().map(PathBuf::from).collect(),
            path: raw.system.path.clone(),
            tripwires: super::tripwire::resolve(&tripwires, home.as_deref()),
        });
        let check = |role, provided, programs, raw| {
            check(source, templates, (role, provided, programs), raw, &system)
        };
        // No class of the shipped scanner policy may start a process: a skill's interpreter is
        // held to that at run time too, unless its profile says otherwise.
        let skill = |role, raw| check(role, SKILL_VALUES, false, raw);
        Ok(Self {
            builder: check("builder", BUILDER_VALUES, true, raw.builder)?,
            gate: check("gate", GATE_VALUES, true, raw.gate)?,
            read_only: skill("READ_ONLY skill", raw.read_only)?,
            file_write: skill("FILE_WRITE skill", raw.file_write)?,
            network: skill("NETWORK skill", raw.network)?,
            secret_read: skill("SECRET_READ skill", raw.secret_read)?,
            source: Arc::clone(source),
        })
    }
}

/// `raw` checked as the profile of `role`, whose templates may read `provided`, and which may
/// start programs by default when `programs`.
fn check(
    source: &Arc<SourceFile>,
    templates: &TemplateEngine,
    (role, provided, programs): (&'static str, &[&str], bool),
    raw: RawProfile,
    system: &Arc<System>,
) -> Result<RoleProfile, Diagnostic> {
    let mut per_write = std::collections::HashSet::new();
    for path in raw.read.iter().chain(&raw.write).chain(&raw.hide) {
        let reads = templates.check_str(path.get_ref()).map_err(|e| {
            Diagnostic::new(format!("invalid template: {}", describe_error(&e)))
                .at(source, path.span())
        })?;
        if reads.iter().any(|read| read == "write") {
            per_write.insert(path.get_ref().clone());
        }
        if let Some(unknown) = reads
            .iter()
            .find(|read| !provided.contains(&read.split('.').next().unwrap_or_default()))
        {
            return Err(Diagnostic::new(format!(
                "the {role} profile may read only {}; `{unknown}` is not one of them",
                provided
                    .iter()
                    .map(|p| format!("`{p}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .at(source, path.span()));
        }
    }
    let plain = |paths: Vec<Spanned<String>>| {
        paths
            .into_iter()
            .map(|path| PathTemplate {
                per_write: per_write.contains(path.get_ref()),
                text: path.into_inner(),
            })
            .collect()
    };
    Ok(RoleProfile {
        role: role.to_owned(),
        policy: super::PolicyRef {
            path: source.path.display().to_string(),
            hash: source.spec_hash().to_owned(),
        },
        require: raw.require,
        read: plain(raw.read),
        write: plain(raw.write),
        hide: plain(raw.hide),
        // Checked here, at their lines, and compiled once.
        hide_globs: (!raw.hide_matching.is_empty())
            .then(|| kavi_foundation::diagnostic::glob_set(&raw.hide_matching, source))
            .transpose()?
            .map(Arc::new),
        hide_matching: raw
            .hide_matching
            .into_iter()
            .map(Spanned::into_inner)
            .collect(),
        network: raw.network,
        hosts: Arc::default(),
        hosts_policy: None,
        programs: raw.programs.unwrap_or(programs),
        locks: raw.locks,
        limits: raw.limits,
        system: Arc::clone(system),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfinementPolicy, Diagnostic> {
        let text = if text.contains("[system]") {
            text.to_owned()
        } else {
            format!("{text}[system]\nread = [\"/usr\"]\npath = \"/usr/bin\"\n")
        };
        let text = text.as_str();
        let dir = tempfile::tempdir().unwrap();
        let templates = TemplateEngine::new(dir.path());
        ConfinementPolicy::parse(
            &SourceFile::new("policies/confinement.toml", text.to_owned()),
            &templates,
        )
    }

    /// Minimal sections for every role but `except`.
    fn others(except: &str) -> String {
        [
            "builder",
            "gate",
            "read_only",
            "file_write",
            "network",
            "secret_read",
        ]
        .iter()
        .filter(|role| **role != except)
        .map(|role| format!("[{role}]\nread = []\nwrite = []\n"))
        .collect()
    }

    #[test]
    fn a_file_write_entry_is_repeated_for_each_declared_path() {
        let text = format!(
            "[file_write]\nread = [\"/\"]\nwrite = [\"{{{{ tmp }}}}\", \"{{{{ workspace }}}}/{{{{ write }}}}\"]\n{}",
            others("file_write")
        );
        let policy = parse(&text).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let templates = TemplateEngine::new(dir.path());
        let values = minijinja::context! { workspace => "/ws", tmp => "/t" };
        let profile = policy
            .for_skill(kavi_foundation::side_effect::SideEffect::FileWrite.into())
            .resolve(&templates, &values, &["notes".into(), "out/a.txt".into()])
            .unwrap();
        assert_eq!(
            profile.write,
            [
                PathBuf::from("/t"),
                "/ws/notes".into(),
                "/ws/out/a.txt".into()
            ]
        );
        let none = policy.file_write.resolve(&templates, &values, &[]).unwrap();
        assert_eq!(none.write, [PathBuf::from("/t")]);
    }

    /// A skill of several classes runs under their union: what either may write, the network
    /// if either may use it.
    #[test]
    fn several_classes_run_under_the_union_of_their_profiles() {
        let text = std::fs::read_to_string(
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
                .join(DEFAULT_POLICY),
        )
        .unwrap();
        let policy = parse(&text).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let templates = TemplateEngine::new(dir.path());
        let values = minijinja::context! { workspace => "/ws", tmp => "/t", snapshot => "/ws" };
        let classes =
            kavi_foundation::side_effect::SideEffects::parse("FILE_WRITE+NETWORK").unwrap();
        let union = policy.for_skill(classes);
        assert_eq!(union.role, "FILE_WRITE+NETWORK skill");
        let profile = union
            .resolve(&templates, &values, &["notes".into()])
            .unwrap();
        assert!(profile.network && profile.require);
        assert!(profile.write.contains(&PathBuf::from("/ws/notes")));
        // Each path once, however many profiles grant it.
        let tmp = profile
            .write
            .iter()
            .filter(|p| p.as_path() == std::path::Path::new("/t"))
            .count();
        assert_eq!(tmp, 1, "{:?}", profile.write);
        let alone = policy
            .for_skill(kavi_foundation::side_effect::SideEffect::Network.into())
            .resolve(&templates, &values, &["notes".into()])
            .unwrap();
        assert!(!alone.write.contains(&PathBuf::from("/ws/notes")));
    }

    /// Each class's `hide_matching` globs are compiled when the policy is parsed; a union hides
    /// what any of its classes hides, and shares the compiled set where the globs are the same.
    #[test]
    fn hidden_matches_are_compiled_once_and_a_union_hides_every_class_s() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let section = |role: &str, glob: &str| {
            format!(
                "[{role}]\nread = [\"{{{{ workspace }}}}\"]\nwrite = []\nhide_matching = [\"{glob}\"]\n"
            )
        };
        let text = format!(
            "{}{}{}{}",
            section("file_write", "**/*.key"),
            section("network", "**/*.key"),
            section("secret_read", "**/.env"),
            ["builder", "gate", "read_only"]
                .iter()
                .map(|role| format!("[{role}]\nread = []\nwrite = []\n"))
                .collect::<String>()
        );
        let policy = parse(&text).unwrap();
        let templates = TemplateEngine::new(dir.path());
        let values = minijinja::context! { workspace => ws.display().to_string() };
        let resolved = |classes: &str| {
            let classes = kavi_foundation::side_effect::SideEffects::parse(classes).unwrap();
            policy
                .for_skill(classes)
                .resolve(&templates, &values, &[])
                .unwrap()
                .hide_matching
                .unwrap()
                .0
        };
        let network = resolved("NETWORK");
        // The same compiled set at every launch, and for a union whose classes share globs.
        assert!(Arc::ptr_eq(&network, &resolved("NETWORK")));
        let shared = resolved("FILE_WRITE+NETWORK");
        assert!(Arc::ptr_eq(&shared, &network) || Arc::ptr_eq(&shared, &resolved("FILE_WRITE")));
        let union = resolved("NETWORK+SECRET_READ");
        assert!(union.is_match("a/b.key") && union.is_match("a/.env"));
        assert!(network.is_match("a/b.key") && !network.is_match("a/.env"));
    }

    #[test]
    fn the_shipped_policy_parses_and_resolves_to_absolute_paths() {
        let text = std::fs::read_to_string(
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
                .join(DEFAULT_POLICY),
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let templates = TemplateEngine::new(dir.path());
        let policy = parse(&text).unwrap();
        let profile = policy
            .builder
            .resolve(
                &templates,
                &minijinja::context! { sandbox => "/s/box", tmp => "/s/tmp" },
                &[],
            )
            .unwrap();
        assert!(profile.write.contains(&PathBuf::from("/s/box")));
        assert!(profile.write.contains(&PathBuf::from("/s/tmp")));
        assert!(profile.require && !profile.network);
    }

    #[test]
    fn a_template_reading_a_value_the_role_lacks_is_refused_at_its_line() {
        let gate = "[gate]\nread = []\nwrite = []\n[read_only]\nread = []\nwrite = []\n\
                    [file_write]\nread = []\nwrite = []\n[network]\nread = []\nwrite = []\n\
                    [secret_read]\nread = []\nwrite = []\n";
        let err = parse(&format!(
            "[builder]\nread = [\"/\"]\nwrite = [\"{{{{ workspace }}}}\"]\n{gate}"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("may read only `sandbox`, `tmp`"), "{err}");
        assert!(err.contains("confinement.toml:3:"), "{err}");
    }

    #[test]
    fn relative_paths_are_refused_when_resolved() {
        let policy = parse(&format!(
            "[builder]\nread = [\"usr\"]\nwrite = []\n{}",
            others("builder")
        ))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let err = policy
            .builder
            .resolve(
                &TemplateEngine::new(dir.path()),
                &minijinja::context! {},
                &[],
            )
            .unwrap_err();
        assert!(err.contains("not absolute"), "{err}");
    }

    #[test]
    fn a_tripwire_neither_absolute_nor_in_home_is_refused_at_its_line() {
        let err = parse(&format!(
            "{}[system]\nread = []\npath = \"/bin\"\ntripwires = [\".ssh/id_rsa\"]\n",
            others("")
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("did you mean `~/.ssh/id_rsa`?"), "{err}");
        assert!(err.contains("confinement.toml:"), "{err}");
    }
}
