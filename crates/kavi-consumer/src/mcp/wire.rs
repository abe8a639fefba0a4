//! The stdio wire: one JSON-RPC message a line, each line bounded, and every line that is not a
//! message answered as JSON-RPC 2.0 says.
//!
//! The SDK's own stdio transport drops what it cannot parse and answers nothing, so a client
//! that sent bad JSON, binary, invalid UTF-8 or an oversized line waits forever. Here such a line
//! gets an error response: a parse error (-32700) for what is not JSON, an invalid request
//! (-32600) for JSON that is no message or a line over the limit, with the request's `id` when it
//! has one and `"id": null` otherwise.

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::ErrorCode;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

/// The transport over a reader and a writer (stdin and stdout for `kavi mcp`).
pub struct Lines<R, W> {
    read: BufReader<R>,
    write: Arc<Mutex<W>>,
    /// The most bytes a line may have (`max_request_bytes` in `policies/mcp.toml`).
    limit: usize,
    /// The line read so far: kept here, as `receive` can be dropped mid-line and resumed.
    line: Vec<u8>,
    /// The size of the oversized line being skipped, until its end.
    skipping: Option<usize>,
}

/// What one read ended with.
enum Read {
    Line,
    /// A line over the limit, skipped whole; its size.
    Oversized(usize),
    End,
}

impl<R, W> Lines<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    pub fn new(read: R, write: W, limit: usize) -> Self {
        Self {
            read: BufReader::new(read),
            write: Arc::new(Mutex::new(write)),
            limit,
            line: Vec::new(),
            skipping: None,
        }
    }

    /// Reads up to the next newline, never holding more than `limit` bytes of it. Between the
    /// one await and taking the bytes nothing else awaits, so a dropped read loses nothing.
    async fn read_line(&mut self) -> std::io::Result<Read> {
        loop {
            let available = self.read.fill_buf().await?;
            if available.is_empty() {
                return Ok(Read::End);
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |at| at + 1);
            if let Some(skipped) = &mut self.skipping {
                *skipped += take;
            } else if self.line.len() + take > self.limit + 1 {
                // Over the limit (the newline aside): the rest of the line is only counted.
                self.skipping = Some(self.line.len() + take);
                self.line.clear();
            } else {
                self.line.extend_from_slice(&available[..take]);
            }
            self.read.consume(take);
            if newline.is_some() {
                return Ok(match self.skipping.take() {
                    Some(size) => Read::Oversized(size.saturating_sub(1)),
                    None => Read::Line,
                });
            }
        }
    }

    /// Answers a line that is not a message; in a task of its own, so that the answer is
    /// written whole even if the read that found it is dropped.
    fn answer(&self, answer: Value) {
        let write = self.write.clone();
        tokio::spawn(async move {
            let mut line = answer.to_string().into_bytes();
            line.push(b'\n');
            let mut write = write.lock().await;
            if let Err(e) = write.write_all(&line).await {
                tracing::warn!("could not answer a malformed MCP message: {e}");
            }
            let _ = write.flush().await;
        });
    }
}

/// A line as a message, or the error response it gets (`None`: no answer, as for a notification).
fn parse(line: &[u8]) -> Result<RxJsonRpcMessage<RoleServer>, Option<Value>> {
    let text = std::str::from_utf8(line).map_err(|e| {
        Some(error(
            Value::Null,
            ErrorCode::PARSE_ERROR,
            format!(
                "Parse error: the message is not UTF-8 (an invalid byte at offset {})",
                e.valid_up_to()
            ),
        ))
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let value: Value = serde_json::from_str(text).map_err(|e| {
        Some(error(
            Value::Null,
            ErrorCode::PARSE_ERROR,
            format!("Parse error: the message is not JSON: {e}"),
        ))
    })?;
    serde_json::from_value(value.clone()).map_err(|e| {
        let id = value
            .get("id")
            .filter(|id| id.is_string() || id.is_number());
        match (id, value.get("method")) {
            // A notification is never answered, even when it is malformed.
            (None, Some(method)) if method.is_string() => {
                tracing::debug!("ignoring a malformed notification: {e}");
                None
            }
            (id, _) => Some(error(
                id.cloned().unwrap_or(Value::Null),
                ErrorCode::INVALID_REQUEST,
                format!("Invalid Request: not a JSON-RPC 2.0 message: {e}"),
            )),
        }
    })
}

fn error(id: Value, code: ErrorCode, message: String) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code.0, "message": message}})
}

impl<R, W> Transport<RoleServer> for Lines<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = self.write.clone();
        async move {
            let mut line = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            line.push(b'\n');
            let mut write = write.lock().await;
            write.write_all(&line).await?;
            write.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            match self.read_line().await {
                Err(e) => {
                    tracing::warn!("reading the MCP client's messages failed: {e}");
                    return None;
                }
                Ok(Read::End) => return None,
                Ok(Read::Oversized(size)) => self.answer(error(
                    Value::Null,
                    ErrorCode::INVALID_REQUEST,
                    format!(
                        "Invalid Request: the message is {size} bytes, over the {} bytes a \
                         message may have (`max_request_bytes` in {}); it was not read",
                        self.limit,
                        super::policy::DEFAULT_POLICY
                    ),
                )),
                Ok(Read::Line) => {
                    let line = std::mem::take(&mut self.line);
                    let line = line.strip_suffix(b"\n").unwrap_or(&line);
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    match parse(line) {
                        Ok(message) => return Some(message),
                        Err(Some(answer)) => self.answer(answer),
                        Err(None) => {}
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.write.lock().await.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(line: &[u8]) -> Value {
        parse(line).err().flatten().expect("an error answer")
    }

    #[test]
    fn what_is_not_a_message_gets_the_error_json_rpc_names() {
        let binary = answer(b"\x00\x01\xff");
        assert_eq!(binary["error"]["code"], -32700);
        assert_eq!(binary["id"], Value::Null);
        assert!(binary.as_object().unwrap().contains_key("id"));
        assert_eq!(answer(b"{\"jsonrpc\": ")["error"]["code"], -32700);
        let no_message = answer(b"{\"jsonrpc\":\"2.0\",\"id\":7}");
        assert_eq!(no_message["error"]["code"], -32600);
        assert_eq!(no_message["id"], 7);
        assert_eq!(answer(b"[1, 2]")["id"], Value::Null);
        // A notification is not answered, and a message is a message.
        assert!(matches!(
            parse(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\",\"params\":7}"),
            Err(None) | Ok(_)
        ));
        assert!(parse(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}").is_ok());
    }
}
