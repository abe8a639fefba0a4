//! `kavi serve`: the review page of crates/kavi-serve, given what only the binary can do: the
//! policy diff of a run against the workspace's pipeline as it loads now, `explain`, the graph
//! of the spec a run kept, `ledger verify`, and resuming an approved run, each through the function the CLI's own command uses.

use std::net::SocketAddr;

use kavi_governance::adoption::FileChange;
use kavi_serve::{Options, ServeError};

use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::ledger::{Ledger, RunRow};

struct Binary;

impl kavi_serve::Cli for Binary {
    fn policy_diff(&self, workspace: &Workspace, run_id: i64) -> Result<Vec<FileChange>, String> {
        let ledger = Ledger::open_existing(&workspace.config.ledger).map_err(|e| e.to_string())?;
        super::policy::changed_since(workspace, &ledger, run_id).map_err(|e| e.to_string())
    }

    fn explain(
        &self,
        workspace: &Workspace,
        run_id: i64,
        node: &str,
    ) -> Result<serde_json::Value, String> {
        super::explain::explanation(workspace, &run_id.to_string(), node)
            .map(|explained| explained.report)
            .map_err(|e| e.to_string())
    }

    fn graph(
        &self,
        workspace: &Workspace,
        run_id: i64,
    ) -> Result<Vec<(String, Vec<String>)>, String> {
        super::pipeline::kept_graph(workspace, run_id).map_err(|e| e.to_string())
    }

    fn ledger_verify(&self, workspace: &Workspace) -> Result<serde_json::Value, String> {
        let (findings, trusted) = super::ledger::findings(workspace).map_err(|e| e.to_string())?;
        Ok(super::ledger::report(&findings, trusted.as_deref()))
    }

    fn resume(&self, workspace: &Workspace, root: RunRow) {
        let workspace = workspace.clone();
        // The resumed run is a pipeline run of its own, as long as it takes: on a thread and a
        // runtime of its own, reporting to the server's output as `kavi approve` would.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let resumed = match runtime {
                Ok(runtime) => runtime.block_on(super::review::resume(&workspace, &root)),
                Err(e) => Err(Error::Unusable(format!(
                    "failed to start the async runtime: {e}"
                ))),
            };
            match resumed {
                Ok(code) => outln!("the resumed run of run {} ended ({code})", root.id),
                Err(e) => errln!("error: resuming run {}: {e}", root.id),
            }
        });
    }
}

pub async fn run(workspace: Workspace, addr: SocketAddr, allow_remote: bool) -> Result<i32, Error> {
    super::served_workspace(&workspace, "kavi serve")?;
    let options = Options { addr, allow_remote };
    let served = kavi_serve::serve(workspace, options, Box::new(Binary), |address| {
        outln!(
            "serving the review page on {} (Ctrl-C stops it)",
            address.url()
        );
    });
    // A run the page resumes takes SIGINT and SIGTERM to cancel itself; the server must still
    // end on them, with the code a cancelled command ends with.
    let stopped = super::signals::cancel_on_signals("the review page and any run it resumed");
    let served = tokio::select! {
        served = served => served,
        () = stopped.cancelled() => return Ok(super::signals::cancelled_exit_code()),
    };
    match served {
        Ok(()) => Ok(exit::SUCCESS),
        Err(e @ (ServeError::NotLoopback(_) | ServeError::NotNamedLoopback(_))) => {
            Err(Error::Usage(e.to_string()))
        }
        Err(e) => Err(Error::Unusable(e.to_string())),
    }
}
