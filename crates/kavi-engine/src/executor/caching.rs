//! The executor and the cache: a node's key, its outputs reused from the run being resumed or
//! restored from the cache, and what a cached node records.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::{Value, json};

use super::Executor;
use super::recorder::Write;
use super::{Done, Event, here_else_on_the_pool};
use crate::cache::{DigestMemo, Key};
use crate::ledger::{CacheHit, CacheRecord, LedgerError, NodeRecord};
use crate::state::NodeState;

impl<'a> Executor<'a> {
    /// Takes a node's outputs from the run being resumed, when it succeeded there and so did
    /// (there, again) everything it needs: what is upstream of something that runs anew is never
    /// reused. An instance is taken so when its fan-out did not succeed but it did, for the same
    /// item. Returns whether it was.
    pub(super) fn reuse_node(&mut self, index: usize) -> bool {
        let node = self.spec(index);
        let node_id = self.slot_id(index);
        let Some(reused) = self.reuse.get(&node_id) else {
            return false;
        };
        // Its items are its fan-out's dependencies' doing, which are reused; a different item
        // in its place is still not what it ran for.
        if let Some((_, item)) = &self.slots[index].instance
            && reused.outputs.get("item") != Some(item)
        {
            return false;
        }
        if self
            .dag
            .dependencies(self.slots[index].node)
            .any(|dep| self.slots[dep].state != Some(NodeState::Reused))
            || self.stopped_for(index).is_some()
        {
            return false;
        }
        let record = NodeRecord {
            outputs: Some(reused.outputs.clone()),
            reason: Some(format!("reused from run {}", reused.run_id)),
            reused_from: Some(reused.node_run_id),
            ..Default::default()
        };
        self.observer.event(&Event::NodeFinished {
            node: &node_id,
            attempt: 1,
            state: NodeState::Reused,
            duration: None,
            detail: Some(&format!("from run {}", reused.run_id)),
            outputs: Some(&reused.outputs),
            will_retry: false,
        });
        // Templates see it as they saw it in the run it comes from: it succeeded there.
        self.slots[index].entry = json!({
            "state": NodeState::Succeeded,
            "kind": node.kind,
            "error": null,
            "outputs": reused.outputs,
        });
        self.recorder.record(Write::Finish {
            node_id,
            attempt: 1,
            state: NodeState::Reused,
            record: Box::new(record),
        });
        self.mark_done(index, NodeState::Reused);
        true
    }

    /// For a node that declares its inputs: makes its key's parts that the loop knows, and
    /// hashes its input files as a task of the loop's set (`--jobs` bounds those as it bounds
    /// attempts): on the loop's thread while they are few and small (see [`OnTheLoop`]), else
    /// on a thread of the blocking pool. Inputs of gigabytes hold up neither the running nodes
    /// (their output is read, their timeouts kept) nor a cancel; [`Executor::consult_cache`]
    /// takes the key when it is whole.
    pub(super) fn start_keying(&mut self, index: usize) {
        let spec = self
            .spec(index)
            .cache
            .as_ref()
            .expect("only nodes with inputs have keys");
        let key = self.node_key(index);
        let inputs = spec.inputs.clone();
        let workspace = Arc::clone(&self.env.workspace);
        let skip = Arc::clone(&self.env.state_paths);
        let memo = DigestMemo::of_store(&self.env.artifacts);
        // A cancel (or a spent budget) ends the hashing too: inputs of terabytes would
        // otherwise hold kavi's exit for as long as they take to read.
        let cancel = self.nodes_cancel.child_token();
        self.running.spawn(async move {
            let hash = move |stopped: &dyn Fn() -> bool| {
                let mut key = key.clone();
                key.add_inputs(&workspace, &inputs, &skip, &memo, stopped)
                    .map(|()| key)
            };
            let key = here_else_on_the_pool(cancel, hash)
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            Done::Keyed { index, key }
        });
    }

    /// For a node whose key is whole: when an earlier node run with that key succeeded, starts
    /// putting its output files back (see [`Executor::outputs_restored`]). Otherwise keeps the
    /// key (and why it was not used) for when the node finishes, and makes it due to start.
    /// Returns whether the node finished: only when its inputs could not be read, which fails it.
    pub(super) fn consult_cache(
        &mut self,
        index: usize,
        key: std::io::Result<Key>,
    ) -> Result<bool, LedgerError> {
        let node = self.spec(index);
        let spec = node
            .cache
            .as_ref()
            .expect("only nodes with inputs have keys");
        let key = match key {
            Ok(key) => key,
            Err(_) if self.nodes_cancel.is_cancelled() => {
                // The loop may take the cancel itself only after this.
                let reason = self
                    .stopped_for(index)
                    .unwrap_or_else(|| "run cancelled".into());
                let reason = format!("not started: {reason}");
                self.finish_without_running(index, NodeState::Cancelled, None, Some(&reason))?;
                return Ok(true);
            }
            Err(e) => {
                let error = format!("failed to read its inputs: {e}");
                self.finish_without_running(index, NodeState::Failed, Some(&error), None)?;
                return Ok(true);
            }
        };
        let mut record = CacheRecord {
            key: key.digest(),
            parts: key.parts,
            ..CacheRecord::default()
        };
        let hit = if !spec.enabled {
            record.note = Some("it has `cache = false`".into());
            None
        } else if !self.env.use_cache {
            record.note = Some("the run was started with --no-cache".into());
            None
        } else if self.rerun.contains(&node.id) {
            record.note = Some("the run was started with --rerun naming it".into());
            None
        } else {
            self.ledger.cache_hit(&record.key)?
        };
        let Some(hit) = hit else {
            if record.note.is_none() {
                record.note = Some("no earlier run of it with this key succeeded".into());
            }
            self.slots[index].cache = Some(record);
            self.to_start.push(Reverse((index, 1)));
            return Ok(false);
        };
        // What the ledger keeps of the outputs is read here, on its connection; the files are
        // compared, copied and checked on a thread of the blocking pool, as the inputs were
        // hashed (see `start_keying`).
        let mut kept = HashMap::new();
        for sha256 in hit.files.values() {
            match self.ledger.kept_artifact(sha256) {
                Ok(None) => {}
                Ok(Some(bytes)) => _ = kept.insert(sha256.clone(), Ok(bytes)),
                Err(e) => _ = kept.insert(sha256.clone(), Err(e)),
            }
        }
        let workspace = Arc::clone(&self.env.workspace);
        let store = self.env.artifacts.clone();
        let staging = self.env.owner.spill_dir().to_owned();
        let cancel = self.nodes_cancel.child_token();
        self.running.spawn(async move {
            let files = hit.files.clone();
            let restore = move |stopped: &dyn Fn() -> bool| {
                let copy = |sha256: &str, to: &mut dyn std::io::Write| match kept.get(sha256) {
                    Some(Ok(bytes)) => to.write_all(bytes).map_err(|e| e.to_string()),
                    Some(Err(e)) => Err(e.clone()),
                    None => store.copy_out(sha256, to),
                };
                crate::cache::restore_outputs(&workspace, &files, &staging, copy, stopped)
            };
            // Most outputs are already in place and small. A stop part way leaves every output
            // as it was, so the blocking pool can start over.
            let restored = here_else_on_the_pool(cancel, restore)
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            Done::Restored {
                index,
                record,
                hit,
                restored,
            }
        });
        Ok(false)
    }

    /// Takes a cached node's restored outputs: finishes it as `cached`, or, when they could not
    /// be put back, makes it due to run with the reason kept. Returns whether it finished.
    pub(super) fn outputs_restored(
        &mut self,
        index: usize,
        mut record: CacheRecord,
        hit: &CacheHit,
        restored: Result<usize, String>,
    ) -> bool {
        match restored {
            Ok(restored) => {
                self.finish_cached(index, record, hit, restored);
                true
            }
            Err(e) => {
                record.note = Some(format!(
                    "node run {} of run {} had this key, but {e}",
                    hit.node_run_id, hit.run_id
                ));
                self.slots[index].cache = Some(record);
                self.to_start.push(Reverse((index, 1)));
                false
            }
        }
    }

    fn finish_cached(
        &mut self,
        index: usize,
        mut record: CacheRecord,
        hit: &CacheHit,
        restored: usize,
    ) {
        let node = self.spec(index);
        let node_id = self.slot_id(index);
        record.source = Some(hit.node_run_id);
        record.files.clone_from(&hit.files);
        let reason = format!(
            "node run {} of run {} had the same key: its recorded result was taken, and no \
             process started",
            hit.node_run_id, hit.run_id
        );
        let detail = match restored {
            0 => format!("from run {}", hit.run_id),
            n => format!("from run {}, {n} output file(s) restored", hit.run_id),
        };
        self.observer.event(&Event::NodeFinished {
            node: &node_id,
            attempt: 1,
            state: NodeState::Cached,
            duration: None,
            detail: Some(&detail),
            outputs: Some(&hit.outputs),
            will_retry: false,
        });
        // Templates see the result as it was when the node ran.
        self.slots[index].entry = json!({
            "state": NodeState::Succeeded,
            "kind": node.kind,
            "error": null,
            "outputs": hit.outputs,
        });
        let record = NodeRecord {
            outputs: Some(hit.outputs.clone()),
            reason: Some(reason),
            cache: Some(record),
            ..Default::default()
        };
        self.recorder.record(Write::Finish {
            node_id,
            attempt: 1,
            state: NodeState::Cached,
            record: Box::new(record),
        });
        self.mark_done(index, NodeState::Cached);
    }

    /// A node's key (see [`crate::cache`]) but for its input files, which are hashed off the
    /// loop (see [`Executor::start_keying`]).
    fn node_key(&self, index: usize) -> Key {
        let run = json!({ "id": self.run_id, "pipeline": self.dag.pipeline.name, "spec_hash": self.dag.pipeline.spec_hash });
        let facts = KeyFacts {
            nodes: &self.dag.pipeline.nodes,
            params: &self.params,
            run: &run,
            settings: &self.config_settings,
        };
        let mut key = key_but_inputs(self.slots[index].node, &facts, |i| {
            self.slots[i]
                .state
                .is_some()
                .then_some(&self.slots[i].entry)
        });
        // An instance's result depends on its item, whatever its templates do with it.
        if let Some((_, item)) = &self.slots[index].instance {
            key.add("item", item.to_string());
        }
        key
    }
}

/// What a node's key is made of beside the node itself: its pipeline's nodes, the run's
/// parameters and fields, the configuration setting by setting (see
/// [`crate::spec::governing::config_settings`]).
pub(crate) struct KeyFacts<'k> {
    pub nodes: &'k [crate::spec::NodeSpec],
    pub params: &'k Value,
    pub run: &'k Value,
    pub settings: &'k BTreeMap<String, String>,
}

/// Node `index`'s key but for its input files: its definition, kavi's version, the files that
/// govern it, the settings it depends on, what its templates read (`entry` gives a finished
/// node's entry as templates see it) and its environment.
pub(crate) fn key_but_inputs<'e>(
    index: usize,
    facts: &KeyFacts<'e>,
    entry: impl Fn(usize) -> Option<&'e Value>,
) -> Key {
    let node = &facts.nodes[index];
    let spec = node
        .cache
        .as_ref()
        .expect("only nodes with inputs have keys");
    let mut key = Key::default();
    key.parts
        .insert("definition".into(), spec.definition.clone());
    key.add("kavi", env!("CARGO_PKG_VERSION"));
    key.parts.extend(spec.governing.iter().cloned());
    // The settings its result depends on: its kind's, and those its templates read.
    let mut settings: BTreeSet<&str> = node.action.config_settings().iter().copied().collect();
    // What its templates read; not what its `for_each` reads: an instance's key has its own
    // item (see `Executor::node_key`), so a list that grows leaves the others cached.
    let items_span = node
        .fan_out
        .as_ref()
        .and_then(|fan_out| match &fan_out.items {
            crate::spec::ForEach::Expression(expression) => Some(expression.span()),
            crate::spec::ForEach::Items(_) => None,
        });
    for (path, span) in &node.reads {
        if items_span.as_ref() == Some(span) {
            continue;
        }
        let mut names = path.split('.');
        let (root, name) = (names.next().unwrap_or_default(), names.next());
        let (prefix, values) = match root {
            "params" => ("param", facts.params),
            "run" => ("run", facts.run),
            "nodes" => {
                for (i, other) in facts.nodes.iter().enumerate() {
                    if name.is_none_or(|id| id == other.id)
                        && let Some(entry) = entry(i)
                    {
                        key.add(format!("node:{}", other.id), entry.to_string());
                    }
                }
                continue;
            }
            "config" => {
                match name {
                    Some(name) => _ = settings.insert(name),
                    None => settings.extend(facts.settings.keys().map(String::as_str)),
                }
                continue;
            }
            _ => continue,
        };
        for (field, value) in values.as_object().into_iter().flatten() {
            if name.is_none_or(|name| name == field) {
                key.add(format!("{prefix}:{field}"), value.to_string());
            }
        }
    }
    for name in settings {
        if let Some(text) = facts.settings.get(name) {
            key.add(format!("config:{name}"), text);
        }
    }
    for (name, value) in crate::process::base_env() {
        key.add(format!("env:{name}"), value);
    }
    if node.action.inherits_environment() {
        let mut inherited: Vec<String> = std::env::vars()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        inherited.sort();
        key.add("env:*", inherited.join("\0"));
    }
    key
}
