//! `kavi mcp`: serve the workspace's trusted skills to an MCP client on stdio (see
//! [`crate::mcp`]). Nothing but the protocol goes to stdout.

use std::sync::Arc;

use rmcp::ServiceExt;

use super::skills::SkillEnv;
use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::executions::Runner;
use crate::mcp::wire::Lines;
use crate::mcp::{McpPolicy, Runners, SkillServer, policy};
use crate::spec::SpecError;

/// What the server runs skills with: the workspace and what `kavi skill run` loads.
struct Served {
    workspace: Workspace,
    env: SkillEnv,
}

impl Runners for Served {
    fn runner(&self) -> Runner<'_> {
        self.env.runner(&self.workspace, true)
    }
}

pub async fn run(workspace: Workspace, client: Option<String>) -> Result<i32, Error> {
    super::served_workspace(&workspace, "kavi mcp")?;
    let env = SkillEnv::load(&workspace)?;
    // Read from the rules skills run under, never a weakening on disk nobody adopted. No policy
    // file grants nothing: READ_ONLY skills only.
    let policy = match env.rules.source(policy::DEFAULT_POLICY) {
        Some(source) => McpPolicy::parse(&source).map_err(SpecError::from)?,
        None => McpPolicy::default(),
    };
    let served = Arc::new(Served { workspace, env });
    let wire = Lines::new(
        tokio::io::stdin(),
        tokio::io::stdout(),
        policy.max_request_bytes,
    );
    let server = SkillServer::new(served, policy, client);
    let service = server
        .serve(wire)
        .await
        .map_err(|e| Error::Usage(format!("the MCP client did not start a session: {e}")))?;
    service.waiting().await.map_err(|e| Error::Io {
        context: "the MCP server stopped".into(),
        source: std::io::Error::other(e),
    })?;
    Ok(exit::SUCCESS)
}
