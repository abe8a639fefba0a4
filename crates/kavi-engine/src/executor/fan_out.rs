//! Nodes that run once per item (`for_each`), as Argo's `withItems`/`withParam` and GitHub
//! Actions' `matrix` do. When such a node is ready its items are read, and each becomes an
//! instance: a slot of its own, recorded as its own node run (`id[0]`, `id[1]`, ...) with its
//! item, keyed, retried, skipped by `when` and limited by `max_parallel` one by one. The node
//! itself waits on its instances, then ends with the list of their outputs.

use std::cmp::Reverse;

use serde_json::{Value, json};

use super::recorder::Write;
use super::{Event, Executor, Slot};
use crate::ledger::{LedgerError, NodeRecord};
use crate::spec::{FanOut, ForEach};
use crate::state::NodeState;

impl<'a> Executor<'a> {
    /// Decides a fan-out that is ready: the first time, what its dependencies decide or its
    /// instances (none when it has no items); once they have all finished, its own end.
    /// Returns whether it finished.
    pub(super) fn settle_fan_out(&mut self, index: usize) -> Result<bool, LedgerError> {
        if self.slots[index].instances.is_some() {
            self.gather(index)?;
            return Ok(true);
        }
        // Its `when` is each instance's: it may read the item.
        let verdict = self.dependency_verdict(index).or_else(|| {
            self.stopped_for(index)
                .map(|reason| (NodeState::Cancelled, format!("not started: {reason}")))
        });
        if let Some((state, text)) = verdict {
            let (error, reason) = match state {
                NodeState::Failed => (Some(text.as_str()), None),
                _ => (None, Some(text.as_str())),
            };
            self.finish_without_running(index, state, error, reason)?;
            return Ok(true);
        }
        let items = match self.items(index) {
            Ok(items) => items,
            Err(error) => {
                self.finish_without_running(index, NodeState::Failed, Some(&error), None)?;
                return Ok(true);
            }
        };
        let node = self.spec(index);
        let first = self.slots.len();
        for (position, item) in items.into_iter().enumerate() {
            self.recorder.record(Write::Pending {
                node_id: FanOut::instance_id(&node.id, position),
                kind: node.kind,
            });
            self.slots.push(Slot {
                instance: Some((position, item)),
                ..Slot::new(index, 0)
            });
            self.ready.push(Reverse(first + position));
        }
        let instances = first..self.slots.len();
        self.slots[index].waiting_on = instances.len();
        let none = instances.is_empty();
        self.slots[index].instances = Some((instances, 0));
        if none {
            self.gather(index)?;
        }
        Ok(none)
    }

    /// A fan-out's items: as written, or what its expression gives, a list or text holding a
    /// JSON array (what a node printed).
    pub(super) fn items(&self, index: usize) -> Result<Vec<Value>, String> {
        let fan_out = self.spec(index).fan_out.as_ref().expect("a fan-out");
        let expression = match &fan_out.items {
            ForEach::Items(items) => return Ok(items.clone()),
            ForEach::Expression(expression) => expression.get_ref(),
        };
        let value = self
            .env
            .templates
            .eval_expression(expression, &self.context_for(index))
            .map_err(|e| {
                format!(
                    "failed to evaluate `for_each`: {}",
                    crate::template::describe_error(&e)
                )
            })?;
        let value = serde_json::to_value(&value)
            .map_err(|e| format!("`for_each` ({expression}) gave what is not data: {e}"))?;
        let listed = match value {
            Value::String(text) => serde_json::from_str(&text).map_err(|e| {
                format!("`for_each` ({expression}) gave text that is not a JSON array: {e}")
            })?,
            value => value,
        };
        match listed {
            Value::Array(items) => Ok(items),
            other => Err(format!(
                "`for_each` ({expression}) gave {}, not a list",
                match other {
                    Value::Null => "nothing",
                    Value::Bool(_) => "a boolean",
                    Value::Number(_) => "a number",
                    Value::String(_) => "a string",
                    Value::Object(_) => "a map",
                    Value::Array(_) => "a list",
                }
            )),
        }
    }

    /// Whether slot `index` is an instance whose fan-out has `max_parallel` instances running.
    pub(super) fn at_max_parallel(&self, index: usize) -> bool {
        if self.slots[index].instance.is_none() {
            return false;
        }
        let fan_out = self.slots[index].node;
        let limit = self
            .spec(fan_out)
            .fan_out
            .as_ref()
            .and_then(|f| f.max_parallel);
        let running = self.slots[fan_out]
            .instances
            .as_ref()
            .map_or(0, |(_, n)| *n);
        limit.is_some_and(|limit| running >= limit)
    }

    /// Counts an instance's attempt as running (`started`) or not any more, for `max_parallel`.
    pub(super) fn instance_started(&mut self, index: usize, started: bool) {
        if self.slots[index].instance.is_none() {
            return;
        }
        let fan_out = self.slots[index].node;
        if let Some((_, running)) = &mut self.slots[fan_out].instances {
            *running = if started {
                *running + 1
            } else {
                running.saturating_sub(1)
            };
        }
    }

    /// Ends a fan-out whose instances have all finished: its outputs are theirs, in item order;
    /// it failed when one failed or timed out (its `on_failure` then decides what that does to
    /// the nodes that need it), was cancelled when one was, was skipped when every one was.
    pub(super) fn gather(&mut self, index: usize) -> Result<(), LedgerError> {
        let node = self.spec(index);
        let (instances, _) = self.slots[index]
            .instances
            .clone()
            .expect("a fan-out with instances");
        let states: Vec<NodeState> = instances
            .clone()
            .map(|i| self.slots[i].state.expect("instances finish first"))
            .collect();
        let outputs: Vec<Value> = instances
            .clone()
            .map(|i| self.slots[i].entry["outputs"].clone())
            .collect();
        let failed = |s: &NodeState| matches!(s, NodeState::Failed | NodeState::TimedOut);
        let state = if states.iter().any(failed) {
            NodeState::Failed
        } else if states.contains(&NodeState::Cancelled) {
            NodeState::Cancelled
        } else if states.contains(&NodeState::AwaitingReview) {
            NodeState::AwaitingReview
        } else if !states.is_empty() && states.iter().all(|s| *s == NodeState::Skipped) {
            NodeState::Skipped
        } else {
            NodeState::Succeeded
        };
        let mut tally: Vec<(NodeState, usize)> = Vec::new();
        for s in &states {
            match tally.iter_mut().find(|(t, _)| t == s) {
                Some((_, n)) => *n += 1,
                None => tally.push((*s, 1)),
            }
        }
        let tally: Vec<String> = tally.iter().map(|(s, n)| format!("{n} {s}")).collect();
        let summary = match states.len() {
            0 => "`for_each` gave no items: no instance ran".to_owned(),
            n => format!("{n} instance(s): {}", tally.join(", ")),
        };
        // The first instance that made it end so, when that is not success.
        let made_it = |s: &NodeState| match state {
            NodeState::Failed => failed(s),
            NodeState::Succeeded | NodeState::Skipped => false,
            _ => *s == state,
        };
        let error = instances
            .clone()
            .find(|&i| made_it(&states[i - instances.start]))
            .map(|i| {
                let why = self.slots[i].entry["error"].as_str().unwrap_or_default();
                format!(
                    "`{}` {}: {why}",
                    self.slot_id(i),
                    super::describe_state(state)
                )
            });
        let outputs = Value::Array(outputs);
        self.observer.event(&Event::NodeFinished {
            node: &node.id,
            attempt: 1,
            state,
            duration: None,
            detail: Some(error.as_deref().unwrap_or(&summary)),
            outputs: Some(&outputs),
            will_retry: false,
        });
        self.recorder.record(Write::Finish {
            node_id: node.id.clone(),
            attempt: 1,
            state,
            record: Box::new(NodeRecord {
                outputs: Some(outputs.clone()),
                error: error.clone(),
                reason: Some(summary),
                ..Default::default()
            }),
        });
        self.slots[index].entry = json!({
            "state": state,
            "kind": node.kind,
            "error": error,
            "outputs": outputs,
        });
        self.mark_done(index, state);
        Ok(())
    }
}
